//! The capacity split's promises, for any applications.

use proptest::prelude::*;

use super::split::{Ask, Scratch, split};

fn ask(priority: u32, guaranteed: f64, ceiling: f64, demand: f64) -> Ask {
    Ask {
        priority,
        guaranteed,
        ceiling,
        demand,
    }
}

fn granted(capacity: f64, asks: &[Ask]) -> Vec<f64> {
    let shares = split(capacity, asks, &mut Scratch::default());
    shares.iter().map(|s| s.granted).collect()
}

#[test]
fn guarantees_first_then_bursts_by_priority() {
    // Capacity 1,000: guarantees 200 + 300 + 400 fit, 100 left for the
    // highest priority's burst.
    let asks = [
        ask(0, 200.0, 800.0, 400.0),
        ask(1, 300.0, 800.0, 600.0),
        ask(2, 400.0, 800.0, 800.0),
    ];
    assert_eq!(granted(1000.0, &asks), vec![300.0, 300.0, 400.0]);
}

#[test]
fn when_guarantees_do_not_fit_the_lowest_priority_is_cut() {
    let asks = [
        ask(0, 500.0, 500.0, 1000.0),
        ask(1, 400.0, 400.0, 1000.0),
        ask(2, 400.0, 400.0, 1000.0),
    ];
    assert_eq!(granted(1000.0, &asks), vec![500.0, 400.0, 100.0]);
    // One priority: cut in proportion to the guarantees.
    let asks = [ask(0, 600.0, 600.0, 900.0), ask(0, 900.0, 900.0, 900.0)];
    assert_eq!(granted(1000.0, &asks), vec![400.0, 600.0]);
}

#[test]
fn an_idle_application_lends_its_guarantee() {
    let asks = [ask(0, 500.0, 1000.0, 0.0), ask(1, 300.0, 1000.0, 900.0)];
    let shares = split(1000.0, &asks, &mut Scratch::default());
    assert_eq!(shares[1].served, 900.0, "the idle one's guarantee lent");
    assert_eq!(
        shares[0].granted, 100.0,
        "what is left kept as its headroom"
    );
}

#[test]
fn bursts_within_a_priority_follow_demand() {
    let asks = [ask(0, 0.0, 1000.0, 300.0), ask(0, 0.0, 1000.0, 900.0)];
    assert_eq!(granted(600.0, &asks), vec![150.0, 450.0]);
}

fn asks() -> impl Strategy<Value = Vec<Ask>> {
    prop::collection::vec(
        (0u32..3, 0.0f64..500.0, 0.0f64..1000.0, 0.0f64..1500.0)
            .prop_map(|(p, g, c, d)| ask(p, g, c.max(g), d)),
        1..8,
    )
}

proptest! {
    /// The grants never add up to more than the capacity, nobody gets
    /// more than its ceiling, and every application demanding at least its
    /// guarantee gets it when the guarantees fit.
    #[test]
    fn capacity_holds_and_fitting_guarantees_are_met(capacity in 0.0f64..3000.0, asks in asks()) {
        let shares = split(capacity, &asks, &mut Scratch::default());
        let total: f64 = shares.iter().map(|s| s.granted).sum();
        prop_assert!(total <= capacity * (1.0 + 1e-9) + 1e-9, "{} > {}", total, capacity);
        let guarantees: f64 = asks.iter().map(|a| a.guaranteed).sum();
        for (a, s) in asks.iter().zip(&shares) {
            prop_assert!(s.served <= s.granted + 1e-9);
            prop_assert!(s.granted <= a.ceiling.max(a.guaranteed) + 1e-6);
            prop_assert!(s.served <= a.demand + 1e-6);
            if guarantees <= capacity {
                prop_assert!(s.served >= a.guaranteed.min(a.demand) - 1e-6);
            }
        }
    }

    /// A lower priority is served beyond nothing while a higher one lacks
    /// part of its guarantee; capacity is lent: while any is left, every
    /// application is served its demand up to its ceiling.
    #[test]
    fn priorities_are_cut_lowest_first_and_nothing_is_kept_back(
        capacity in 0.0f64..3000.0,
        asks in asks(),
    ) {
        let shares = split(capacity, &asks, &mut Scratch::default());
        for (a, s) in asks.iter().zip(&shares) {
            let lacking = s.served < a.guaranteed.min(a.demand) - 1e-6;
            for (b, t) in asks.iter().zip(&shares) {
                if lacking && b.priority > a.priority {
                    prop_assert!(t.served <= 1e-6, "priority {} served while {} lacks", b.priority, a.priority);
                }
            }
        }
        let total: f64 = shares.iter().map(|s| s.granted).sum();
        if total < capacity - 1e-6 {
            for (a, s) in asks.iter().zip(&shares) {
                prop_assert!(s.served >= a.demand.min(a.ceiling) - 1e-6);
                prop_assert!(s.granted >= a.guaranteed - 1e-6);
            }
        }
    }
}
