//! A restored ledger grants nothing until the nodes it expects have sent
//! their reports again (`ledger/catch_up.rs`), then assigns at once.

use std::sync::Arc;

use throttle_proto::v1;

use super::{Accepts, Assigner};
use crate::ledger::{Ledger, LedgerConfig, hold_ms};
use crate::limits::{Limit, LimitSet, StaticLimits};

const SLOT_MS: i64 = 1000;

fn assigner() -> Assigner {
    let mut set = LimitSet::new();
    set.insert(
        "front",
        Limit {
            user: "alice".into(),
            per_second: [("requests".into(), 100.0)].into(),
            burst_seconds: 10.0,
            ..Limit::default()
        },
    );
    let mut a = Assigner::new(
        Ledger::new(LedgerConfig::default()),
        Arc::new(StaticLimits::new(set)),
    );
    a.refresh_limits(0);
    a
}

/// A report of `node`, sent in `slot`, of `amount` requests of alice.
fn report(node: &str, slot: i64, amount: i64) -> v1::Report {
    let amounts = v1::Amounts {
        resources: [("requests".to_owned(), amount)].into(),
    };
    v1::Report {
        node_id: node.into(),
        slot_number: slot,
        consumption: [(
            "front".to_owned(),
            v1::Usage {
                users: [("alice".to_owned(), amounts)].into(),
            },
        )]
        .into(),
        ..v1::Report::default()
    }
}

/// A central that filed n1 and n2 through slot 10, checkpointed at 10.5 s,
/// and a new one restored from that checkpoint at 13.4 s.
fn restored() -> Assigner {
    let mut old = assigner();
    let services = ["front".to_owned()];
    for node in ["n1", "n2"] {
        old.connect(node, &services, Accepts::NONE, 9_000);
    }
    for slot in 10..=11 {
        for node in ["n1", "n2"] {
            old.report(
                old.ledger().find_node(node).unwrap(),
                &report(node, slot, 150),
                slot * SLOT_MS + 50,
            )
            .unwrap();
        }
    }
    let checkpoint = old.ledger().checkpoint(11_500);
    let mut new = assigner();
    new.ledger_mut().restore(&checkpoint, 13_400).unwrap();
    new
}

fn has_rows(q: &v1::Quota) -> bool {
    !q.services.is_empty()
}

#[test]
fn a_restored_central_grants_nothing_until_its_nodes_are_back() {
    let mut a = restored();
    let services = ["front".to_owned()];
    let (n1, pushes) = a.connect("n1", &services, Accepts::NONE, 13_400);
    assert!(pushes.is_empty(), "no push on connect while holding");
    assert!(a.tick(13_500).is_empty(), "no push at the tick either");
    // n1's kept reports: its answer carries no table, so the node keeps
    // its last quotas (an empty table would mean "not limited").
    for slot in 12..=13 {
        let answer = a.report(n1, &report("n1", slot, 150), 13_550).unwrap();
        assert!(!has_rows(&answer.quota), "{:?}", answer.quota);
        assert_eq!(answer.quota.report_slot, Some(slot));
    }
    assert!(a.ledger().holding(), "n2 is still awaited");
    let (n2, _) = a.connect("n2", &services, Accepts::NONE, 13_600);
    a.report(n2, &report("n2", 12, 150), 13_600).unwrap();
    let last = a.report(n2, &report("n2", 13, 150), 13_600).unwrap();
    assert!(!a.ledger().holding(), "every node caught up");
    assert_eq!(last.complete, vec!["front".to_owned()], "assign it now");
    assert!(has_rows(&last.quota), "answered from the new grants");
    assert!(!a.reassign("front", 13_600).is_empty());
}

#[test]
fn a_node_that_never_comes_back_holds_grants_only_for_a_while() {
    let mut a = restored();
    let services = ["front".to_owned()];
    let (n1, _) = a.connect("n1", &services, Accepts::NONE, 13_400);
    a.report(n1, &report("n1", 13, 150), 13_450).unwrap();
    assert!(a.ledger().holding(), "n2 is awaited");
    let until = 13_400 + hold_ms(throttle_clock::SlotLength::SECOND);
    assert!(a.tick(until - 1).is_empty());
    assert!(!a.tick(until).is_empty(), "granted once the hold is over");
    assert!(!a.ledger().holding());
}

