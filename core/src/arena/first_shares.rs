//! What proxies' new buckets were told before the proxies reported them.

use std::collections::BTreeMap;
use std::ops::RangeInclusive;
use std::sync::Arc;

use super::ids::NodeId;

/// Most users a service keeps first shares of: beyond, a new one is not
/// kept (its proxy's slots are then counted as an idle node's).
pub(crate) const MAX_FIRST_SHARE_USERS: usize = 100_000;

/// One proxy's first share of a user.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct FirstShare {
    node: NodeId,
    slots: RangeInclusive<i64>,
    /// Requests a slot.
    per_slot: f64,
}

impl FirstShare {
    /// The proxy told it.
    pub(crate) fn node(&self) -> NodeId {
        self.node
    }

    /// Its first slot.
    pub(crate) fn first(&self) -> i64 {
        *self.slots.start()
    }

    /// What its proxy may have admitted in `slot` on it, if that slot is
    /// one of it: the share, and on its first slot the bucket it starts
    /// with (a second's worth, `per_second` slots) too.
    pub(crate) fn in_slot(&self, slot: i64, per_second: f64) -> Option<f64> {
        if !self.slots.contains(&slot) {
            return None;
        }
        let start = if slot == self.first() {
            self.per_slot * per_second
        } else {
            0.0
        };
        Some(self.per_slot + start)
    }
}

/// The *first shares* of a service: a proxy's bucket new to it is told its
/// share of the user's rule for its first slots, before its first report
/// shows what it wants ([`rlqs`](crate::rlqs)), and admits up to that
/// share (and its bucket's capacity at once) while the quota policy has
/// nothing of it yet. The policy counts those slots from here.
#[derive(Debug, Default)]
pub(crate) struct FirstShares {
    users: BTreeMap<Arc<str>, Vec<FirstShare>>,
}

impl FirstShares {
    /// `node` told `user`'s bucket `per_slot` requests a slot over `slots`:
    /// replaces what it told before.
    pub(crate) fn tell(
        &mut self,
        node: NodeId,
        user: &str,
        slots: RangeInclusive<i64>,
        per_slot: f64,
    ) {
        if !self.users.contains_key(user) && self.users.len() >= MAX_FIRST_SHARE_USERS {
            metrics::counter!("throttle_central_first_shares_dropped_total").increment(1);
            return;
        }
        let shares = self.users.entry(Arc::from(user)).or_default();
        shares.retain(|s| s.node != node);
        shares.push(FirstShare {
            node,
            slots,
            per_slot: per_slot.max(0.0),
        });
    }

    /// The first shares of `user`, one per proxy: looked up once per key
    /// of an assign, most often none.
    pub(crate) fn of(&self, user: &str) -> &[FirstShare] {
        if self.users.is_empty() {
            return &[];
        }
        self.users.get(user).map(Vec::as_slice).unwrap_or_default()
    }

    /// Forgets the first shares that ended before `slot`.
    pub(crate) fn forget_before(&mut self, slot: i64) {
        self.users.retain(|_, shares| {
            shares.retain(|s| *s.slots.end() >= slot);
            !shares.is_empty()
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_first_share_counts_its_slots_and_a_full_bucket_at_first() {
        let mut first = FirstShares::default();
        let (a, b) = (NodeId::from_index(0), NodeId::from_index(1));
        first.tell(a, "alice", 10..=15, 33.0);
        let in_slot = |f: &FirstShares, user: &str, node: NodeId, slot: i64, per_second: f64| {
            let share = f.of(user).iter().find(|s| s.node() == node)?;
            share.in_slot(slot, per_second)
        };
        let nodes = |f: &FirstShares| -> Vec<(NodeId, i64)> {
            f.of("alice")
                .iter()
                .map(|s| (s.node(), s.first()))
                .collect()
        };
        assert_eq!(in_slot(&first, "alice", a, 9, 1.0), None);
        assert_eq!(in_slot(&first, "alice", a, 10, 1.0), Some(66.0));
        assert_eq!(in_slot(&first, "alice", a, 15, 1.0), Some(33.0));
        assert_eq!(in_slot(&first, "alice", a, 16, 1.0), None);
        assert_eq!(in_slot(&first, "alice", b, 12, 1.0), None);
        assert_eq!(in_slot(&first, "bob", a, 12, 1.0), None);
        // Slots of 100 ms: a bucket of a second holds ten slots' shares.
        first.tell(b, "alice", 10..=70, 3.3);
        let at_start = in_slot(&first, "alice", b, 10, 10.0).unwrap_or(0.0);
        assert!((at_start - 36.3).abs() < 1e-9);
        // Told again: replaced.
        first.tell(a, "alice", 12..=17, 20.0);
        assert_eq!(in_slot(&first, "alice", a, 11, 1.0), None);
        assert_eq!(in_slot(&first, "alice", a, 13, 1.0), Some(20.0));
        assert_eq!(nodes(&first).len(), 2);
        first.forget_before(18);
        assert_eq!(nodes(&first), vec![(b, 10)]);
        first.forget_before(71);
        assert!(first.of("alice").is_empty());
    }
}
