//! [`IdealBucket`]: the buckets the promise gives a user, read from the
//! rules as `docs/guides/central.md` says, without the central's code.

use super::case::{Case, Rule, Span, Who};

/// `burst_seconds` where a rule sets none.
const DEFAULT_BURST_SECONDS: f64 = 10.0;

/// One token bucket of a user, in the resource's units.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct IdealBucket {
    /// Its period.
    pub span: Span,
    /// Refill per second: the amount over the period.
    pub rate: f64,
    /// What it holds at most: `burst_seconds` of the rate for a second,
    /// the whole amount for a longer period.
    pub capacity: f64,
    /// What it holds when the central first meets the user: one second's
    /// worth (at most the capacity), or the whole amount.
    pub start: f64,
}

impl IdealBucket {
    fn of(span: Span, amount: f64, burst_seconds: f64) -> Self {
        let rate = amount / span.seconds();
        let (capacity, start) = match span {
            Span::Second => {
                let capacity = rate * burst_seconds;
                (capacity, rate.min(capacity))
            }
            _ => (amount, amount),
        };
        Self {
            span,
            rate,
            capacity,
            start,
        }
    }
}

/// How a rule names a user: alone outranks a list, a list the `*` rule.
fn rank(rule: &Rule, user: &str) -> Option<u8> {
    match &rule.who {
        Who::One(u) if u == user => Some(2),
        Who::Many(us) if us.iter().any(|u| u == user) => Some(1),
        Who::Every => Some(0),
        _ => None,
    }
}

/// The buckets of `user` in `case`, one per period that a rule naming
/// them (or the `*` rule) sets: the amount of the highest-ranked such rule
/// (the user alone, then a list, then `*`), the lower amount and burst
/// between rules of one rank. Every one of them is charged.
pub fn buckets(case: &Case, user: &str) -> Vec<IdealBucket> {
    let mut out = Vec::new();
    for span in Span::ALL {
        let mut best: Option<(u8, f64, f64)> = None;
        for rule in &case.rules {
            let Some(r) = rank(rule, user) else { continue };
            let Some(&(_, amount)) = rule.amounts.iter().find(|(s, _)| *s == span) else {
                continue;
            };
            let burst = rule.burst_seconds.unwrap_or(DEFAULT_BURST_SECONDS);
            best = match best {
                Some((br, ba, bb)) if br > r || (br == r && ba <= amount) => {
                    Some((br, ba, if br == r { bb.min(burst) } else { bb }))
                }
                Some((br, _, bb)) if br == r => Some((r, amount, bb.min(burst))),
                _ => Some((r, amount, burst)),
            };
        }
        if let Some((_, amount, burst)) = best {
            out.push(IdealBucket::of(span, amount, burst));
        }
    }
    out
}