#[test]
fn a_ledger_restored_from_an_empty_checkpoint_grants_at_once() {
    let mut a = assigner();
    let checkpoint = assigner().ledger().checkpoint(5_000);
    a.ledger_mut().restore(&checkpoint, 6_000).unwrap();
    assert!(!a.ledger().holding());
    let (_, pushes) = a.connect("n1", &["front".to_owned()], Accepts::NONE, 6_000);
    assert!(!pushes.is_empty());
}

/// Every node cut off from a central that led on: the first node back is
/// granted nothing, at its connect or its first report, until the other
/// has sent its kept reports too.
#[test]
fn nodes_back_after_a_silence_are_granted_once_all_have_reported() {
    let mut a = assigner();
    let services = ["front".to_owned()];
    let (n1, _) = a.connect("n1", &services, Accepts::NONE, 9_000);
    let (n2, _) = a.connect("n2", &services, Accepts::NONE, 9_000);
    for slot in 10..=11 {
        let now = slot * SLOT_MS + 50;
        a.report(n1, &report("n1", slot, 100), now).unwrap();
        a.report(n2, &report("n2", slot, 100), now).unwrap();
        a.tick(now + 400);
    }
    assert!(!a.ledger().holding(), "reports every slot are no silence");
    a.disconnect(n1, Accepts::NONE);
    a.disconnect(n2, Accepts::NONE);
    // Nothing heard from 11.5 s to 16.3 s: the buckets refill meanwhile.
    for t in [12_500, 13_500, 14_500, 15_500] {
        a.tick(t);
    }
    let (n1, pushes) = a.connect("n1", &services, Accepts::NONE, 16_300);
    assert!(pushes.is_empty(), "nothing granted at the connect");
    assert!(a.ledger().holding());
    for slot in 12..=16 {
        a.report(n1, &report("n1", slot, 100), 16_300).unwrap();
    }
    assert!(a.ledger().holding(), "n2 is still away");
    let (n2, _) = a.connect("n2", &services, Accepts::NONE, 16_600);
    for slot in 12..=16 {
        a.report(n2, &report("n2", slot, 100), 16_600).unwrap();
    }
    a.tick(16_700);
    assert!(!a.ledger().holding(), "both back: granting again");
}

#[test]
fn a_fresh_central_holds_for_nodes_that_resume_and_not_for_new_ones() {
    let services = ["front".to_owned()];
    // Nodes that never had a central: granted at connect.
    let mut first = assigner();
    first.ledger_mut().begin(13_000);
    let (_, pushes) = first.connect("n1", &services, Accepts::NONE, 13_100);
    assert!(!pushes.is_empty(), "a new node is granted at once");
    assert!(!first.ledger().holding());
    // Nodes back from another central's quotas: nothing until the hold
    // is over, however few of them are back.
    let mut a = assigner();
    a.ledger_mut().begin(13_000);
    a.resumes(13_100);
    let (n1, pushes) = a.connect("n1", &services, Accepts::NONE, 13_100);
    assert!(pushes.is_empty(), "no push on connect while holding");
    let mut kept = report("n1", 13, 150);
    kept.answered = true;
    a.report(n1, &kept, 13_150).unwrap();
    let answer = a.report(n1, &report("n1", 14, 150), 14_050).unwrap();
    assert!(!has_rows(&answer.quota), "the node keeps its last quotas");
    let until = 13_100 + hold_ms(throttle_clock::SlotLength::SECOND);
    assert!(a.tick(until - 1).is_empty());
    assert!(!a.tick(until).is_empty(), "granted once the hold is over");
}

#[test]
fn an_answered_report_holds_a_fresh_central_too() {
    let mut a = assigner();
    a.ledger_mut().begin(13_000);
    let (n1, _) = a.connect("n1", &["front".to_owned()], Accepts::NONE, 13_100);
    let mut kept = report("n1", 13, 150);
    kept.answered = true;
    a.report(n1, &kept, 13_150).unwrap();
    assert!(
        a.ledger().holding(),
        "a node that had another central's quotas"
    );
    // A ledger that has filed reports does not start such a hold.
    a.tick(13_150 + hold_ms(throttle_clock::SlotLength::SECOND));
    assert!(!a.ledger().holding());
    a.resumes(16_000);
    assert!(!a.ledger().holding());
}
