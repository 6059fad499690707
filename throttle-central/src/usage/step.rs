//! The resolutions usage is kept at ([`Step`]).

use std::fmt;
use std::str::FromStr;

/// A resolution of the usage store: each has its own table, rows keyed by
/// the Unix second their minute, hour or day (UTC) starts at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Step {
    /// `usage_minutes`.
    Minute,
    /// `usage_hours`.
    Hour,
    /// `usage_days`.
    Day,
}

impl Step {
    /// Every step, finest first.
    pub const ALL: [Step; 3] = [Step::Minute, Step::Hour, Step::Day];

    /// Its length in seconds.
    pub const fn seconds(self) -> i64 {
        match self {
            Step::Minute => 60,
            Step::Hour => 3_600,
            Step::Day => 86_400,
        }
    }

    /// The start of the step holding `unix_s`.
    pub const fn start_of(self, unix_s: i64) -> i64 {
        unix_s - unix_s.rem_euclid(self.seconds())
    }

    /// Its table.
    pub const fn table(self) -> &'static str {
        match self {
            Step::Minute => "usage_minutes",
            Step::Hour => "usage_hours",
            Step::Day => "usage_days",
        }
    }

    /// Its name in the API: `minute`, `hour` or `day`.
    pub const fn name(self) -> &'static str {
        match self {
            Step::Minute => "minute",
            Step::Hour => "hour",
            Step::Day => "day",
        }
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Step {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Step::ALL
            .into_iter()
            .find(|step| step.name() == s)
            .ok_or_else(|| format!("step must be minute, hour or day, not {s:?}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_start_on_utc_boundaries() {
        let t = 1_795_000_123;
        assert_eq!(Step::Minute.start_of(t), 1_795_000_080);
        assert_eq!(Step::Hour.start_of(t), 1_794_999_600);
        assert_eq!(Step::Day.start_of(t), 1_794_960_000);
        assert_eq!(Step::Minute.start_of(-1), -60);
        assert_eq!("hour".parse::<Step>(), Ok(Step::Hour));
        assert!("week".parse::<Step>().is_err());
    }
}
