//! Token buckets, one per (service, user, resource), as in the original.
//!
//! A bucket refills continuously at `rate` per second up to `capacity`
//! (`burst_seconds x rate`), starts with one second's worth, and is charged
//! with what nodes *report*, after the fact. It may therefore go below zero:
//! a debt that the refill pays back before quotas are offered again. The
//! original let the debt grow without bound, so one absurd report (or a
//! long outage's backlog) locked a user out for as long as it took to
//! repay; [`Bucket::consume_down_to`] bounds it (the ledger's default: as
//! deep as the capacity, so at most `burst_seconds` to repay).
//!
//! # Examples
//!
//! ```
//! use throttle_central::bucket::Bucket;
//!
//! let mut b = Bucket::new(100.0, 10.0, 0);
//! assert_eq!(b.level(0), 100.0);
//! b.consume(250, 0);
//! assert_eq!(b.level(0), -150.0);
//! assert_eq!(b.level(2_000), 50.0);
//! assert_eq!(b.level(60_000), 1_000.0); // capped at 10 s worth
//! ```

/// A token bucket that may go negative; see the [module docs](self).
#[derive(Debug, Clone, PartialEq)]
pub struct Bucket {
    rate: f64,
    capacity: f64,
    level: f64,
    updated_ms: i64,
}

impl Bucket {
    /// A bucket of `rate` per second holding at most `burst_seconds x rate`,
    /// starting with `min(rate, capacity)` at `now_ms`.
    ///
    /// Negative or non-finite arguments count as 0.
    pub fn new(rate: f64, burst_seconds: f64, now_ms: i64) -> Self {
        let rate = sanitize(rate);
        let capacity = sanitize(burst_seconds) * rate;
        Self {
            rate,
            capacity,
            level: rate.min(capacity),
            updated_ms: now_ms,
        }
    }

    /// As [`Bucket::new`], starting full: the bucket of a longer period,
    /// whose whole amount may be spent at any pace.
    pub fn full(rate: f64, burst_seconds: f64, now_ms: i64) -> Self {
        let mut b = Self::new(rate, burst_seconds, now_ms);
        b.level = b.capacity;
        b
    }

    /// Tokens added per second.
    pub fn rate(&self) -> f64 {
        self.rate
    }

    /// The most the bucket holds.
    pub fn capacity(&self) -> f64 {
        self.capacity
    }

    /// The level at `now_ms` (may be negative).
    pub fn level(&mut self, now_ms: i64) -> f64 {
        self.refill(now_ms);
        self.level
    }

    /// The level at `now_ms` without recording the refill (for readers that
    /// only look, e.g. a policy computing quotas).
    pub fn level_at(&self, now_ms: i64) -> f64 {
        if now_ms > self.updated_ms {
            let gained = self.rate * (now_ms - self.updated_ms) as f64 / 1000.0;
            self.refilled(gained)
        } else {
            self.level
        }
    }

    /// The level after `gained` more: capped at the capacity, except for
    /// a level already above it, which only [`Bucket::restore`] leaves
    /// (until [`Bucket::clamp`]) and which refills uncapped.
    fn refilled(&self, gained: f64) -> f64 {
        if self.level > self.capacity {
            self.level + gained
        } else {
            (self.level + gained).min(self.capacity)
        }
    }

    /// Takes `amount` tokens, going below zero if need be.
    pub fn consume(&mut self, amount: i64, now_ms: i64) {
        self.consume_down_to(amount, now_ms, f64::NEG_INFINITY);
    }

    /// Takes `amount` tokens, going below zero if need be but not below
    /// `floor` (at most 0; `f64::NEG_INFINITY` for no bound). A level
    /// already below `floor` stays where it is.
    pub fn consume_down_to(&mut self, amount: i64, now_ms: i64, floor: f64) {
        self.refill(now_ms);
        let charged = self.level - amount as f64;
        self.level = charged.max(floor.min(self.level));
    }

