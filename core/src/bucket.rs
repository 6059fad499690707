//! Token buckets, one per (service, user, resource), as in the legacy system.
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
//! use throttle_core::bucket::Bucket;
//!
//! let mut b = Bucket::new(100.0, 10.0, 0);
//! assert_eq!(b.level(0), 100.0);
//! b.consume(250, 0);
//! assert_eq!(b.level(0), -150.0);
//! assert_eq!(b.level(2_000), 50.0);
//! assert_eq!(b.level(60_000), 1_000.0); // capped at 10 s worth
//! ```

/// The refill a bucket turns away at its capacity that it keeps for late
/// reports, in seconds of its rate: as long a gap as a node keeps reports
/// of (60 by default).
pub const SPILL_SECONDS: f64 = 60.0;

/// A token bucket that may go negative; see the [module docs](self).
///
/// Besides its level it keeps what its capacity turned away over the last
/// [`SPILL_SECONDS`] of rate: the refill of slots whose reports have not
/// come in yet. A late report (one of a gap, sent again after a
/// reconnection) is charged to that first ([`Bucket::consume_late`]), so
/// a gap costs what the nodes admitted in it less the refill of it, as if
/// its reports had come on time; nothing spilled is ever granted.
#[derive(Debug, Clone, PartialEq)]
pub struct Bucket {
    rate: f64,
    capacity: f64,
    level: f64,
    updated_ms: i64,
    spilled: f64,
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
            spilled: 0.0,
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

    /// The refill turned away at the capacity and kept for late reports,
    /// as of the last change.
    pub fn spilled(&self) -> f64 {
        self.spilled
    }

    /// What the capacity turned away and keeps for late reports, as of
    /// `now_ms`, without recording it (see [`Bucket::level_at`]).
    pub fn spilled_at(&self, now_ms: i64) -> f64 {
        let gained = self.rate * (now_ms - self.updated_ms).max(0) as f64 / 1000.0;
        self.kept_with(self.spill_of(gained))
    }

    /// The level at `now_ms` without recording the refill (for readers that
    /// only look, e.g. a policy computing quotas).
    pub fn level_at(&self, now_ms: i64) -> f64 {
        if now_ms > self.updated_ms {
            let gained = self.rate * (now_ms - self.updated_ms) as f64 / 1000.0;
            (self.level + gained).min(self.capacity.max(self.level))
        } else {
            self.level
        }
    }

    /// Adds `gained`: up to the capacity into the level, the rest into
    /// what is kept for late reports.
    fn gain(&mut self, gained: f64) {
        let spill = self.spill_of(gained);
        self.level += gained - spill;
        self.spilled = self.kept_with(spill);
    }

    /// What of `gained` the capacity turns away.
    fn spill_of(&self, gained: f64) -> f64 {
        let room = (self.capacity - self.level).max(0.0);
        (gained - room).max(0.0)
    }

    /// What is kept for late reports with `spill` more.
    fn kept_with(&self, spill: f64) -> f64 {
        (self.spilled + spill).min(self.rate * SPILL_SECONDS)
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
        self.take(amount as f64, floor);
    }

    /// As [`Bucket::consume_down_to`], for a report on time when no late
    /// report is awaited: what the capacity turned away so far was no
    /// one's use (the bucket was full while its user was idle), and is
    /// dropped. Kept, that refill would pay for the late reports of a
    /// later gap, whose own refill it is not, and leave the bucket that
    /// much too high after it.
    pub fn consume_steady(&mut self, amount: i64, now_ms: i64, floor: f64) {
        self.refill(now_ms);
        self.spilled = 0.0;
        self.take(amount as f64, floor);
    }

    /// As [`Bucket::consume_down_to`], for the report of a slot that has
    /// passed (a gap's, sent again): charged first to the refill the
    /// capacity turned away meanwhile, then to the level, but not into a
    /// debt: what nodes admitted in a gap on their last quotas beyond its
    /// refill (a node admits one request past its quota each slot) would
    /// otherwise be repaid in one slot, all at once.
    pub fn consume_late(&mut self, amount: i64, now_ms: i64, floor: f64) {
        self.refill(now_ms);
        let floor = floor.max(self.level.min(0.0));
        self.take_spilled_first(amount as f64, floor);
    }

