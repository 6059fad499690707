//! Keys limited over several periods (a second, a minute, an hour, a day):
//! every period's bucket is charged, and the one with the least room is the
//! key's own bucket (`Key::bucket`), the one policies read. Keys of one period,
//! the common case, carry nothing more than their bucket.

use smallvec::SmallVec;

use crate::bucket::Bucket;
use crate::limits::{Allowance, Period};

/// A key's buckets besides its own, and its own one's period.
#[derive(Debug, Clone)]
pub(crate) struct Periods {
    /// The period of the key's own bucket.
    pub(crate) own: Period,
    /// The other periods' buckets.
    pub(crate) others: SmallVec<[(Period, Bucket); 3]>,
}

/// How much a bucket can take over the next second: what binds first.
pub(crate) fn room(bucket: &Bucket, now_ms: i64) -> f64 {
    bucket.level_at(now_ms) + bucket.rate()
}

/// A bucket for `allowance`, from `old` when it had one of its period (its
/// level kept, its limit changed if the rule did).
pub(crate) fn bucket_for(allowance: &Allowance, old: Option<Bucket>, now_ms: i64) -> Bucket {
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