    /// The lowest level [`Bucket::consume_down_to`] goes to for a debt of
    /// at most `max_debt_seconds` of rate (infinity: no bound).
    pub fn floor(&self, max_debt_seconds: f64) -> f64 {
        if max_debt_seconds.is_infinite() {
            f64::NEG_INFINITY
        } else {
            -(sanitize(max_debt_seconds) * self.rate)
        }
    }

    /// Changes rate and burst from `now_ms` on. What accrued so far accrued at
    /// the old rate; a level above the new capacity is clamped to it.
    pub fn set_limit(&mut self, rate: f64, burst_seconds: f64, now_ms: i64) {
        self.refill(now_ms);
        self.rate = sanitize(rate);
        self.capacity = sanitize(burst_seconds) * self.rate;
        self.level = self.level.min(self.capacity);
    }

    /// Sets the level read at `at_ms` (from a checkpoint), at most the
    /// capacity, plus the refill from then to `now_ms` without the cap:
    /// the reports of that time are still to be charged, and what the
    /// nodes admitted meanwhile was paid for by that refill, second by
    /// second. Above the capacity it keeps refilling uncapped until
    /// [`Bucket::clamp`] caps it, once they are in. A non-finite level is
    /// ignored.
    pub fn restore(&mut self, level: f64, at_ms: i64, now_ms: i64) {
        if level.is_finite() {
            let away = (now_ms - at_ms).max(0) as f64 / 1000.0;
            self.level = level.min(self.capacity) + self.rate * away;
            self.updated_ms = now_ms.max(at_ms);
        }
    }

    /// Caps the level at the capacity (after [`Bucket::restore`]).
    pub fn clamp(&mut self, now_ms: i64) {
        self.refill(now_ms);
        self.level = self.level.min(self.capacity);
    }

    fn refill(&mut self, now_ms: i64) {
        // A clock that steps back adds nothing and does not move `updated_ms`
        // backwards, so the same interval is never credited twice.
        if now_ms > self.updated_ms {
            let gained = self.rate * (now_ms - self.updated_ms) as f64 / 1000.0;
            self.level = self.refilled(gained);
            self.updated_ms = now_ms;
        }
    }
}

