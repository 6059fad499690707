//! Warnings said once: a central that stays unreachable would otherwise
//! log the same line at every retry.

use std::time::{Duration, Instant};

/// How often a warning that has not changed is said again.
const AGAIN_AFTER: Duration = Duration::from_secs(30);

/// The last warning let through, and when.
#[derive(Debug, Default)]
pub(super) struct Repeats {
    last: Option<(String, Instant)>,
}

impl Repeats {
    /// Whether `text` should be logged as a warning at `now`: it differs
    /// from the last one let through, or that was [`AGAIN_AFTER`] ago.
    pub(super) fn fresh(&mut self, text: &str, now: Instant) -> bool {
        let same = self.last.as_ref().is_some_and(|(last, at)| {
            last == text && now.saturating_duration_since(*at) < AGAIN_AFTER
        });
        if !same {
            self.last = Some((text.to_owned(), now));
        }
        !same
    }

    /// The trouble is over: the next warning is fresh.
    pub(super) fn clear(&mut self) {
        self.last = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repeated_warning_is_said_again_only_after_a_while() {
        let mut r = Repeats::default();
        let t = Instant::now();
        assert!(r.fresh("refused", t));
        assert!(!r.fresh("refused", t + Duration::from_secs(5)));
        assert!(r.fresh("timed out", t + Duration::from_secs(6)));
        assert!(!r.fresh("timed out", t + Duration::from_secs(35)));
        assert!(r.fresh("timed out", t + Duration::from_secs(37)));
        r.clear();
        assert!(r.fresh("timed out", t + Duration::from_secs(38)));
    }
}
