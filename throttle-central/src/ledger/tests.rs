use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{Value, json};
use throttle_proto::legacy::report_from_json;
use throttle_proto::v1;

use super::*;
use crate::assigner::render::{Rendering, Skeletons, quota_for};
use crate::http::monitor::to_json;
use crate::limits::Limit;
use crate::policy::Projected;
use crate::policy::{Grant, Granted};
use crate::server::MonitorView;
use throttle_proto::MAX_NAME_LEN;

fn monitor_quota(l: &Ledger, range: SlotRange) -> Value {
    to_json(&MonitorView::Quota(l.quota_view(range)))
}

fn monitor_sums(l: &Ledger, range: SlotRange, rejection: bool) -> Value {
    to_json(&MonitorView::Sums(l.sums_view(range, rejection)))
}

fn monitor_distribution(l: &Ledger, range: SlotRange, now_ms: i64) -> Value {
    to_json(&MonitorView::Distribution(
        l.distribution_view(range, now_ms),
    ))
}

fn monitor_reported(l: &Ledger, range: SlotRange) -> Value {
    to_json(&MonitorView::Reported(l.reported_view(range)))
}

fn limit(user: &str, resource: &str, rate: f64) -> Limit {
    Limit {
        user: user.into(),
        per_second: [(resource.into(), rate)].into(),
        burst_seconds: 10.0,
        max_debt_seconds: None,
    }
}

/// A report of service `front` from its legacy JSON maps of users.
pub(crate) fn report(node: &str, slot: i64, consumption: &str, rejection: &str) -> v1::Report {
    report_from_json(&format!(
        r#"{{"node_id": "{node}", "slot_number": {slot}, "consumption": {{"front": {consumption}}}, "rejection": {{"front": {rejection}}}}}"#
    ))
    .unwrap()
}

const T: i64 = 100_000; // slot 100 at 1 s slots

/// A ledger keeping `nr_slot` slots of history.
fn keeping(nr_slot: u32) -> Ledger {
    Ledger::new(LedgerConfig {
        nr_slot,
        ..LedgerConfig::default()
    })
}

/// A report's packed usages are filed as the map entries they stand
/// for; one whose bits and amounts disagree is refused whole.
#[test]
fn packed_usages_are_ingested_as_the_maps_they_stand_for() {
    let mut l = keeping(3);
    let table = |rejection, amounts: Vec<i64>| v1::PackedUsage {
        service: "front".into(),
        rejection,
        resources: vec!["requests".into()],
        users: vec![v1::PackedUser {
            user: "alice".into(),
            resources: vec![1],
        }],
        amounts,
    };
    let packed = |amounts: Vec<i64>| v1::Report {
        node_id: "n1".into(),
        slot_number: 100,
        packed: vec![table(false, amounts), table(true, vec![2])],
        ..v1::Report::default()
    };
    assert!(matches!(
        l.ingest(&packed(vec![]), T),
        Err(ReportError::Packed(_))
    ));
    l.ingest(&packed(vec![5]), T).unwrap();
    assert_eq!(l.slot_sum("front", "alice", "requests", 99, false), 5);
    assert_eq!(l.slot_sum("front", "alice", "requests", 99, true), 2);
}

#[test]
fn an_assign_into_a_recycled_assignment_keeps_none_of_its_grants() {
    let mut l = keeping(3);
    l.apply_limits("front", &[limit("alice", "requests", 100.0)], T);
    let alice = r#"{"alice": {"requests": 5}}"#;
    for node in ["n1", "n2"] {
        l.ingest(&report(node, 100, alice, "{}"), T).unwrap();
    }
    let (n1, n2) = (l.node_id("n1"), l.node_id("n2"));
    let users = |l: &Ledger, node, slot| {
        let quota = quota_for(l, node, [("front", slot)]);
        quota.services["front"].slots[&slot].users.len()
    };
    let first = l.assign(T + 500)["front"];
    assert_eq!((users(&l, n1, first), users(&l, n2, first)), (1, 1));
    // n2 stops reporting; its grants in the book's assignments, later
    // recycled, must not come back.
    let mut n2_granted = Vec::new();
    for slot in 101..112 {
        let now = slot * 1_000;
        l.ingest(&report("n1", slot, alice, "{}"), now).unwrap();
        let assigned = l.assign(now + 500)["front"];
        assert_eq!(users(&l, n1, assigned), 1);
        n2_granted.push(users(&l, n2, assigned));
        l.forget(now + 500);
    }
    assert!(
        l.services["front"].spare.is_some(),
        "an assignment is recycled"
    );
    // Granted while in the window, then never again.
    let granted = n2_granted.iter().take_while(|n| **n == 1).count();
    assert!(granted < 6, "{n2_granted:?}");
    assert!(
        n2_granted[granted..].iter().all(|n| *n == 0),
        "{n2_granted:?}"
    );
}

