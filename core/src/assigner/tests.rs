use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use throttle_proto::v1;

use super::*;
use crate::ledger::LedgerConfig;
use crate::ledger::{Ledger, NodeId};
use crate::limits::LimitSource;
use crate::limits::{Limit, LimitSet, StaticLimits};

/// Counts how often the limits are read.
#[derive(Debug)]
struct Counting {
    inner: StaticLimits,
    versioned: bool,
    reads: AtomicUsize,
}

impl LimitSource for Counting {
    fn services(&self) -> Vec<String> {
        self.inner.services()
    }

    fn list_limits(&self, service: &str) -> Vec<crate::limits::Limit> {
        self.reads.fetch_add(1, Ordering::Relaxed);
        self.inner.list_limits(service)
    }

    fn policy(&self, service: &str) -> Option<String> {
        self.inner.policy(service)
    }

    fn version(&self) -> Option<u64> {
        if self.versioned {
            self.inner.version()
        } else {
            None
        }
    }
}

fn set(rate: f64) -> LimitSet {
    let mut set = LimitSet::new();
    set.insert(
        "front",
        Limit {
            user: "alice".into(),
            per_second: [("requests".into(), rate)].into(),
            burst_seconds: 1.0,
            max_debt_seconds: None,
            per_period: Default::default(),
        },
    );
    set
}

fn assigner(versioned: bool) -> (Assigner, Arc<Counting>) {
    let limits = Arc::new(Counting {
        inner: StaticLimits::new(set(10.0)),
        versioned,
        reads: AtomicUsize::new(0),
    });
    let assigner = Assigner::new(Ledger::new(LedgerConfig::default()), limits.clone());
    (assigner, limits)
}

#[test]
fn limits_are_read_again_only_when_their_version_changes() {
    let (mut a, limits) = assigner(true);
    a.refresh_limits(0);
    a.refresh_limits(1_000);
    assert_eq!(
        limits.reads.load(Ordering::Relaxed),
        1,
        "unchanged: skipped"
    );
    limits.inner.replace(set(20.0));
    a.refresh_limits(2_000);
    assert_eq!(limits.reads.load(Ordering::Relaxed), 2);
    let level = a
        .ledger_mut()
        .bucket_level("front", "alice", "requests", 2_000);
    assert_eq!(level, Some(10.0), "the new rate applies from now on");
    assert_eq!(
        a.ledger_mut()
            .bucket_level("front", "alice", "requests", 3_000),
        Some(20.0)
    );
}

#[test]
fn a_service_takes_the_policy_its_limits_name_and_the_default_again() {
    let (mut a, limits) = assigner(true);
    a.refresh_limits(0);
    assert_eq!(a.ledger().policy_name("front"), Some("projected"));
    let mut classic = set(10.0);
    classic.set_policy("front", "classic");
    limits.inner.replace(classic);
    a.refresh_limits(1_000);
    assert_eq!(a.ledger().policy_name("front"), Some("classic"));
    assert_eq!(
        a.ledger_mut()
            .bucket_level("front", "alice", "requests", 1_000),
        Some(10.0),
        "the limits still apply"
    );
    limits.inner.replace(set(10.0));
    a.refresh_limits(2_000);
    assert_eq!(a.ledger().policy_name("front"), Some("projected"));
}

/// Accepts packed quotas or not, and no refs.
fn packed(packed: bool) -> Accepts {
    Accepts {
        packed,
        refs: false,
    }
}

