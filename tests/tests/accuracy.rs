//! The accuracy targets, asserted on the simulator with the default
//! policy. Deterministic: the scenarios are seeded and run in virtual time.

use throttle_core::policy::{Classic, Projected};
use throttle_layer::Fallback;
use throttle_tests::hierarchy;
use throttle_tests::sim::{self, Outcome};

fn projected(prefix: &str) -> Outcome {
    sim::run(
        &sim::scenario(prefix),
        Box::new(|_| Box::new(Projected::new())),
    )
}

fn within_2_percent(o: &Outcome) {
    assert!(
        o.window_min >= 0.98 && o.window_max <= 1.02,
        "every 10 s window within 98%..102%: {o:?}"
    );
}

#[test]
fn steady_even_load_holds_the_limit() {
    let o = projected("1 ");
    within_2_percent(&o);
}

#[test]
fn skewed_load_holds_the_limit_and_uses_it() {
    let o = projected("2 ");
    within_2_percent(&o);
    assert!(o.utilization >= 0.98, "{o:?}");
}

#[test]
fn a_moving_hot_node_reconverges_within_three_slots() {
    let o = projected("3 ");
    assert!(o.reconverge_slots <= 3, "{o:?}");
    within_2_percent(&o);
}

#[test]
fn light_users_are_never_refused_beside_a_heavy_one() {
    let o = projected("5 ");
    assert_eq!(o.others_refused, 0, "{o:?}");
    within_2_percent(&o);
}

#[test]
fn light_users_arriving_at_new_nodes_are_never_refused() {
    let o = projected("10 ");
    assert_eq!(o.others_refused, 0, "{o:?}");
    within_2_percent(&o);
}

#[test]
fn envoy_proxies_beside_a_node_hold_the_limit_whatever_the_burst() {
    // Two proxies that report every 5 s and a node of the library: with
    // the default burst, and with a burst shorter than the proxies'
    // reports (their usage is charged to the refill the bucket turned
    // away meanwhile, or the budget would read as spent).
    for prefix in ["24 ", "26 "] {
        let o = projected(prefix);
        within_2_percent(&o);
        assert_eq!(o.others_refused, 0, "{prefix}: {o:?}");
    }
}

#[test]
fn a_load_moved_between_envoy_proxies_is_followed_within_15_s() {
    // Every 5 s window from 15 s after the move within 90%..110%.
    let s = sim::scenario("25 ");
    let trace = sim::run_traced(&s, Box::new(|_| Box::new(Projected::new())));
    let (limit, moved) = (s.users[0].limit, (s.shifts[0] / 1_000) as usize);
    let admitted = &trace.admitted[0];
    let windows: Vec<f64> = admitted[moved + 15..]
        .windows(5)
        .map(|w| w.iter().sum::<i64>() as f64 / (5.0 * limit))
        .collect();
    assert!(
        windows.iter().all(|w| (0.9..=1.1).contains(w)),
        "{windows:?} of {admitted:?}"
    );
    assert_eq!(trace.outcome.others_refused, 0, "{:?}", trace.outcome);
}

#[test]
fn a_user_idle_on_envoy_proxies_then_busy_stays_within_its_bucket() {
    // 20 s idle on two proxies, then 3x on both with a burst of one
    // second: from then on, no 5 s holds more than the bucket allows
    // (its capacity and 5 s of rate: 120%), and from 10 s on, 90%..110%.
    let s = sim::scenario("27 ");
    let trace = sim::run_traced(&s, Box::new(|_| Box::new(Projected::new())));
    let limit = s.users[0].limit;
    let admitted = &trace.admitted[0];
    let window = |from: usize| admitted[from..from + 5].iter().sum::<i64>() as f64 / (5.0 * limit);
    let windows: Vec<f64> = (30..admitted.len() - 4).map(window).collect();
    assert!(
        windows.iter().all(|w| *w <= 1.2),
        "{windows:?} of {admitted:?}"
    );
    assert!(
        windows[10..].iter().all(|w| (0.9..=1.1).contains(w)),
        "{windows:?} of {admitted:?}"
    );
    assert_eq!(trace.outcome.others_refused, 0, "{:?}", trace.outcome);
}

#[test]
fn envoy_proxies_back_on_a_restarted_central_get_no_burst() {
    // Two proxies at 2x, the central restarted on its checkpoint after
    // 20 s; back at their next report (40 s in), in the 10 s from 2 s
    // after: the limit, and no more than a tenth over it (the refill kept
    // over the outage would give 1.45x).
    let s = sim::scenario("28 ");
    let trace = sim::run_traced(&s, Box::new(|_| Box::new(Projected::new())));
    let admitted = &trace.admitted[0];
    let after: i64 = admitted[42..52].iter().sum();
    let of_limit = after as f64 / (10.0 * s.users[0].limit);
    assert!(
        (0.75..=1.1).contains(&of_limit),
        "{of_limit} of {admitted:?}"
    );
}

#[test]
fn reports_spread_over_the_slot_still_hold_the_limit() {
    // The current slot is re-assigned only once the last node has
    // reported, so a moving load is followed a slot later than with
    // reports at once (2 slots in scenario 3), still within the target.
    let o = projected("11 ");
    assert!(o.reconverge_slots <= 3, "{o:?}");
    within_2_percent(&o);
    let o = projected("12 ");
    within_2_percent(&o);
}

#[test]
fn a_burst_after_idle_stays_within_the_bucket() {
    // 10 s of refill plus a full bucket of 10 s: at most 200% in a window.
    let o = projected("4 ");
    assert!(o.window_max <= 2.0, "{o:?}");
    assert!(o.window_min >= 0.98, "{o:?}");
}

