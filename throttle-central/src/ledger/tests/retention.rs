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

/// Keys that left are given back once their ids could be given again: the
/// arena is cut after its last key in use, and a key at a cut id is a new
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
    l.ingest(&report("n1", 112, &one("carol"), "{}"), T + 12_000)
        .unwrap();
    l.forget(T + 13_000);
    assert_eq!(state(&l).id_bound(), 3, "dave's id may still be named");
    l.forget(T + 14_000);
    assert_eq!(state(&l).id_bound(), 2, "cut after carol");
    // Erin reuses bob's id; frank is pushed where dave was.
    l.ingest(&report("n1", 114, &one("erin"), "{}"), T + 14_000)
        .unwrap();
    l.ingest(&report("n2", 114, &one("frank"), "{}"), T + 14_000)
        .unwrap();
    let generation = |user| {
        let id = state(&l).find(user, "requests").unwrap();
        (id, state(&l).key(id).generation())
    };
    assert_eq!(generation("erin"), (KeyId(0), 1));
    assert_eq!(
        generation("frank"),
        (KeyId(2), 1),
        "a cut id is a new generation"
    );
    assert_eq!(state(&l).find("dave", "requests"), None);
}
