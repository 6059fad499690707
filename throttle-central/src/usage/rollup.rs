//! What a batch of filed reports adds to each table ([`Rollup`]).

use std::collections::{BTreeMap, HashMap};

use foldhash::fast::RandomState;

use super::filed::FiledUsage;
use super::step::Step;

/// A row of one table: (step, start, service, user, resource).
type RowKey<'a> = (Step, i64, &'a str, &'a str, &'a str);

/// A row of the minutes' table: (start, service, user, resource).
type MinuteKey<'a> = (i64, &'a str, &'a str, &'a str);

/// Adds `more` (admitted, refused) to `sum`, held at `i64::MAX`.
fn add(sum: &mut (i64, i64), more: (i64, i64)) {
    sum.0 = sum.0.saturating_add(more.0);
    sum.1 = sum.1.saturating_add(more.1);
}

/// The amounts a batch adds, per step and row, each row once: one upsert
/// per row and step, whatever the number of reports in the batch.
#[derive(Debug, Default)]
pub(super) struct Rollup<'a> {
    /// (step, start, service, user, resource) -> (admitted, refused).
    rows: BTreeMap<RowKey<'a>, (i64, i64)>,
}

/// One row of a [`Rollup`]: what it adds to the row of `start` in `step`'s
/// table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct RowDelta<'a> {
    /// The start of the row's minute, hour or day.
    pub(super) start: i64,
    /// The service.
    pub(super) service: &'a str,
    /// The user.
    pub(super) user: &'a str,
    /// The resource.
    pub(super) resource: &'a str,
    /// Amount admitted to add.
    pub(super) admitted: i64,
    /// Amount refused to add.
    pub(super) refused: i64,
}

impl<'a> Rollup<'a> {
    /// The rows `reports` add to, every step: summed by minute first (one
    /// map operation per entry, in a hash map), then the minutes' sums
    /// into the hours and days, so the work per entry does not grow with
    /// the number of tables.
    pub(super) fn of(reports: impl IntoIterator<Item = &'a FiledUsage>) -> Self {
        let mut minutes: HashMap<MinuteKey<'a>, (i64, i64), RandomState> = HashMap::default();
        for report in reports {
            let start = Step::Minute.start_of(report.start_s);
            for e in &report.entries {
                let key = (start, &*e.service, &*e.user, &*e.resource);
                add(minutes.entry(key).or_default(), (e.admitted, e.refused));
            }
        }
        let mut rows = BTreeMap::new();
        for ((start, service, user, resource), sum) in minutes {
            for step in Step::ALL {
                let key = (step, step.start_of(start), service, user, resource);
                add(rows.entry(key).or_default(), sum);
            }
        }
        Self { rows }
    }

    /// The rows of `step`'s table.
    pub(super) fn rows(&self, step: Step) -> impl Iterator<Item = RowDelta<'a>> + '_ {
        self.rows
            .range((step, i64::MIN, "", "", "")..)
            .take_while(move |((s, ..), _)| *s == step)
            .map(
                |(&(_, start, service, user, resource), &(admitted, refused))| RowDelta {
                    start,
                    service,
                    user,
                    resource,
                    admitted,
                    refused,
                },
            )
    }

    /// Rows over every step.
    pub(super) fn len(&self) -> usize {
        self.rows.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::usage::filed::UsageEntry;

    fn filed(node: &str, start_s: i64, user: &str, admitted: i64) -> FiledUsage {
        FiledUsage {
            node: node.into(),
            slot: start_s,
            start_s,
            entries: vec![UsageEntry {
                service: "front".into(),
                user: user.into(),
                resource: "requests".into(),
                admitted,
                refused: 1,
            }],
        }
    }

    #[test]
    fn reports_of_one_minute_add_to_one_row_per_step() {
        let batch = [
            filed("n1", 120, "alice", 3),
            filed("n2", 179, "alice", 4),
            filed("n1", 180, "alice", 5),
            filed("n1", 120, "bob", 7),
        ];
        let rollup = Rollup::of(&batch);
        let minutes: Vec<_> = rollup
            .rows(Step::Minute)
            .map(|r| (r.start, r.user, r.admitted, r.refused))
            .collect();
        assert_eq!(
            minutes,
            [
                (120, "alice", 7, 2),
                (120, "bob", 7, 1),
                (180, "alice", 5, 1)
            ]
        );
        let hours: Vec<_> = rollup
            .rows(Step::Hour)
            .map(|r| (r.user, r.admitted))
            .collect();
        assert_eq!(hours, [("alice", 12), ("bob", 7)]);
        assert_eq!(rollup.rows(Step::Day).count(), 2);
        assert_eq!(rollup.len(), 7);
    }

    proptest::proptest! {
        /// Summing by minute first gives every table what summing each
        /// entry into each table gives, across minute, hour and day ends.
        #[test]
        fn every_table_gets_the_sum_of_its_entries(
            reports in proptest::collection::vec(
                (0..3u8, 0..200_000i64, proptest::collection::vec((0..3u8, 0..2u8, 0..1_000i64), 0..6)),
                0..20,
            )
        ) {
            let batch: Vec<FiledUsage> = reports
                .iter()
                .map(|(node, start_s, entries)| FiledUsage {
                    node: format!("n{node}"),
                    slot: *start_s,
                    start_s: *start_s,
                    entries: entries
                        .iter()
                        .map(|(user, resource, amount)| UsageEntry {
                            service: "front".into(),
                            user: format!("u{user}"),
                            resource: format!("r{resource}"),
                            admitted: *amount,
                            refused: amount / 3,
                        })
                        .collect(),
                })
                .collect();
            let mut want: BTreeMap<(Step, i64, String, String), (i64, i64)> = BTreeMap::new();
            for r in &batch {
                for e in &r.entries {
                    for step in Step::ALL {
                        let key = (step, step.start_of(r.start_s), e.user.clone(), e.resource.clone());
                        add(want.entry(key).or_default(), (e.admitted, e.refused));
                    }
                }
            }
            let rollup = Rollup::of(&batch);
            let mut got = BTreeMap::new();
            for step in Step::ALL {
                for row in rollup.rows(step) {
                    got.insert((step, row.start, row.user.to_owned(), row.resource.to_owned()), (row.admitted, row.refused));
                }
            }
            proptest::prop_assert_eq!(rollup.len(), want.len());
            proptest::prop_assert_eq!(got, want);
        }
    }
}
