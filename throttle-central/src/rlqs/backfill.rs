//! A proxy's usage, reported every few seconds, filed at once over the
//! slots it covers.
//!
//! Envoy reports what each bucket admitted and denied over the seconds
//! since its last report (5 s, whatever its configuration says).
//! [`Backfill`] files a report as soon as it comes, split evenly, in whole
//! amounts that add up to exactly what was reported, over the data slots
//! it covers that this proxy has not filed yet: its usage is charged in the
//! slots it happened in. Between two reports the proxy's newest slots are
//! unreported, and the quota policy counts what it granted the proxy for
//! them as spent ([`ServiceState::lag`](crate::ledger::ServiceState::lag)).

use std::collections::BTreeMap;

/// Per user: (admitted, denied, data slots covered).
pub(super) type Usage = BTreeMap<String, (u64, u64, usize)>;

/// One data slot's share of a report: per user, (admitted, denied).
pub(super) type SlotUsage = (i64, Vec<(String, u64, u64)>);

/// Most slots one report is filed over.
pub(super) const MAX_SLOTS: usize = 60;

/// Where a proxy's filing stands.
#[derive(Debug, Default)]
pub(super) struct Backfill {
    /// The newest data slot filed.
    last: Option<i64>,
    /// What came while no slot was left to file it in (a second report
    /// within a slot already filed), per user: (admitted, denied).
    carry: BTreeMap<String, (u64, u64)>,
}

impl Backfill {
    /// Splits `usage`, reported in slot `current`, with anything carried,
    /// over the data slots it covers that are not filed yet: up to the one
    /// before `current` (or `current` itself when that one is filed), at
    /// least one; oldest first, users with nothing left out. Nothing when
    /// even `current` is filed: it is carried to the next report.
    pub(super) fn split(&mut self, usage: Usage, current: i64) -> Vec<SlotUsage> {
        for (user, (a, d, _)) in &usage {
            let c = self.carry.entry(user.clone()).or_default();
            *c = (c.0.saturating_add(*a), c.1.saturating_add(*d));
        }
        let next = self.last.map_or(i64::MIN, |l| l + 1);
        let end = next.max(current - 1);
        if end > current {
            return Vec::new();
        }
        let mut slots: BTreeMap<i64, Vec<(String, u64, u64)>> = BTreeMap::new();
        for (user, (a, d)) in std::mem::take(&mut self.carry) {
            let covered = usage.get(&user).map_or(1, |u| u.2).clamp(1, MAX_SLOTS);
            let start = next.max(end + 1 - covered as i64);
            let n = usize::try_from(end - start + 1).unwrap_or(1);
            for (k, slot) in (start..=end).enumerate() {
                let (pa, pd) = (part(a, k, n), part(d, k, n));
                if (pa, pd) != (0, 0) {
                    slots.entry(slot).or_default().push((user.clone(), pa, pd));
                }
            }
        }
        self.last = Some(end);
        slots.into_iter().collect()
    }

    /// Everything carried, to file in data slot `current` (`None` if
    /// nothing is carried, or `current` is filed): at each slot's end, and
    /// as the stream ends.
    pub(super) fn rest(&mut self, current: i64) -> Option<SlotUsage> {
        let filed = self.last.is_some_and(|l| l >= current);
        if self.carry.is_empty() || filed {
            return None;
        }
        let users = std::mem::take(&mut self.carry).into_iter();
        let users = users.map(|(u, (a, d))| (u, a, d)).collect();
        self.last = Some(current);
        Some((current, users))
    }

    /// Users with something carried.
    #[cfg(test)]
    pub(super) fn carried(&self) -> usize {
        self.carry.len()
    }
}

/// The `k`th of `slots` whole parts of `total`, which add up to it.
fn part(total: u64, k: usize, slots: usize) -> u64 {
    let at = |i: usize| (u128::from(total) * i as u128 / slots as u128) as u64;
    at(k + 1) - at(k)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn usage(rows: &[(&str, u64, u64, usize)]) -> Usage {
        rows.iter()
            .map(|(u, a, d, c)| ((*u).to_owned(), (*a, *d, *c)))
            .collect()
    }

    #[test]
    fn a_report_is_filed_over_the_slots_it_covers() {
        let mut b = Backfill::default();
        // The first request of a bucket: one unit, in the slot before.
        let first = b.split(usage(&[("alice", 1, 0, 0)]), 100);
        assert_eq!(first, [(99, vec![("alice".into(), 1, 0)])]);
        // Five seconds later: slots 100 to 104, 100 each.
        let next = b.split(usage(&[("alice", 500, 10, 5), ("bob", 3, 0, 5)]), 105);
        let slots: Vec<i64> = next.iter().map(|s| s.0).collect();
        assert_eq!(slots, [100, 101, 102, 103, 104]);
        assert!(next.iter().all(|(_, u)| u[0] == ("alice".into(), 100, 2)));
        let bob: u64 = next
            .iter()
            .flat_map(|(_, u)| u)
            .filter(|r| r.0 == "bob")
            .map(|r| r.1)
            .sum();
        assert_eq!(bob, 3);
        // A report that covers slots already filed goes to the new ones.
        let late = b.split(usage(&[("alice", 60, 0, 5)]), 106);
        assert_eq!(late, [(105, vec![("alice".into(), 60, 0)])]);
        // Two more within the same slot: the current one, then carried.
        let now = b.split(usage(&[("alice", 7, 0, 0)]), 106);
        assert_eq!(now, [(106, vec![("alice".into(), 7, 0)])]);
        assert!(b.split(usage(&[("alice", 8, 0, 0)]), 106).is_empty());
        assert_eq!(b.carried(), 1);
        assert_eq!(b.rest(106), None, "slot 106 is filed");
        assert_eq!(b.rest(107), Some((107, vec![("alice".into(), 8, 0)])));
    }

    proptest! {
        #[test]
        fn every_unit_is_filed_exactly_once_in_slots_that_never_repeat(
            reports in prop::collection::vec(
                (0u64..1_000_000, 0u64..1_000, 0usize..100, 0usize..3, 0i64..8),
                0..30,
            ),
        ) {
            let mut b = Backfill::default();
            let (mut filed, mut reported) = ((0u64, 0u64), (0u64, 0u64));
            let users = ["a", "b", "c"];
            let mut current = 1_000;
            let mut newest = i64::MIN;
            for (allowed, denied, slots, user, wait) in reports {
                current += wait;
                reported = (reported.0 + allowed, reported.1 + denied);
                let u = usage(&[(users[user], allowed, denied, slots)]);
                for (slot, rows) in b.split(u, current) {
                    prop_assert!(slot > newest && slot <= current, "{slot} after {newest}, now {current}");
                    newest = slot;
                    for (_, a, d) in rows {
                        filed = (filed.0 + a, filed.1 + d);
                    }
                }
            }
            if let Some((slot, rows)) = b.rest(current + 1) {
                prop_assert!(slot > newest);
                for (_, a, d) in rows {
                    filed = (filed.0 + a, filed.1 + d);
                }
            }
            prop_assert_eq!(filed, reported);
        }
    }
}
