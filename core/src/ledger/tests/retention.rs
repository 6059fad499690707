//! Limits changing, and what the retention forgets and reuses.

use super::*;

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
fn freed_key_ids_are_reused_only_once_the_history_lets_go() {
    let mut l = keeping(5);
    let one = |user: &str| format!(r#"{{"{user}": {{"requests": 1}}}}"#);
    l.ingest(&report("n1", 100, &one("bob"), "{}"), T).unwrap();
    l.ingest(&report("n2", 100, &one("carol"), "{}"), T)
        .unwrap();
    l.ingest(&report("n2", 104, &one("carol"), "{}"), T + 4_000)
        .unwrap();
    l.forget(T + 5_000);
    fn state(l: &Ledger) -> &ServiceState {
        &l.services["front"].state
    }
    assert_eq!(state(&l).key_count(), 1, "carol stays");
    assert_eq!(
        state(&l).key(KeyId(0)).user(),
        "bob",
        "a freed key keeps its names for the grants still naming it"
    );
    // Too soon to reuse id 0: the history may name it up to slot 107.
    l.ingest(&report("n1", 106, &one("dave"), "{}"), T + 6_000)
        .unwrap();
    assert_eq!(state(&l).find("dave", "requests"), Some(KeyId(2)));
    l.ingest(&report("n2", 113, &one("carol"), "{}"), T + 13_000)
        .unwrap();
    l.forget(T + 14_000);
    l.ingest(&report("n1", 115, &one("erin"), "{}"), T + 15_000)
        .unwrap();
    assert_eq!(state(&l).find("erin", "requests"), Some(KeyId(0)));
    let key = state(&l).key(KeyId(0));
    assert_eq!((key.user(), key.resource()), ("erin", "requests"));
    assert_eq!(key.generation(), 1, "a reused id is a new generation");
    assert_eq!(l.slot_sum("front", "erin", "requests", 114, false), 1);
    assert_eq!(l.slot_sum("front", "bob", "requests", 99, false), 0);
}

/// Keys that left the arena's end are given back at once: the arena is
/// cut after its last key in use, the book's grants of the keys cut go,
/// the older ones kept are stale, and a key at a cut id is a new
/// generation.
#[test]
fn the_arena_is_cut_after_its_last_key_in_use() {
    let mut l = keeping(5);
    let one = |user: &str| format!(r#"{{"{user}": {{"requests": 1}}}}"#);
    for (i, user) in ["bob", "carol", "dave"].iter().enumerate() {
        l.ingest(&report(&format!("n{i}"), 100, &one(user), "{}"), T)
            .unwrap();
    }
    fn state(l: &Ledger) -> &ServiceState {
        &l.services["front"].state
    }
    assert_eq!(state(&l).id_bound(), 3);
    // Carol (id 1) stays; bob and dave leave at slot 105.
    l.ingest(&report("n1", 104, &one("carol"), "{}"), T + 4_000)
        .unwrap();
    l.forget(T + 5_000);
    assert_eq!(state(&l).id_bound(), 2, "cut after carol");
    let cuts = state(&l).cuts();
    assert!(cuts.stale(104, KeyId(2)), "granted before the cut");
    assert!(!cuts.stale(105, KeyId(2)) && !cuts.stale(104, KeyId(1)));
    // Frank is pushed where dave was.
    l.ingest(&report("n2", 106, &one("frank"), "{}"), T + 6_000)
        .unwrap();
    let found = state(&l).find("frank", "requests");
    let generation = found.map(|id| (id, state(&l).key(id).generation()));
    assert_eq!(
        generation,
        Some((KeyId(2), 1)),
        "a cut id is a new generation"
    );
    assert_eq!(state(&l).find("dave", "requests"), None);
}

/// A key cut from the arena leaves the quota history with it: the key
/// pushed at its id next is not shown the grants it had.
#[test]
fn a_cut_keys_quotas_leave_with_it() {
    let mut l = keeping(10);
    l.apply_limits("front", &[limit("*", "requests", 10.0)], T);
    let one = |user: &str| format!(r#"{{"{user}": {{"requests": 1}}}}"#);
    l.ingest(&report("n1", 100, &one("bob"), "{}"), T).unwrap();
    fn state(l: &Ledger) -> &ServiceState {
        &l.services["front"].state
    }
    for slot in 100..=110 {
        l.assign(slot * 1_000 + 500);
        if slot == 110 {
            let quotas = monitor_quota(&l, SlotRange::default());
            assert_eq!(quotas["front"]["104"]["n1"]["bob"]["requests"], 55.0);
        }
        l.forget(slot * 1_000 + 500);
    }
    // Bob was forgotten at slot 110 (data slot 99 left the 10 kept) and
    // cut at once, while the history still held his grants of slot 104.
    assert_eq!(state(&l).id_bound(), 0, "bob's id is cut");
    l.ingest(&report("n1", 110, &one("frank"), "{}"), 110_600)
        .unwrap();
    assert_eq!(state(&l).find("frank", "requests"), Some(KeyId(0)));
    let quotas = monitor_quota(&l, SlotRange::default());
    assert!(!quotas.to_string().contains("frank"), "{quotas}");
    assert!(!quotas.to_string().contains("bob"), "{quotas}");
}
