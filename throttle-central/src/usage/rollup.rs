//! What a batch of filed reports adds to each table ([`Rollup`]).

use std::collections::BTreeMap;

use super::filed::FiledUsage;
use super::step::Step;

/// A row of one table: (step, start, service, user, resource).
type RowKey<'a> = (Step, i64, &'a str, &'a str, &'a str);

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
    /// The rows `reports` add to, every step.
    pub(super) fn of(reports: impl IntoIterator<Item = &'a FiledUsage>) -> Self {
        let mut rows = BTreeMap::new();
        for report in reports {
            for e in &report.entries {
                for step in Step::ALL {
                    let start = step.start_of(report.start_s);
                    let key = (step, start, &*e.service, &*e.user, &*e.resource);
                    let sum: &mut (i64, i64) = rows.entry(key).or_default();
                    sum.0 = sum.0.saturating_add(e.admitted);
                    sum.1 = sum.1.saturating_add(e.refused);
                }
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
}
