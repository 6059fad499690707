//! A proxy's usage, reported every few seconds, filed one slot at a time.
//!
//! Envoy reports what each bucket admitted and denied over the seconds
//! since its last report (5 s, whatever its configuration says). Filed at
//! once, that would look to the quota policies like a node busy one slot in
//! five; [`Spread`] files it over as many slots as it covers, starting with
//! the next, in whole amounts that add up to exactly what was reported.

use std::collections::{BTreeMap, VecDeque};

/// Most slots one report is spread over.
pub(super) const MAX_SLOTS: usize = 60;

/// What is still to be filed, per user: (admitted, denied) for each
/// coming slot.
#[derive(Debug, Default)]
pub(super) struct Spread {
    users: BTreeMap<String, VecDeque<(u64, u64)>>,
}

impl Spread {
    /// Adds `allowed` and `denied` of `user`, reported over `covered`
    /// slots: what is still due of the user and this report, evenly over
    /// `covered + 1` slots (at most [`MAX_SLOTS`]). The slot more than the
    /// report covers keeps the flow going when the next report comes a
    /// little late; with reports on time, each slot carries the reported
    /// rate.
    pub(super) fn add(&mut self, user: &str, allowed: u64, denied: u64, covered: usize) {
        if allowed == 0 && denied == 0 {
            return;
        }
        let slots = (covered + 1).clamp(1, MAX_SLOTS);
        let queue = self.users.entry(user.to_owned()).or_default();
        let (a, d) = queue
            .iter()
            .fold((allowed, denied), |t, q| (t.0 + q.0, t.1 + q.1));
        queue.clear();
        queue.extend((0..slots).map(|k| (part(a, k, slots), part(d, k, slots))));
    }

    /// What to file for the slot that just ended: per user, (admitted,
    /// denied), users with neither left out.
    pub(super) fn next_slot(&mut self) -> Vec<(String, u64, u64)> {
        let mut due = Vec::new();
        self.users.retain(|user, queue| {
            if let Some((a, d)) = queue.pop_front()
                && (a, d) != (0, 0)
            {
                due.push((user.clone(), a, d));
            }
            !queue.is_empty()
        });
        due
    }

    /// Everything still to be filed, at once (the stream ends).
    pub(super) fn all(&mut self) -> Vec<(String, u64, u64)> {
        let users = std::mem::take(&mut self.users);
        users
            .into_iter()
            .map(|(user, queue)| {
                let (a, d) = queue.iter().fold((0, 0), |t, q| (t.0 + q.0, t.1 + q.1));
                (user, a, d)
            })
            .filter(|(_, a, d)| (*a, *d) != (0, 0))
            .collect()
    }

    /// Users with something still to file.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.users.len()
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

    #[test]
    fn a_report_is_filed_over_the_slots_it_covers() {
        let mut spread = Spread::default();
        spread.add("alice", 600, 12, 5);
        spread.add("bob", 1, 0, 0);
        let first = spread.next_slot();
        assert_eq!(first, [("alice".into(), 100, 2), ("bob".into(), 1, 0)]);
        let rest: Vec<_> = (0..4).map(|_| spread.next_slot()).collect();
        let alice: u64 = rest.iter().flatten().map(|(_, a, _)| a).sum();
        assert_eq!(alice, 400);
        // Reports on time: every slot carries some, near the rate.
        let mut filed = 500;
        for _ in 0..10 {
            spread.add("alice", 500, 10, 5);
            for _ in 0..5 {
                let slot = spread.next_slot();
                let [(_, a, _)] = slot[..] else {
                    panic!("{slot:?}")
                };
                assert!((100..=117).contains(&a), "{a}");
                filed += a;
            }
        }
        let rest: u64 = spread.all().iter().map(|(_, a, _)| a).sum();
        assert_eq!(filed + rest, 600 + 10 * 500);
        assert_eq!(spread.len(), 0);
    }

    proptest! {
        #[test]
        fn every_unit_is_filed_exactly_once(
            reports in prop::collection::vec((0u64..1_000_000, 0u64..1_000, 0usize..100, 0usize..3), 0..30),
            cut in 0usize..40,
        ) {
            let mut spread = Spread::default();
            let mut filed = (0u64, 0u64);
            let users = ["a", "b", "c"];
            for (i, (allowed, denied, slots, user)) in reports.iter().enumerate() {
                spread.add(users[*user], *allowed, *denied, *slots);
                if i % 2 == 0 {
                    for (_, a, d) in spread.next_slot() {
                        filed = (filed.0 + a, filed.1 + d);
                    }
                }
                if i == cut {
                    break;
                }
            }
            for (_, a, d) in spread.all() {
                filed = (filed.0 + a, filed.1 + d);
            }
            let taken = reports.iter().take(cut + 1);
            let reported = taken.fold((0, 0), |t, r| (t.0 + r.0, t.1 + r.1));
            prop_assert_eq!(filed, reported);
        }
    }
}
