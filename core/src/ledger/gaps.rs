//! A proxy's unreported gap ([`Gaps`]): the slots between its last report
//! on a lost stream and the first on the stream it opens again.
//!
//! Envoy drops the reports that fall due while its stream is down, and
//! admits meanwhile on its last assignments, then on its
//! `no_assignment_behavior` (often `ALLOW_ALL`). The buckets kept the
//! refill of those seconds (as spill, see [`Bucket`](crate::Bucket)),
//! which nothing would ever be charged to: the user would get them on top
//! of the limit once back. So the first slot the proxy files on its new
//! stream is charged again for every slot of the gap, late: first to the
//! refill the buckets turned away, then to the level, never into debt.
//! The gap is charged at the rate of that first report because it is the
//! best guess the central has of what the proxy admitted unseen; an
//! overestimate only empties the bucket.
//!
//! Only a proxy that was filing when it was lost has a gap: one idle for
//! two of its report periods before (as the checkpoint or this ledger
//! saw it) is taken to have stayed idle.

use super::checkpoint::Restored;
use crate::arena::ids::{Map, NodeId};
use crate::arena::state::ServiceState;

/// The most slots a gap is charged for: more than the slots of history a
/// ledger keeps.
const MAX_GAP_SLOTS: i64 = 3_600;

/// Where a node stood as it opened its stream in data slot `opened`:
/// its last filed data slot (until its gap is charged), and the newest
/// slot of the ledger (or checkpoint) that saw it.
#[derive(Debug, Clone, Copy)]
struct Opened {
    last: Option<i64>,
    newest: i64,
    opened: i64,
}

/// What a lost stream left unreported for a slot a node files on its new
/// one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Lost {
    /// The slots before it that went unreported (its first slot only).
    pub(super) gap: i64,
    /// Whether it is itself a slot the proxy admitted in while lost (it
    /// precedes the new stream), so charged late.
    pub(super) late: bool,
}

/// The nodes that opened a stream and have not filed on it yet.
#[derive(Debug, Default)]
pub(super) struct Gaps {
    opened: Map<NodeId, Opened>,
}

impl Gaps {
    /// Notes that `node` opened a stream in data slot `before` + 1: its
    /// last filed slot is read from `services` (this ledger) or, if none
    /// filed it, `restored` (the checkpoint the ledger started on).
    pub(super) fn open<'s>(
        &mut self,
        node: NodeId,
        services: impl Iterator<Item = &'s ServiceState>,
        restored: Option<&Restored>,
        before: i64,
    ) {
        let own = services.filter_map(|s| s.last_report.get(&node)).max();
        let (last, newest) = match (own, restored) {
            (Some(&last), _) => (Some(last), before),
            (None, Some(r)) => r
                .last_filed(node)
                .map_or((None, before), |(l, n)| (Some(l), n)),
            (None, None) => (None, before),
        };
        let opened = before + 1;
        self.opened.insert(
            node,
            Opened {
                last,
                newest,
                opened,
            },
        );
    }

    /// Whether `node` opened a stream and has not filed on it yet.
    pub(super) fn awaits(&self, node: NodeId) -> bool {
        !self.opened.is_empty() && self.opened.contains_key(&node)
    }

    /// What a lost stream left unreported for data slot `slot`, filed by
    /// `node`, whose reports lag `lag` slots (0: a node that reports
    /// every slot, and sends again what it could not: nothing is lost).
    pub(super) fn take(&mut self, node: NodeId, slot: i64, lag: i64) -> Lost {
        let Some(o) = self.opened.get_mut(&node) else {
            return Lost::default();
        };
        let gap = match o.last.take() {
            Some(last) if lag > 0 && last + 2 * lag + 1 >= o.newest => {
                (slot - last - 1).clamp(0, MAX_GAP_SLOTS)
            }
            _ => 0,
        };
        let late = lag > 0 && slot < o.opened;
        if slot >= o.opened {
            self.opened.remove(&node);
        }
        Lost { gap, late }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opened(last: i64, newest: i64) -> Gaps {
        let mut gaps = Gaps::default();
        let o = Opened {
            last: Some(last),
            newest,
            opened: 25,
        };
        gaps.opened.insert(NodeId(0), o);
        gaps
    }

    fn lost(gap: i64, late: bool) -> Lost {
        Lost { gap, late }
    }

    #[test]
    fn a_proxy_lost_while_filing_has_the_slots_it_never_reported() {
        // Last filed slot 10, lost then, back in slot 25 with a report of
        // 20..=24: 11..=19 went unreported, and 20..=24 were admitted
        // while it was lost.
        let mut gaps = opened(10, 12);
        assert_eq!(gaps.take(NodeId(0), 20, 6), lost(9, true));
        assert_eq!(gaps.take(NodeId(0), 21, 6), lost(0, true));
        assert_eq!(gaps.take(NodeId(0), 25, 6), lost(0, false));
        assert_eq!(gaps.take(NodeId(0), 21, 6), lost(0, false));
    }

    #[test]
    fn a_node_reporting_every_slot_or_an_idle_proxy_has_none() {
        assert_eq!(opened(10, 12).take(NodeId(0), 20, 0), lost(0, false));
        // Idle for more than two report periods before it was lost.
        assert_eq!(opened(10, 24).take(NodeId(0), 20, 6), lost(0, true));
        // Its stream picks up where it left off.
        assert_eq!(opened(10, 12).take(NodeId(0), 11, 6), lost(0, true));
        assert_eq!(opened(10, 12).take(NodeId(1), 20, 6), lost(0, false));
    }
}
