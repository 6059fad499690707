//! Periods of a limit, and which of a service's rules limit one user's
//! resource: a user's own rule and the service's `*` rule both apply,
//! period by period, the user's own winning where both set one.

use serde::Serialize;
use smallvec::SmallVec;

use super::Limit;

/// How long a limit's amount is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Period {
    /// `per_second`.
    Second,
    /// `per_minute`.
    Minute,
    /// `per_hour`.
    Hour,
    /// `per_day`.
    Day,
}

impl Period {
    /// Every period, shortest first.
    pub const ALL: [Period; 4] = [Self::Second, Self::Minute, Self::Hour, Self::Day];

    /// The period's length in seconds.
    pub fn seconds(self) -> f64 {
        f64::from(self.window_seconds())
    }

    /// The period's length in whole seconds, as the protocol writes it.
    pub fn window_seconds(self) -> u32 {
        match self {
            Self::Second => 1,
            Self::Minute => 60,
            Self::Hour => 3_600,
            Self::Day => 86_400,
        }
    }

    /// Its name: `second`, `minute`, `hour`, `day`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Second => "second",
            Self::Minute => "minute",
            Self::Hour => "hour",
            Self::Day => "day",
        }
    }
}

/// One token bucket a limit sets for a resource: its period's amount as a
/// rate, and how many seconds of it the bucket holds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Allowance {
    /// The period the limit was written for.
    pub period: Period,
    /// Tokens per second: the amount divided by the period.
    pub rate: f64,
    /// Capacity, in seconds of rate.
    pub burst_seconds: f64,
}

impl Allowance {
    /// The amount per period this allowance was written as.
    pub fn amount(&self) -> f64 {
        self.rate * self.period.seconds()
    }
}

/// What limits one (user, resource): a bucket per period, and how deep
/// each may go into debt.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Resolved {
    /// Shortest period first; empty when nothing limits the key.
    pub allowances: SmallVec<[Allowance; 4]>,
    /// As [`Limit::max_debt_seconds`], of the rule that set the first
    /// allowance.
    pub max_debt_seconds: Option<f64>,
}

/// What limits `resource` for a user whose own rule is `own` (if any) in a
/// service whose `*` rule is `every` (if any): for each period, the own
/// rule's allowance if it sets one for the resource, else the `*` rule's.
pub fn resolve(own: Option<&Limit>, every: Option<&Limit>, resource: &str) -> Resolved {
    let mut out = Resolved::default();
    for period in Period::ALL {
        let from_own = own.and_then(|l| l.allowance(resource, period).map(|a| (a, l)));
        let from_every = || every.and_then(|l| l.allowance(resource, period).map(|a| (a, l)));
        if let Some((allowance, rule)) = from_own.or_else(from_every) {
            if out.allowances.is_empty() {
                out.max_debt_seconds = rule.max_debt_seconds;
            }
            out.allowances.push(allowance);
        }
    }
    out
}

/// The resources a user whose own rule is `own` (if any) is limited in,
/// where the `*` rule is `every` (if any): each once, in order.
pub fn limited_resources<'a>(own: Option<&'a Limit>, every: Option<&'a Limit>) -> Vec<&'a str> {
    let mut resources: Vec<&str> = own
        .into_iter()
        .chain(every)
        .flat_map(Limit::resources)
        .collect();
    resources.sort_unstable();
    resources.dedup();
    resources
}
