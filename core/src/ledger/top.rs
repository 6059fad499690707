//! The heaviest users of each resource over the last slots, with what
//! they were admitted and refused slot by slot: what the dashboard draws.
//!
//! Read from the per-slot sums a column at a time (only the keys each
//! slot holds a sum for), once per slot while anyone asks, rather than for
//! every question: `GET /v1/monitor/top` answers from the last reading.

use std::collections::BTreeMap;

use super::ledger::Ledger;
use super::views::{BucketView, bucket_view};
use crate::arena::ids::KeyId;
use crate::arena::state::ServiceState;

/// Admitted (`0`) or refused (`1`): which sums rank the users.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RankBy {
    /// By what they were admitted.
    #[default]
    Admitted,
    /// By what they were refused.
    Refused,
}

impl RankBy {
    /// The column of the sums it reads.
    fn which(self) -> usize {
        match self {
            Self::Admitted => 0,
            Self::Refused => 1,
        }
    }
}

/// One user's sums of one resource over the slots read.
#[derive(Debug, Clone, PartialEq)]
pub struct UserSeries {
    /// The user.
    pub user: String,
    /// Admitted per slot, the oldest first.
    pub admitted: Vec<i64>,
    /// Refused per slot, the oldest first.
    pub refused: Vec<i64>,
    /// The key's bucket (the shortest period's) when it is read.
    pub bucket: Option<BucketView>,
}

impl UserSeries {
    /// What the last `slots` slots add up to, admitted or refused.
    pub fn total(&self, by: RankBy, slots: usize) -> i64 {
        let series = match by {
            RankBy::Admitted => &self.admitted,
            RankBy::Refused => &self.refused,
        };
        series.iter().rev().take(slots).sum()
    }
}

/// Per service and resource, the users that were admitted or refused the
/// most over the `slots` data slots up to `to_slot`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TopUsers {
    /// The newest data slot read.
    pub to_slot: i64,
    /// How many slots were read, up to `to_slot`.
    pub slots: usize,
    /// Service -> resource -> the heaviest users by admitted amount, then
    /// the heaviest by refusals not among them (at most `keep` each).
    pub services: BTreeMap<String, BTreeMap<String, Vec<UserSeries>>>,
}

impl TopUsers {
    /// Reads `ledger`'s `slots` data slots up to `to_slot` at `now_ms`,
    /// keeping per service and resource the `keep` users admitted most and
    /// the `keep` refused most.
    pub fn read(ledger: &Ledger, to_slot: i64, slots: usize, keep: usize, now_ms: i64) -> Self {
        let mut services = BTreeMap::new();
        for name in ledger.services() {
            if let Some(state) = ledger.service_state(name) {
                let read = Self::of_service(state, to_slot, slots, keep, now_ms);
                if !read.is_empty() {
                    services.insert(name.to_owned(), read);
                }
            }
        }
        Self {
            to_slot,
            slots,
            services,
        }
    }

    /// One service's heaviest users per resource.
    fn of_service(
        state: &ServiceState,
        to_slot: i64,
        slots: usize,
        keep: usize,
        now_ms: i64,
    ) -> BTreeMap<String, Vec<UserSeries>> {
        let from = to_slot - slots as i64 + 1;
        let columns: Vec<_> = (state.sums.iter())
            .filter(|c| (from..=to_slot).contains(&c.slot))
            .collect();
        // Totals by key id, each column read once.
        let mut totals = [vec![0i64; state.id_bound()], vec![0i64; state.id_bound()]];
        for c in &columns {
            for (which, total) in totals.iter_mut().enumerate() {
                for (id, amount) in c.entries(which) {
                    if let Some(t) = total.get_mut(id.index()) {
                        *t = t.saturating_add(amount);
                    }
                }
            }
        }
        let mut by_resource: BTreeMap<&str, Vec<KeyId>> = BTreeMap::new();
        for by in [RankBy::Admitted, RankBy::Refused] {
            let total = &totals[by.which()];
            for (resource, ids) in heaviest(state, total, keep) {
                let kept = by_resource.entry(resource).or_default();
                for id in ids {
                    if !kept.contains(&id) {
                        kept.push(id);
                    }
                }
            }
        }
        let series = |id: KeyId| {
            let key = state.key(id);
            let per_slot = |which: usize| {
                (from..=to_slot)
                    .map(|slot| {
                        let column = columns.iter().find(|c| c.slot == slot);
                        column.map_or(0, |c| c.get(id, which))
                    })
                    .collect()
            };
            UserSeries {
                user: key.user().to_owned(),
                admitted: per_slot(0),
                refused: per_slot(1),
                bucket: key.buckets().next().map(|(p, b)| bucket_view(p, b, now_ms)),
            }
        };
        by_resource
            .into_iter()
            .map(|(resource, ids)| (resource.to_owned(), ids.into_iter().map(series).collect()))
            .collect()
    }
}

