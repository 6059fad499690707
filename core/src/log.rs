//! Log helpers: names from outside cut short, lines rate-limited.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use throttle_clock::{Clock, SystemClock};

/// At most the first 80 bytes of `s`, for a log line about a name from
/// outside.
pub fn truncate(s: &str) -> &str {
    let mut end = s.len().min(80);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Lets a kind of log line through at most once a second, and says how
/// many were left out in between: a flood of bad input must not become a
/// flood of log lines.
#[derive(Debug)]
pub struct Throttled {
    next_ms: AtomicI64,
    skipped: AtomicU64,
}

impl Default for Throttled {
    fn default() -> Self {
        Self::new()
    }
}

impl Throttled {
    /// A kind of line none of which went out yet.
    pub const fn new() -> Self {
        Self {
            next_ms: AtomicI64::new(i64::MIN),
            skipped: AtomicU64::new(0),
        }
    }

    /// [`Throttled::allow`] at the system clock's now.
    pub fn allow_now(&self) -> Option<u64> {
        self.allow(SystemClock.now_ms())
    }

    /// `Some(lines left out since the last one)` when a line may go out at
    /// `now_ms`, else `None` (and this one is counted as left out).
    pub fn allow(&self, now_ms: i64) -> Option<u64> {
        let next = self.next_ms.load(Ordering::Relaxed);
        let due = now_ms >= next
            && self
                .next_ms
                .compare_exchange(
                    next,
                    now_ms.saturating_add(1000),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok();
        if due {
            Some(self.skipped.swap(0, Ordering::Relaxed))
        } else {
            self.skipped.fetch_add(1, Ordering::Relaxed);
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_a_second_with_the_count_left_out() {
        let t = Throttled::new();
        assert_eq!(t.allow(10_000), Some(0));
        assert_eq!(t.allow(10_100), None);
        assert_eq!(t.allow(10_999), None);
        assert_eq!(t.allow(11_000), Some(2));
        assert_eq!(t.allow(11_000), None);
    }
}
