//! The oracle: from what each user was admitted and offered per slot,
//! whether the promise of `docs/guides/central.md` ("What a limit
//! promises") held, and by how much it missed where it did not.

use std::fmt;

use super::buckets::{IdealBucket, buckets};
use super::case::{Case, Fault, Span, Who};
use crate::sim::Comeback;

/// Over a window with no fault near it, admitted may pass the bound by
/// this share of it.
pub const TOLERANCE: f64 = 0.05;
/// Over a window that a fault touches (its slots, and the five after).
pub const FAULT_TOLERANCE: f64 = 0.15;
/// A node admits while its count is at most its quota, so each node may
/// pass its share by one request a slot: this many requests per node and
/// slot are added to every bound.
pub const PER_NODE_SLOT: f64 = 1.0;
/// A saturated user is admitted at least this share of what an exact
/// bucket would have admitted, over any window of [`LOWER_WINDOW`] slots
/// with no fault near it.
pub const LOWER_SHARE: f64 = 0.85;
/// The windows the lower bound is checked over, in slots.
pub const LOWER_WINDOW: usize = 10;
/// Slots after a fault ends, and after a user starts, that the lower
/// bound leaves out (the central meets the user, the nodes catch up).
const SETTLE_SLOTS: usize = 5;

/// Which bound a [`Miss`] broke.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// Admitted more than the buckets hold.
    Upper,
    /// Refused what an exact bucket would have admitted.
    Lower,
}

/// One window where the promise did not hold.
#[derive(Debug, Clone, PartialEq)]
pub struct Miss {
    /// Whose.
    pub user: String,
    /// Which bound.
    pub side: Side,
    /// The bucket's period (the upper bound is checked per bucket).
    pub bucket: IdealBucket,
    /// The window, slots from the start, both ends included.
    pub first: usize,
    /// See `first`.
    pub last: usize,
    /// What was admitted over it.
    pub admitted: f64,
    /// The bound, with the per-node slack and before the tolerance.
    pub bound: f64,
    /// The fault it touches, if any.
    pub fault: Option<&'static str>,
}

impl Miss {
    /// Admitted over the bound (upper) or the bound over admitted
    /// (lower): 1.0 is exactly on it.
    pub fn ratio(&self) -> f64 {
        match self.side {
            Side::Upper => self.admitted / self.bound.max(1e-9),
            Side::Lower => self.bound / self.admitted.max(1e-9),
        }
    }
}

impl fmt::Display for Miss {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {:?} bound of its {:?} bucket missed over slots {}..={}: admitted {:.0}, bound {:.1} ({:.2}x){}",
            self.user,
            self.side,
            self.bucket.span,
            self.first,
            self.last,
            self.admitted,
            self.bound,
            self.ratio(),
            self.fault.map(|k| format!(", {k}")).unwrap_or_default()
        )
    }
}

/// What the oracle found of one run.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Verdict {
    /// Every window that missed, worst first per user and bound.
    pub misses: Vec<Miss>,
    /// Per fault kind the case has, the largest admitted / bound seen over
    /// the windows it touches (held or not).
    pub worst_by_fault: Vec<(&'static str, f64)>,
    /// The largest admitted / bound over windows no fault touches.
    pub worst_clear: f64,
}

impl Verdict {
    /// Whether the promise held.
    pub fn held(&self) -> bool {
        self.misses.is_empty()
    }
}

/// The slots of a run each fault touches (its own and [`SETTLE_SLOTS`]
/// after), with its kind.
fn fault_slots(case: &Case) -> Vec<(usize, usize, &'static str)> {
    (case.faults.iter())
        .map(|f| {
            let (from, to) = f.span_ms();
            let first = (from / 1000) as usize;
            let last = ((to + 999) / 1000) as usize + SETTLE_SLOTS;
            (first, last, f.kind())
        })
        .collect()
}