/// The default policy's grants for slot 101 of `alice`'s requests on
/// n1, n2 and n3, when n1 reported `used` of them in slot 99 and the
/// others only `bob`'s.
fn grants_after(used: i64) -> [f64; 3] {
    let mut l = Ledger::new(LedgerConfig::default());
    l.apply_limits("front", &[limit("alice", "requests", 100.0)], T);
    let alice = format!(r#"{{"alice": {{"requests": {used}}}}}"#);
    l.ingest(&report("n1", 100, &alice, "{}"), T).unwrap();
    for node in ["n2", "n3"] {
        l.ingest(&report(node, 100, r#"{"bob": {"requests": 1}}"#, "{}"), T)
            .unwrap();
    }
    let slot = l.assign(T + 500)["front"];
    assert_eq!(slot, 101);
    ["n1", "n2", "n3"].map(|n| {
        let node = l.node_id(n);
        let quota = quota_for(&l, node, [("front", slot)]);
        quota.services["front"].slots[&slot].users["alice"].resources["requests"]
    })
}

#[test]
fn idle_nodes_share_a_tenth_of_what_the_busy_ones_leave() {
    // Under the limit: n1's 5 requests leave most of the budget.
    let [busy, idle2, idle3] = grants_after(5);
    let budget = busy + idle2 + idle3;
    assert_eq!(idle2, idle3);
    let each = 0.1 * (budget - 5.0) / 3.0;
    assert!((idle2 - each).abs() < 1e-3, "{idle2} vs {each}");
    assert!(idle2 >= 9.0, "room for a user arriving there: {idle2}");
    assert!(busy >= 5.0);
    // At the limit: no slack, so the idle nodes get only the floor (1%
    // of a slot's rate, at least 1) and n1 keeps the whole budget.
    // (The bucket's 150 by then, less the 120 expected in slot 100 too,
    // plus 100 per second up to the end of slot 101: 60 < 120.)
    let [busy, idle2, idle3] = grants_after(120);
    assert_eq!((idle2, idle3), (1.0, 1.0));
    assert_eq!(busy, 60.0);
}

#[test]
fn the_monitor_reads_the_same_quotas_once_a_slot_is_kept_compact() {
    let mut l = keeping(10);
    l.apply_limits("front", &[limit("alice", "requests", 100.0)], T);
    let range = SlotRange::default();
    let mut seen = BTreeMap::new();
    for slot in 100..120 {
        let now = slot * 1_000;
        for (node, used) in [("n1", 5 + slot % 7), ("n2", 3)] {
            let r = format!(r#"{{"alice": {{"requests": {used}}}, "bob": {{"requests": 1}}}}"#);
            l.ingest(&report(node, slot, &r, "{}"), now).unwrap();
        }
        let assigned = l.assign(now + 500)["front"];
        // As assigned, before any forget.
        seen.insert(
            assigned,
            monitor_quota(&l, range)["front"][assigned.to_string()].clone(),
        );
        l.forget(now + 500);
        let svc = &l.services["front"];
        assert!(svc.book.len() <= 3, "only the slots still answered");
    }
    let quotas = monitor_quota(&l, range)["front"].clone();
    let kept: Vec<i64> = l.services["front"].kept.slots().collect();
    assert!(kept.len() >= 8, "{kept:?}");
    for (slot, q) in seen.iter().filter(|(s, _)| **s >= 110) {
        assert_eq!(&quotas[slot.to_string()], q, "slot {slot}");
        assert!(q["n1"]["alice"]["requests"].as_f64().is_some(), "{q}");
    }
    assert!(quotas.get("108").is_none(), "past the retention");
}

/// A ledger keeping 10 slots, where alice may make 100 requests a
/// second and carol 40.
fn alice_and_carol_limited() -> Ledger {
    let mut l = keeping(10);
    let limits = [
        limit("alice", "requests", 100.0),
        limit("carol", "requests", 40.0),
    ];
    l.apply_limits("front", &limits, T);
    l
}

/// Between assigns, as at every mid-slot, the book and the history
/// still hold the grants of the slots the next assign weighs (the
/// default policy's four slots before it), and give them back node by
/// node, key by key.
#[test]
fn the_slots_an_assign_weighs_are_still_held_when_it_runs() {
    let mut l = alice_and_carol_limited();
    let mut seen: BTreeMap<i64, Vec<(NodeId, Vec<Grant>)>> = BTreeMap::new();
    for slot in 100..116 {
        let now = slot * 1_000;
        for (node, used) in [("n1", 5 + slot % 7), ("n2", 30 + slot % 3)] {
            let r = format!(r#"{{"alice": {{"requests": {used}}}, "carol": {{"requests": 9}}}}"#);
            l.ingest(&report(node, slot, &r, "{}"), now).unwrap();
        }
        let assigned = l.assign(now + 500)["front"];
        let svc = &l.services["front"];
        let grants = svc.book[&assigned].iter();
        seen.insert(
            assigned,
            grants
                .map(|(n, g)| (n, g.iter().collect::<Vec<_>>()))
                .collect(),
        );
        l.forget(now + 500);
        let svc = &l.services["front"];
        let granted = Granted::new(&svc.book, &svc.kept);
        let next = assigned + 1;
        for y in (next - 4..next).filter(|y| seen.contains_key(y)) {
            let mut found = granted.slot(y);
            for (node, grants) in &seen[&y] {
                assert_eq!(grants.len(), 2, "alice and carol");
                for g in grants {
                    let got = found.get(*node, g.key).map(f64::from);
                    assert_eq!(got, Some(g.amount()), "slot {y} for {next}");
                }
            }
        }
    }
    assert!(seen.len() >= 15);
}

/// While a node's users stay, the book's assignments, the skeleton its
/// quotas are encoded from and every slot of its quota history hold
/// one list of its keys.
#[test]
fn a_nodes_assignments_skeleton_and_quota_history_share_one_key_list() {
    let mut l = alice_and_carol_limited();
    let mut skeletons = Skeletons::default();
    let r = r#"{"alice": {"requests": 5}, "carol": {"requests": 9}}"#;
    for slot in 100..110 {
        let now = slot * 1_000;
        l.ingest(&report("n1", slot, r, "{}"), now).unwrap();
        let assigned = l.assign(now + 500)["front"];
        let n1 = l.node_id("n1");
        let to = Rendering {
            ledger: &l,
            skeletons: &skeletons,
            node: n1,
            packed: false,
        };
        to.encode([("front", assigned)], &[], Some(slot));
        l.forget(now + 500);
        skeletons.forget(&l);
    }
    let n1 = l.node_id("n1");
    let skeleton = skeletons.keys_of("front", n1).expect("a skeleton");
    let svc = &l.services["front"];
    assert_eq!(skeleton.len(), 2, "alice's and carol's requests");
    let newest = svc.kept.newest_keys(n1).expect("kept");
    assert!(Arc::ptr_eq(&skeleton, &newest));
    let booked = svc
        .book
        .values()
        .map(|a| a.get(n1).and_then(|g| g.shared_keys()));
    let booked: Vec<Arc<[KeyId]>> = booked.map(|k| k.expect("shared")).collect();
    assert!(booked.len() >= 2, "the current slot and the next");
    assert!(booked.iter().all(|k| Arc::ptr_eq(k, &skeleton)));
    // The clones here, the skeleton, every assignment and slot kept.
    let kept = svc.kept.slots().count();
    assert!(kept >= 8, "{kept}");
    let clones = 2 + booked.len();
    assert_eq!(
        Arc::strong_count(&skeleton),
        clones + 1 + booked.len() + kept
    );
}

#[test]
fn ingest_charges_buckets_and_sums_by_data_slot() {
    let mut l = Ledger::new(LedgerConfig::default());
    l.apply_limits("front", &[limit("alice", "requests", 10.0)], T);
    l.ingest(
        &report(
            "n1",
            100,
            r#"{"alice": {"requests": 4}, "bob": {"requests": 7}}"#,
            "{}",
        ),
        T,
    )
    .unwrap();
    l.ingest(
        &report(
            "n2",
            100,
            r#"{"alice": {"requests": 3}}"#,
            r#"{"alice": {"requests": 2}}"#,
        ),
        T,
    )
    .unwrap();
    assert_eq!(l.bucket_level("front", "alice", "requests", T), Some(3.0));
    assert_eq!(
        l.bucket_level("front", "bob", "requests", T),
        None,
        "no limit, no bucket"
    );
    assert_eq!(l.slot_sum("front", "alice", "requests", 99, false), 7);
    assert_eq!(l.slot_sum("front", "alice", "requests", 99, true), 2);
    assert_eq!(
        l.slot_sum("front", "bob", "requests", 99, false),
        7,
        "accounting without limit"
    );
}

#[test]
fn duplicate_report_is_not_charged_twice() {
    let mut l = Ledger::new(LedgerConfig::default());
    l.apply_limits("front", &[limit("alice", "requests", 10.0)], T);
    let r = report("n1", 100, r#"{"alice": {"requests": 4}}"#, "{}");
    assert!(!l.ingest(&r, T).unwrap().duplicate);
    assert!(l.ingest(&r, T).unwrap().duplicate);
    assert_eq!(l.bucket_level("front", "alice", "requests", T), Some(6.0));
    assert_eq!(l.slot_sum("front", "alice", "requests", 99, false), 4);
}

#[test]
fn late_report_is_charged_under_its_own_slot() {
    let mut l = Ledger::new(LedgerConfig::default());
    l.apply_limits("front", &[limit("alice", "requests", 10.0)], T);
    l.ingest(&report("n1", 100, r#"{"alice": {"requests": 4}}"#, "{}"), T)
        .unwrap();
    l.ingest(&report("n1", 98, r#"{"alice": {"requests": 5}}"#, "{}"), T)
        .unwrap();
    assert_eq!(l.slot_sum("front", "alice", "requests", 97, false), 5);
    assert_eq!(l.slot_sum("front", "alice", "requests", 99, false), 4);
    assert_eq!(l.bucket_level("front", "alice", "requests", T), Some(1.0));
    let dist = monitor_distribution(&l, SlotRange::default(), T);
    assert_eq!(
        dist["front"]["alice"]["requests"]["nodes"]["n1"]["slot"], 99,
        "latest stays"
    );
}

#[test]
fn whole_report_errors() {
    let mut l = Ledger::new(LedgerConfig {
        max_users_per_report: 1,
        ..LedgerConfig::default()
    });
    let far = report("n1", 100 + 61, "{}", "{}");
    assert!(matches!(
        l.ingest(&far, T),
        Err(ReportError::SlotOutOfRange { .. })
    ));
    let old = report("n1", 100 - 61, "{}", "{}");
    assert!(matches!(
        l.ingest(&old, T),
        Err(ReportError::SlotOutOfRange { .. })
    ));
    let anon = report("", 100, "{}", "{}");
    assert_eq!(l.ingest(&anon, T), Err(ReportError::BadNodeId));
    let long = report(&"n".repeat(MAX_NAME_LEN + 1), 100, "{}", "{}");
    assert_eq!(l.ingest(&long, T), Err(ReportError::BadNodeId));
    let many = report("n1", 100, r#"{"a": {"r": 1}, "b": {"r": 1}}"#, "{}");
    assert_eq!(
        l.ingest(&many, T),
        Err(ReportError::TooManyUsers { users: 2, max: 1 })
    );
}

#[test]
fn bad_entries_are_dropped_and_the_rest_kept() {
    let mut l = Ledger::new(LedgerConfig::default());
    let long = "u".repeat(MAX_NAME_LEN + 1);
    let r = report(
        "n1",
        100,
        &format!(
            r#"{{"ok": {{"requests": 2}}, "neg": {{"requests": -5}}, "{long}": {{"r": 1}}, "e": {{"": 1}}}}"#
        ),
        r#"{"ok": {"requests": 4294967295}, "absurd": {"requests": 4294967296}}"#,
    );
    let out = l.ingest(&r, T).unwrap();
    assert_eq!(out.entries, 2);
    let reasons: Vec<_> = out.dropped.iter().map(|d| d.0).collect();
    assert_eq!(
        reasons
            .iter()
            .filter(|r| **r == DropReason::BadName)
            .count(),
        2
    );
    assert_eq!(
        reasons
            .iter()
            .filter(|r| **r == DropReason::NegativeAmount)
            .count(),
        1
    );
    assert_eq!(
        out.dropped
            .iter()
            .filter(|r| r.0 == DropReason::TooManyRejections)
            .map(|r| r.1.as_str())
            .collect::<Vec<_>>(),
        ["front/absurd/requests"]
    );
    assert_eq!(l.slot_sum("front", "ok", "requests", 99, false), 2);
    assert_eq!(
        l.slot_sum("front", "ok", "requests", 99, true),
        i64::from(u32::MAX),
        "the largest count kept"
    );
    assert_eq!(l.slot_sum("front", "absurd", "requests", 99, true), 0);
}

#[test]
fn limits_change_and_disappear() {
    let mut l = Ledger::new(LedgerConfig::default());
    l.apply_limits("front", &[limit("alice", "requests", 10.0)], T);
    l.apply_limits("front", &[limit("alice", "requests", 1.0)], T);
    assert_eq!(
        l.bucket_level("front", "alice", "requests", T),
        Some(10.0),
        "clamped to 10 x 1"
    );
    l.apply_limits("front", &[], T);
    assert_eq!(l.bucket_level("front", "alice", "requests", T), None);
}

#[test]
fn forget_drops_old_slots_and_idle_keys() {
    let mut l = keeping(5);
    l.ingest(&report("n1", 100, r#"{"bob": {"requests": 1}}"#, "{}"), T)
        .unwrap();
    assert_eq!(l.key_count(), 1);
    l.forget(T + 4_000);
    assert_eq!(
        l.key_count(),
        1,
        "slot 99 is one of the 5 slots kept at slot 104"
    );
    l.forget(T + 5_000);
    assert_eq!(l.key_count(), 0);
    assert_eq!(monitor_reported(&l, SlotRange::default()), json!({}));
}

#[test]
fn freed_key_ids_are_reused_only_once_the_book_lets_go() {
    let mut l = keeping(5);
    let one = |user: &str| format!(r#"{{"{user}": {{"requests": 1}}}}"#);
    l.ingest(&report("n1", 100, &one("bob"), "{}"), T).unwrap();
    l.forget(T + 5_000);
    fn state(l: &Ledger) -> &ServiceState {
        &l.services["front"].state
    }
    assert_eq!(state(&l).key_count(), 0);
    assert_eq!(
        state(&l).key(KeyId(0)).user(),
        "bob",
        "a freed key keeps its names for the assignments still naming it"
    );
    // Too soon to reuse id 0: the book may hold slots up to 107.
    l.ingest(&report("n1", 106, &one("carol"), "{}"), T + 6_000)
        .unwrap();
    assert_eq!(state(&l).find("carol", "requests"), Some(KeyId(1)));
    // Carol's data slot 105 is forgotten too; id 0 may now be reused.
    l.forget(T + 14_000);
    l.ingest(&report("n1", 115, &one("dave"), "{}"), T + 15_000)
        .unwrap();
    let dave = state(&l).find("dave", "requests");
    assert_eq!(dave, Some(KeyId(0)));
    let key = state(&l).key(KeyId(0));
    assert_eq!((key.user(), key.resource()), ("dave", "requests"));
    assert_eq!(key.generation(), 1, "a reused id is a new generation");
    assert_eq!(state(&l).id_bound(), 2);
    assert_eq!(l.slot_sum("front", "dave", "requests", 114, false), 1);
    assert_eq!(l.slot_sum("front", "bob", "requests", 99, false), 0);
}

proptest::proptest! {
    /// Whatever the order of reports and forgetting, the arena holds
    /// exactly the keys reported within the last `nr_slot` slots, each
    /// found under its own names.
    #[test]
    fn the_arena_holds_exactly_the_recent_keys(
        ops in proptest::collection::vec((0..6usize, 0..3usize, 0..4i64), 1..120)
    ) {
        const RESOURCES: [&str; 3] = ["requests", "traffic_up", "db"];
        let nr_slot = 5;
        let mut l = keeping(nr_slot);
        let mut model: BTreeMap<(usize, usize), i64> = BTreeMap::new();
        let mut now = T;
        for (i, (user, resource, advance)) in ops.into_iter().enumerate() {
            now += advance * 1_000;
            let slot = l.config().slot.slot_at(now);
            let usage = format!(r#"{{"u{user}": {{"{}": 1}}}}"#, RESOURCES[resource]);
            l.ingest(&report(&format!("n{i}"), slot, &usage, "{}"), now).unwrap();
            model.insert((user, resource), slot - 1);
            l.forget(now);
            let cutoff = slot - i64::from(nr_slot);
            model.retain(|_, s| *s >= cutoff);
            let state = &l.services["front"].state;
            proptest::prop_assert_eq!(state.key_count(), model.len());
            proptest::prop_assert_eq!(state.keys().count(), model.len());
            for &(u, r) in model.keys() {
                let id = state.find(&format!("u{u}"), RESOURCES[r]);
                proptest::prop_assert!(id.is_some());
                let key = state.key(id.unwrap_or(KeyId(u32::MAX)));
                proptest::prop_assert_eq!(key.user(), format!("u{u}"));
                proptest::prop_assert_eq!(key.resource(), RESOURCES[r]);
            }
        }
    }
}

proptest::proptest! {
    /// Whatever the same few nodes report from slot to slot (users
    /// coming and going, resources changing, keys freed and their ids
    /// reused), each amount is filed under its own user and resource,
    /// whether its keys were found by name or from the node's last
    /// report.
    #[test]
    fn amounts_land_on_their_own_keys(
        reports in proptest::collection::vec(
            (
                0..3usize,
                0..3i64,
                proptest::collection::btree_map(
                    (0..8usize, 0..4usize),
                    1..100i64,
                    1..20,
                ),
            ),
            1..40,
        ),
    ) {
        const RESOURCES: [&str; 4] = ["requests", "up", "down", "db"];
        let mut l = keeping(2);
        let mut now = T;
        for (node, advance, entries) in reports {
            now += advance * 1_000;
            let slot = l.config().slot.slot_at(now);
            let mut users: BTreeMap<String, BTreeMap<&str, i64>> = BTreeMap::new();
            for (&(u, r), &amount) in &entries {
                users.entry(format!("u{u}")).or_default().insert(RESOURCES[r], amount);
            }
            let name = format!("n{node}");
            let filed = l.ingest(&report(&name, slot, &json!(users).to_string(), "{}"), now);
            l.forget(now);
            if filed.as_ref().is_ok_and(|f| f.duplicate) {
                continue;
            }
            proptest::prop_assert!(filed.is_ok());
            let n = l.node_id(&name);
            let state = &l.services["front"].state;
            for (&(u, r), &amount) in &entries {
                let id = state.find(&format!("u{u}"), RESOURCES[r]);
                proptest::prop_assert!(id.is_some(), "u{} {} not found", u, RESOURCES[r]);
                let key = state.key(id.unwrap_or(KeyId(u32::MAX)));
                proptest::prop_assert_eq!(key.user(), format!("u{u}"));
                proptest::prop_assert_eq!(key.resource(), RESOURCES[r]);
                let mine = key.nodes().iter().find(|e| e.node == n).copied();
                proptest::prop_assert_eq!(mine.map(|e| (e.slot, e.consumption)), Some((slot - 1, amount)));
                proptest::prop_assert_eq!(
                    l.slot_sum("front", &format!("u{u}"), RESOURCES[r], slot - 1, false) >= amount,
                    true
                );
            }
            proptest::prop_assert_eq!(state.keys().count(), state.key_count());
        }
    }
}

proptest::proptest! {
    /// The per-slot sums read back as a plain model's, as columns turn
    /// dense, widen past `u32`, slots pass the retention and key ids
    /// are reused.
    #[test]
    fn sums_read_back_as_the_model_says(
        reports in proptest::collection::vec(
            (
                0..3usize,
                0..3i64,
                proptest::bool::ANY,
                proptest::collection::vec(
                    (
                        0..10usize,
                        0..4usize,
                        proptest::prop_oneof![
                            8 => 0..50i64,
                            1 => (1i64 << 31)..(1i64 << 33),
                        ],
                    ),
                    1..30,
                ),
            ),
            1..25,
        ),
    ) {
        const RESOURCES: [&str; 4] = ["requests", "up", "down", "db"];
        let nr_slot = 3;
        let mut l = keeping(nr_slot);
        // (data slot, user, resource) -> [consumption, rejection]
        let mut model: BTreeMap<(i64, usize, usize), [i64; 2]> = BTreeMap::new();
        let mut now = T;
        for (i, (node, advance, late, entries)) in reports.into_iter().enumerate() {
            now += advance * 1_000;
            // A late report carries the slot before the current one.
            let slot = l.config().slot.slot_at(now) - i64::from(late);
            let mut users: [BTreeMap<String, BTreeMap<&str, i64>>; 2] = Default::default();
            for (j, &(u, r, amount)) in entries.iter().enumerate() {
                users[j % 2].entry(format!("u{u}")).or_default().insert(RESOURCES[r], amount);
            }
            let [consumption, rejection] = [&users[0], &users[1]].map(|u| json!(u).to_string());
            let node = format!("n{node}-{i}");
            l.ingest(&report(&node, slot, &consumption, &rejection), now).unwrap();
            for (which, usage) in users.iter().enumerate() {
                for (user, amounts) in usage {
                    let u: usize = user[1..].parse().unwrap_or_default();
                    // A rejection count above u32::MAX is dropped; the
                    // sums of several still outgrow it.
                    for (resource, amount) in amounts.iter().filter(|(_, a)| which == 0 || **a <= i64::from(u32::MAX)) {
                        let r = RESOURCES.iter().position(|x| x == resource).unwrap_or(0);
                        model.entry((slot - 1, u, r)).or_default()[which] += amount;
                    }
                }
            }
            l.forget(now);
            let cutoff = l.config().slot.slot_at(now) - i64::from(nr_slot);
            model.retain(|(s, ..), _| *s >= cutoff);
            for (&(s, u, r), sums) in &model {
                for (which, want) in sums.iter().enumerate() {
                    let got = l.slot_sum("front", &format!("u{u}"), RESOURCES[r], s, which == 1);
                    proptest::prop_assert_eq!(got, *want);
                }
            }
            let monitored = monitor_sums(&l, SlotRange::default(), false);
            let total: i64 = model.values().map(|s| s[0]).sum();
            let monitored_total: i64 = monitored["front"]
                .as_object()
                .into_iter()
                .flat_map(|slots| slots.values())
                .flat_map(|users| users.as_object().into_iter().flat_map(|u| u.values()))
                .flat_map(|res| res.as_object().into_iter().flat_map(|r| r.values()))
                .filter_map(Value::as_i64)
                .sum();
            proptest::prop_assert_eq!(monitored_total, total);
        }
    }
}

proptest::proptest! {
    /// The encoded answer says exactly what the built one says, also
    /// when a user's keys are far apart in the arena (a resource that
    /// first appears in a later report).
    #[test]
    fn encoded_quotas_decode_as_the_built_ones(
        reports in proptest::collection::vec(
            (0..3usize, proptest::collection::vec((0..8usize, 0..4usize, 0..50i64), 1..12)),
            2..8,
        ),
        limited in proptest::collection::btree_set((0..8usize, 0..4usize), 0..20),
        policy in 0..3usize,
    ) {
        use prost::Message;
        const RESOURCES: [&str; 4] = ["requests", "up", "down", "db"];
        let factory: PolicyFactory = match policy {
            0 => Box::new(|_| Box::new(Projected::new())),
            1 => Box::new(|_| Box::new(crate::policy::Classic::new())),
            _ => Box::new(|_| Box::new(crate::policy::StaticSplit::new())),
        };
        // Short retention: keys are freed and their ids reused.
        let config = LedgerConfig { nr_slot: 3, ..LedgerConfig::default() };
        let mut l = Ledger::with_policies(config, factory);
        let limits: Vec<Limit> = limited
            .iter()
            .map(|&(u, r)| limit(&format!("user-{u}"), RESOURCES[r], 10.0 + r as f64))
            .collect();
        // Every node's quotas around `slot`, encoded (from a node's
        // last encoding when its keys are the same) and built.
        let skeletons = Skeletons::default();
        let check = |l: &Ledger, slot: i64| -> Result<(), proptest::test_runner::TestCaseError> {
            for node in 0..3 {
                let n = l.find_node(&format!("n{node}"));
                let Some(n) = n else { continue };
                for s in [slot, slot + 1, slot + 2] {
                    let built = quota_for(l, n, [("front", s), ("other", s)]);
                    let to = Rendering { ledger: l, skeletons: &skeletons, node: n, packed: false };
                    let encoded = to.encode([("front", s), ("other", s)], &[], Some(s - 1));
                    let decoded = v1::CentralMessage::decode(&encoded[..]);
                    let want = v1::CentralMessage {
                        kind: Some(v1::central_message::Kind::Quota(v1::Quota {
                            report_slot: Some(s - 1),
                            ..built
                        })),
                    };
                    proptest::prop_assert_eq!(decoded, Ok(want));
                }
            }
            Ok(())
        };
        for (i, (node, entries)) in reports.iter().enumerate() {
            if i == 1 {
                // Keys the first report created come before the
                // limited ones in the arena.
                l.apply_limits("front", &limits, T);
            }
            let mut users: BTreeMap<String, BTreeMap<&str, i64>> = BTreeMap::new();
            for &(u, r, amount) in entries {
                users.entry(format!("user-{u}")).or_default().insert(RESOURCES[r], amount);
            }
            let now = T + i as i64 * 1_000;
            let slot = l.config().slot.slot_at(now);
            l.ingest(&report(&format!("n{node}"), slot, &json!(users).to_string(), "{}"), now)
                .unwrap();
            l.assign(now + 500);
            check(&l, slot)?;
            l.forget(now + 500);
        }
        let now = T + reports.len() as i64 * 1_000;
        check(&l, l.config().slot.slot_at(now))?;
    }
}

#[test]
fn quota_for_unknown_service_is_an_empty_slot() {
    let mut l = Ledger::new(LedgerConfig::default());
    let n = l.node_id("n1");
    let q = quota_for(&l, n, [("front", 101)]);
    assert_eq!(
        throttle_proto::legacy::quota_to_json(&q).unwrap(),
        r#"{"front":{"101":{}}}"#
    );
}

#[test]
fn absurd_amounts_and_slots_not_begun_are_refused() {
    let mut l = Ledger::new(LedgerConfig {
        max_amount: 1_000,
        ..LedgerConfig::default()
    });
    l.apply_limits("front", &[limit("alice", "requests", 100.0)], T);
    let huge = format!(
        r#"{{"alice": {{"requests": {}, "bytes": 1000}}}}"#,
        i64::MAX
    );
    let out = l.ingest(&report("n1", 100, &huge, "{}"), T).unwrap();
    assert_eq!(out.entries, 1, "the entry within the ceiling is filed");
    assert_eq!(
        out.dropped,
        vec![(
            DropReason::AmountTooLarge,
            "front/alice/requests".to_string()
        )]
    );
    let level = l.bucket_level("front", "alice", "requests", T).unwrap();
    assert!(level > 0.0, "nothing charged: {level}");
    // Data of the current slot (a report of the next) is filed; data of a
    // slot not yet begun is not.
    let next = report("n1", 101, r#"{"alice": {"requests": 1}}"#, "{}");
    assert!(l.ingest(&next, T).is_ok());
    let later = report("n1", 102, r#"{"alice": {"requests": 1}}"#, "{}");
    assert!(matches!(
        l.ingest(&later, T),
        Err(ReportError::SlotOutOfRange {
            slot: 102,
            current: 100,
            ..
        })
    ));
}

#[test]
fn debt_is_bounded_by_the_burst_unless_the_limit_says_otherwise() {
    let mut l = Ledger::new(LedgerConfig::default());
    let mut unbounded = limit("bob", "requests", 100.0);
    unbounded.max_debt_seconds = Some(f64::INFINITY);
    let mut short = limit("carol", "requests", 100.0);
    short.max_debt_seconds = Some(2.0);
    l.apply_limits(
        "front",
        &[limit("alice", "requests", 100.0), unbounded, short],
        T,
    );
    let flood = r#"{"alice": {"requests": 1000000}, "bob": {"requests": 1000000}, "carol": {"requests": 1000000}}"#;
    l.ingest(&report("n1", 100, flood, "{}"), T).unwrap();
    let level = |l: &mut Ledger, user| l.bucket_level("front", user, "requests", T).unwrap();
    assert_eq!(level(&mut l, "alice"), -1_000.0, "as deep as the capacity");
    assert_eq!(level(&mut l, "bob"), 100.0 - 1_000_000.0, "the original's");
    assert_eq!(level(&mut l, "carol"), -200.0, "two seconds of rate");
}

#[test]
fn new_services_past_the_cap_are_refused_and_the_rest_filed() {
    let mut l = Ledger::new(LedgerConfig {
        max_services: 2,
        ..LedgerConfig::default()
    });
    let n = l.node_id("n1");
    l.connect(n, ["a", "b", "c"], T);
    assert_eq!(l.services().collect::<Vec<_>>(), ["a", "b"]);
    let r = report_from_json(
        r#"{"node_id": "n1", "slot_number": 100, "consumption": {"a": {"u": {"r": 1}}, "d": {"u": {"r": 1}}}, "rejection": {"d": {"u": {"r": 1}}}}"#,
    )
    .unwrap();
    let out = l.ingest(&r, T).unwrap();
    assert_eq!(out.entries, 1);
    assert_eq!(
        out.dropped,
        vec![(DropReason::TooManyServices, "d".to_string())]
    );
    assert_eq!(l.services().count(), 2);
}
