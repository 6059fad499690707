//! A proxy's usage, reported every few seconds, filed one slot at a time.
//!
//! Envoy reports what each bucket admitted and denied over the seconds
//! since its last report (5 s, whatever its configuration says). Filed
//! when it comes, that would look to the quota policies like a node busy
//! one slot in five, and reach the buckets seconds late, so that the
//! grants of the slots between run on a level that does not know it.
//! [`Spread`] instead files, each slot, what the last report says the
//! proxy admits and denies a slot, and settles at each report: what the
//! report holds beyond what was filed since the last one is filed with
//! the next slot; what was filed beyond it is taken off the slots after.
//! What was filed beyond what the proxy admitted and is not taken off by
//! the time its user goes idle (at most a report's worth) stays charged.

use std::collections::BTreeMap;

/// Most slots one report is taken to cover.
pub(super) const MAX_SLOTS: usize = 60;

/// (admitted, denied).
type Pair = (u64, u64);

/// One user's pace and balance.
#[derive(Debug, Default)]
struct Paced {
    /// A slot's worth, from the last report.
    rate: (f64, f64),
    /// The fractions of a unit not filed yet.
    carry: (f64, f64),
    /// Paced since the last report.
    paced: Pair,
    /// Reported beyond what was paced: filed with the next slot.
    owed: Pair,
    /// Paced beyond what was reported: taken off the next filings.
    credit: Pair,
}

/// What is to be filed, per user.
#[derive(Debug, Default)]
pub(super) struct Spread {
    users: BTreeMap<String, Paced>,
}

impl Spread {
    /// A report of `user`: `allowed` and `denied` over `covered` slots.
    /// Settles what was paced since the last report, and paces the slots
    /// to come at the report's rate. A report that covers no time (a
    /// bucket's first) is filed with the next slot, and changes no pace.
    pub(super) fn add(&mut self, user: &str, allowed: u64, denied: u64, covered: usize) {
        if allowed == 0 && denied == 0 && !self.users.contains_key(user) {
            return;
        }
        let p = self.users.entry(user.to_owned()).or_default();
        if covered == 0 {
            p.owed = (p.owed.0 + allowed, p.owed.1 + denied);
            return;
        }
        let slots = covered.min(MAX_SLOTS) as f64;
        settle(&mut p.owed.0, &mut p.credit.0, allowed, p.paced.0);
        settle(&mut p.owed.1, &mut p.credit.1, denied, p.paced.1);
        p.paced = (0, 0);
        p.rate = (allowed as f64 / slots, denied as f64 / slots);
        if allowed == 0 && denied == 0 && p.owed == (0, 0) {
            // Idle: what was paced beyond its use stays charged.
            self.users.remove(user);
        }
    }

    /// What to file for the slot that just ended: per user, (admitted,
    /// denied), users with neither left out.
    pub(super) fn next_slot(&mut self) -> Vec<(String, u64, u64)> {
        let mut due = Vec::new();
        for (user, p) in &mut self.users {
            let a = pace(
                &mut p.carry.0,
                p.rate.0,
                &mut p.paced.0,
                &mut p.owed.0,
                &mut p.credit.0,
            );
            let d = pace(
                &mut p.carry.1,
                p.rate.1,
                &mut p.paced.1,
                &mut p.owed.1,
                &mut p.credit.1,
            );
            if (a, d) != (0, 0) {
                due.push((user.clone(), a, d));
            }
        }
        due
    }

    /// What is owed, at once (the stream ends); the slots no report
    /// covers are not filed.
    pub(super) fn all(&mut self) -> Vec<(String, u64, u64)> {
        let users = std::mem::take(&mut self.users);
        users
            .into_iter()
            .map(|(user, p)| (user, p.owed.0, p.owed.1))
            .filter(|(_, a, d)| (*a, *d) != (0, 0))
            .collect()
    }

    /// Users paced.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.users.len()
    }

    /// Of `user`: (paced since the last report, owed, credit) admitted.
    #[cfg(test)]
    fn balance(&self, user: &str) -> (u64, u64, u64) {
        self.users
            .get(user)
            .map_or((0, 0, 0), |p| (p.paced.0, p.owed.0, p.credit.0))
    }
}

/// Settles a report of `reported` against `paced`: the difference goes to
/// what is owed, or to the credit, each first paying off the other.
fn settle(owed: &mut u64, credit: &mut u64, reported: u64, paced: u64) {
    if reported >= paced {
        let more = reported - paced;
        let paid = more.min(*credit);
        *credit -= paid;
        *owed += more - paid;
    } else {
        let less = paced - reported;
        let paid = less.min(*owed);
        *owed -= paid;
        *credit += less - paid;
    }
}

/// One slot of one count: the rate's whole part (fractions carried), what
/// is owed, less the credit.
fn pace(carry: &mut f64, rate: f64, paced: &mut u64, owed: &mut u64, credit: &mut u64) -> u64 {
    let x = *carry + rate;
    let whole = x.floor();
    *carry = x - whole;
    let estimate = whole as u64;
    *paced += estimate;
    let amount = estimate + std::mem::take(owed);
    let paid = amount.min(*credit);
    *credit -= paid;
    amount - paid
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn slots(spread: &mut Spread, n: usize) -> u64 {
        (0..n)
            .flat_map(|_| spread.next_slot())
            .map(|(_, a, _)| a)
            .sum()
    }

    #[test]
    fn each_slot_carries_the_reported_rate_and_reports_settle() {
        let mut spread = Spread::default();
        // The first report: filed at once, then paced.
        spread.add("alice", 500, 10, 5);
        assert_eq!(spread.next_slot(), [("alice".into(), 600, 12)]);
        assert_eq!(slots(&mut spread, 4), 400);
        // She admitted 600 meanwhile: 100 more with the next slot.
        spread.add("alice", 600, 0, 5);
        assert_eq!(spread.next_slot(), [("alice".into(), 220, 0)]);
        assert_eq!(slots(&mut spread, 4), 480);
        // Then 300: the 300 filed beyond it come off the slots after.
        spread.add("alice", 300, 0, 5);
        assert_eq!(slots(&mut spread, 5), 0);
        assert_eq!(slots(&mut spread, 5), 300);
        // Idle: nothing more is filed, and she is forgotten.
        spread.add("alice", 0, 0, 5);
        assert!(spread.next_slot().is_empty());
        assert_eq!(spread.len(), 0);
        // Unknown and idle: nothing to hold.
        spread.add("bob", 0, 0, 5);
        assert_eq!(spread.len(), 0);
        // A first report covers no time: filed, no pace.
        spread.add("carol", 1, 0, 0);
        assert_eq!(spread.next_slot(), [("carol".into(), 1, 0)]);
        assert!(spread.next_slot().is_empty());
    }

    proptest! {
        /// Whatever the reports and the slots between them, what was
        /// filed and is owed, less the credit, is what was reported and
        /// paced since the last report.
        #[test]
        fn what_is_filed_is_what_was_reported(
            steps in prop::collection::vec((1u64..10_000, 0usize..10, 0usize..8), 1..40),
        ) {
            let mut spread = Spread::default();
            let (mut reported, mut filed) = (0u64, 0u64);
            for (allowed, covered, slots_after) in steps {
                spread.add("alice", allowed, 0, covered);
                reported += allowed;
                filed += slots(&mut spread, slots_after);
                let (paced, owed, credit) = spread.balance("alice");
                prop_assert_eq!(
                    i128::from(filed) + i128::from(owed) - i128::from(credit),
                    i128::from(reported) + i128::from(paced),
                );
            }
        }
    }
}