/// The slots where a central without state came back: its buckets start
/// again.
fn fresh_starts(case: &Case) -> Vec<usize> {
    (case.faults.iter())
        .filter_map(|f| match f {
            Fault::Central {
                to_ms,
                comeback: Comeback::Fresh,
                ..
            } => Some((*to_ms / 1000) as usize),
            _ => None,
        })
        .collect()
}

/// Checks the run of `case` that admitted `admitted` and was offered
/// `offered` (per user of [`Case::users`], per slot, in the resource's
/// units).
pub fn check(case: &Case, admitted: &[Vec<i64>], offered: &[Vec<i64>]) -> Verdict {
    check_after(case, admitted, offered, 0.0)
}

/// [`check`] where the central ran `lead` slots before the run's first
/// slot: the buckets of the users a rule names started that much earlier
/// and refilled meanwhile (a live run, whose centrals start, elect and
/// take the nodes before the load begins).
pub fn check_after(case: &Case, admitted: &[Vec<i64>], offered: &[Vec<i64>], lead: f64) -> Verdict {
    let faults = fault_slots(case);
    let fresh = fresh_starts(case);
    let mut verdict = Verdict {
        worst_clear: 0.0,
        ..Verdict::default()
    };
    for (u, user) in case.users().iter().enumerate() {
        let (Some(adm), Some(off)) = (admitted.get(u), offered.get(u)) else {
            continue;
        };
        if !off.iter().any(|&o| o > 0) {
            continue;
        }
        // The central meets a user a rule names at its start, one only
        // the `*` rule limits when a node first reports them.
        let (first, lead) = match named(case, user) {
            true => (0, lead.max(0.0)),
            false => (off.iter().position(|&o| o > 0).unwrap_or(0), 0.0),
        };
        let user_buckets = buckets(case, user);
        if user_buckets.is_empty() {
            continue;
        }
        let run = Run {
            case,
            user,
            admitted: adm,
            first,
            lead,
            faults: &faults,
            fresh: &fresh,
        };
        for b in &user_buckets {
            run.upper(b, &mut verdict);
        }
        run.lower(&user_buckets, off, &mut verdict);
    }
    verdict
}

/// Whether a rule other than the `*` rule names `user`.
fn named(case: &Case, user: &str) -> bool {
    case.rules.iter().any(|r| match &r.who {
        Who::One(u) => u == user,
        Who::Many(us) => us.iter().any(|u| u == user),
        Who::Every => false,
    })
}

/// One user's run, as the bounds read it.
struct Run<'a> {
    case: &'a Case,
    user: &'a str,
    admitted: &'a [i64],
    /// The slot the central met them in.
    first: usize,
    /// Slots their bucket refilled before `first`.
    lead: f64,
    faults: &'a [(usize, usize, &'static str)],
    fresh: &'a [usize],
}