    /// As [`Bucket::consume_down_to`], for the slots of a node that reports
    /// every few slots (a proxy): charged first to the refill the capacity
    /// turned away since (its usage of those slots was not charged yet),
    /// then to the level, as deep as `floor`.
    ///
    /// Only the refill turned away since `since_ms` (when the oldest slot
    /// charged began) pays: what spilled before, while the user was idle,
    /// was no one's use, and is dropped.
    pub fn consume_batched(&mut self, amount: i64, now_ms: i64, floor: f64, since_ms: i64) {
        self.refill(now_ms);
        let since = (now_ms - since_ms).max(0) as f64 / 1000.0;
        self.spilled = self.spilled.min(self.rate * since);
        self.take_spilled_first(amount as f64, floor);
    }

    /// Keeps for late reports at least the refill from `since_ms` to
    /// `now_ms` (at most [`SPILL_SECONDS`] of rate): a new bucket charged
    /// with slots before it began, whose nodes admitted on that refill.
    pub fn keep_refill_since(&mut self, since_ms: i64, now_ms: i64) {
        let since = (now_ms - since_ms).max(0) as f64 / 1000.0;
        let refill = (self.rate * since).min(self.rate * SPILL_SECONDS);
        self.spilled = self.spilled.max(refill);
    }

    /// Takes `amount` from what was spilled, then the rest from the level
    /// down to `floor`.
    fn take_spilled_first(&mut self, amount: f64, floor: f64) {
        let covered = self.spilled.min(amount);
        self.spilled -= covered;
        self.take(amount - covered, floor);
    }

    fn take(&mut self, amount: f64, floor: f64) {
        let charged = self.level - amount;
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
        self.spilled = self.spilled.min(self.rate * SPILL_SECONDS);
    }

    /// Sets the level read at `at_ms` (from a checkpoint), at most the
    /// capacity, plus the refill from then to `now_ms`: what the capacity
    /// turns away of it is kept for the reports of that time, still to be
    /// charged (the nodes admitted meanwhile on that refill, second by
    /// second). A non-finite level is ignored.
    pub fn restore(&mut self, level: f64, at_ms: i64, now_ms: i64) {
        if level.is_finite() {
            let away = (now_ms - at_ms).max(0) as f64 / 1000.0;
            self.level = level.min(self.capacity);
            self.spilled = 0.0;
            self.gain(self.rate * away);
            self.updated_ms = now_ms.max(at_ms);
        }
    }

