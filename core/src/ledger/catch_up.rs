//! Grants held after a restore until the nodes' reports are back.
//!
//! A ledger restored from a checkpoint has its buckets as they stood when
//! the checkpoint was taken, refilled since. What the nodes admitted
//! meanwhile (on their last quotas, as the layer's
//! `Fallback::LastKnownThenAllow` lets them) reaches it only as they reconnect and send their kept
//! reports again. A grant made before those are filed hands out the
//! refill they already spent, and the debt that follows starves the next
//! slots. So a restored ledger grants nothing (its nodes keep deciding on
//! their last quotas) until every node that reported the checkpoint's
//! newest slot has reported the slot before the current one, or until
//! [`hold_ms`] passed (ended by the next report or tick), for nodes that
//! do not come back.
//!
//! Meanwhile the restored buckets keep the refill of the whole time the
//! central was away: what their capacity turns away of it is spilled
//! (`Bucket::restore`), and the nodes' reports of that time, late, are
//! charged to it first (`Bucket::consume_late`), however late they come.
//!
//! A ledger that leads again after a time without leading (an etcd outage
//! that ended with the same central leading), or that hears again from
//! its nodes after none reported for two slots, holds in the same way for
//! the nodes that reported just before (`Ledger::await_nodes`).
//!
//! A ledger that starts with no checkpoint cannot know which nodes to
//! wait for. When its first report was answered by a central it has no
//! record of (the nodes ran on that central's quotas and come back with
//! what they admitted since), it holds for [`hold_ms`] whatever reports
//! come (`Ledger::await_unknown_nodes`): the first node back would
//! otherwise be granted buckets the others' kept reports are about to
//! empty.

use std::collections::{BTreeMap, BTreeSet};

use throttle_clock::SlotLength;

use crate::arena::ids::NodeId;

/// The longest a restored ledger waits for the nodes it expects: two
/// slots, and at least one second (nodes reconnect within their backoff).
pub fn hold_ms(slot: SlotLength) -> i64 {
    (2 * i64::from(slot.as_ms())).max(1_000)
}

/// What a restored ledger waits for before it grants.
#[derive(Debug, Clone, Default)]
pub(super) struct CatchUp {
    /// The nodes not yet caught up.
    awaiting: BTreeSet<NodeId>,
    /// The nodes to wait for are not known: only the time ends it.
    unknown: bool,
    /// When it grants regardless.
    until_ms: i64,
}

impl CatchUp {
    pub(super) fn new(awaiting: BTreeSet<NodeId>, now_ms: i64, slot: SlotLength) -> Option<Self> {
        (!awaiting.is_empty()).then(|| Self {
            awaiting,
            unknown: false,
            until_ms: now_ms + hold_ms(slot),
        })
    }

    /// For a ledger that does not know which nodes to wait for: it holds
    /// for [`hold_ms`].
    pub(super) fn for_unknown_nodes(now_ms: i64, slot: SlotLength) -> Self {
        Self {
            awaiting: BTreeSet::new(),
            unknown: true,
            until_ms: now_ms + hold_ms(slot),
        }
    }

    /// For a ledger that leads again after a gap: the nodes that filed
    /// the newest two slots of `reported`, if its newest is older than the
    /// slot before the current one.
    pub(super) fn after_gap(
        reported: &BTreeMap<i64, BTreeSet<NodeId>>,
        now_ms: i64,
        slot: SlotLength,
    ) -> Option<Self> {
        let &newest = reported.keys().next_back()?;
        if newest >= slot.slot_at(now_ms) - 1 {
            return None;
        }
        let recent = reported.range(newest - 1..).flat_map(|(_, n)| n);
        Self::new(recent.copied().collect(), now_ms, slot)
    }

    /// Notes that `node` filed data slot `slot`, the current slot being
    /// `current`: caught up if that is the slot before.
    pub(super) fn caught_up(&mut self, node: NodeId, slot: i64, current: i64) {
        if slot >= current - 1 {
            self.awaiting.remove(&node);
        }
    }

    /// The nodes still awaited.
    pub(super) fn awaiting(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.awaiting.iter().copied()
    }

    /// Whether it is over at `now_ms`.
    pub(super) fn over(&self, now_ms: i64) -> bool {
        (self.awaiting.is_empty() && !self.unknown) || now_ms >= self.until_ms
    }

    /// How many nodes it still waits for.
    pub(super) fn awaited(&self) -> usize {
        self.awaiting.len()
    }
}