impl Run<'_> {
    /// The fault a window touches, if any.
    fn fault(&self, first: usize, last: usize) -> Option<&'static str> {
        (self.faults.iter())
            .find(|(from, to, _)| first <= *to && last >= *from)
            .map(|(_, _, kind)| *kind)
    }

    /// The upper bound of bucket `b` over every window: what it held at
    /// the window's start (at most its capacity, and at most its start
    /// plus the refill since the user's first slot) plus the refill over
    /// the window; a central without state that came back inside the
    /// window adds a new start.
    fn upper(&self, b: &IdealBucket, verdict: &mut Verdict) {
        let n = self.admitted.len();
        let mut worst: Option<(f64, Miss)> = None;
        for first in self.first..n {
            let mut sum = 0.0;
            let since = (self.fresh.iter().copied())
                .filter(|&k| k <= first)
                .max()
                .map_or(self.first, |k| k.max(self.first));
            let lead = if since == self.first { self.lead } else { 0.0 };
            let held = b
                .capacity
                .min(b.start + b.rate * ((first - since) as f64 + lead));
            for last in first..n {
                sum += self.admitted[last] as f64;
                let w = (last - first + 1) as f64;
                let restarts = (self.fresh.iter())
                    .filter(|&&k| k > first && k <= last)
                    .count() as f64;
                let bound = held + b.rate * w + restarts * b.start;
                let fault = self.fault(first, last);
                let tolerance = match fault {
                    Some(_) => FAULT_TOLERANCE,
                    None => TOLERANCE,
                };
                let cost = self.case.resource.cost as f64;
                let slack = PER_NODE_SLOT * cost * self.case.nodes as f64 * w;
                record(verdict, fault, sum / (bound + slack).max(1e-9));
                let over = sum / (bound * (1.0 + tolerance) + slack).max(1e-9);
                if over > 1.0 && worst.as_ref().is_none_or(|(o, _)| over > *o) {
                    let miss = Miss {
                        user: self.user.to_owned(),
                        side: Side::Upper,
                        bucket: *b,
                        first,
                        last,
                        admitted: sum,
                        bound: bound + slack,
                        fault,
                    };
                    worst = Some((over, miss));
                }
            }
        }
        verdict.misses.extend(worst.map(|(_, m)| m));
    }

    /// The lower bound: over any window of [`LOWER_WINDOW`] slots where
    /// the user offered, every slot, at least what exact buckets charged
    /// with what was admitted could admit, away from faults and the
    /// user's first slots, at least [`LOWER_SHARE`] of what exact buckets
    /// at their levels of the window's start would admit over it.
    fn lower(&self, buckets: &[IdealBucket], offered: &[i64], verdict: &mut Verdict) {
        let n = self.admitted.len();
        let mut levels: Vec<f64> = buckets.iter().map(|b| b.start).collect();
        let mut at_start = vec![Vec::new(); n];
        let mut saturated = vec![false; n];
        let unit = self.case.resource.cost as f64 * self.case.nodes as f64;
        // A central without state is sent every report the nodes keep,
        // and charges them: its buckets are not read as new here.
        for t in self.first..n {
            at_start[t] = levels.clone();
            let (room, rate) = room_of(buckets, &levels, t == self.first);
            // A node refuses on a quota below one request: a binding rate
            // below a request per node and slot is not promised.
            let whole = rate >= unit;
            saturated[t] = offered[t] as f64 >= room && room > 0.0 && whole;
            charge(
                buckets,
                &mut levels,
                t == self.first,
                self.admitted[t] as f64,
            );
        }
        let mut worst: Option<Miss> = None;
        for first in (self.first + SETTLE_SLOTS)..n.saturating_sub(LOWER_WINDOW - 1) {
            let last = first + LOWER_WINDOW - 1;
            if self
                .fault(first.saturating_sub(SETTLE_SLOTS), last)
                .is_some()
                || !saturated[first - SETTLE_SLOTS..=last].iter().all(|&s| s)
            {
                continue;
            }
            let slack = PER_NODE_SLOT
                * self.case.resource.cost as f64
                * self.case.nodes as f64
                * LOWER_WINDOW as f64;
            let could = exact_over(buckets, at_start[first].clone(), &offered[first..=last]);
            let bound = could * LOWER_SHARE - slack;
            let sum: f64 = self.admitted[first..=last].iter().map(|&a| a as f64).sum();
            if sum < bound && worst.as_ref().is_none_or(|m| bound / sum > m.ratio()) {
                worst = Some(Miss {
                    user: self.user.to_owned(),
                    side: Side::Lower,
                    bucket: buckets[0],
                    first,
                    last,
                    admitted: sum,
                    bound,
                    fault: None,
                });
            }
        }
        verdict.misses.extend(worst);
    }
}

/// What exact buckets at `levels` would admit of `offered`, slot by slot,
/// each slot charged with what they admitted in it.
fn exact_over(buckets: &[IdealBucket], mut levels: Vec<f64>, offered: &[i64]) -> f64 {
    let mut sum = 0.0;
    for &o in offered {
        let (room, _) = room_of(buckets, &levels, false);
        let admitted = room.min(o as f64);
        charge(buckets, &mut levels, false, admitted);
        sum += admitted;
    }
    sum
}

