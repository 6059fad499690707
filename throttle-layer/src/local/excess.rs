//! nginx `limit_req`'s arithmetic, for one key: a leaky bucket of
//! "excess" requests, in thousandths of a request.

/// What `limit_req` decides for one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Pass now.
    Pass,
    /// Pass after this many milliseconds.
    Delay(u64),
    /// Past the burst: refuse.
    Reject,
}

/// How a limit paces requests, in `limit_req`'s units: its rate, burst and delay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pace {
    /// Requests per 1,000 seconds (`10r/s` is 10,000; `6r/m` is 100).
    pub rate: u64,
    /// Excess allowed, in thousandths of a request (`burst=5` is 5,000).
    pub burst: u64,
    /// Excess passed at once, in thousandths (`delay=2` is 2,000;
    /// `nodelay` is the burst); past it requests are held.
    pub delay: u64,
}

/// One key's state: how far past the rate it is, and since when.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Excess {
    /// Thousandths of a request above the rate.
    milli: u64,
    /// When it was last accounted, in ms.
    last_ms: u64,
}

impl Excess {
    /// A key met for the first time, with its first request at `now_ms`:
    /// as nginx, that request passes and leaves no excess.
    pub fn first(now_ms: u64) -> Self {
        Self {
            milli: 0,
            last_ms: now_ms,
        }
    }

    /// Accounts one request at `now_ms`: the excess drains at the rate
    /// since the last one and grows by one request; past the burst the
    /// request is refused (and the state left as it was), past `delay` it
    /// waits until the excess above `delay` has drained.
    pub fn account(&mut self, shape: Pace, now_ms: u64) -> Verdict {
        let excess = self
            .milli
            .saturating_sub(self.drained(shape, now_ms))
            .saturating_add(1000);
        if excess > shape.burst {
            return Verdict::Reject;
        }
        self.milli = excess;
        self.last_ms = now_ms.max(self.last_ms);
        if excess <= shape.delay || shape.rate == 0 {
            return Verdict::Pass;
        }
        Verdict::Delay((excess - shape.delay).saturating_mul(1000) / shape.rate)
    }

    /// Takes back one request accounted (a later limit refused it).
    pub fn refund(&mut self) {
        self.milli = self.milli.saturating_sub(1000);
    }

    /// Whether the excess has drained by `now_ms`: the key holds nothing
    /// a new one would not.
    pub fn is_idle(&self, shape: Pace, now_ms: u64) -> bool {
        self.drained(shape, now_ms) >= self.milli
    }

    /// Thousandths of a request the rate has drained since the last one.
    fn drained(&self, shape: Pace, now_ms: u64) -> u64 {
        let elapsed = now_ms.saturating_sub(self.last_ms);
        shape.rate.saturating_mul(elapsed) / 1000
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn shape(rate: u64, burst: u64, delay: Option<u64>) -> Pace {
        Pace {
            rate: rate * 1000,
            burst: burst * 1000,
            delay: delay.unwrap_or(burst) * 1000,
        }
    }

    #[test]
    fn nodelay_passes_the_burst_and_one_then_refuses() {
        let s = shape(10, 5, None);
        let mut e = Excess::first(0);
        // The first request made the state; 99 more at the same instant.
        let verdicts: Vec<Verdict> = (1..100).map(|_| e.account(s, 0)).collect();
        assert_eq!(verdicts.iter().filter(|v| **v == Verdict::Pass).count(), 5);
        assert!(verdicts[5..].iter().all(|v| *v == Verdict::Reject));
        // 100 ms later, one request's worth has drained.
        assert_eq!(e.account(s, 100), Verdict::Pass);
        assert_eq!(e.account(s, 100), Verdict::Reject);
    }

    #[test]
    fn delay_holds_the_requests_past_it_by_their_place_in_the_queue() {
        let s = shape(10, 5, Some(2));
        let mut e = Excess::first(0);
        let verdicts: Vec<Verdict> = (1..100).map(|_| e.account(s, 0)).collect();
        use Verdict::*;
        assert_eq!(
            verdicts[..6],
            [Pass, Pass, Delay(100), Delay(200), Delay(300), Reject]
        );
        assert!(verdicts[5..].iter().all(|v| *v == Reject));
    }

    proptest! {
        /// Over any arrivals, what passes never exceeds the burst plus the
        /// rate times the time (plus the first request), and a refusal
        /// leaves the state unchanged.
        #[test]
        fn passes_stay_within_rate_and_burst(
            rate in 1u64..100,
            burst in 0u64..20,
            gaps in prop::collection::vec(0u64..200, 1..300),
        ) {
            let s = shape(rate, burst, None);
            let mut e = Excess::first(0);
            let (mut now, mut passed) = (0u64, 1u64);
            for gap in gaps {
                now += gap;
                let before = e;
                match e.account(s, now) {
                    Verdict::Reject => prop_assert_eq!(e, before),
                    _ => passed += 1,
                }
                prop_assert!(passed <= 1 + burst + rate * now / 1000 + 1);
            }
        }
    }
}