/// Per resource, the ids of the `keep` live keys with the largest
/// `total` above zero, the largest first.
fn heaviest<'s>(
    state: &'s ServiceState,
    total: &[i64],
    keep: usize,
) -> BTreeMap<&'s str, Vec<KeyId>> {
    let mut ranked: BTreeMap<&str, Vec<(i64, KeyId)>> = BTreeMap::new();
    for (id, key) in state.keys() {
        let t = total.get(id.index()).copied().unwrap_or(0);
        if t > 0 {
            ranked.entry(key.resource()).or_default().push((t, id));
        }
    }
    ranked
        .into_iter()
        .map(|(resource, mut ids)| {
            if ids.len() > keep {
                ids.select_nth_unstable_by(keep, |a, b| b.0.cmp(&a.0));
                ids.truncate(keep);
            }
            ids.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.index().cmp(&b.1.index())));
            (resource, ids.into_iter().map(|(_, id)| id).collect())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::LedgerConfig;
    use crate::ledger::tests::report;

    /// u1..=u5 each admitted their number in slots 99 and 100 (u5 also in
    /// slot 98, outside the reading), and u1 refused 50 in slot 100.
    fn ledger() -> Ledger {
        let mut l = Ledger::new(LedgerConfig::default());
        let users = |n: i64| {
            let entries: Vec<String> = (1..=n)
                .map(|i| format!(r#""u{i}": {{"requests": {i}}}"#))
                .collect();
            format!("{{{}}}", entries.join(", "))
        };
        l.ingest(
            &report("n1", 99, r#"{"u5": {"requests": 1000}}"#, "{}"),
            99_050,
        )
        .unwrap();
        l.ingest(&report("n1", 100, &users(5), "{}"), 100_050)
            .unwrap();
        let refused = r#"{"u1": {"requests": 50}}"#;
        l.ingest(&report("n1", 101, &users(5), refused), 101_050)
            .unwrap();
        l
    }

    #[test]
    fn the_heaviest_by_admitted_and_by_refused_are_kept_with_their_slots() {
        let l = ledger();
        let top = TopUsers::read(&l, 100, 2, 2, 101_100);
        let users = &top.services["front"]["requests"];
        let names: Vec<&str> = users.iter().map(|u| u.user.as_str()).collect();
        assert_eq!(names, ["u5", "u4", "u1"], "two by admitted, one by refused");
        assert_eq!(users[0].admitted, [5, 5], "slot 98's 1,000 is not read");
        assert_eq!(users[2].refused, [0, 50]);
        assert_eq!(users[2].total(RankBy::Refused, 1), 50);
        assert_eq!(users[0].total(RankBy::Admitted, 1), 5);
    }

    #[test]
    fn nothing_admitted_or_refused_is_not_listed() {
        let l = ledger();
        let top = TopUsers::read(&l, 90, 5, 10, 101_100);
        assert!(top.services.is_empty(), "{top:?}");
    }
}
