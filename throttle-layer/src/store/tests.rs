use super::decision::*;
use super::service::*;
use super::slot_store::*;
use super::user::*;
use super::users::*;
use super::*;
use compact_str::CompactString;
use parking_lot::Mutex;
use prost::Message;
use std::sync::Arc;
use std::time::Duration;
use throttle_clock::ManualClock;
use throttle_proto::legacy::quota_from_json;
use throttle_proto::v1;
use throttle_proto::wire::RawQuota;

const T: i64 = 100_000; // slot 100

struct Fixture {
    clock: Arc<ManualClock>,
    store: SlotStore,
    front: Arc<ServiceStore>,
    requests: ResourceId,
    down: ResourceId,
}

fn fixture() -> Fixture {
    let clock = Arc::new(ManualClock::new(T));
    let store = SlotStore::builder().clock(clock.clone()).build();
    let front = store.service("front");
    let requests = front.resource("requests").unwrap();
    let down = front.resource("traffic_down").unwrap();
    Fixture {
        clock,
        store,
        front,
        requests,
        down,
    }
}

impl Fixture {
    fn quota(&self, json: &str) {
        self.store.apply_quota(&quota_from_json(json).unwrap());
    }

    fn admit(&self, user: &str, fallback: Fallback) -> Decision {
        self.front
            .admit(user, &[(self.requests, 1)], fallback)
            .decision
    }
}

fn amount(usage: &BTreeMap<String, v1::Usage>, user: &str, resource: &str) -> i64 {
    usage["front"]
        .users
        .get(user)
        .and_then(|a| a.resources.get(resource))
        .copied()
        .unwrap_or(0)
}

use std::collections::BTreeMap;

