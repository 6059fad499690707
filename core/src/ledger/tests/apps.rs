//! A capacity shared by applications, through the ledger: grants per
//! application each slot, burst allowances, and the monitor's view.

use super::*;
use crate::limits::{LimitSet, LimitSource};

const APPS: &str = r#"
[service.front]
capacity = { requests = 1000 }

[[app]]
service = "front"
name = "video"
users = ["video-*"]
priority = 0
guaranteed = { requests = 300 }
burst = { requests = 600 }
burst_seconds = 3

[[app]]
service = "front"
name = "batch"
users = ["batch"]
priority = 1
guaranteed = { requests = 300 }
burst = { requests = 1000 }
"#;

fn with_apps(toml: &str) -> Ledger {
    let set = LimitSet::from_toml(toml).unwrap();
    let mut l = keeping(10);
    l.apply_limits("front", &set.list_limits("front"), T);
    l.apply_hierarchy("front", LimitSource::hierarchy(&set, "front"));
    assert!(l.use_policy("front", set.policy("front").as_deref()));
    l
}

/// Per user, what every node was granted for `slot`.
fn granted(l: &mut Ledger, slot: i64) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for node in ["n1", "n2"] {
        let id = l.node_id(node);
        let Some((state, grants)) = l.grants(id, "front", slot) else {
            continue;
        };
        for g in grants.iter() {
            *out.entry(state.key(g.key).user().to_owned()).or_default() += g.amount();
        }
    }
    out
}

/// Each slot from 101, `video-1` and `batch` each want 700 and `carol`
/// (in no application) 200, split evenly over two nodes: each node
/// admits what it was granted for the slot (500 of the first two and
/// 200 of carol, before any grant) and refuses the rest. The report
/// sent in slot `s` is of data slot `s - 1`; the assign at mid-slot `s`
/// is of slot `s + 1`.
fn run(l: &mut Ledger, slots: std::ops::Range<i64>) -> Vec<BTreeMap<String, f64>> {
    let wants = [("video-1", 700.0), ("batch", 700.0), ("carol", 200.0)];
    let first: BTreeMap<String, f64> = [("video-1", 500.0), ("batch", 500.0), ("carol", 200.0)]
        .map(|(u, a)| (u.to_owned(), a))
        .into();
    let mut by_slot: BTreeMap<i64, BTreeMap<String, f64>> = BTreeMap::new();
    let mut out = Vec::new();
    for slot in slots {
        let now = slot * 1_000;
        let had = by_slot.get(&(slot - 1)).unwrap_or(&first);
        let (mut used, mut refused) = (Vec::new(), Vec::new());
        for (user, want) in wants {
            let admitted = had.get(user).copied().unwrap_or(want).min(want);
            let half = |x: f64| (x / 2.0).round() as i64;
            used.push(format!(r#""{user}": {{"requests": {}}}"#, half(admitted)));
            refused.push(format!(
                r#""{user}": {{"requests": {}}}"#,
                half(want - admitted)
            ));
        }
        let (used, refused) = (
            format!("{{{}}}", used.join(",")),
            format!("{{{}}}", refused.join(",")),
        );
        for node in ["n1", "n2"] {
            l.ingest(&report(node, slot, &used, &refused), now).unwrap();
        }
        let assigned = l.assign(now + 500)["front"];
        let grants = granted(l, assigned);
        by_slot.insert(assigned, grants.clone());
        out.push(grants);
        l.forget(now + 500);
    }
    out
}

#[test]
fn guarantees_then_bursts_by_priority_and_never_past_the_capacity() {
    let mut l = with_apps(APPS);
    let slots = run(&mut l, 101..104);
    let first = &slots[0];
    assert!((first["video-1"] - 600.0).abs() < 1e-3, "{first:?}");
    assert!((first["batch"] - 400.0).abs() < 1e-3, "{first:?}");
    assert_eq!(first.get("carol"), Some(&0.0), "lowest priority: cut");
    for grants in &slots {
        assert!(grants.values().sum::<f64>() <= 1000.0 + 1e-3, "{grants:?}");
    }
}

#[test]
fn a_burst_ends_after_its_seconds_and_the_rest_goes_down_the_priorities() {
    let mut l = with_apps(APPS);
    let slots = run(&mut l, 101..108);
    let video: Vec<f64> = slots.iter().map(|g| g["video-1"].round()).collect();
    assert_eq!(video, [600.0, 600.0, 600.0, 300.0, 300.0, 300.0, 300.0]);
    let batch = slots[4]["batch"].round();
    assert_eq!(batch, 700.0, "video's burst went to batch: {:?}", slots[4]);
    let view = Monitor::of(&l).apps(None);
    let status = &view[0].1.resources[0];
    let names: Vec<&str> = status.apps.iter().map(|a| a.name.as_str()).collect();
    assert_eq!(names, ["video", "batch", "*"]);
    assert_eq!(status.apps[0].burst_seconds_left, 0.0);
    assert_eq!(status.apps[2].users, 1, "carol");
    let json = json::apps(&view);
    assert_eq!(json["front"]["resources"][0]["capacity"], 1000.0);
}

#[test]
fn an_idle_application_lends_its_share() {
    let mut l = with_apps(APPS);
    run(&mut l, 101..103);
    // video goes quiet: batch may take up to its ceiling.
    for slot in 103..106 {
        let now = slot * 1_000;
        let users = r#"{"batch": {"requests": 500}}"#;
        let refused = r#"{"batch": {"requests": 400}}"#;
        l.ingest(&report("n1", slot, users, refused), now).unwrap();
        l.ingest(&report("n2", slot, "{}", "{}"), now).unwrap();
        l.assign(now + 500);
        l.forget(now + 500);
    }
    let grants = granted(&mut l, 106);
    assert!((grants["batch"] - 900.0).abs() < 1e-3, "{grants:?}");
    assert!(!grants.contains_key("video-1"), "idle: no quota {grants:?}");
}
