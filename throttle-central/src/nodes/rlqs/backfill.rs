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
//! The slot a report comes in is one of them: what of the report fell in
//! it waits for the next report, or it would be counted twice, charged
//! and granted (a second under the limit after each report).

use std::collections::{BTreeMap, BTreeSet};

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
    /// The part of the newest report that fell in the slot it came in,
    /// per user: that slot is not over, and the quota policy counts its
    /// whole grant as unreported, so it is filed with the next report (or
    /// as the stream ends), in that slot.
    ahead: BTreeMap<String, (u64, u64)>,
    /// The slot `ahead` fell in (the oldest, if several).
    ahead_slot: Option<i64>,
    /// The users whose last report held something: one that then reports
    /// nothing is filed once with nothing, in the newest slot its report
    /// covers, so the quota policy sees it stop (it reads each node's
    /// newest slot of a user) instead of the demand of its last report.
    active: BTreeSet<String>,
}

impl Backfill {
    /// Splits `usage`, reported in slot `current` a share `into` of the
    /// way through it, with anything carried, over the data slots it
    /// covers that are not filed yet: up to the one before `current` (or
    /// `current` itself when that one is filed), at least one; oldest
    /// first, users with nothing left out. What of a report covering whole
    /// slots fell in `current` (`into` of one of them) waits for the next
    /// report, and so does all of a report covering no whole slot (a
    /// bucket's first request): filed at once it would read as the proxy
    /// wanting one request a slot, and the quota policy would give the
    /// user's other nodes no more than an idle node's part. Nothing when
    /// even `current` is filed: it is carried to the next report.
    pub(super) fn split(&mut self, usage: Usage, current: i64, into: f64) -> Vec<SlotUsage> {
        let next = self.last.map_or(i64::MIN, |l| l + 1);
        let end = next.max(current - 1);
        // What waited is filed with a report of whole slots, as Envoy's
        // periodic ones are; another bucket's first request leaves it
        // waiting.
        let waited = match usage.values().any(|u| u.2 > 0) {
            true => (std::mem::take(&mut self.ahead), self.ahead_slot.take()),
            false => (BTreeMap::new(), None),
        };
        for (user, (a, d, covered)) in &usage {
            let (na, nd) = if *covered == 0 || end < current {
                let now = |x: u64| in_current(x, into, *covered);
                (now(*a), now(*d))
            } else {
                (0, 0)
            };
            if (na, nd) != (0, 0) {
                add(&mut self.ahead, user.clone(), na, nd);
                self.ahead_slot = Some(self.ahead_slot.map_or(current, |s| s.min(current)));
            }
            add(&mut self.carry, user.clone(), a - na, d - nd);
        }
        if end > current {
            for (user, (a, d)) in waited.0 {
                add(&mut self.carry, user, a, d);
            }
            return Vec::new();
        }
        let mut slots = self.spread(&usage, next, end);
        let at = waited.1.unwrap_or(next).clamp(next, end);
        for (user, (a, d)) in waited.0 {
            let rows = slots.entry(at).or_default();
            match rows.iter_mut().find(|r| r.0 == user) {
                Some(r) => (r.1, r.2) = (r.1.saturating_add(a), r.2.saturating_add(d)),
                None => rows.push((user, a, d)),
            }
        }
        self.note_stops(&usage, &mut slots, end);
        if !slots.is_empty() {
            self.last = Some(end);
        }
        slots.into_iter().collect()
    }

    /// What is carried, each user's spread evenly over the slots from
    /// `next` to `end` that its report in `usage` covers.
    fn spread(
        &mut self,
        usage: &Usage,
        next: i64,
        end: i64,
    ) -> BTreeMap<i64, Vec<(String, u64, u64)>> {
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
        slots
    }

    /// Files nothing in slot `end` for each user of `usage` that had
    /// something in its last report and nothing in this one, and notes
    /// who has something now.
    fn note_stops(
        &mut self,
        usage: &Usage,
        slots: &mut BTreeMap<i64, Vec<(String, u64, u64)>>,
        end: i64,
    ) {
        for (user, &(a, d, _)) in usage {
            if a > 0 || d > 0 {
                self.active.insert(user.clone());
            } else if self.active.remove(user) {
                let rows = slots.entry(end).or_default();
                if !rows.iter().any(|r| r.0 == *user) {
                    rows.push((user.clone(), 0, 0));
                }
            }
        }
    }

    /// Everything carried and held for the next report, to file in data
    /// slot `current` as the stream ends (see [`Backfill::rest`]).
    pub(super) fn last_rest(&mut self, current: i64) -> Option<SlotUsage> {
        self.ahead_slot = None;
        for (user, (a, d)) in std::mem::take(&mut self.ahead) {
            add(&mut self.carry, user, a, d);
        }
        self.rest(current)
    }

