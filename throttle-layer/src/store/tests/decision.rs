//! Deciding from quota rows, fallbacks, caps and resources.

use super::*;

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
fn the_last_known_quota_is_found_behind_a_table_for_a_later_slot() {
    let f = fixture();
    f.quota(r#"{"front": {"100": {"alice": {"requests": 0.0}}}}"#);
    f.quota(r#"{"front": {"103": {"alice": {"requests": 50.0}}}}"#);
    f.clock.set(T + 2_000); // slot 102: no table of its own, 103 is ahead
    let d = f.admit("alice", Fallback::LastKnownThenAllow(3));
    assert!(!d.is_allowed(), "slot 100's quota, not 103's");
    assert_eq!(d.basis, Basis::Fallback);
    f.clock.set(T + 5_000); // slot 105: 103 is the newest, 2 slots back
    assert!(
        f.admit("alice", Fallback::LastKnownThenDeny(3))
            .is_allowed()
    );
    f.clock.set(T + 7_000); // slot 107: 103 is 4 slots back
    assert!(
        !f.admit("alice", Fallback::LastKnownThenDeny(3))
            .is_allowed()
    );
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

/// With a default quota from the central, a user the slot's table has no
/// row for is held to it (the `*` rule's share of this node) instead of
/// let through; their own row, once it comes, decides instead; without a
/// table for the slot the fallback decides as before.
#[test]
fn a_user_without_a_row_is_held_to_the_default_quota() {
    let f = fixture();
    f.quota(r#"{"front": {"100": {"alice": {"requests": 10.0}}}}"#);
    f.store.set_limits(v1::Limits {
        service: "front".into(),
        default_quota: [("requests".to_string(), 2.5)].into(),
        ..v1::Limits::default()
    });
    let newcomer: Vec<_> = (0..4).map(|_| f.admit("zoe", Fallback::Allow)).collect();
    let allowed = newcomer.iter().filter(|d| d.is_allowed()).count();
    assert_eq!(
        allowed, 3,
        "used 0, 1, 2 are not above 2 whole units: {newcomer:?}"
    );
    assert!(
        newcomer.iter().all(|d| d.basis == Basis::Quota),
        "a row for the slot"
    );
    let refused = newcomer[3].tightest.expect("names the resource");
    assert_eq!((refused.resource, refused.quota), (f.requests, 2.0));
    // Her own row replaces the default.
    f.quota(r#"{"front": {"100": {"alice": {"requests": 10.0}, "zoe": {"requests": 50.0}}}}"#);
    assert!(f.admit("zoe", Fallback::Allow).is_allowed());
    // Known from the slot before, still without a row of her own in the
    // next slot's table: the default again.
    f.quota(r#"{"front": {"101": {"alice": {"requests": 10.0}}}}"#);
    f.clock.set(T + 1_000);
    let next: Vec<_> = (0..4)
        .map(|_| f.admit("zoe", Fallback::Allow).is_allowed())
        .collect();
    assert_eq!(next, [true, true, true, false]);
    // No table for the slot: the fallback, not the default.
    f.clock.set(T + 5_000);
    assert_eq!(f.admit("yann", Fallback::Allow).basis, Basis::Fallback);
    // Limits without a default quota: a user without a row is not limited.
    f.quota(r#"{"front": {"105": {"alice": {"requests": 10.0}}}}"#);
    f.store.set_limits(v1::Limits {
        service: "front".into(),
        ..v1::Limits::default()
    });
    assert_eq!(f.admit("xena", Fallback::Allow).basis, Basis::Unlimited);
}

/// Without a table for the slot (the central away), a user entering the
/// slot gets no default row: the last known row stays, and the fallback
/// reads it.
#[test]
fn no_default_row_pushes_out_the_last_known_one() {
    let f = fixture();
    f.store.set_limits(v1::Limits {
        service: "front".into(),
        default_quota: [("requests".to_string(), 100.0)].into(),
        ..v1::Limits::default()
    });
    f.quota(r#"{"front": {"100": {"alice": {"requests": 1.0}}}}"#);
    assert!(
        f.admit("alice", Fallback::LastKnownThenAllow(60))
            .is_allowed()
    );
    f.clock.set(T + 3_000);
    let d: Vec<_> = (0..3)
        .map(|_| f.admit("alice", Fallback::LastKnownThenAllow(60)))
        .collect();
    assert!(d.iter().all(|d| d.basis == Basis::Fallback), "{d:?}");
    assert_eq!(
        d.iter().filter(|d| d.is_allowed()).count(),
        2,
        "her last quota, 1: {d:?}"
    );
}

/// Under a last-known fallback, a user new to the node is held to the
/// default quota from the node's first request on: before its first
/// table (a node that has just connected) and through an outage (a last
/// known table that does not name them), so a new key gains nothing
/// over a known one. `Fallback::Allow` still lets them through.
#[test]
fn a_new_user_is_held_to_the_default_quota_without_a_table() {
    let f = fixture();
    f.store.set_limits(v1::Limits {
        service: "front".into(),
        default_quota: [("requests".to_string(), 2.5)].into(),
        ..v1::Limits::default()
    });
    let held = |user: &str| -> Vec<bool> {
        (0..4)
            .map(|_| f.admit(user, Fallback::LastKnownThenAllow(60)).is_allowed())
            .collect()
    };
    // No table received yet.
    assert_eq!(held("zoe"), [true, true, true, false]);
    assert!((0..4).all(|_| f.admit("yves", Fallback::Allow).is_allowed()));
    // The central away: the newest table names alice, not the newcomers.
    f.quota(r#"{"front": {"100": {"alice": {"requests": 1.0}}}}"#);
    f.clock.set(T + 3_000);
    assert_eq!(held("xena"), [true, true, true, false], "new in the outage");
    assert_eq!(
        held("zoe"),
        [true, true, true, false],
        "known, not in the table"
    );
    assert_eq!(held("alice"), [true, true, false, false], "her last quota");
}

/// The promise oracle's seed 5859: without a table for the slot, the
/// last known table is sent again without the user's row (a central that
/// came back without state, which does not know them yet). The user, who
/// entered the slot on that table's row, is then held to their default
/// quota, not let through.
#[test]
fn a_last_known_table_sent_again_without_a_user_leaves_them_the_default() {
    let f = fixture();
    f.store.set_limits(v1::Limits {
        service: "front".into(),
        default_quota: [("requests".to_string(), 2.5)].into(),
        ..v1::Limits::default()
    });
    f.quota(r#"{"front": {"100": {"zoe": {"requests": 1.0}}}}"#);
    f.clock.set(T + 2_000); // slot 102: no table; 100's names zoe
    let fallback = Fallback::LastKnownThenAllow(60);
    assert!(f.admit("zoe", fallback).is_allowed(), "her last quota, 1");
    f.quota(r#"{"front": {"100": {"alice": {"requests": 1.0}}}}"#);
    let held: Vec<_> = (0..3).map(|_| f.admit("zoe", fallback)).collect();
    assert!(held.iter().all(|d| d.basis == Basis::Fallback), "{held:?}");
    let allowed: Vec<bool> = held.iter().map(Decision::is_allowed).collect();
    assert_eq!(allowed, [true, true, false], "the default, 2.5: {held:?}");
}

/// Under a service's capacity, the users without a row take together no
/// more than the pool the central gives this node, each still within
/// their default quota, with or without a table for the slot; a user
/// with a row of their own is not held by the pool, and the pool starts
/// again each slot.
#[test]
fn the_users_without_a_row_share_the_newcomers_pool() {
    let f = fixture();
    f.store.set_limits(v1::Limits {
        service: "front".into(),
        default_quota: [("requests".to_string(), 3.0)].into(),
        newcomers: [("requests".to_string(), 7.0)].into(),
        ..v1::Limits::default()
    });
    let take = |prefix: &str| -> usize {
        (0..10)
            .map(|k| format!("{prefix}-{k}"))
            .map(|user| {
                (0..10)
                    .filter(|_| {
                        f.admit(&user, Fallback::LastKnownThenAllow(60))
                            .is_allowed()
                    })
                    .count()
            })
            .sum()
    };
    assert_eq!(take("before-a-table"), 8, "used 0..=7 are not above 7");
    f.quota(r#"{"front": {"101": {"alice": {"requests": 50.0}}}}"#);
    f.clock.set(T + 1_000);
    assert_eq!(take("in-the-table's-slot"), 8);
    let alice = (0..20).filter(|_| f.admit("alice", Fallback::Allow).is_allowed());
    assert_eq!(alice.count(), 20, "her own row");
    let refused = f.admit("late", Fallback::Allow);
    let tightest = refused.tightest.expect("the pool named");
    assert_eq!((tightest.quota, tightest.used), (7.0, 8));
    assert_eq!(refused.basis, Basis::Quota);
    f.clock.set(T + 2_000);
    assert_eq!(take("the-central-away"), 8, "a new slot, a new pool");
    // Newcomers held together, with no rule that holds each.
    f.store.set_limits(v1::Limits {
        service: "front".into(),
        newcomers: [("requests".to_string(), 4.0)].into(),
        ..v1::Limits::default()
    });
    f.clock.set(T + 3_000);
    let one = (0..10).filter(|_| {
        f.admit("solo", Fallback::LastKnownThenAllow(60))
            .is_allowed()
    });
    assert_eq!(one.count(), 5, "no rule of its own, the pool alone");
}

/// A table that came ahead, in an answer to a report, is applied in its
/// slot, but the budgets the central told hold there as without a table:
/// its grants were rendered before the slot before was reported. A push
/// of the same slot is a quota the budget does not hold.
#[test]
fn a_table_that_came_ahead_leaves_the_budget_to_hold() {
    let f = fixture();
    zoe_has_left_of_the_hour(&f, 2.0);
    let answer = answer_of(r#"{"front": {"101": {"zoe": {"requests": 10.0}}}}"#);
    f.store.apply_quota(&answer);
    f.clock.set(T + 1_000);
    let held: Vec<bool> = (0..4)
        .map(|_| f.admit("zoe", Fallback::default()).is_allowed())
        .collect();
    assert_eq!(held, [true, true, false, false], "the budget, 2");
    // A push naming the table unchanged since (a ref to its own slot).
    f.store.apply_quota(&v1::Quota {
        refs: vec![v1::QuotaRef {
            service: "front".into(),
            slot: 101,
            from_slot: 101,
        }],
        ..v1::Quota::default()
    });
    assert!(
        f.admit("zoe", Fallback::default()).is_allowed(),
        "pushed: on quota"
    );
}

/// A table pushed for the next slot and sent again in an answer (a
/// policy that assigns two slots ahead) is still a quota there: the
/// budget does not hold on it.
#[test]
fn an_answer_sending_a_pushed_table_again_leaves_it_a_quota() {
    let f = fixture();
    zoe_has_left_of_the_hour(&f, 0.0);
    let table = r#"{"front": {"101": {"zoe": {"requests": 10.0}}}}"#;
    f.quota(table);
    f.store.apply_quota(&answer_of(table));
    f.clock.set(T + 1_000);
    let d = f.admit("zoe", Fallback::default());
    assert!(d.is_allowed() && d.basis == Basis::Quota, "{d:?}");
}

/// The central's budget of zoe's hour: `remaining`, for this node alone.
fn zoe_has_left_of_the_hour(f: &Fixture, remaining: f64) {
    let budget = v1::Budget {
        user: "zoe".into(),
        resource: "requests".into(),
        window_seconds: 3600,
        remaining,
        nodes: 1,
        refill: 0.0,
    };
    f.store.set_bound(v1::Bound {
        service: "front".into(),
        budgets: vec![budget],
        ..v1::Bound::default()
    });
}

/// The quota of `json` as an answer to the report of slot 100.
fn answer_of(json: &str) -> v1::Quota {
    let mut answer = quota_from_json(json).unwrap();
    answer.report_slot = Some(100);
    answer
}
