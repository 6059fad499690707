//! How long an application may still run above its guarantee.

/// An application's burst allowance for one resource, in seconds: spent
/// while it is served above its guarantee, earned back second for
/// second while its demand is below it, never above its
/// `burst_seconds`.
///
/// A slot may be assigned again (when every node has reported the one
/// before it); the allowance then counts the slot once, from the level
/// it had when the slot was first assigned.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BurstAllowance {
    /// The level at the start of `slot`.
    before: f64,
    /// The level after `slot`.
    after: f64,
    /// The newest slot counted.
    slot: i64,
}

impl BurstAllowance {
    /// A full allowance of `seconds`.
    pub fn full(seconds: f64) -> Self {
        Self {
            before: seconds,
            after: seconds,
            slot: i64::MIN,
        }
    }

    /// Seconds left as `slot` starts (no more than `max`).
    pub fn at(&mut self, slot: i64, max: f64) -> f64 {
        if slot > self.slot {
            self.before = self.after;
            self.slot = slot;
        }
        self.before.min(max)
    }

    /// Counts `slot` (of `slot_secs` seconds): spent if `above` the
    /// guarantee, earned if `below` it. An older slot changes nothing.
    pub fn count(&mut self, slot: i64, slot_secs: f64, above: bool, below: bool, max: f64) {
        if slot != self.slot {
            return;
        }
        let change = match (above, below) {
            (true, _) => -slot_secs,
            (false, true) => slot_secs,
            (false, false) => 0.0,
        };
        self.after = (self.before.min(max) + change).clamp(0.0, max);
    }
}

#[cfg(test)]
mod tests {
    use super::BurstAllowance;

    #[test]
    fn spent_above_earned_below_and_counted_once_per_slot() {
        let mut a = BurstAllowance::full(3.0);
        for slot in 0..5 {
            assert!(a.at(slot, 3.0) >= 0.0);
            a.count(slot, 1.0, true, false, 3.0);
            // The slot assigned again: counted once.
            a.at(slot, 3.0);
            a.count(slot, 1.0, true, false, 3.0);
        }
        assert_eq!(a.at(5, 3.0), 0.0);
        a.count(5, 1.0, false, true, 3.0);
        assert_eq!(a.at(6, 3.0), 1.0);
        a.count(6, 1.0, false, false, 3.0);
        assert_eq!(a.at(7, 3.0), 1.0, "at its guarantee: neither");
        a.count(3, 1.0, false, true, 3.0);
        assert_eq!(a.at(7, 3.0), 1.0, "an older slot changes nothing");
        assert_eq!(a.at(8, 0.5), 0.5, "a shorter burst_seconds caps it");
    }
}
