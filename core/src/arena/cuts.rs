//! [`Cuts`]: where a service's key arena was cut, for readers of older
//! slots' grants.

use std::collections::VecDeque;

use super::ids::KeyId;

/// The cuts of a service's key arena within the retention: after each,
/// the grants kept of the slots before it may name ids past the arena's
/// end then, ids that a key pushed since may hold again.
///
/// The arena is cut as soon as no assignment still to be sent names the
/// keys cut (a few slots after they were freed), rather than once the
/// quota history of the whole retention no longer names them, so that a
/// churn of users gives its memory back when the users are forgotten.
/// The readers of that history ask [`Cuts::stale`] and skip such ids:
/// their keys are forgotten, and with them their quotas.
#[derive(Debug, Default, Clone)]
pub struct Cuts {
    /// (the newest slot whose grants were made before the cut, the
    /// arena's length after it), oldest first.
    cuts: VecDeque<(i64, usize)>,
}

impl Cuts {
    /// Notes a cut to `len` keys, made before any grant of slot
    /// `before` + 1 and later.
    pub(crate) fn record(&mut self, before: i64, len: usize) {
        while self.cuts.back().is_some_and(|&(_, l)| l >= len) {
            self.cuts.pop_back();
        }
        self.cuts.push_back((before, len));
    }

    /// Forgets the cuts no slot kept is before.
    pub(crate) fn forget_before(&mut self, cutoff: i64) {
        while self.cuts.front().is_some_and(|&(s, _)| s < cutoff) {
            self.cuts.pop_front();
        }
    }

    /// The first id that a grant of `slot` cannot name any more: ids from
    /// it on were cut after that slot was assigned.
    pub fn bound(&self, slot: i64) -> usize {
        let after = self.cuts.iter().filter(|&&(s, _)| s >= slot);
        after.map(|&(_, len)| len).min().unwrap_or(usize::MAX)
    }

    /// Whether a grant of `slot` naming `id` names a key cut since.
    pub fn stale(&self, slot: i64, id: KeyId) -> bool {
        id.index() >= self.bound(slot)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_grant_before_a_cut_past_its_end_is_stale_and_after_it_is_not() {
        let mut cuts = Cuts::default();
        cuts.record(10, 5);
        assert!(cuts.stale(10, KeyId(5)));
        assert!(cuts.stale(3, KeyId(7)));
        assert!(!cuts.stale(10, KeyId(4)), "below the cut");
        assert!(!cuts.stale(11, KeyId(5)), "granted after the cut");
        cuts.record(20, 2);
        assert!(cuts.stale(10, KeyId(2)), "the later, shorter cut binds");
        assert!(!cuts.stale(21, KeyId(9)));
        assert_eq!(cuts.bound(15), 2);
        cuts.forget_before(21);
        assert_eq!(cuts.bound(15), usize::MAX, "no slot kept is before it");
    }

    #[test]
    fn a_longer_cut_after_a_shorter_one_keeps_both() {
        let mut cuts = Cuts::default();
        cuts.record(10, 2);
        cuts.record(20, 8);
        assert_eq!(cuts.bound(10), 2);
        assert_eq!(cuts.bound(15), 8);
        cuts.record(30, 4);
        assert_eq!(cuts.bound(15), 4, "8 gave way to the shorter cut");
        assert_eq!(cuts.bound(5), 2);
    }
}
