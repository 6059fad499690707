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
//! that ended with the same central leading) holds in the same way for the
//! nodes that reported just before ([`Ledger::await_nodes`]).

use std::collections::BTreeSet;

use throttle_clock::SlotLength;

use super::ids::NodeId;
use super::ledger::Ledger;

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
    /// When it grants regardless.
    until_ms: i64,
}

impl CatchUp {
    pub(super) fn new(awaiting: BTreeSet<NodeId>, now_ms: i64, slot: SlotLength) -> Option<Self> {
        (!awaiting.is_empty()).then(|| Self {
            awaiting,
            until_ms: now_ms + hold_ms(slot),
        })
    }

    /// Whether it is over at `now_ms`.
    fn over(&self, now_ms: i64) -> bool {
        self.awaiting.is_empty() || now_ms >= self.until_ms
    }

    /// How many nodes it still waits for.
    pub(super) fn awaited(&self) -> usize {
        self.awaiting.len()
    }
}

impl Ledger {
    /// Whether grants are held: the ledger was restored and still waits
    /// for the reports of a node its checkpoint names. Only
    /// [`Ledger::release`] ends a hold, its time included (the assigner
    /// calls it on every report and tick), so no grant is made from a
    /// bucket not yet capped again.
    pub fn holding(&self) -> bool {
        self.catch_up.is_some()
    }

    /// Holds grants, as after a restore, until the nodes that filed the
    /// newest two slots this ledger holds report again (or [`hold_ms`]
    /// passed): for a ledger that leads again after a gap. Nothing if a
    /// hold is under way or no node is awaited.
    pub fn await_nodes(&mut self, now_ms: i64) {
        if self.catch_up.is_some() {
            return;
        }
        let Some(&newest) = self.reported.keys().next_back() else {
            return;
        };
        let current = self.config.slot.slot_at(now_ms);
        if newest >= current - 1 {
            return;
        }
        let recent = self.reported.range(newest - 1..).flat_map(|(_, n)| n);
        self.catch_up = CatchUp::new(recent.copied().collect(), now_ms, self.config.slot);
        if let Some(c) = &self.catch_up {
            tracing::info!(
                nodes = c.awaited(),
                "leading again: holding grants until the nodes' reports are back"
            );
        }
    }

    /// Starts a ledger that has filed nothing and restored nothing at
    /// `now_ms`, on its first leadership: what the nodes admitted up to
    /// this slot, on the last quotas of a ledger it has no record of, was
    /// paid for by that ledger's refill, and only empties what its buckets
    /// start with (see `before_start`).
    pub fn begin(&mut self, now_ms: i64) {
        if self.restored.is_none() && self.charges_from.is_none() {
            self.charges_from = Some(self.config.slot.slot_at(now_ms) + 1);
        }
    }

    /// Notes that `node` filed data slot `slot`: caught up if that is the
    /// slot before the current one.
    pub(super) fn caught_up(&mut self, node: NodeId, slot: i64, now_ms: i64) {
        let current = self.config.slot.slot_at(now_ms);
        if let Some(c) = &mut self.catch_up
            && slot >= current - 1
        {
            c.awaiting.remove(&node);
        }
    }

    /// Ends the hold if nothing is awaited or its time is up; true if it
    /// ended now (once): every service should be assigned at once.
    pub fn release(&mut self, now_ms: i64) -> bool {
        let Some(c) = &self.catch_up else {
            return false;
        };
        let done = c.over(now_ms);
        if done {
            let missing: Vec<&str> = c.awaiting.iter().map(|&n| self.node_name(n)).collect();
            tracing::info!(?missing, "restored: granting again");
            self.catch_up = None;
        }
        done
    }
}