    /// Everything carried, to file in data slot `current` (`None` if
    /// nothing is carried, or `current` is filed): at each slot's end.
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

/// Adds (`a`, `d`) to `user`'s counts in `to`.
fn add(to: &mut BTreeMap<String, (u64, u64)>, user: String, a: u64, d: u64) {
    let c = to.entry(user).or_default();
    *c = (c.0.saturating_add(a), c.1.saturating_add(d));
}

/// What of `total`, counted over `covered` slots up to now, fell in the
/// current slot, `into` of the way through it: all of it when it covers
/// no whole slot (a bucket's first request tells no rate yet).
fn in_current(total: u64, into: f64, covered: usize) -> u64 {
    if covered == 0 {
        return total;
    }
    let share = into.clamp(0.0, 1.0) / covered as f64;
    ((total as f64 * share).round() as u64).min(total)
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
        // The first request of a bucket tells no rate: it waits, and so
        // does another bucket's.
        assert!(b.split(usage(&[("alice", 1, 0, 0)]), 100, 0.0).is_empty());
        assert!(b.split(usage(&[("bob", 1, 0, 0)]), 100, 0.0).is_empty());
        assert_eq!(b.rest(100), None, "not filed at the slot's end either");
        // Five seconds later: slots 100 to 104, 100 each (and the first).
        let next = b.split(usage(&[("alice", 499, 10, 5), ("bob", 2, 0, 5)]), 105, 0.0);
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
        let late = b.split(usage(&[("alice", 60, 0, 5)]), 106, 0.0);
        assert_eq!(late, [(105, vec![("alice".into(), 60, 0)])]);
        // Two more within the same slot: the current one, then carried.
        let now = b.split(usage(&[("alice", 7, 0, 1)]), 106, 0.0);
        assert_eq!(now, [(106, vec![("alice".into(), 7, 0)])]);
        assert!(b.split(usage(&[("alice", 8, 0, 1)]), 106, 0.0).is_empty());
        assert_eq!(b.carried(), 1);
        assert_eq!(b.rest(106), None, "slot 106 is filed");
        assert_eq!(b.rest(107), Some((107, vec![("alice".into(), 8, 0)])));
    }

    #[test]
    fn what_fell_in_the_slot_under_way_waits_for_the_next_report() {
        let mut b = Backfill::default();
        b.split(usage(&[("alice", 1, 0, 0)]), 100, 0.3);
        // 499 over the 5 s up to 0.3 s into slot 105: 30 of them in 105,
        // and the first request with the rest.
        let next = b.split(usage(&[("alice", 499, 0, 5)]), 105, 0.3);
        let filed: u64 = next.iter().flat_map(|(_, u)| u).map(|r| r.1).sum();
        assert_eq!(filed, 470);
        assert_eq!(next.last().map(|s| s.0), Some(104));
        // Not at the slot's end: slot 105 is filed with the next report.
        assert_eq!(b.rest(105), None);
        let after = b.split(usage(&[("alice", 500, 0, 5)]), 110, 0.3);
        let slots: Vec<i64> = after.iter().map(|s| s.0).collect();
        assert_eq!(slots, [105, 106, 107, 108, 109]);
        let filed: u64 = after.iter().flat_map(|(_, u)| u).map(|r| r.1).sum();
        assert_eq!(filed, 500);
        // As the stream ends, what waited is filed too.
        assert_eq!(b.last_rest(110), Some((110, vec![("alice".into(), 30, 0)])));
    }

    #[test]
    fn a_user_that_stops_is_filed_once_with_nothing() {
        let mut b = Backfill::default();
        b.split(usage(&[("alice", 500, 0, 5)]), 105, 0.0);
        // Nothing in 105..=109: filed in 109 alone, once.
        let stop = b.split(usage(&[("alice", 0, 0, 5)]), 110, 0.0);
        assert_eq!(stop, [(109, vec![("alice".into(), 0, 0)])]);
        assert!(b.split(usage(&[("alice", 0, 0, 5)]), 115, 0.0).is_empty());
        // What fell in the slot a report came in (20 of 100 in 120) goes
        // there when the next one shows the user stopped.
        b.split(usage(&[("alice", 500, 0, 5)]), 120, 0.2);
        let stop = b.split(usage(&[("alice", 0, 0, 5)]), 125, 0.2);
        let expected = [
            (120, vec![("alice".into(), 20, 0)]),
            (124, vec![("alice".into(), 0, 0)]),
        ];
        assert_eq!(stop, expected);
        // Never active: nothing.
        assert!(b.split(usage(&[("bob", 0, 0, 5)]), 120, 0.0).is_empty());
    }

    proptest! {
        #[test]
        fn every_unit_is_filed_exactly_once_in_slots_that_never_repeat(
            reports in prop::collection::vec(
                (0u64..1_000_000, 0u64..1_000, 0usize..100, 0usize..3, 0i64..8, 0.0f64..1.0),
                0..30,
            ),
        ) {
            let mut b = Backfill::default();
            let (mut filed, mut reported) = ((0u64, 0u64), (0u64, 0u64));
            let users = ["a", "b", "c"];
            let mut current = 1_000;
            let mut newest = i64::MIN;
            for (allowed, denied, slots, user, wait, into) in reports {
                current += wait;
                reported = (reported.0 + allowed, reported.1 + denied);
                let u = usage(&[(users[user], allowed, denied, slots)]);
                for (slot, rows) in b.split(u, current, into) {
                    prop_assert!(slot > newest && slot <= current, "{slot} after {newest}, now {current}");
                    newest = slot;
                    for (_, a, d) in rows {
                        filed = (filed.0 + a, filed.1 + d);
                    }
                }
            }
            if let Some((slot, rows)) = b.last_rest(current + 1) {
                prop_assert!(slot > newest);
                for (_, a, d) in rows {
                    filed = (filed.0 + a, filed.1 + d);
                }
            }
            prop_assert_eq!(filed, reported);
        }
    }
}
