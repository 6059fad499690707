//! [`Level`]: one bucket's tokens, and the arithmetic every store runs
//! (the Redis script is its transcription), sans IO: time is given in
//! microseconds.

use std::time::Duration;

use super::shape::Shape;

/// Why tokens were not taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// Not enough now: this long until there are.
    For(Duration),
    /// More than the bucket ever holds: no wait is enough.
    TooMany,
    /// The key is on its service's block list.
    Blocked,
    /// The store could not be asked (Redis unreachable or too slow) and
    /// its fallback is to deny.
    Unavailable,
}

/// One bucket's tokens as of a fill tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Level {
    /// Tokens after the fill of tick `tick`.
    tokens: u64,
    /// Fill intervals since the Unix epoch (or the clock's origin).
    tick: u64,
}

impl Level {
    /// A bucket first met at `now_us`: full.
    pub fn full(shape: &Shape, now_us: u64) -> Self {
        Self {
            tokens: shape.capacity_tokens(),
            tick: now_us / shape.interval_us(),
        }
    }

    /// A level as a store kept it.
    pub fn from_parts(tokens: u64, tick: u64) -> Self {
        Self { tokens, tick }
    }

    /// Tokens, and the tick they are counted at.
    pub fn parts(&self) -> (u64, u64) {
        (self.tokens, self.tick)
    }

    /// The level at `now_us`: `quantum` more for every tick passed, up to
    /// the capacity (and never more than it, whatever was stored). A clock
    /// that went back adds nothing.
    pub fn at(&self, shape: &Shape, now_us: u64) -> Self {
        let tick = (now_us / shape.interval_us()).max(self.tick);
        let fill = (tick - self.tick).saturating_mul(shape.quantum());
        Self {
            tokens: self
                .tokens
                .saturating_add(fill)
                .min(shape.capacity_tokens()),
            tick,
        }
    }

    /// Tokens available at `now_us`.
    pub fn available(&self, shape: &Shape, now_us: u64) -> u64 {
        self.at(shape, now_us).tokens
    }

    /// Takes `n` tokens at `now_us` if there are; else says how long
    /// until there will be, and takes nothing.
    pub fn take(&mut self, shape: &Shape, now_us: u64, n: u64) -> Result<(), Wait> {
        if n > shape.capacity_tokens() {
            return Err(Wait::TooMany);
        }
        *self = self.at(shape, now_us);
        if self.tokens >= n {
            self.tokens -= n;
            return Ok(());
        }
        let ticks = (n - self.tokens).div_ceil(shape.quantum());
        let ready_us = (self.tick + ticks).saturating_mul(shape.interval_us());
        Err(Wait::For(Duration::from_micros(
            ready_us.saturating_sub(now_us),
        )))
    }

    /// Puts back `n` tokens taken (what they were taken for did not
    /// happen), up to the capacity.
    pub fn give_back(&mut self, shape: &Shape, n: u64) {
        self.tokens = self.tokens.saturating_add(n).min(shape.capacity_tokens());
    }