/// The room of the buckets at `levels` in a slot (the least over them,
/// a per-second bucket's at most its rate), and the binding bucket's
/// rate. In the user's first slot (`first`) the buckets hold their start
/// and do not refill.
fn room_of(buckets: &[IdealBucket], levels: &[f64], first: bool) -> (f64, f64) {
    let (room, rate) = (buckets.iter().zip(levels))
        .map(|(b, l)| {
            let room = if first {
                *l
            } else {
                (l + b.rate).min(b.capacity)
            };
            // The burst a per-second bucket holds is allowed, not
            // promised: a saturated user is promised its rate.
            let room = match b.span {
                Span::Second => room.min(b.rate),
                _ => room,
            };
            (room, b.rate)
        })
        .fold((f64::INFINITY, 0.0), |a, b| if b.0 < a.0 { b } else { a });
    (room.max(0.0), rate)
}

/// Refills the buckets at `levels` for one slot (none in the user's
/// first) and charges them `admitted`.
fn charge(buckets: &[IdealBucket], levels: &mut [f64], first: bool, admitted: f64) {
    for (b, l) in buckets.iter().zip(levels.iter_mut()) {
        let refilled = if first {
            *l
        } else {
            (*l + b.rate).min(b.capacity)
        };
        *l = refilled - admitted;
    }
}

/// Keeps the largest ratio seen per fault kind, and without one.
fn record(verdict: &mut Verdict, fault: Option<&'static str>, ratio: f64) {
    match fault {
        None => verdict.worst_clear = verdict.worst_clear.max(ratio),
        Some(kind) => match verdict.worst_by_fault.iter_mut().find(|(k, _)| *k == kind) {
            Some((_, w)) => *w = w.max(ratio),
            None => verdict.worst_by_fault.push((kind, ratio)),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::promise::case::{Load, Resource, Rule};

    /// ann alone under a minute of 600 (10 a second), offered 1,000 a
    /// second on one node for 40 s.
    fn minute_case() -> Case {
        Case {
            seed: 0,
            seconds: 40,
            nodes: 1,
            resource: Resource {
                name: "requests",
                cost: 1,
            },
            rules: vec![Rule {
                who: Who::One("ann".into()),
                amounts: vec![(Span::Minute, 600.0)],
                burst_seconds: None,
            }],
            loads: vec![Load {
                user: "ann".into(),
                from_ms: 0,
                to_ms: 40_000,
                rate: 1000.0,
                shares: vec![1.0],
                moved: None,
            }],
            faults: Vec::new(),
        }
    }

    fn lower_misses(admitted: Vec<i64>) -> Vec<Miss> {
        let case = minute_case();
        let offered = vec![vec![1000; 40]];
        let verdict = check(&case, &[admitted], &offered);
        (verdict.misses.into_iter())
            .filter(|m| m.side == Side::Lower)
            .collect()
    }

    /// 300 of the minute left unspent, then held at the rate: a window
    /// could have had the 300 once more than it got, not once a slot.
    #[test]
    fn a_level_held_back_is_counted_once_over_a_window() {
        let mut admitted = vec![30; 10];
        admitted.extend([10; 30]);
        // Exact buckets from slot 10 on: 390 and the refill, 490 over
        // ten slots, 85% of it less 10 (406.5), where 100 were admitted.
        // Counted every slot, the 390 made it 3,315.
        let misses = lower_misses(admitted);
        assert_eq!(misses.len(), 1, "{misses:?}");
        let m = &misses[0];
        assert!((m.bound - 406.5).abs() < 1e-6, "{m}");
    }

    /// The minute spent in the first slots, then the rate: no miss; and
    /// a user refused everything past the first slots is one.
    #[test]
    fn the_rate_after_a_spent_minute_holds_and_nothing_misses() {
        let mut spent = vec![100, 100, 100, 100, 100, 150];
        spent.extend([10; 34]);
        assert!(lower_misses(spent).is_empty());
        let mut refused = vec![100, 100, 100, 100, 100, 150];
        refused.extend([0; 34]);
        assert!(!lower_misses(refused).is_empty());
    }
}
