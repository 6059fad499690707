//! How long each resolution is kept ([`Retention`]).

use std::time::Duration;

use super::step::Step;

/// How long rows of each step are kept, and the (node, slot) marks that
/// make writes exactly once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// How long minute rows are kept.
    pub minutes: Duration,
    /// How long hour rows are kept.
    pub hours: Duration,
    /// How long day rows are kept.
    pub days: Duration,
    /// How long a report's mark is kept: a report sent again later than
    /// this would be counted twice, so it is above the longest a node keeps
    /// a report (the ledger's history, which refuses older data).
    pub marks: Duration,
}

/// Marks are kept at least this long.
pub(super) const MIN_MARKS_KEPT: Duration = Duration::from_secs(3_600);

impl Default for Retention {
    /// Minutes 7 days, hours 90 days, days 2 years (730 days), marks an
    /// hour.
    fn default() -> Self {
        Self {
            minutes: Duration::from_secs(7 * 86_400),
            hours: Duration::from_secs(90 * 86_400),
            days: Duration::from_secs(730 * 86_400),
            marks: MIN_MARKS_KEPT,
        }
    }
}

impl Retention {
    /// How long `step`'s rows are kept.
    pub fn of(&self, step: Step) -> Duration {
        match step {
            Step::Minute => self.minutes,
            Step::Hour => self.hours,
            Step::Day => self.days,
        }
    }

    /// The first start `step` keeps at `now_s`: rows before it are
    /// deleted.
    pub fn cutoff(&self, step: Step, now_s: i64) -> i64 {
        step.start_of(now_s.saturating_sub(secs(self.of(step))))
    }

    /// The first data slot start whose mark is kept at `now_s`.
    pub fn marks_cutoff(&self, now_s: i64) -> i64 {
        now_s.saturating_sub(secs(self.marks))
    }

    /// The finest step that still holds rows from `from_s` at `now_s`.
    pub fn finest_holding(&self, from_s: i64, now_s: i64) -> Step {
        Step::ALL
            .into_iter()
            .find(|&step| self.cutoff(step, now_s) <= from_s)
            .unwrap_or(Step::Day)
    }
}

fn secs(d: Duration) -> i64 {
    i64::try_from(d.as_secs()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_finest_step_holding_a_start_is_chosen() {
        let r = Retention::default();
        let now = 1_800_000_000;
        assert_eq!(r.finest_holding(now - 3_600, now), Step::Minute);
        assert_eq!(r.finest_holding(now - 30 * 86_400, now), Step::Hour);
        assert_eq!(r.finest_holding(now - 400 * 86_400, now), Step::Day);
        assert_eq!(
            r.cutoff(Step::Day, now),
            Step::Day.start_of(now - 730 * 86_400)
        );
    }
}