#[test]
fn nodes_joining_and_leaving_and_hundreds_of_nodes() {
    let o = projected("6 ");
    within_2_percent(&o);
    let o = projected("9 ");
    within_2_percent(&o);
}

#[test]
fn the_simulator_is_deterministic_and_tells_policies_apart() {
    let a = projected("2 ");
    let b = projected("2 ");
    assert_eq!(a, b, "same seed, same outcome");
    let classic = sim::run(&sim::scenario("2 "), Box::new(|_| Box::new(Classic::new())));
    // The original algorithm's known overshoot: whole bucket offered each slot.
    assert!(classic.worst_slot > 2.0, "{classic:?}");
}

#[test]
fn every_user_under_one_rule_holds_the_heavy_ones() {
    // Scenario 13 with 1,000 light users instead of 100,000 (the accuracy
    // program runs those, in a release build).
    let s = sim::every_user("13 (1,000 light)", 1_000);
    let o = sim::run(&s, Box::new(|_| Box::new(Projected::new())));
    within_2_percent(&o);
    assert_eq!(o.others_refused, 0, "light users are never refused: {o:?}");
}

fn within(o: &hierarchy::AppsOutcome, low: f64, high: f64) {
    assert!(
        o.total_min >= low && o.total_max <= high,
        "every 10 s window of the total within {low}..{high} of the capacity: {o:?}"
    );
}

#[test]
fn applications_get_their_guarantees_and_the_lowest_priority_is_cut_first() {
    // Guarantees of 3 x 300 in a capacity of 1,000, each wanting 600:
    // gold (priority 0) gets the 100 left, the others their guarantee.
    let o = hierarchy::run(&hierarchy::named("A1"));
    within(&o, 0.98, 1.02);
    assert!(o.app_min[0] >= 1.3 && o.app_min[1] >= 0.98, "{o:?}");
    assert!((0.98..1.02).contains(&o.app_min[2]), "{o:?}");
    // Guarantees past a capacity of 800: bronze (priority 2) is cut.
    let o = hierarchy::run(&hierarchy::named("A2"));
    within(&o, 0.98, 1.02);
    assert!(o.app_min[0] >= 0.98 && o.app_min[1] >= 0.98, "{o:?}");
    assert!(o.app_mean[2] <= 0.7 * 300.0, "{o:?}");
}

#[test]
fn an_idle_application_lends_its_share_within_three_slots() {
    let o = hierarchy::run(&hierarchy::named("A3"));
    assert!(o.lend_slots.is_some_and(|n| n <= 3), "{o:?}");
    assert!(o.lent_utilization.is_some_and(|u| u >= 0.98), "{o:?}");
    assert!(o.total_max <= 1.02, "{o:?}");
}

#[test]
fn a_burst_above_the_guarantee_ends_after_its_seconds() {
    let o = hierarchy::run(&hierarchy::named("A4"));
    assert!((19..=21).contains(&o.burst_slots), "20 s of burst: {o:?}");
    assert!(
        o.app_min.iter().all(|m| (0.98..=1.02).contains(m)),
        "then the guarantee: {o:?}"
    );
}

#[test]
fn every_slot_stays_near_the_limit_through_an_outage() {
    // Killed and back 5 s later; a standby taking over 2.3 s after the
    // kill; the nodes cut off from a central that leads on; a central
    // back without its state; the last two with the nodes back one by
    // one, in a random order. The nodes keep their last quotas meanwhile
    // (the default fallback) and the central grants once their reports
    // are back.
    for prefix in ["14 ", "15 ", "16 ", "17 ", "21 ", "22 "] {
        let o = projected(prefix);
        let around = o.outage.expect("an outage scenario");
        assert!(
            (0.98..=1.02).contains(&around.window),
            "{prefix}: the 30 s around: {around:?}"
        );
        assert!(
            around.lowest_slot >= 0.9 && around.highest_slot <= 1.1,
            "{prefix}: every slot within 10%: {around:?}"
        );
    }
}

#[test]
fn a_central_without_state_is_not_spent_by_the_first_node_back() {
    // Nodes back one by one to a central that knows none of them: it
    // holds for them, so the first back is not granted buckets the
    // others' kept reports then empty (31% and 128% slots before).
    let o = projected("23 ");
    let around = o.outage.expect("an outage scenario");
    assert!(
        (0.95..=1.05).contains(&around.window),
        "the 30 s around: {around:?}"
    );
    assert!(
        around.lowest_slot >= 0.5 && around.highest_slot <= 1.1,
        "{around:?}"
    );
}

#[test]
fn failing_open_through_an_outage_bursts_then_starves() {
    // The original fallback, for contrast: 3x the limit while the central
    // is away, then refused while the debt drains.
    let mut s = sim::scenario("14 ");
    s.fallback = Fallback::Allow;
    let o = sim::run(&s, Box::new(|_| Box::new(Projected::new())));
    let around = o.outage.expect("an outage scenario");
    assert!(around.highest_slot > 2.5, "{around:?}");
    assert!(around.lowest_slot < 0.01, "{around:?}");
}

/// Users new to every node, all at once, at 3x the `*` rate: told the
/// default quota, each node holds them to its share from their first
/// request; without it they get twice the rate in their first slot.
#[test]
fn newcomers_are_held_to_the_every_user_rate_from_their_first_slot() {
    let run = |told| {
        let scenario = sim::newcomers("newcomers", told);
        let trace = sim::run_traced(&scenario, Box::new(|_| Box::new(Projected::new())));
        within_2_percent(&trace.outcome);
        sim::FirstSlots::of(&scenario, &trace)
    };
    let told = run(true);
    assert!(told.worst <= 1.05, "{told:?}");
    let untold = run(false);
    assert!(untold.mean >= 1.5, "the control: {untold:?}");
}