#[test]
fn no_quota_for_the_slot_is_fail_open_by_default() {
    let f = fixture();
    let d = f.admit("alice", Fallback::Allow);
    assert!(d.is_allowed());
    assert_eq!(d.basis, Basis::Fallback);
    // A quota for another slot does not count for this one.
    f.quota(r#"{"front": {"101": {"alice": {"requests": 0.0}}}}"#);
    assert!(f.admit("alice", Fallback::Allow).is_allowed());
}

/// A ref installs, for its slot, the table the store holds for its
/// `from_slot`, deciding as that table sent again for the slot would;
/// read in place or as prost decodes it. A ref to a table the store
/// does not hold installs nothing.
#[test]
fn a_quota_ref_installs_the_table_it_names_for_its_slot() {
    const TABLE: &str =
        r#"{"alice": {"requests": 2.0, "traffic_down": 5.0}, "bob": {"requests": 0.0}}"#;
    let refer = |slot: i64, from_slot: i64| v1::Quota {
        refs: vec![v1::QuotaRef {
            service: "front".into(),
            slot,
            from_slot,
        }],
        ..v1::Quota::default()
    };
    let sent = fixture();
    let by_ref = fixture();
    let in_place = fixture();
    // An older table for slot 101, which the new one replaces.
    for f in [&sent, &by_ref, &in_place] {
        f.quota(&format!(
            r#"{{"front": {{"100": {TABLE}, "101": {{"carol": {{"requests": 0.0}}}}}}}}"#
        ));
    }
    sent.quota(&format!(r#"{{"front": {{"101": {TABLE}}}}}"#));
    by_ref.store.apply_quota(&refer(101, 100));
    let bytes = refer(101, 100).encode_to_vec();
    in_place
        .store
        .apply_raw_quota(&RawQuota::parse(&bytes).unwrap());
    let decisions = |f: &Fixture| {
        f.clock.set(T + 1_000);
        ["alice", "alice", "alice", "alice", "bob", "carol", "dave"]
            .map(|user| {
                let d = f.admit(user, Fallback::Deny);
                (d.is_allowed(), d.basis)
            })
            .to_vec()
    };
    let want = decisions(&sent);
    assert_eq!(
        want,
        [
            (true, Basis::Quota),
            (true, Basis::Quota),
            (true, Basis::Quota),
            (false, Basis::Quota),
            (false, Basis::Quota),
            (true, Basis::Unlimited),
            (true, Basis::Unlimited),
        ]
    );
    assert_eq!(decisions(&by_ref), want);
    assert_eq!(decisions(&in_place), want);

    // Slot 99 has no table here: its ref installs nothing for 102.
    by_ref.store.apply_quota(&refer(102, 99));
    assert!(!by_ref.front.has_quota(102));
    // A ref to its own slot keeps the table as it is.
    by_ref.store.apply_quota(&refer(101, 101));
    assert_eq!(by_ref.admit("bob", Fallback::Allow).basis, Basis::Quota);
}

#[test]
fn no_row_for_the_user_means_unlimited() {
    let f = fixture();
    f.quota(r#"{"front": {"100": {"bob": {"requests": 0.0}}}}"#);
    let d = f.admit("alice", Fallback::Deny);
    assert!(d.is_allowed());
    assert_eq!(d.basis, Basis::Unlimited);
    assert!(!f.admit("bob", Fallback::Allow).is_allowed());
}

#[test]
fn quota_below_one_refuses_and_counts_a_rejection() {
    let f = fixture();
    f.quota(r#"{"front": {"100": {"alice": {"requests": 0.9}}}}"#);
    let d = f.admit("alice", Fallback::Allow);
    assert!(!d.is_allowed());
    assert_eq!(d.tightest.unwrap().resource, f.requests);
    f.clock.set(T + 1_000);
    let r = f.store.collect(100);
    assert_eq!(amount(&r.rejection, "alice", "requests"), 1);
    assert_eq!(amount(&r.consumption, "alice", "requests"), 0);
}

#[test]
fn consumption_above_the_quota_refuses() {
    let f = fixture();
    f.quota(r#"{"front": {"100": {"alice": {"requests": 100.0, "traffic_down": 1000.0}}}}"#);
    let h = f
        .front
        .admit_with_handle("alice", &[(f.requests, 1)], Fallback::Allow, true);
    assert!(h.decision.is_allowed());
    let handle = h.handle.unwrap();
    handle.consume(f.down, 1000);
    // 1000 is not above 1000: still allowed.
    assert!(f.admit("alice", Fallback::Allow).is_allowed());
    handle.consume(f.down, 1);
    let d = f.admit("alice", Fallback::Allow);
    assert!(!d.is_allowed());
    assert_eq!(d.basis, Basis::Quota);
    assert_eq!(d.tightest.unwrap().resource, f.down);
    assert_eq!(d.tightest.unwrap().used, 1001);
    f.clock.set(T + 1_050);
    let r = f.store.collect(100);
    assert_eq!(amount(&r.rejection, "alice", "traffic_down"), 1);
    assert_eq!(amount(&r.rejection, "alice", "requests"), 0);
    assert_eq!(amount(&r.consumption, "alice", "requests"), 2);
    assert_eq!(amount(&r.consumption, "alice", "traffic_down"), 1001);
}

#[test]
fn every_exhausted_resource_counts_a_rejection() {
    let f = fixture();
    f.quota(r#"{"front": {"100": {"alice": {"requests": 0.0, "traffic_down": 0.5}}}}"#);
    assert!(!f.admit("alice", Fallback::Allow).is_allowed());
    f.clock.set(T + 1_000);
    let r = f.store.collect(100);
    assert_eq!(amount(&r.rejection, "alice", "requests"), 1);
    assert_eq!(amount(&r.rejection, "alice", "traffic_down"), 1);
}

#[test]
fn a_newer_table_for_a_slot_replaces_the_older() {
    let f = fixture();
    f.quota(r#"{"front": {"100": {"alice": {"requests": 0.0}, "bob": {"requests": 0.0}}}}"#);
    assert!(!f.admit("bob", Fallback::Allow).is_allowed());
    f.quota(r#"{"front": {"100": {"alice": {"requests": 5.0}}}}"#);
    assert!(f.admit("alice", Fallback::Allow).is_allowed());
    let d = f.admit("bob", Fallback::Allow);
    assert!(d.is_allowed(), "bob is absent from the newer table");
    assert_eq!(d.basis, Basis::Unlimited);
}

#[test]
fn fallback_policies() {
    let f = fixture();
    assert!(!f.admit("alice", Fallback::Deny).is_allowed());
    f.quota(r#"{"front": {"100": {"alice": {"requests": 0.0}}}}"#);
    f.clock.set(T + 2_000); // slot 102: no table
    assert!(f.admit("alice", Fallback::Allow).is_allowed());
    let d = f.admit("alice", Fallback::LastKnownThenAllow(3));
    assert!(!d.is_allowed(), "slot 100's quota still applies");
    assert_eq!(d.basis, Basis::Fallback);
    f.clock.set(T + 4_000); // slot 104: 100 is 4 slots back
    assert!(
        f.admit("alice", Fallback::LastKnownThenAllow(3))
            .is_allowed()
    );
    assert!(
        !f.admit("alice", Fallback::LastKnownThenDeny(3))
            .is_allowed()
    );
    assert!(
        !f.admit("alice", Fallback::LastKnownThenDeny(4))
            .is_allowed()
    );
}

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

#[test]
fn the_key_cap_hands_new_users_to_the_fallback() {
    let clock = Arc::new(ManualClock::new(T));
    let store = SlotStore::builder().clock(clock).max_keys(2).build();
    let front = store.service("front");
    let r = front.resource("requests").unwrap();
    for u in ["a", "b"] {
        assert_eq!(
            front.admit(u, &[(r, 1)], Fallback::Deny).decision.basis,
            Basis::Fallback
        );
    }
    let d = front.admit("c", &[(r, 1)], Fallback::Deny).decision;
    assert_eq!(d.basis, Basis::AtCap);
    assert!(!d.is_allowed());
    assert!(
        front
            .admit("c", &[(r, 1)], Fallback::Allow)
            .decision
            .is_allowed()
    );
    assert_eq!(store.keys(), 2);
    // Known users are still tracked.
    assert_eq!(
        front.admit("a", &[(r, 1)], Fallback::Deny).decision.basis,
        Basis::Fallback
    );
}

#[test]
fn resources_are_capped_per_service() {
    let f = fixture();
    for i in 2..MAX_RESOURCES {
        assert!(f.front.resource(&format!("r{i}")).is_some());
    }
    assert_eq!(f.front.resource("one_too_many"), None);
    assert_eq!(f.front.resource(""), None);
    assert_eq!(f.front.resource("requests"), Some(f.requests));
    // A quota naming an unknown resource beyond the cap is ignored, the rest applies.
    f.quota(r#"{"front": {"100": {"alice": {"requests": 0.0, "zzz": 0.0}}}}"#);
    assert!(!f.admit("alice", Fallback::Allow).is_allowed());
}

#[test]
fn quotas_for_many_coming_slots_keep_the_current_one() {
    let f = fixture();
    let slots: Vec<String> = (99..112)
        .map(|s| format!(r#""{s}": {{"alice": {{"requests": 0.0}}}}"#))
        .collect();
    f.quota(&format!(r#"{{"front": {{{}}}}}"#, slots.join(",")));
    let d = f.admit("alice", Fallback::Allow);
    assert!(!d.is_allowed() && d.basis == Basis::Quota, "{d:?}");
    f.clock.set(T + 2_000);
    assert!(
        !f.admit("alice", Fallback::Allow).is_allowed(),
        "slot 102 kept too"
    );
}

#[test]
fn distant_or_malformed_quotas_are_ignored() {
    let f = fixture();
    f.quota(r#"{"front": {"200": {"alice": {"requests": 0.0}}}}"#);
    f.quota(r#"{"": {"100": {"alice": {"requests": 0.0}}}}"#);
    assert_eq!(f.admit("alice", Fallback::Allow).basis, Basis::Fallback);
    let mut q = quota_from_json(r#"{"front": {"100": {"alice": {"requests": 5.0}}}}"#).unwrap();
    q.services
        .get_mut("front")
        .unwrap()
        .slots
        .get_mut(&100)
        .unwrap()
        .users
        .get_mut("alice")
        .unwrap()
        .resources
        .insert("requests".into(), f64::NAN);
    f.store.apply_quota(&q);
    assert!(
        !f.admit("alice", Fallback::Allow).is_allowed(),
        "NaN counts as no quota left"
    );
}

#[test]
fn shadow_mode_decides_without_counting_rejections() {
    let f = fixture();
    f.quota(r#"{"front": {"100": {"alice": {"requests": 0.0}}}}"#);
    let a = f
        .front
        .admit_with_handle("alice", &[(f.requests, 1)], Fallback::Allow, false);
    assert!(!a.decision.is_allowed());
    f.clock.set(T + 1_000);
    let r = f.store.collect(100);
    assert_eq!(amount(&r.rejection, "alice", "requests"), 0);
}

#[test]
fn resources_registered_after_the_first_user_spill_and_count() {
    let f = fixture();
    // The map is made at the first user, for the two resources then known.
    assert_eq!(f.front.cells_per_user(), None);
    assert!(f.admit("alice", Fallback::Allow).is_allowed());
    assert_eq!(f.front.cells_per_user(), Some(2));
    let late: Vec<ResourceId> = (0..3)
        .map(|i| f.front.resource(&format!("late{i}")).unwrap())
        .collect();
    let a = f
        .front
        .admit_with_handle("alice", &[(f.requests, 1)], Fallback::Allow, true);
    let handle = a.handle.unwrap();
    handle.consume(f.down, 7);
    handle.consume(late[2], 5);
    // A quota naming a late resource refuses by it.
    f.quota(r#"{"front": {"100": {"alice": {"requests": 10.0, "late1": 0.0}}}}"#);
    let d = f.admit("alice", Fallback::Allow);
    assert_eq!(d.tightest.map(|t| t.resource), Some(late[1]), "{d:?}");
    assert!(!d.is_allowed());
    // A user first seen now starts with inline cells and spills too.
    f.front.consume("bob", late[0], 3);
    f.clock.set(T + 1_000);
    let r = f.store.collect(100);
    assert_eq!(amount(&r.consumption, "alice", "requests"), 2);
    assert_eq!(amount(&r.consumption, "alice", "traffic_down"), 7);
    assert_eq!(amount(&r.consumption, "alice", "late2"), 5);
    assert_eq!(amount(&r.rejection, "alice", "late1"), 1);
    assert_eq!(amount(&r.consumption, "bob", "late0"), 3);
}

#[test]
fn a_quota_table_first_sizes_the_map_to_its_resources() {
    let clock = Arc::new(ManualClock::new(T));
    let store = SlotStore::builder().clock(clock).build();
    store.apply_quota(
        &quota_from_json(r#"{"api": {"100": {"carol": {"a": 1.0, "b": 1.0, "c": 1.0}}}}"#).unwrap(),
    );
    let api = store.service("api");
    assert_eq!(api.cells_per_user(), Some(3));
    assert_eq!(api.users(), 1);
}

#[test]
fn a_slot_takes_at_most_65535_quota_tables() {
    let f = fixture();
    let q = |quota: f64| {
        quota_from_json(&format!(
            r#"{{"front": {{"100": {{"alice": {{"requests": {quota:.1}}}}}}}}}"#
        ))
        .unwrap()
    };
    let open = q(100.0);
    for _ in 1..u16::MAX {
        f.store.apply_quota(&open);
    }
    f.store.apply_quota(&q(0.0));
    assert!(
        !f.admit("alice", Fallback::Allow).is_allowed(),
        "the 65,535th applies"
    );
    f.store.apply_quota(&open);
    assert!(
        !f.admit("alice", Fallback::Allow).is_allowed(),
        "the 65,536th is ignored"
    );
}

#[test]
fn a_user_of_four_resources_is_one_224_byte_allocation() {
    // papaya's node is the key and the value; the allocator adds 8 bytes
    // and rounds up to 16.
    let node = std::mem::size_of::<(CompactString, Entry<4>)>();
    assert!(node + 8 <= 224, "{node} bytes");
    assert_eq!(std::mem::size_of::<Cell>(), 36);
}

#[test]
fn rows_too_old_for_their_tags_are_forgotten() {
    let overflow = Mutex::new(Overflow::default());
    let mut st = UserState::<[Cell; 1]>::new(0);
    let st: &mut UserState = &mut st;
    st.insert_row(0, 1, &[5.0], 0);
    st.roll(RowTag::MAX_AGE - 1, "alice", &overflow);
    assert_eq!(st.row(0, 1), Some(0), "still readable");
    st.roll(RowTag::MAX_AGE, "alice", &overflow);
    assert_eq!(st.row(0, 1), None);
    // Without that, slot 2^32 would read slot 0's row: same low bits.
    st.roll(1 << 32, "alice", &overflow);
    assert_eq!(st.row(1 << 32, 1), None);
}

#[test]
fn a_name_finds_its_key_by_the_same_hash() {
    let map: UserMap<1> = UserMap::with_hasher(foldhash::fast::RandomState::default());
    let guard = map.guard();
    for name in ["u", "user-00042", "a-name-longer-than-twenty-four-bytes"] {
        let entry: Entry<1> = UserLock::new(UserState::new(1));
        map.insert(CompactString::from(name), entry, &guard);
        assert!(map.get(&Name(name), &guard).is_some(), "{name}");
    }
    assert!(map.get(&Name("user-00043"), &guard).is_none());
}

proptest::proptest! {
    /// Names compare as their bytes do, at every length around the
    /// 8-byte steps.
    #[test]
    fn names_compare_as_their_bytes(
        a in proptest::collection::vec(0..3u8, 0..40),
        b in proptest::collection::vec(0..3u8, 0..40),
    ) {
        proptest::prop_assert_eq!(same_bytes(&a, &b), a == b);
        proptest::prop_assert!(same_bytes(&a, &a));
        let mut c = a.clone();
        if let Some(last) = c.last_mut() {
            *last ^= 1;
            proptest::prop_assert!(!same_bytes(&a, &c));
        }
    }
}

proptest::proptest! {
    /// A row's 32-bit tag reads back as its slot from any slot within
    /// 2^31 of it, across the sign and the 32-bit boundaries.
    #[test]
    fn row_tags_read_back_near_their_slot(
        slot in proptest::prop_oneof![
            -1_000i64..1_000,
            proptest::strategy::Strategy::prop_map(proptest::prelude::any::<i64>(), |s| s / 4),
            (1i64 << 32) - 3..(1i64 << 32) + 3,
        ],
        off in -(1i64 << 31) + 1..(1i64 << 31),
    ) {
        let now = slot - off;
        proptest::prop_assert_eq!(RowTag::of(slot).near(now), slot);
    }

    /// A quota kept in whole `f32` units decides as the `f64` does up to
    /// 2^24 units, and never more permissively above.
    #[test]
    fn whole_units_decide_as_the_full_quota(
        q in proptest::prop_oneof![-4.0f64..20.0, -1e9f64..1e9, 0.0f64..1e18],
        used in proptest::prop_oneof![-4i64..40, 0i64..(1 << 40)],
    ) {
        let w = f64::from(whole_units(q));
        let refuses = |quota: f64| quota < 1.0 || used as f64 > quota;
        if q.abs() <= f64::from(1u32 << 24) {
            proptest::prop_assert_eq!(refuses(w), refuses(q), "q {} kept as {}", q, w);
        } else {
            proptest::prop_assert!(w <= q.floor());
            proptest::prop_assert!(q.floor() - w <= q.abs() / f64::from(1u32 << 23));
            proptest::prop_assert!(refuses(w) || !refuses(q));
        }
    }
}

proptest::proptest! {
    /// The fixed rows keep what a sorted list of rows would: the current
    /// row or else the newest past one, then the nearest coming slots,
    /// each with its own quotas and version, for any order of arrival;
    /// the quotas of resources past the inline cell move to the spill.
    #[test]
    fn rows_keep_the_current_or_newest_past_and_the_nearest_slots(
        inserts in proptest::collection::vec((90i64..110, 0usize..3, 0.0f64..1e9), 1..40),
        now in 95i64..105,
    ) {
        let mut st = UserState::<[Cell; 1]>::new(now);
        let st: &mut UserState = &mut st;
        // Model: (slot, version, quota per resource), sorted by slot.
        let mut model: Vec<(i64, u16, Vec<f32>)> = Vec::new();
        for (v, &(slot, resources, q)) in inserts.iter().enumerate() {
            let version = v as u16 + 1;
            let quotas: Vec<f32> = (0..=resources).map(|i| whole_units(q + i as f64)).collect();
            st.insert_row(slot, version, &quotas, now);
            model.retain(|r| r.0 != slot);
            model.push((slot, version, quotas));
            model.sort_by_key(|r| r.0);
            let due = model.iter().filter(|r| r.0 <= now).count();
            if due > 1 {
                model.drain(..due - 1);
            }
            model.truncate(ROWS_PER_USER);
        }
        for (slot, version, quotas) in &model {
            let k = st.row(*slot, *version);
            proptest::prop_assert!(k.is_some(), "row for slot {} lost", slot);
            let k = k.unwrap_or_default();
            for (i, cell) in st.cells().iter().enumerate() {
                let quota = cell.quota[k];
                match quotas.get(i) {
                    Some(q) => proptest::prop_assert_eq!(quota, *q),
                    None => proptest::prop_assert!(quota.is_nan()),
                }
            }
        }
        let kept = (0..ROWS_PER_USER).filter(|&k| st.row_version[k] != 0).count();
        proptest::prop_assert_eq!(kept, model.len());
    }
}

/// One step of [`every_count_is_reported_once`].
#[derive(Debug, Clone)]
enum Step {
    /// Time moves on by this many milliseconds.
    Wait(i64),
    /// A request of this user that read the clock this many slots ago
    /// (0: now) and was admitted only now.
    Admit { user: u8, late: i64 },
    /// A byte count for this user, added without a decision.
    Consume { user: u8, amount: i64 },
    /// The reporter collects the slots that ended, as it does at every
    /// slot boundary (or late, after several).
    Collect,
}

fn step() -> impl proptest::strategy::Strategy<Value = Step> {
    use proptest::prelude::*;
    prop_oneof![
        (1..2_500i64).prop_map(Step::Wait),
        (0..3u8, prop_oneof![4 => Just(0i64), 1 => 1..3i64])
            .prop_map(|(user, late)| Step::Admit { user, late }),
        (0..3u8, 1..1_000i64).prop_map(|(user, amount)| Step::Consume { user, amount }),
        Just(Step::Collect),
    ]
}

proptest::proptest! {
    /// Whatever the order of requests, late requests, byte counts,
    /// collections and evictions, every count is in exactly one report:
    /// none lost, none reported twice.
    #[test]
    fn every_count_is_reported_once(steps in proptest::collection::vec(step(), 1..80)) {
        let f = fixture();
        let mut now = T;
        let mut collected = f.store.current_slot() - 1;
        let (mut want_requests, mut want_bytes) = (0i64, 0i64);
        // Requests and bytes in the reports.
        let mut got = (0i64, 0i64);
        let take = |r: &v1::Report, got: &mut (i64, i64)| {
            for user in ["u0", "u1", "u2"] {
                got.0 += amount(&r.consumption, user, "requests");
                got.1 += amount(&r.consumption, user, "traffic_down");
            }
        };
        for s in steps {
            match s {
                Step::Wait(ms) => now += ms,
                Step::Admit { user, late } => {
                    f.clock.set(now - late * 1_000);
                    f.admit(&format!("u{user}"), Fallback::Allow);
                    f.clock.set(now);
                    want_requests += 1;
                }
                Step::Consume { user, amount } => {
                    f.clock.set(now);
                    f.front.consume(&format!("u{user}"), f.down, amount);
                    want_bytes += amount;
                }
                Step::Collect => {
                    f.clock.set(now);
                    let finished = f.store.current_slot() - 1;
                    if finished > collected {
                        collected = finished;
                        let r = f.store.collect(finished);
                        take(&r, &mut got);
                    }
                }
            }
        }
        // Everything ends: two more reports collect what is left.
        for _ in 0..2 {
            now += 1_000;
            f.clock.set(now);
            let r = f.store.collect(f.store.current_slot() - 1);
            take(&r, &mut got);
        }
        proptest::prop_assert_eq!(got, (want_requests, want_bytes));
    }
}

#[test]
fn a_quota_read_in_place_installs_what_the_decoded_one_does() {
    use prost::Message;
    let json = r#"{"front": {"100": {"alice": {"requests": 2.0}, "bob": {"requests": 0.5}},
                             "101": {"alice": {"requests": 1.0}}},
                   "back": {"100": {"carol": {"requests": 0, "traffic_down": 9}}}}"#;
    let quota = quota_from_json(json).unwrap();
    let raw = RawQuota::parse(&quota.encode_to_vec()).unwrap();
    let (a, b) = (fixture(), fixture());
    a.store.apply_quota(&quota);
    b.store.apply_raw_quota(&raw);
    let decide = |f: &Fixture, service: &str, user: &str| {
        let svc = f.store.service(service);
        let r = svc.resource("requests").unwrap();
        let d = svc.admit(user, &[(r, 1)], Fallback::Deny).decision;
        (d.allowed, d.basis, d.tightest.map(|t| (t.quota, t.used)))
    };
    for slot in 0..2 {
        for (service, user) in [
            ("front", "alice"),
            ("front", "bob"),
            ("front", "dave"),
            ("back", "carol"),
        ] {
            for _ in 0..3 {
                assert_eq!(
                    decide(&a, service, user),
                    decide(&b, service, user),
                    "{service}/{user} in slot {slot}"
                );
            }
        }
        a.clock.advance(Duration::from_secs(1));
        b.clock.advance(Duration::from_secs(1));
    }
    assert!(!decide(&a, "back", "carol").0, "carol has no quota");
}

/// One step of [`reports_encoded_as_prost_encodes_the_collected_one`].
#[derive(Debug, Clone)]
enum ReportStep {
    /// A user admitted (quota 0 or none) with a cost, in a service.
    Admit(u8, u8, bool),
    /// A user's handle counts an amount of a resource.
    Consume(u8, u8, u8, i64),
    /// The clock moves on this many slots.
    Advance(u8),
    /// The last slot is collected.
    Collect,
}

fn report_step() -> impl proptest::strategy::Strategy<Value = ReportStep> {
    use proptest::prelude::*;
    prop_oneof![
        4 => (0..2u8, 0..12u8, any::<bool>()).prop_map(|(s, u, q)| ReportStep::Admit(s, u, q)),
        4 => (0..2u8, 0..12u8, 0..5u8, prop_oneof![1i64..1000, any::<i64>()])
            .prop_map(|(s, u, r, a)| ReportStep::Consume(s, u, r, a)),
        1 => (0..3u8).prop_map(ReportStep::Advance),
        1 => Just(ReportStep::Collect),
    ]
}

proptest::proptest! {
    /// The report the reporter sends, written straight from the store,
    /// is byte for byte what prost writes for the same report (that of
    /// a second store fed the same steps, read back by `collect`):
    /// each user once, users and resources in name order, over any mix
    /// of users, services, resources (some registered late, past the
    /// inline cells), refusals, rolls and late counts. What the report
    /// holds is checked by the other tests here, which read it through
    /// `collect`.
    #[test]
    fn reports_encoded_as_prost_encodes_the_collected_one(
        steps in proptest::collection::vec(report_step(), 1..60),
    ) {
        use prost::Message;
        let stores: Vec<(Arc<ManualClock>, SlotStore)> = (0..2)
            .map(|_| {
                let clock = Arc::new(ManualClock::new(T));
                let store = SlotStore::builder().clock(clock.clone()).build();
                (clock, store)
            })
            .collect();
        let service = |s: u8| ["front", "back"][usize::from(s)];
        let resource = |r: u8| ["requests", "zeta", "alpha", "traffic_down", "b"][usize::from(r)];
        for step in steps {
            let mut reports = Vec::new();
            for (clock, store) in &stores {
                match &step {
                    ReportStep::Admit(s, u, quota) => {
                        let svc = store.service(service(*s));
                        let requests = svc.resource("requests").unwrap();
                        let slot = store.current_slot();
                        if *quota {
                            store.apply_quota(&quota_from_json(&format!(
                                r#"{{"{}": {{"{slot}": {{"user-{u}": {{"requests": 0}}}}}}}}"#,
                                service(*s)
                            )).unwrap());
                        }
                        svc.admit(&format!("user-{u}"), &[(requests, 1)], Fallback::Allow);
                    }
                    ReportStep::Consume(s, u, r, amount) => {
                        let svc = store.service(service(*s));
                        let r = svc.resource(resource(*r)).unwrap();
                        svc.consume(&format!("user-{u}"), r, *amount);
                    }
                    ReportStep::Advance(n) => clock.advance(Duration::from_secs(u64::from(*n))),
                    ReportStep::Collect => {}
                }
                if matches!(step, ReportStep::Collect) {
                    let slot = store.current_slot() - 1;
                    reports.push((store.clone(), slot));
                }
            }
            if let [(a, slot), (b, _)] = &reports[..] {
                let encoded = a.collect_encoded(*slot, "node-1");
                let mut built = b.collect(*slot);
                built.node_id = "node-1".into();
                proptest::prop_assert_eq!(&encoded[..], &built.encode_to_vec()[..]);
            }
        }
    }
}
