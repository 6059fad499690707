//! What a group's users took beyond its grants, paid back from the
//! grants after.

use std::collections::VecDeque;

/// The part of the debt cut from each slot's grant. The debt is measured
/// two slots after the grant it is of, so a full cut would swing for
/// ever; a quarter settles in a few slots, with no swing.
const GAIN: f64 = 0.25;

/// Slots of grants kept to compare consumption with.
const KEPT: usize = 4;

/// An application's (or the users in none's) grants of one resource,
/// compared with what its users consumed.
///
/// Nodes admit up to their quota, rounding up to whole requests, and a
/// user without a quota yet is allowed: a group at its grant consumes
/// a little more than it. The debt is what it consumed beyond its
/// grants (never below zero: using less earns nothing), and each grant
/// is cut by a part of it, so what the group consumes settles at its
/// grant.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Overshoot {
    /// (slot, what the group was granted), the newest last.
    granted: VecDeque<(i64, f64)>,
    debt: f64,
    /// The newest data slot counted.
    counted: i64,
}

impl Overshoot {
    /// Records that the group was meant to get `amount` for `slot` (its
    /// grant before the cut), replacing an earlier one of that slot.
    pub fn granted(&mut self, slot: i64, amount: f64) {
        self.granted.retain(|(s, _)| *s != slot);
        let at = self.granted.partition_point(|(s, _)| *s < slot);
        self.granted.insert(at, (slot, amount));
        while self.granted.len() > KEPT {
            self.granted.pop_front();
        }
    }

    /// Whether data slot `slot` is yet to be counted.
    pub fn wants(&self, slot: i64) -> bool {
        slot > self.counted
    }

    /// Counts what the group `consumed` in data slot `slot`, if it was
    /// granted for it and the slot is not counted yet.
    pub fn count(&mut self, slot: i64, consumed: f64) {
        if !self.wants(slot) {
            return;
        }
        let Some(&(_, granted)) = self.granted.iter().find(|(s, _)| *s == slot) else {
            return;
        };
        self.counted = slot;
        self.debt = (self.debt + consumed - granted).max(0.0);
    }

    /// What to cut from the next grant.
    pub fn cut(&self) -> f64 {
        GAIN * self.debt
    }
}

#[cfg(test)]
mod tests {
    use super::Overshoot;

    /// Nodes that admit 6 past whatever they are granted, and a group
    /// granted 300 less the cut: its consumption settles at 300.
    #[test]
    fn a_steady_overshoot_is_cut_until_consumption_meets_the_grant() {
        let mut o = Overshoot::default();
        let mut consumed = Vec::new();
        for slot in 0..30 {
            if slot >= 2 {
                o.count(slot - 2, consumed[slot as usize - 2]);
            }
            o.granted(slot, 300.0);
            consumed.push(300.0 - o.cut() + 6.0);
        }
        let last = consumed[29];
        assert!((last - 300.0).abs() < 0.5, "{consumed:?}");
        let most = consumed.iter().copied().fold(0.0, f64::max);
        assert!(
            most <= 306.0,
            "no swing above the first overshoot: {consumed:?}"
        );
    }

    #[test]
    fn using_less_earns_nothing_and_slots_count_once() {
        let mut o = Overshoot::default();
        o.granted(1, 100.0);
        o.count(1, 50.0);
        assert_eq!(o.cut(), 0.0);
        o.granted(2, 100.0);
        o.count(2, 140.0);
        o.count(2, 140.0);
        assert_eq!(o.cut(), 10.0);
        o.count(3, 500.0);
        assert_eq!(o.cut(), 10.0, "never granted slot 3: not counted");
    }
}
