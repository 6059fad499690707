//! Assigning, the book of assignments, and what is rendered from it.

use super::*;

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
fn a_slot_granted_nothing_counts_what_held_the_node_not_its_demand() {
    // alice, 100/s with a bucket of 1 s: n1 admitted 100 and refused 200
    // in slot 99, on quotas this ledger did not grant (a hold, or another
    // central's). For slot 100, unreported and granted nothing, n1 keeps
    // to what held it: 100 more, not its demand of 300.
    let mut l = Ledger::new(LedgerConfig::default());
    let mut rule = limit("alice", "requests", 100.0);
    rule.burst_seconds = 1.0;
    l.apply_limits("front", &[rule], T);
    let used = r#"{"alice": {"requests": 100}}"#;
    let refused = r#"{"alice": {"requests": 200}}"#;
    l.ingest(&report("n1", 100, used, refused), T).unwrap();
    let slot = l.assign(T + 500)["front"];
    assert_eq!(slot, 101);
    let n1 = l.node_id("n1");
    let quota = quota_for(&l, n1, [("front", slot)]);
    let grant = quota.services["front"].slots[&slot].users["alice"].resources["requests"];
    // The bucket, empty after slot 99, holds 50 half a slot later; less
    // 100 for slot 100, plus 150 to the end of slot 101. (Its demand of
    // 300 for slot 100 would leave nothing.)
    assert!((grant - 100.0).abs() < 1.0, "{grant}");
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
        let granted = Granted::new(&svc.book, &svc.kept, svc.state.cuts());
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
fn a_node_that_reports_every_few_slots_stays_active_and_is_not_awaited() {
    let mut l = Ledger::new(LedgerConfig::default());
    l.apply_limits("front", &[limit("alice", "requests", 100.0)], T);
    let alice = r#"{"alice": {"requests": 20}}"#;
    let (n, p) = (l.node_id("n"), l.node_id("p"));
    l.connect(n, ["front"], T);
    l.connect(p, ["front"], T);
    // p, a proxy, reports every 5 s: its reports lag 6 slots at most.
    l.reports_every(p, ["front"], 5_000);
    assert_eq!(l.service_state("front").unwrap().lag(p), 6);
    l.ingest(&report("p", 100, alice, "{}"), T).unwrap();
    for slot in 100..=107 {
        l.ingest(&report("n", slot, alice, "{}"), slot * 1_000 + 50)
            .unwrap();
        assert!(
            l.all_reported("front", slot),
            "p is not waited for in {slot}"
        );
    }
    // Slot 108, assigned at 107.5: p's newest slot (99) is 8 slots back,
    // still within its lag: it keeps a grant.
    let slot = l.assign(107_500)["front"];
    let quota = quota_for(&l, p, [("front", slot)]);
    let users = &quota.services["front"].slots[&slot].users;
    assert!(users.contains_key("alice"), "p is still active: {quota:?}");
}

#[test]
fn a_proxys_first_share_is_counted_until_it_reports() {
    // Alice's grant on node n for slot 105, with or without proxy p's new
    // bucket holding a first share of 30 a slot from slot 102 on.
    let grant_to_n = |first_share: bool| {
        let mut l = Ledger::new(LedgerConfig::default());
        l.apply_limits("front", &[limit("alice", "requests", 100.0)], T);
        let (n, p) = (l.node_id("n"), l.node_id("p"));
        l.connect(n, ["front"], T);
        l.connect(p, ["front"], T);
        l.reports_every(p, ["front"], 5_000);
        l.ingest(&report("p", 100, "{}", "{}"), T).unwrap();
        if first_share {
            l.tell_first_share("front", p, "alice", 102..=108, 30.0);
        }
        let alice = r#"{"alice": {"requests": 20}}"#;
        for slot in 100..=105 {
            l.ingest(&report("n", slot, alice, "{}"), slot * 1_000 + 50)
                .unwrap();
        }
        let slot = l.assign(105_500)["front"];
        let quota = quota_for(&l, n, [("front", slot)]);
        let users = &quota.services["front"].slots[&slot].users;
        users["alice"].resources["requests"]
    };
    let (without, with) = (grant_to_n(false), grant_to_n(true));
    // p may have admitted 30 a slot in 102..=105, and its bucket's 30 at
    // once, none of it reported yet: the budget is 150 less, of which n,
    // the one busy node of two, loses all but what idle p would have had
    // of it (a tenth of the slack, shared as if by every node).
    assert!(without >= 200.0, "{without}");
    assert!(
        (without - with - 150.0 * 0.95).abs() < 0.01,
        "without {without}, with {with}"
    );
}

#[test]
fn a_proxy_is_not_starved_by_a_burst_shorter_than_its_reports() {
    // alice: 100/s with a burst of one second, on proxy p alone, which
    // reports every 5 slots what it admitted in each: 100, and 50 refused.
    let mut l = Ledger::new(LedgerConfig::default());
    let short = Limit {
        burst_seconds: 1.0,
        ..limit("alice", "requests", 100.0)
    };
    l.apply_limits("front", &[short], T);
    let p = l.node_id("p");
    l.connect(p, ["front"], T);
    l.reports_every(p, ["front"], 5_000);
    let (used, refused) = (
        r#"{"alice": {"requests": 100}}"#,
        r#"{"alice": {"requests": 50}}"#,
    );
    let mut grants = Vec::new();
    for slot in 101..=125 {
        if slot % 5 == 0 {
            for data in slot - 5..slot {
                let r = report("p", data + 1, used, refused);
                l.ingest(&r, slot * 1_000 + 50).unwrap();
            }
        }
        let next = l.assign(slot * 1_000 + 500)["front"];
        let quota = quota_for(&l, p, [("front", next)]);
        let users = &quota.services["front"].slots[&next].users;
        grants.push(users.get("alice").map_or(0.0, |g| g.resources["requests"]));
    }
    // Its reports come up to 5 slots late, and the bucket holds one
    // slot's refill: what it turned away meanwhile pays for them, so each
    // slot's grant is the rate.
    assert!(
        grants[5..].iter().all(|g| (90.0..=110.0).contains(g)),
        "{grants:?}"
    );
}