fn sanitize(x: f64) -> f64 {
    if x.is_finite() && x > 0.0 { x } else { 0.0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_restored_bucket_holds_the_refill_of_the_gap_until_clamped() {
        // 100/s, 2 s of burst; checkpointed at 1 s, restored at 6 s.
        let mut b = Bucket::new(100.0, 2.0, 0);
        b.consume(100, 0);
        b.restore(20.0, 1_000, 6_000);
        assert_eq!(b.level(6_000), 520.0, "5 s of refill, above the capacity");
        assert_eq!(b.level(6_500), 570.0, "and still refilling uncapped");
        // The reports of the gap: 100 a second.
        b.consume(500, 6_500);
        assert_eq!(b.level(6_500), 70.0);
        b.clamp(6_500);
        assert_eq!(b.level(60_000), 200.0, "capped again once clamped");
        let mut above = Bucket::new(100.0, 2.0, 0);
        above.restore(0.0, 0, 10_000);
        above.clamp(10_000);
        assert_eq!(above.level(10_000), 200.0);
    }
    use proptest::prelude::*;

    #[test]
    fn a_bounded_debt_stops_at_its_floor_and_is_repaid_in_time() {
        let mut b = Bucket::new(100.0, 10.0, 0);
        let floor = b.floor(10.0);
        assert_eq!(floor, -1_000.0);
        b.consume_down_to(i64::MAX, 0, floor);
        assert_eq!(b.level(0), -1_000.0);
        assert_eq!(b.level(10_000), 0.0, "repaid after max_debt seconds");
        let mut unbounded = Bucket::new(100.0, 10.0, 0);
        unbounded.consume_down_to(1_000_000, 0, unbounded.floor(f64::INFINITY));
        assert_eq!(unbounded.level(0), -999_900.0);
    }

    #[test]
    fn starts_with_one_second_and_caps_at_capacity() {
        let mut b = Bucket::new(10.0, 10.0, 1_000);
        assert_eq!(b.capacity(), 100.0);
        assert_eq!(b.level(1_000), 10.0);
        assert_eq!(b.level(1_500), 15.0);
        assert_eq!(b.level(100_000), 100.0);
        let mut small = Bucket::new(10.0, 0.5, 0);
        assert_eq!(small.level(0), 5.0);
    }

    #[test]
    fn debt_has_no_lower_bound_and_is_paid_back() {
        let mut b = Bucket::new(10.0, 10.0, 0);
        b.consume(1_000_000, 0);
        assert_eq!(b.level(0), -999_990.0);
        assert_eq!(b.level(1_000), -999_980.0);
    }

    #[test]
    fn lowering_capacity_clamps_and_new_rate_applies_from_now() {
        let mut b = Bucket::new(10.0, 10.0, 0);
        assert_eq!(b.level(20_000), 100.0);
        b.set_limit(2.0, 10.0, 20_000);
        assert_eq!(b.level(20_000), 20.0);
        b.consume(20, 20_000);
        assert_eq!(b.level(21_000), 2.0);
        b.set_limit(100.0, 10.0, 21_000);
        assert_eq!(b.level(21_500), 52.0);
    }

    #[test]
    fn absurd_limits_are_zero() {
        let mut b = Bucket::new(f64::NAN, -3.0, 0);
        assert_eq!(b.level(10_000), 0.0);
        let mut b = Bucket::new(-5.0, 10.0, 0);
        assert_eq!(b.level(10_000), 0.0);
    }

    #[test]
    fn time_going_backwards_adds_nothing() {
        let mut b = Bucket::new(10.0, 10.0, 5_000);
        b.consume(10, 5_000);
        assert_eq!(b.level(4_000), 0.0);
        assert_eq!(b.level(5_000), 0.0);
        assert_eq!(b.level(6_000), 10.0);
    }

    proptest! {
        #[test]
        fn level_never_exceeds_capacity_and_refill_is_additive(
            rate in 0.0f64..1e9, burst in 0.0f64..100.0,
            ops in prop::collection::vec((0i64..5_000, 0i64..1_000_000_000), 0..50),
        ) {
            let mut b = Bucket::new(rate, burst, 0);
            let mut now = 0;
            let mut consumed = 0.0;
            for (dt, amount) in ops {
                now += dt;
                b.consume(amount, now);
                consumed += amount as f64;
                prop_assert!(b.level(now) <= b.capacity() + 1e-6 * b.capacity().max(1.0));
            }
            // Without the cap the level would be start + rate x t - consumed;
            // the cap only ever removes tokens.
            let uncapped = rate.min(rate * burst) + rate * now as f64 / 1000.0 - consumed;
            prop_assert!(b.level(now) <= uncapped + 1e-6 * uncapped.abs().max(1.0));
            // Looking does not change anything.
            let later = now + 1_234;
            let seen = b.level_at(later);
            prop_assert_eq!(seen, b.clone().level(later));
            prop_assert_eq!(b.level_at(later), seen);
        }
    }
}

#[cfg(test)]
mod floor_tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Whatever is charged, a bounded bucket's level stays at or above
        /// its floor, and charging never raises it.
        #[test]
        fn the_floor_holds(
            rate in 0.0f64..1e6,
            debt in 0.0f64..100.0,
            charges in proptest::collection::vec((0i64..i64::MAX, 0i64..5_000), 1..20),
        ) {
            let mut b = Bucket::new(rate, 10.0, 0);
            let floor = b.floor(debt);
            let mut now = 0;
            for (amount, step) in charges {
                now += step;
                let before = b.level(now);
                b.consume_down_to(amount, now, floor);
                let after = b.level(now);
                prop_assert!(after >= floor.min(before));
                prop_assert!(after <= before);
            }
        }
    }
}
