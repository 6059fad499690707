//! Rules as operators write them: `*` limits every user the moment the
//! central meets them, idle users of `*` are forgotten, and a key limited
//! over several periods is held by the bucket with the least room.

use proptest::prelude::*;

use super::*;
use crate::limits::{LimitSet, LimitSource, Period, StaticLimits};

/// The rules of `toml` for service `front`.
fn rules(toml: &str) -> Vec<Limit> {
    StaticLimits::new(LimitSet::from_toml(toml).unwrap()).list_limits("front")
}

const EVERY_100: &str = r#"
[[limit]]
service = "front"
user = "*"
per_second = { requests = 100 }
burst_seconds = 1
"#;

fn level(l: &mut Ledger, user: &str, now_ms: i64) -> Option<f64> {
    l.bucket_level("front", user, "requests", now_ms)
}

#[test]
fn every_user_is_limited_from_the_first_report() {
    let mut l = keeping(5);
    l.apply_limits("front", &rules(EVERY_100), T);
    let r = report("n1", 100, r#"{"zoe": {"requests": 150, "bytes": 9}}"#, "{}");
    l.ingest(&r, T).unwrap();
    assert_eq!(
        level(&mut l, "zoe", T),
        Some(100.0 - 150.0),
        "charged at once"
    );
    assert_eq!(
        l.bucket_level("front", "zoe", "bytes", T),
        None,
        "no rule limits bytes"
    );
}

#[test]
fn idle_users_of_the_every_user_rule_are_forgotten_unless_in_debt() {
    let mut l = keeping(5);
    let mut limits = rules(EVERY_100);
    limits.extend(rules(
        "[[limit]]\nservice = \"front\"\nuser = \"named\"\nper_second = { requests = 5 }\n",
    ));
    l.apply_limits("front", &limits, T);
    let users =
        r#"{"light": {"requests": 1}, "heavy": {"requests": 100000}, "named": {"requests": 1}}"#;
    l.ingest(&report("n1", 100, users, "{}"), T).unwrap();
    assert_eq!(l.key_count(), 3);
    // Six slots later the history has passed: the light user's bucket
    // refilled and goes; the heavy one is still paying its debt (one
    // second of 100/s at most: -100, so it refills within 2 s)... and the
    // named user's rule keeps theirs.
    l.forget(T + 6_000);
    assert_eq!(level(&mut l, "light", T + 6_000), None, "forgotten");
    assert!(
        level(&mut l, "named", T + 6_000).is_some(),
        "kept by its rule"
    );
    // A forgotten user is limited again when next seen.
    l.ingest(
        &report("n1", 106, r#"{"light": {"requests": 500}}"#, "{}"),
        T + 6_000,
    )
    .unwrap();
    assert_eq!(
        level(&mut l, "light", T + 6_000),
        Some(-100.0),
        "debt bounded at the capacity"
    );
    // One in debt when the history passes is kept until it has paid.
    l.ingest(
        &report("n2", 106, r#"{"deep": {"requests": 500}}"#, "{}"),
        T + 6_000,
    )
    .unwrap();
    l.forget(T + 6_500);
    assert!(
        level(&mut l, "deep", T + 6_500).is_some(),
        "kept while in debt"
    );
}

const SECOND_AND_MINUTE: &str = r#"
[[limit]]
service = "front"
user = "*"
per_second = { requests = 100 }

[[limit]]
service = "front"
user = "alice"
per_minute = { requests = 600 }
"#;

#[test]
fn several_periods_all_charge_and_the_tightest_binds() {
    let mut l = keeping(60);
    l.apply_limits("front", &rules(SECOND_AND_MINUTE), T);
    let view = |l: &Ledger, now| {
        let page = Monitor::of(l).distribution(SlotRange::default(), now, &Page::ALL);
        let (_, keys) = page.rows.into_iter().next().unwrap();
        keys.into_iter().find(|k| k.user == "alice").unwrap()
    };
    // Fresh: the second's bucket (100 + 100 of room) binds before the
    // minute's, which starts full (600 + 10).
    let fresh = view(&l, T);
    assert_eq!(fresh.bucket.unwrap().period, Period::Second);
    assert_eq!(fresh.others[0].period, Period::Minute);
    assert_eq!(fresh.others[0].level, 600.0);
    // 95 a second for six seconds: the second's bucket keeps up (it
    // refills 100 a second), the minute's does not (10 a second): both
    // are charged, and the minute's has the least room by then.
    for slot in 100..106 {
        let now = slot * 1000;
        let users = r#"{"alice": {"requests": 95}}"#;
        l.ingest(&report("n1", slot, users, "{}"), now).unwrap();
        l.assign(now + 500);
    }
    let spent = view(&l, 105_500);
    let own = spent.bucket.unwrap();
    assert_eq!(own.period, Period::Minute, "{spent:?}");
    assert_eq!(
        own.level,
        600.0 - 6.0 * 95.0 + 55.0,
        "refilled 10/s for 5.5 s"
    );
    let second = spent.others[0];
    assert_eq!(second.period, Period::Second);
    assert_eq!(
        second.level,
        100.0 - 6.0 * 95.0 + 550.0,
        "refilled 100/s for 5.5 s"
    );
    // bob has no rule of his own: the * rule's second alone.
    l.ingest(
        &report("n2", 105, r#"{"bob": {"requests": 1}}"#, "{}"),
        105_500,
    )
    .unwrap();
    let bob = Monitor::of(&l)
        .distribution(SlotRange::default(), 105_500, &Page::ALL)
        .rows[0]
        .1
        .iter()
        .find(|k| k.user == "bob")
        .cloned()
        .unwrap();
    assert!(bob.others.is_empty());
}

proptest! {
    /// Whatever the periods' rates and the consumption, the bucket a key
    /// is held by is the one with the least room.
    #[test]
    fn the_bucket_with_the_least_room_binds(
        per_second in 1u32..1000,
        per_minute in 1u32..100_000,
        per_hour in 1u32..1_000_000,
        spends in proptest::collection::vec(0i64..2000, 1..8),
    ) {
        let toml = format!(
            "[[limit]]\nservice = \"front\"\nuser = \"u\"\nper_second = {{ requests = {per_second} }}\nper_minute = {{ requests = {per_minute} }}\nper_hour = {{ requests = {per_hour} }}\n"
        );
        let mut l = keeping(60);
        l.apply_limits("front", &rules(&toml), T);
        for (i, spend) in spends.iter().enumerate() {
            let slot = 100 + i as i64;
            let now = slot * 1000;
            let users = format!(r#"{{"u": {{"requests": {spend}}}}}"#);
            l.ingest(&report("n1", slot, &users, "{}"), now).unwrap();
            l.assign(now + 500);
            let page = Monitor::of(&l).distribution(SlotRange::default(), now + 500, &Page::ALL);
            let key = &page.rows[0].1[0];
            let room = |b: &BucketView| b.level + b.rate;
            let own = key.bucket.as_ref().map(room).unwrap_or_default();
            prop_assert_eq!(key.others.len(), 2);
            for other in &key.others {
                prop_assert!(own <= room(other) + 1e-6, "{key:?}");
            }
        }
    }
}

/// The nodes are told the `*` rule's rate for a slot split over the
/// service's nodes (its tightest period), every user's allowances, and
/// the same message while nothing changes.
#[test]
fn nodes_are_told_the_every_user_share_and_each_rules_allowances() {
    let mut l = keeping(5);
    let mut limits = rules(
        "[[limit]]\nservice = \"front\"\nuser = \"*\"\nper_second = { requests = 100 }\nper_minute = { requests = 3000 }\n",
    );
    limits.extend(rules(
        "[[limit]]\nservice = \"front\"\nuser = \"alice\"\nper_day = { requests = 1000000 }\n",
    ));
    l.apply_limits("front", &limits, T);
    for node in ["n1", "n2", "n3", "n4"] {
        let id = l.node_id(node);
        l.connect(id, ["front"], T);
    }
    let told = l.told("front", T).unwrap();
    // 3,000 a minute is 50/s, tighter than 100/s: a quarter of 50.
    assert_eq!(told.default_quota["requests"], 12.5);
    let windows = |a: &[v1::Allowance]| {
        a.iter()
            .map(|a| (a.window_seconds, a.amount))
            .collect::<Vec<_>>()
    };
    assert_eq!(windows(&told.every), [(1, 100.0), (60, 3000.0)]);
    assert_eq!(told.users.len(), 1);
    assert_eq!(told.users[0].user, "alice");
    assert_eq!(
        windows(&told.users[0].allowances),
        [(1, 100.0), (60, 3000.0), (86_400, 1e6)]
    );
    assert!(
        Arc::ptr_eq(&told, &l.told("front", T + 1_000).unwrap()),
        "unchanged"
    );
    // The same rules applied again: the same message.
    l.apply_limits("front", &limits, T);
    assert!(Arc::ptr_eq(&told, &l.told("front", T).unwrap()));
    // Nodes that neither report nor connect may still apply what they
    // were told: they count for 60 slots, then stop.
    l.ingest(&report("n1", 107, "{}", "{}"), T + 7_000).unwrap();
    let silent = l.told("front", T + 7_000).unwrap();
    assert_eq!(silent.default_quota["requests"], 12.5, "{silent:?}");
    l.ingest(&report("n1", 162, "{}", "{}"), T + 62_000)
        .unwrap();
    let later = l.told("front", T + 62_000).unwrap();
    assert_eq!(later.default_quota["requests"], 50.0, "n1 alone: {later:?}");
    assert!(
        l.told("back", T).is_none(),
        "a service the ledger does not know"
    );
}

/// A user who spent their per-minute quota is bound by it: the nodes are
/// told so, and told again when it no longer binds.
/// Under a capacity the nodes are told what the users without a row may
/// take together: the capacity for a slot split over the service's
/// nodes, told again when the capacity or the nodes change.
#[test]
fn nodes_are_told_the_capacity_split_for_the_users_without_a_row() {
    let mut l = keeping(5);
    l.apply_limits("front", &rules(EVERY_100), T);
    for node in ["n1", "n2", "n3", "n4"] {
        let id = l.node_id(node);
        l.connect(id, ["front"], T);
    }
    assert!(
        l.told("front", T).unwrap().newcomers.is_empty(),
        "no capacity"
    );
    let set = LimitSet::from_toml("[service.front]\ncapacity = { requests = 1000 }\n").unwrap();
    l.apply_hierarchy("front", LimitSource::hierarchy(&set, "front"));
    let told = l.told("front", T).unwrap();
    assert_eq!(told.newcomers["requests"], 250.0, "{told:?}");
    l.ingest(&report("n1", 107, "{}", "{}"), T + 7_000).unwrap();
    let silent = l.told("front", T + 7_000).unwrap();
    assert_eq!(silent.newcomers["requests"], 250.0, "silent nodes count");
    l.ingest(&report("n1", 162, "{}", "{}"), T + 62_000)
        .unwrap();
    let later = l.told("front", T + 62_000).unwrap();
    assert_eq!(later.newcomers["requests"], 1000.0, "n1 alone");
    l.apply_hierarchy("front", None);
    assert!(l.told("front", T + 62_000).unwrap().newcomers.is_empty());
}

#[test]
fn a_key_bound_by_its_longer_period_is_told() {
    let mut l = keeping(5);
    l.apply_limits(
        "front",
        &rules("[[limit]]\nservice = \"front\"\nuser = \"minute\"\nper_second = { requests = 1000 }\nper_minute = { requests = 3000 }\n"),
        T,
    );
    l.assign(T);
    let before = l.bound("front", T).unwrap();
    assert!(before.keys.is_empty(), "{before:?}");
    // A minute holds less than two minutes of the per-second rate: its
    // budget is told from the start.
    let full: Vec<_> = (before.budgets.iter())
        .map(|b| (b.user.as_str(), b.window_seconds, b.remaining, b.nodes))
        .collect();
    assert_eq!(full, [("minute", 60, 3000.0, 1)]);
    l.ingest(
        &report("n1", 101, r#"{"minute": {"requests": 2990}}"#, "{}"),
        T + 1_000,
    )
    .unwrap();
    l.assign(T + 1_500);
    let bound = l.bound("front", T + 1_500).unwrap();
    let keys: Vec<_> = bound
        .keys
        .iter()
        .map(|k| (k.user.as_str(), k.resource.as_str(), k.window_seconds))
        .collect();
    assert_eq!(keys, [("minute", "requests", 60)]);
    // What is left of the minute goes with it, for the one node.
    let [budget] = &bound.budgets[..] else {
        panic!("one budget: {bound:?}")
    };
    assert_eq!(
        (budget.user.as_str(), budget.window_seconds, budget.nodes),
        ("minute", 60, 1)
    );
    assert!(budget.remaining < 100.0, "{budget:?}");
    assert!(
        Arc::ptr_eq(&bound, &l.bound("front", T + 1_500).unwrap()),
        "unchanged"
    );
    // The per-minute quota lifted: the per-second bucket binds.
    l.apply_limits(
        "front",
        &rules(
            "[[limit]]\nservice = \"front\"\nuser = \"minute\"\nper_second = { requests = 1000 }\n",
        ),
        T + 2_000,
    );
    l.assign(T + 2_000);
    let lifted = l.bound("front", T + 2_000).unwrap();
    assert!(
        lifted.keys.is_empty() && lifted.budgets.is_empty(),
        "{lifted:?}"
    );
}

/// A key's longer period is told as a budget only once it holds less than
/// two minutes of the shortest rate, shared by the nodes that serve it.
#[test]
fn a_budget_is_told_when_a_longer_period_runs_low() {
    let mut l = keeping(5);
    let limits = "[[limit]]\nservice = \"front\"\nuser = \"ann\"\nper_second = { requests = 5 }\nper_hour = { requests = 1000 }\n";
    l.apply_limits("front", &rules(limits), T);
    l.assign(T);
    let budgets = |l: &mut Ledger, now| {
        let bound = l.bound("front", now).unwrap();
        (bound.budgets.iter())
            .map(|b| (b.window_seconds, b.remaining, b.nodes))
            .collect::<Vec<_>>()
    };
    // 1,000 left of the hour is 200 s at 5/s: no budget.
    assert_eq!(budgets(&mut l, T), []);
    let spent = r#"{"ann": {"requests": 250}}"#;
    l.ingest(&report("n1", 101, spent, "{}"), T + 1_000)
        .unwrap();
    l.ingest(&report("n2", 101, spent, "{}"), T + 1_000)
        .unwrap();
    l.assign(T + 1_500);
    // 500 left: 100 s at 5/s, a budget for two nodes.
    let told = budgets(&mut l, T + 1_500);
    let [(3600, remaining, 2)] = told[..] else {
        panic!("{told:?}")
    };
    assert!((500.0..502.0).contains(&remaining), "{remaining}");
}

/// A key granted more than a slot of its per-second rate (a stored burst)
/// is told its per-second bucket as a budget, with its rate as the refill,
/// so that a node repeating its last quota through an outage takes the
/// burst once; a key granted about its rate is not.
#[test]
fn a_stored_burst_is_told_as_a_budget_that_refills_at_the_rate() {
    let mut l = keeping(5);
    let limits = "[[limit]]\nservice = \"front\"\nusers = [\"ann\", \"bob\"]\nper_second = { requests = 100 }\nburst_seconds = 10\n";
    l.apply_limits("front", &rules(limits), T);
    let mut now = T;
    for slot in 100..112 {
        // Ann takes a little of her rate, bob ten times it.
        let used = r#"{"ann": {"requests": 20}, "bob": {"requests": 1000}}"#;
        l.ingest(&report("n1", slot, used, "{}"), now).unwrap();
        l.assign(now + 500);
        now += 1_000;
    }
    let bound = l.bound("front", now).unwrap();
    let told: Vec<_> = (bound.budgets.iter())
        .map(|b| (b.user.as_str(), b.window_seconds, b.nodes, b.refill))
        .collect();
    let grants = l
        .grants(NodeId::test(0), "front", 112)
        .map(|(_, g)| g.amounts().to_vec());
    assert_eq!(told, [("ann", 1, 1, 100.0)], "grants {grants:?}");
    let remaining = bound.budgets[0].remaining;
    assert!((900.0..=1000.0).contains(&remaining), "{remaining}");
}
