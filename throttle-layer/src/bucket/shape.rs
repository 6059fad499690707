//! [`Shape`]: how a bucket fills.

use std::time::Duration;

/// How a bucket fills: `quantum` tokens every `interval`, up to
/// `capacity` (the legacy design's fill interval and quantum). A new or
/// long idle bucket is full.
///
/// ```
/// use std::time::Duration;
/// use throttle_layer::bucket::Shape;
///
/// let s = Shape::per_second(50).capacity(100);
/// assert_eq!((s.quantum(), s.interval()), (1, Duration::from_millis(20)));
/// let t = Shape::new(10, 5, Duration::from_secs(1)).unwrap();
/// assert_eq!(t.capacity_tokens(), 10);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Shape {
    capacity: u64,
    quantum: u64,
    /// Microseconds, at least 1.
    interval_us: u64,
}

/// The largest capacity or quantum: 2^50, so that the Redis script's
/// numbers (doubles) stay exact.
pub const MAX_TOKENS: u64 = 1 << 50;

impl Shape {
    /// `quantum` tokens every `interval`, at most `capacity`; `None` when
    /// a number is 0, above [`MAX_TOKENS`], or the interval is under a
    /// microsecond or over a year.
    pub fn new(capacity: u64, quantum: u64, interval: Duration) -> Option<Self> {
        let interval_us = u64::try_from(interval.as_micros()).ok()?;
        let year_us = 366 * 86_400 * 1_000_000;
        let fits = |n: u64| (1..=MAX_TOKENS).contains(&n);
        (fits(capacity) && fits(quantum) && (1..=year_us).contains(&interval_us)).then_some(Self {
            capacity,
            quantum,
            interval_us,
        })
    }

    /// `rate` tokens a second, one at a time, and a capacity of one
    /// second's worth (at least 1). A rate of 0 is taken as 1 a year.
    pub fn per_second(rate: u64) -> Self {
        Self::per(rate, 1_000_000)
    }

    /// `rate` tokens a minute, one at a time, and a capacity of one
    /// minute's worth.
    pub fn per_minute(rate: u64) -> Self {
        Self::per(rate, 60_000_000)
    }

    pub(crate) fn per(rate: u64, period_us: u64) -> Self {
        let rate = rate.clamp(1, MAX_TOKENS);
        let (quantum, interval_us) = if rate.saturating_mul(1000) <= period_us {
            // One token at a time; the interval rounded down by under a
            // microsecond, so the rate is off by at most 0.1%.
            (1, period_us / rate)
        } else {
            // Exact: the rate's and the period's common part.
            let g = gcd(rate, period_us);
            (rate / g, period_us / g)
        };
        Self {
            capacity: rate,
            quantum,
            interval_us,
        }
    }

    /// The same fill, holding at most `capacity` tokens (at least 1, at
    /// most [`MAX_TOKENS`]).
    pub fn capacity(mut self, capacity: u64) -> Self {
        self.capacity = capacity.clamp(1, MAX_TOKENS);
        self
    }

    /// The most tokens the bucket holds.
    pub fn capacity_tokens(&self) -> u64 {
        self.capacity
    }

    /// Tokens added each interval.
    pub fn quantum(&self) -> u64 {
        self.quantum
    }

    /// Time between two fills.
    pub fn interval(&self) -> Duration {
        Duration::from_micros(self.interval_us)
    }

    pub(crate) fn interval_us(&self) -> u64 {
        self.interval_us
    }
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}
