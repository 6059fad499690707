//! Keys limited over several periods (a second, a minute, an hour, a day):
//! every period's bucket is charged, and the one with the least room is the
//! key's own [`Key::bucket`], the one policies read. Keys of one period,
//! the common case, carry nothing more than their bucket.

use smallvec::SmallVec;

use super::state::{Key, MaxDebt};
use crate::bucket::Bucket;
use crate::limits::{Allowance, Period, Resolved};

/// A key's buckets besides its own, and its own one's period.
#[derive(Debug, Clone)]
pub(crate) struct Periods {
    /// The period of [`Key::bucket`].
    own: Period,
    /// The other periods' buckets.
    others: SmallVec<[(Period, Bucket); 3]>,
}

/// How much a bucket can take over the next second: what binds first.
fn room(bucket: &Bucket, now_ms: i64) -> f64 {
    bucket.level_at(now_ms) + bucket.rate()
}

/// A bucket for `allowance`, from `old` when it had one of its period (its
/// level kept, its limit changed if the rule did).
fn bucket_for(allowance: &Allowance, old: Option<Bucket>, now_ms: i64) -> Bucket {
    let Allowance {
        period,
        rate,
        burst_seconds,
    } = *allowance;
    match old {
        Some(b) if b.rate() == rate && b.capacity() == rate * burst_seconds => b,
        Some(mut b) => {
            b.set_limit(rate, burst_seconds, now_ms);
            b
        }
        None if period == Period::Second => Bucket::new(rate, burst_seconds, now_ms),
        None => Bucket::full(rate, burst_seconds, now_ms),
    }
}

impl Key {
    /// The period of the key's bucket (a second for keys no rule limits).
    pub fn period(&self) -> Period {
        self.periods.as_ref().map_or(Period::Second, |p| p.own)
    }

    /// The buckets of every period limiting the key, its own first.
    pub fn buckets(&self) -> impl Iterator<Item = (Period, &Bucket)> {
        let own = self.bucket().map(|b| (self.period(), b));
        let others = self.periods.iter().flat_map(|p| p.others.iter());
        own.into_iter().chain(others.map(|(p, b)| (*p, b)))
    }

    /// The bucket of `period`, if the key is limited over it.
    pub(super) fn bucket_of_mut(&mut self, period: Period) -> Option<&mut Bucket> {
        if !self.limited {
            return None;
        }
        if self.period() == period {
            return Some(&mut self.bucket);
        }
        let mut others = self.periods.as_deref_mut()?.others.iter_mut();
        others.find(|(p, _)| *p == period).map(|(_, b)| b)
    }

    /// Whether the key is limited over several periods.
    pub(super) fn has_several(&self) -> bool {
        self.periods.as_ref().is_some_and(|p| !p.others.is_empty())
    }

    /// Limits the key as `resolved` says from `now_ms`: a bucket per
    /// period, each keeping its level if it had one. Returns whether the
    /// key has buckets of several periods.
    pub(super) fn set_allowances(&mut self, resolved: &Resolved, now_ms: i64) -> bool {
        let mut old: SmallVec<[(Period, Bucket); 4]> = SmallVec::new();
        if self.limited {
            old.push((self.period(), self.bucket.clone()));
        }
        if let Some(p) = self.periods.take() {
            old.extend(p.others);
        }
        let mut take = |period| {
            let i = old.iter().position(|(p, _)| *p == period)?;
            Some(old.swap_remove(i).1)
        };
        let mut buckets = resolved
            .allowances
            .iter()
            .map(|a| (a.period, bucket_for(a, take(a.period), now_ms)));
        let Some((own, bucket)) = buckets.next() else {
            self.limited = false;
            return false;
        };
        let others: SmallVec<[(Period, Bucket); 3]> = buckets.collect();
        let several = !others.is_empty();
        self.bucket = bucket;
        self.limited = true;
        self.max_debt = MaxDebt::of(resolved.max_debt_seconds);
        if several || own != Period::Second {
            self.periods = Some(Box::new(Periods { own, others }));
        }
        self.bind(now_ms);
        several
    }

    /// Makes the bucket with the least room the key's own.
    pub(super) fn bind(&mut self, now_ms: i64) {
        let Some(p) = self.periods.as_deref_mut() else {
            return;
        };
        let mut least = room(&self.bucket, now_ms);
        let mut binding = None;
        for (i, (_, b)) in p.others.iter().enumerate() {
            let r = room(b, now_ms);
            if r < least {
                (least, binding) = (r, Some(i));
            }
        }
        if let Some(i) = binding {
            let (period, bucket) = &mut p.others[i];
            std::mem::swap(&mut self.bucket, bucket);
            std::mem::swap(&mut p.own, period);
        }
    }

    /// Charges `amount` to every bucket, each no deeper than its floor;
    /// the report of a `late` slot first to what the bucket spilled
    /// ([`Bucket::consume_late`]).
    pub(super) fn charge(&mut self, amount: i64, now_ms: i64, late: bool) {
        let max_debt = self.max_debt;
        let charge = |b: &mut Bucket| {
            let floor = max_debt.floor(b);
            if late {
                b.consume_late(amount, now_ms, floor);
            } else {
                b.consume_down_to(amount, now_ms, floor);
            }
        };
        charge(&mut self.bucket);
        if let Some(p) = self.periods.as_deref_mut() {
            p.others.iter_mut().for_each(|(_, b)| charge(b));
        }
    }

    /// Charges `amount` to every bucket, none below zero: what nodes
    /// admitted before the ledger began.
    pub(super) fn empty_by(&mut self, amount: i64, now_ms: i64) {
        self.bucket.consume_down_to(amount, now_ms, 0.0);
        if let Some(p) = self.periods.as_deref_mut() {
            for (_, b) in &mut p.others {
                b.consume_down_to(amount, now_ms, 0.0);
            }
        }
    }

    /// Whether every bucket holds at least what a new one would start
    /// with at `now_ms`: forgetting the key then gives its user nothing
    /// back.
    pub(super) fn buckets_full(&self, now_ms: i64) -> bool {
        self.buckets().all(|(period, b)| {
            let start = match period {
                Period::Second => b.capacity().min(b.rate()),
                _ => b.capacity(),
            };
            b.level_at(now_ms) >= start
        })
    }
}