    fn refill(&mut self, now_ms: i64) {
        // A clock that steps back adds nothing and does not move `updated_ms`
        // backwards, so the same interval is never credited twice.
        if now_ms > self.updated_ms {
            self.gain(self.rate * (now_ms - self.updated_ms) as f64 / 1000.0);
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
    fn what_is_turned_away_is_read_as_of_any_time() {
        // 100/s, 1 s of burst, starting with 100: full, so all refill
        // from then on is turned away; half of it below the capacity.
        let mut b = Bucket::new(100.0, 1.0, 0);
        assert_eq!(b.spilled_at(3_000), 300.0);
        b.consume(150, 0);
        assert_eq!(b.spilled_at(3_000), 150.0);
        assert_eq!(b.level_at(3_000), 100.0);
        // Read without being recorded; at most SPILL_SECONDS of rate.
        assert_eq!(b.spilled(), 0.0);
        assert_eq!(b.spilled_at(600_000), 100.0 * SPILL_SECONDS);
    }

    #[test]
    fn a_proxys_batch_takes_the_spilled_refill_then_goes_into_debt() {
        // 100/s, 1 s of burst, full from the start; 6 s with nothing
        // charged: 600 of refill turned away.
        let mut b = Bucket::new(100.0, 1.0, 0);
        assert_eq!(b.level(6_000), 100.0);
        assert_eq!(b.spilled(), 600.0);
        // The proxy's 6 s at 125 a second: the refill it spent, then 150
        // of the level, into debt (a late gap's report would stop at 0).
        b.consume_batched(750, 6_000, b.floor(2.0), 0);
        assert_eq!((b.level(6_000), b.spilled()), (-50.0, 0.0));
        b.consume_batched(500, 6_000, b.floor(2.0), 0);
        assert_eq!(b.level(6_000), -200.0, "no deeper than the floor");
    }

    #[test]
    fn a_proxys_batch_takes_only_the_refill_spilled_since_its_slots() {
        // Full and idle for 60 s: 5,900 turned away. The proxy's 5 s from
        // 55 s on, 150 a second: 500 of it paid by their refill, 250 by
        // the level; what spilled before was no one's use.
        let mut b = Bucket::new(100.0, 1.0, 0);
        b.consume_batched(750, 60_000, b.floor(f64::INFINITY), 55_000);
        assert_eq!((b.level(60_000), b.spilled()), (-150.0, 0.0));
    }

    #[test]
    fn a_gap_costs_what_was_admitted_less_its_refill() {
        // 100/s, 2 s of burst; checkpointed at 1 s with 20 left, restored
        // at 6 s: 5 s of refill, of which the capacity keeps 180.
        let mut b = Bucket::new(100.0, 2.0, 0);
        b.restore(20.0, 1_000, 6_000);
        assert_eq!(b.level(6_000), 200.0);
        assert_eq!(b.spilled(), 320.0);
        // The gap's reports, 100 a second: back where it stood.
        b.consume_late(500, 6_000, b.floor(2.0));
        assert_eq!(b.level(6_000), 20.0);
        assert_eq!(b.spilled(), 0.0);
        // More than the gap's refill and the level: no debt is left to
        // repay at once.
        b.consume_late(60, 6_000, b.floor(2.0));
        assert_eq!(b.level(6_000), 0.0);
        // On time, a report is charged to the level alone.
        let mut on_time = Bucket::new(100.0, 2.0, 0);
        assert_eq!(on_time.level(10_000), 200.0);
        on_time.consume(150, 10_000);
        assert_eq!(on_time.level(10_000), 50.0);
        assert_eq!(on_time.spilled(), 900.0, "the 9 s the capacity turned away");
        assert_eq!(on_time.level(100_000), 200.0);
        assert_eq!(
            on_time.spilled(),
            100.0 * SPILL_SECONDS,
            "kept, at most a minute"
        );
    }

    /// What a full bucket turned away while its user was idle pays for no
    /// later gap: a steady charge drops it, and the late reports of a gap
    /// after that take only the gap's own refill.
    #[test]
    fn a_steady_charge_drops_the_refill_an_idle_full_bucket_turned_away() {
        let mut b = Bucket::new(100.0, 2.0, 0);
        assert_eq!(b.level(10_000), 200.0);
        assert_eq!(b.spilled(), 900.0, "idle and full for 9 s");
        b.consume_steady(200, 10_000, b.floor(2.0));
        assert_eq!((b.level(10_000), b.spilled()), (0.0, 0.0));
        // Charged steadily while not full: nothing spills.
        b.consume_steady(100, 11_000, b.floor(2.0));
        assert_eq!((b.level(11_000), b.spilled()), (0.0, 0.0));
        // A gap of 5 s: 500 of refill, 300 of it turned away; the late
        // reports of 500 leave the bucket where it was before the gap.
        assert_eq!(b.level(16_000), 200.0);
        b.consume_late(500, 16_000, b.floor(2.0));
        assert_eq!((b.level(16_000), b.spilled()), (0.0, 0.0));
        // Without the steady charge the idle spill would have paid for
        // the gap, leaving the bucket full.
        let mut kept = Bucket::new(100.0, 2.0, 0);
        kept.consume_down_to(200, 10_000, kept.floor(2.0));
        kept.consume_down_to(100, 11_000, kept.floor(2.0));
        kept.consume_late(500, 16_000, kept.floor(2.0));
        assert_eq!(kept.level(16_000), 200.0);
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
                prop_assert!(b.spilled() <= rate * SPILL_SECONDS + 1e-6);
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
