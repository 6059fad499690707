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
struct FirstShare {
    node: NodeId,
    slots: RangeInclusive<i64>,
    /// Requests a slot.
    per_slot: f64,
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

    /// What `node` may have admitted of `user` in `slot` on its first
    /// share, if that slot is one of it: the share, and on its first slot
    /// the bucket it starts with (a second's worth, `per_second` slots)
    /// too.
    pub(crate) fn in_slot(
        &self,
        user: &str,
        node: NodeId,
        slot: i64,
        per_second: f64,
    ) -> Option<f64> {
        let share = self.users.get(user)?.iter().find(|s| s.node == node)?;
        if !share.slots.contains(&slot) {
            return None;
        }
        let start = if slot == *share.slots.start() {
            share.per_slot * per_second
        } else {
            0.0
        };
        Some(share.per_slot + start)
    }

    /// The proxies with a first share of `user`, and the first slot of each.
    pub(crate) fn nodes_of(&self, user: &str) -> impl Iterator<Item = (NodeId, i64)> + '_ {
        let shares = self.users.get(user).map(Vec::as_slice).unwrap_or_default();
        shares.iter().map(|s| (s.node, *s.slots.start()))
    }

    /// Whether no proxy has a first share now.
    pub(crate) fn is_empty(&self) -> bool {
        self.users.is_empty()
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
        assert_eq!(first.in_slot("alice", a, 9, 1.0), None);
        assert_eq!(first.in_slot("alice", a, 10, 1.0), Some(66.0));
        assert_eq!(first.in_slot("alice", a, 15, 1.0), Some(33.0));
        assert_eq!(first.in_slot("alice", a, 16, 1.0), None);
        assert_eq!(first.in_slot("alice", b, 12, 1.0), None);
        assert_eq!(first.in_slot("bob", a, 12, 1.0), None);
        // Slots of 100 ms: a bucket of a second holds ten slots' shares.
        first.tell(b, "alice", 10..=70, 3.3);
        assert!((first.in_slot("alice", b, 10, 10.0).unwrap_or(0.0) - 36.3).abs() < 1e-9);
        // Told again: replaced.
        first.tell(a, "alice", 12..=17, 20.0);
        assert_eq!(first.in_slot("alice", a, 11, 1.0), None);
        assert_eq!(first.in_slot("alice", a, 13, 1.0), Some(20.0));
        assert_eq!(first.nodes_of("alice").count(), 2);
        first.forget_before(18);
        assert_eq!(first.nodes_of("alice").collect::<Vec<_>>(), vec![(b, 10)]);
        first.forget_before(71);
        assert!(first.is_empty());
    }
}
