//! Collecting slots into reports, and forgetting idle users.

use super::*;

#[test]
fn collect_drains_the_slot_and_keeps_the_next() {
    let f = fixture();
    f.admit("alice", Fallback::Allow);
    f.clock.set(T + 1_010); // slot 101 before the reporter runs
    f.admit("alice", Fallback::Allow);
    f.admit("alice", Fallback::Allow);
    let r = f.store.collect(100);
    assert_eq!(r.slot_number, 101);
    assert_eq!(amount(&r.consumption, "alice", "requests"), 1);
    let r = f.store.collect(100);
    assert_eq!(
        amount(&r.consumption, "alice", "requests"),
        0,
        "collected once"
    );
    f.clock.set(T + 2_050);
    let r = f.store.collect(101);
    assert_eq!(amount(&r.consumption, "alice", "requests"), 2);
    assert!(r.rejection["front"].users.is_empty());
}

#[test]
fn counts_of_a_late_collection_are_not_lost() {
    let f = fixture();
    f.admit("alice", Fallback::Allow);
    f.clock.set(T + 1_000);
    f.admit("alice", Fallback::Allow);
    f.clock.set(T + 2_000);
    f.admit("alice", Fallback::Allow);
    // Reporter stalled for two slots: the first slot rolled into the overflow.
    let r = f.store.collect(101);
    assert_eq!(amount(&r.consumption, "alice", "requests"), 2);
    let r = f.store.collect(102);
    assert_eq!(amount(&r.consumption, "alice", "requests"), 1);
}

/// With nothing collecting (a store without a reporter), a user's
/// counts roll into the overflow every slot: they add to one entry per
/// user there, rather than one per user per slot without end, and the
/// first collection still reports every one of them.
#[test]
fn uncollected_slots_keep_one_overflow_entry_per_user() {
    let f = fixture();
    for slot in 0..1_000 {
        f.clock.set(T + slot * 1_000);
        f.admit("alice", Fallback::Allow);
        f.admit("bob", Fallback::Allow);
    }
    assert_eq!(f.front.overflow.lock().len(), 2);
    // Slot 1,099's counts are still in alice's cells; every earlier
    // slot's is in the overflow, and this collection takes both.
    let r = f.store.collect(100 + 999);
    assert_eq!(amount(&r.consumption, "alice", "requests"), 1_000);
    assert_eq!(amount(&r.consumption, "bob", "requests"), 1_000);
    assert!(f.front.overflow.lock().is_empty());
}

/// A request that read the clock in slot 100 and took the user's lock
/// only after slot 100 was collected (a thread preempted for longer
/// than the report delay, or a clock stepped back) charges slot 100
/// late: the next report carries it, and the next roll must not drop it.
#[test]
fn a_charge_after_its_slot_was_collected_is_reported_later() {
    let f = fixture();
    // alice's request at `ms` past slot 100's start.
    let admit_at = |ms| {
        f.clock.set(T + ms);
        f.admit("alice", Fallback::Allow);
    };
    // Slot `slot`'s report, collected at `ms`.
    let requests = |ms, slot| {
        f.clock.set(T + ms);
        amount(&f.store.collect(slot).consumption, "alice", "requests")
    };
    admit_at(0);
    assert_eq!(requests(1_050, 100), 1);
    // The late request, still in slot 100, then one in slot 101.
    admit_at(999);
    admit_at(1_100);
    assert_eq!(requests(2_050, 101), 2);
    // Late in the slot before the last one collected, rolled on over a
    // gap: also carried.
    admit_at(1_999);
    admit_at(4_000);
    assert_eq!(requests(5_050, 104), 2);
}

#[test]
fn every_service_is_in_the_report() {
    let f = fixture();
    f.store.service("storage");
    let r = f.store.collect(99);
    assert!(r.consumption.contains_key("storage") && r.rejection.contains_key("storage"));
    assert!(r.consumption.contains_key("front") && r.rejection.contains_key("front"));
}

#[test]
fn idle_users_are_forgotten() {
    let f = fixture();
    f.admit("alice", Fallback::Allow);
    assert_eq!(f.store.keys(), 1);
    f.clock.set(T + 1_000);
    f.store.collect(100);
    assert_eq!(f.store.keys(), 1, "seen in slot 100");
    f.clock.set(T + 2_000);
    f.store.collect(101);
    assert_eq!(f.store.keys(), 1);
    f.clock.set(T + 3_000);
    f.store.collect(102);
    assert_eq!(f.store.keys(), 0);
    assert_eq!(f.front.users(), 0);
    // A forgotten user comes back as new.
    f.admit("alice", Fallback::Allow);
    assert_eq!(f.store.keys(), 1);
}

#[test]
fn a_handle_outliving_eviction_still_counts() {
    let f = fixture();
    let h = f
        .front
        .admit_with_handle("alice", &[], Fallback::Allow, true)
        .handle
        .unwrap();
    f.clock.set(T + 3_000);
    f.store.collect(100);
    f.store.collect(101);
    f.store.collect(102);
    assert_eq!(f.store.keys(), 0);
    h.consume(f.down, 7);
    f.clock.set(T + 4_000);
    let r = f.store.collect(103);
    assert_eq!(amount(&r.consumption, "alice", "traffic_down"), 7);
}
