//! [`TokioClock`]: a [`Clock`] that reads tokio's time, for tests that
//! pause it.

use throttle_clock::{Clock, SystemClock};
use tokio::time::Instant;

/// Unix time in milliseconds as tokio's clock moves: the system time when
/// made, plus what tokio's [`Instant`] has advanced since. Under
/// `tokio::time::pause()` it stands still until the test (or an idle
/// runtime) advances it, so limits reading it ([`LocalLimit::clock`],
/// [`SlotStoreBuilder::clock`]) follow the test's time exactly.
///
/// [`LocalLimit::clock`]: crate::local::LocalLimit::clock
/// [`SlotStoreBuilder::clock`]: crate::store::SlotStoreBuilder::clock
#[derive(Debug, Clone, Copy)]
pub struct TokioClock {
    unix_ms: i64,
    start: Instant,
}

impl TokioClock {
    /// A clock reading the system time now, moving as tokio's does.
    pub fn new() -> Self {
        Self {
            unix_ms: SystemClock.now_ms(),
            start: Instant::now(),
        }
    }
}

impl Default for TokioClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for TokioClock {
    fn now_ms(&self) -> i64 {
        let ms = i64::try_from(self.start.elapsed().as_millis()).unwrap_or(i64::MAX);
        self.unix_ms.saturating_add(ms)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn it_moves_only_as_tokio_time_does() {
        let clock = TokioClock::new();
        let t0 = clock.now_ms();
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(clock.now_ms(), t0, "paused");
        tokio::time::advance(Duration::from_millis(250)).await;
        assert_eq!(clock.now_ms(), t0 + 250);
    }
}