    /// When the bucket, left alone, is full again (µs): from then on it
    /// holds nothing a new one would not, and may be forgotten (the Redis
    /// script's `f`, its key's expiry).
    pub fn full_at_us(&self, shape: &Shape) -> u64 {
        let missing = shape.capacity_tokens().saturating_sub(self.tokens);
        let ticks = missing.div_ceil(shape.quantum());
        self.tick
            .saturating_add(ticks)
            .saturating_mul(shape.interval_us())
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// The reference model: the bucket stepped one fill at a time.
    #[derive(Debug)]
    struct Model {
        shape: Shape,
        tokens: u64,
        tick: u64,
    }

    impl Model {
        fn advance(&mut self, now_us: u64) {
            while (self.tick + 1) * self.shape.interval_us() <= now_us {
                self.tick += 1;
                self.tokens =
                    (self.tokens + self.shape.quantum()).min(self.shape.capacity_tokens());
            }
        }

        fn take(&mut self, now_us: u64, n: u64) -> bool {
            self.advance(now_us);
            let ok = n <= self.tokens;
            if ok {
                self.tokens -= n;
            }
            ok
        }
    }

    fn shapes() -> impl Strategy<Value = Shape> {
        (1u64..50, 1u64..10, 1_000u64..50_000)
            .prop_map(|(c, q, i)| Shape::new(c, q, Duration::from_micros(i)).unwrap())
    }

    proptest! {
        #[test]
        fn matches_the_stepped_model(
            shape in shapes(),
            start in 0u64..1_000_000_000,
            ops in prop::collection::vec((0u64..200_000, 0u64..60), 1..60),
        ) {
            let mut level = Level::full(&shape, start);
            let mut model = Model { shape, tokens: shape.capacity_tokens(), tick: start / shape.interval_us() };
            let mut now = start;
            for (dt, n) in ops {
                now += dt;
                let got = level.take(&shape, now, n);
                prop_assert_eq!(got.is_ok(), model.take(now, n));
                prop_assert_eq!(level.available(&shape, now), model.tokens);
                prop_assert!(model.tokens <= shape.capacity_tokens());
                // Full again at `full_at_us`, and not a microsecond before.
                let full = level.full_at_us(&shape);
                let cap = shape.capacity_tokens();
                prop_assert_eq!(level.available(&shape, full.max(now)), cap);
                prop_assert!(full <= now || level.available(&shape, full - 1) < cap);
                if n > shape.capacity_tokens() {
                    prop_assert_eq!(got, Err(Wait::TooMany));
                }
                if let Err(Wait::For(wait)) = got {
                    // The stated wait is enough, and not a tick more.
                    let ready = now + u64::try_from(wait.as_micros()).unwrap();
                    let mut early = level;
                    prop_assert!(wait.is_zero() || early.take(&shape, ready - 1, n).is_err());
                    let mut after = level;
                    prop_assert_eq!(after.take(&shape, ready, n), Ok(()));
                }
            }
        }

        #[test]
        fn no_more_than_the_capacity_and_a_quantum_a_tick_pass(
            shape in shapes(),
            ticks in 1u64..100,
        ) {
            // Asking every microsecond for one token over `ticks` fills
            // gets the capacity plus one quantum a fill (no more than the
            // capacity holds), no more.
            let mut level = Level::full(&shape, 0);
            let end = ticks * shape.interval_us();
            let mut taken = 0;
            let mut now = 0;
            while now < end {
                match level.take(&shape, now, 1) {
                    Ok(()) => taken += 1,
                    Err(Wait::For(w)) => now += u64::try_from(w.as_micros()).unwrap().max(1) - 1,
                    Err(other) => prop_assert!(false, "{other:?}"),
                }
                now += 1;
            }
            let per_fill = shape.quantum().min(shape.capacity_tokens());
            prop_assert_eq!(taken, shape.capacity_tokens() + (ticks - 1) * per_fill);
        }
    }

    #[test]
    fn rates_fill_as_their_names_say() {
        for (rate, per_minute) in [
            (1, false),
            (3, false),
            (50, false),
            (1500, false),
            (10, true),
        ] {
            let shape = if per_minute {
                Shape::per_minute(rate)
            } else {
                Shape::per_second(rate)
            };
            let period = if per_minute { 60_000_000 } else { 1_000_000 };
            let mut level = Level::from_parts(0, 0);
            let filled = level.at(&shape, period * 10).tokens;
            // Capacity one period's worth; ten periods fill it at least.
            assert_eq!(filled, shape.capacity_tokens(), "{rate}");
            level = Level::from_parts(0, 0);
            let one = level.at(&shape.capacity(u64::MAX), period).tokens;
            assert!(
                one.abs_diff(rate) * 1000 <= rate,
                "{rate}: {one} in a period"
            );
        }
    }
}
