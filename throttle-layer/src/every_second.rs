//! [`EverySecond`]: a repeated event's log line, at most once a second.

use std::sync::atomic::{AtomicU64, Ordering};

use throttle_clock::CoarseClock;

/// Opens at most once a second: what a flood repeats (refusals, a store
/// that is down) is logged once a second, not once an event.
#[derive(Debug)]
pub(crate) struct EverySecond {
    /// The second it last opened in.
    last: AtomicU64,
}

impl Default for EverySecond {
    fn default() -> Self {
        Self {
            last: AtomicU64::new(u64::MAX),
        }
    }
}

impl EverySecond {
    /// Whether `now_ms` is in a second it has not opened in yet (and
    /// now has).
    pub(crate) fn due_at(&self, now_ms: u64) -> bool {
        let second = now_ms / 1000;
        self.last.swap(second, Ordering::Relaxed) != second
    }

    /// [`EverySecond::due_at`] the kernel's coarse monotonic time: a few
    /// ns, so a flood of refusals does not pay for reading a precise clock.
    pub(crate) fn due(&self) -> bool {
        self.due_at(CoarseClock::monotonic_ms())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_once_in_each_second() {
        let gate = EverySecond::default();
        let opened: Vec<bool> = [0, 999, 1000, 1500, 3000].map(|ms| gate.due_at(ms)).into();
        assert_eq!(opened, [true, false, true, false, true]);
    }
}