fn report(node: &str, slot: i64, requests: i64) -> v1::Report {
    let alice = format!(r#"{{"alice": {{"requests": {requests}}}}}"#);
    crate::ledger::tests::report(node, slot, &alice, "{}")
}

#[test]
fn a_nodes_quotas_are_packed_while_every_stream_of_it_accepts_them() {
    let limits = Arc::new(StaticLimits::new(set(10.0)));
    let mut a: Assigner<Encoded> = Assigner::new(Ledger::new(LedgerConfig::default()), limits);
    let front = ["front".to_string()];
    let (n1, _) = a.connect("n1", &front, packed(true), 0);
    let (n2, _) = a.connect("n2", &front, packed(false), 0);
    assert!(a.is_packed(n1));
    assert!(!a.is_packed(n2));
    // A second stream of n1 (a process replacing it) that does not.
    a.connect("n1", &front, packed(false), 0);
    assert!(!a.is_packed(n1));
    a.disconnect(n1, packed(true));
    assert!(!a.is_packed(n1), "the stream left does not");
    a.disconnect(n1, packed(false));
    a.connect("n1", &front, packed(true), 0);
    assert!(a.is_packed(n1));
    // What is rendered for each.
    for (slot, t) in [(1, 1_050), (2, 2_050)] {
        a.report(n1, &report("n1", slot, 3), t).unwrap();
        a.report(n2, &report("n2", slot, 1), t).unwrap();
        a.tick(t + 450);
    }
    let quota = |node| {
        let bytes = a.prepare(node, 2).unwrap().quota;
        match <v1::CentralMessage as prost::Message>::decode(&bytes[..]) {
            Ok(v1::CentralMessage {
                kind: Some(v1::central_message::Kind::Quota(q)),
            }) => q,
            other => panic!("{other:?}"),
        }
    };
    let (mut packed, classic) = (quota(n1), quota(n2));
    assert!(
        packed.services.is_empty() && packed.packed.len() == 1,
        "{packed:?}"
    );
    assert!(
        classic.packed.is_empty() && classic.services.len() == 1,
        "{classic:?}"
    );
    packed.unpack().unwrap();
    let alice = |q: &v1::Quota| q.services["front"].slots[&3].users["alice"].resources["requests"];
    assert!(
        alice(&packed) > alice(&classic),
        "n1 uses more: {packed:?} {classic:?}"
    );
}

#[test]
fn a_prepared_answer_is_the_answer_the_report_gets() {
    let limits = Arc::new(StaticLimits::new(set(10.0)));
    let mut a: Assigner<Encoded> = Assigner::new(Ledger::new(LedgerConfig::default()), limits);
    let (n1, _) = a.connect("n1", &["front".to_string()], packed(false), 0);
    let (n2, _) = a.connect("n2", &["front".to_string()], packed(false), 0);
    for (slot, t) in [(1, 1_050), (2, 2_050), (3, 3_050)] {
        a.report(n1, &report("n1", slot, 3), t).unwrap();
        a.report(n2, &report("n2", slot, 1), t).unwrap();
        a.tick(t + 450);
    }
    let Ahead {
        quota: prepared,
        services,
        refers,
    } = a.prepare(n1, 4).unwrap();
    assert!(!refers);
    assert_eq!(services, ["front"]);
    let answer = a.report(n1, &report("n1", 4, 3), 4_050).unwrap();
    assert_eq!(answer.quota, prepared, "filing changes no grant");
    let decoded = <v1::CentralMessage as prost::Message>::decode(&prepared[..]).unwrap();
    let Some(v1::central_message::Kind::Quota(q)) = decoded.kind else {
        panic!("{decoded:?}")
    };
    assert_eq!(q.report_slot, Some(4));
    let alice = &q.services["front"].slots[&5].users["alice"].resources["requests"];
    assert!(*alice > 0.0, "n1 has a share of alice's bucket: {alice}");
    // Filing alone answers nothing and leaves the next answer as it was.
    a.file(n2, &report("n2", 4, 1), 4_060).unwrap();
    assert_eq!(a.prepare(n1, 4).unwrap().quota, prepared);
    assert!(
        a.prepare(NodeId::from_index(99), 4).is_none(),
        "not connected"
    );
}

/// For each policy, a maker of assigners over it, with limits of 10.
fn per_policy<F: QuotaFormat>() -> [fn() -> Assigner<F>; 3] {
    fn make<F: QuotaFormat>(policy: fn() -> Box<dyn crate::policy::Policy>) -> Assigner<F> {
        let limits = Arc::new(StaticLimits::new(set(10.0)));
        let ledger = Ledger::with_policies(LedgerConfig::default(), Box::new(move |_| policy()));
        Assigner::new(ledger, limits)
    }
    [
        || make(|| Box::new(crate::policy::Projected::new())),
        || make(|| Box::new(crate::policy::Classic::new())),
        || make(|| Box::new(crate::policy::StaticSplit::new())),
    ]
}

#[test]
fn answers_rendered_with_the_tick_are_those_prepare_renders() {
    for make in per_policy::<Encoded>() {
        // Two assigners fed alike: one ticks and prepares in one pass,
        // the other ticks, then prepares each node.
        let (mut one, mut two) = (make(), make());
        // n1 is also in a service without limits: nothing to reuse there.
        let services = [
            vec!["front".to_string(), "other".to_string()],
            vec!["front".to_string()],
        ];
        let mut nodes = Vec::new();
        // n1 takes its quotas packed.
        for (name, services) in ["n1", "n2"].iter().zip(&services) {
            nodes.push(one.connect(name, services, packed(*name == "n1"), 0).0);
            two.connect(name, services, packed(*name == "n1"), 0);
        }
        for (slot, t) in [(1, 1_050), (2, 2_050), (3, 3_050)] {
            for (name, requests) in [("n1", 3), ("n2", 1)] {
                let node = nodes[usize::from(name == "n2")];
                one.report(node, &report(name, slot, requests), t).unwrap();
                two.report(node, &report(name, slot, requests), t).unwrap();
            }
            let (pushes, prepared) = one.tick_and_prepare(t + 450);
            assert_eq!(pushes, two.tick(t + 450));
            assert_eq!(prepared.len(), 2);
            for (node, answer) in prepared {
                let want = two.prepare(node, slot + 1).unwrap();
                assert_eq!(answer.quota, want.quota, "node {node:?} after slot {slot}");
                assert_eq!(answer.services, want.services);
            }
        }
    }
}

/// An answer rendered ahead for a node that accepts refs names the
/// tables of the push rendered with it that hold its grants, and once
/// those tables are put in for the refs it is the whole answer; for
/// every policy, and only while every stream of the node accepts refs.
#[test]
fn an_answer_ahead_refers_to_the_push_it_repeats() {
    for make in per_policy::<Messages>() {
        // `refs` answers n1 with refs, `whole` without; n2 takes none.
        let (mut refs, mut whole) = (make(), make());
        let services = ["front".to_string(), "other".to_string()];
        let n1 = refs.connect("n1", &services, Accepts::ALL, 0).0;
        whole.connect("n1", &services, packed(true), 0);
        let n2 = refs.connect("n2", &services, packed(true), 0).0;
        whole.connect("n2", &services, packed(true), 0);
        for (slot, t) in [(1, 1_050), (2, 2_050), (3, 3_050)] {
            for (node, name, requests) in [(n1, "n1", 3), (n2, "n2", 1)] {
                refs.report(node, &report(name, slot, requests), t).unwrap();
                whole
                    .report(node, &report(name, slot, requests), t)
                    .unwrap();
            }
            let mut answers = BTreeMap::new();
            refs.tick_each(t + 450, |node, push, answer| {
                answers.insert(node, (push, answer.unwrap()));
            });
            let (_, want) = whole.tick_and_prepare(t + 450);
            for (node, want) in want {
                let (push, mut answer) = answers.remove(&node).unwrap();
                assert_eq!(answer.services, want.services);
                assert_eq!(answer.refers, !answer.quota.refs.is_empty());
                if node == n2 {
                    assert_eq!(answer.quota, want.quota, "n2 takes no refs");
                    continue;
                }
                // "front" has grants for n1, which the push holds;
                // "other" has none, and is sent whole.
                let referred: Vec<&str> = answer
                    .quota
                    .refs
                    .iter()
                    .map(|r| r.service.as_str())
                    .collect();
                assert_eq!(referred, ["front"], "slot {slot}");
                for r in std::mem::take(&mut answer.quota.refs) {
                    assert_eq!(r.slot, slot + 2);
                    let table = push.services[&r.service].slots[&r.from_slot].clone();
                    let slots = &mut answer.quota.services.entry(r.service).or_default().slots;
                    slots.insert(r.slot, table);
                }
                assert_eq!(answer.quota, want.quota, "slot {slot}");
            }
        }
        // A second stream of n1 that does not take refs.
        refs.connect("n1", &services, packed(true), 4_000);
        refs.tick_each(4_500, |node, _, answer| {
            assert!(!answer.unwrap().refers, "{node:?}");
        });
    }
}

#[test]
fn limits_without_a_version_are_read_every_time() {
    let (mut a, limits) = assigner(false);
    a.refresh_limits(0);
    a.refresh_limits(1_000);
    assert_eq!(limits.reads.load(Ordering::Relaxed), 2);
}
