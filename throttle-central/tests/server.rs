//! The central node on 127.0.0.1:0 with real tonic clients as nodes.

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use serde_json::Value;
use throttle_central::ha::leadership::Follower;
use throttle_central::limits::{FileLimits, LimitSet, StaticLimits};
use throttle_central::{Central, RunningCentral, Subject};
use throttle_clock::{Clock, SlotLength, SystemClock};
use throttle_proto::legacy::report_from_json;
use throttle_proto::v1::central_client::CentralClient;
use throttle_proto::v1::{self, central_message, node_message};
use throttle_proto::{PACKED_QUOTAS, QUOTA_REFS};
use tokio::sync::mpsc;
use tonic::Streaming;

mod common;

const SLOT_MS: u32 = 100;

fn metrics() -> metrics_exporter_prometheus::PrometheusHandle {
    static HANDLE: OnceLock<metrics_exporter_prometheus::PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            metrics_exporter_prometheus::PrometheusBuilder::new()
                .install_recorder()
                .unwrap()
        })
        .clone()
}

async fn start(builder: throttle_central::CentralBuilder) -> RunningCentral {
    let grpc = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let http = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    builder
        .slot(SlotLength::from_ms(SLOT_MS).unwrap())
        .metrics(metrics())
        .spawn(grpc, Some(http))
        .unwrap()
}

fn limits(toml: &str) -> Arc<StaticLimits> {
    Arc::new(StaticLimits::new(LimitSet::from_toml(toml).unwrap()))
}

struct Node {
    tx: mpsc::Sender<v1::NodeMessage>,
    inbound: Streaming<v1::CentralMessage>,
    /// Its Hello accepts packed quotas: every quota it receives is checked
    /// to be in the form it accepts, and unpacked.
    packed: bool,
    /// Its Hello accepts refs: each is resolved from the tables this
    /// stream delivered before (and must name one), as a node installs it.
    refs: bool,
    /// Every (service, slot) table received, the last of each.
    tables: std::collections::BTreeMap<(String, i64), v1::UserQuotas>,
    /// Refs resolved so far.
    resolved: usize,
}

fn hello(node_id: &str, slot_ms: u32) -> v1::NodeMessage {
    hello_accepting(node_id, slot_ms, &[])
}

fn hello_accepting(node_id: &str, slot_ms: u32, accepts: &[&str]) -> v1::NodeMessage {
    v1::NodeMessage {
        kind: Some(node_message::Kind::Hello(v1::Hello {
            node_id: node_id.into(),
            slot_ms,
            services: vec!["front".into()],
            version: "test".into(),
            accepts: accepts.iter().map(|a| a.to_string()).collect(),
            resumes: false,
            report_every_ms: 0,
        })),
    }
}

async fn open(addr: SocketAddr, first: v1::NodeMessage) -> Node {
    let accepts = |form: &str| match &first.kind {
        Some(node_message::Kind::Hello(h)) => h.accepts.iter().any(|a| a == form),
        _ => false,
    };
    let (packed, refs) = (accepts(PACKED_QUOTAS), accepts(QUOTA_REFS));
    let mut client = CentralClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    let (tx, rx) = mpsc::channel(16);
    tx.send(first).await.unwrap();
    let inbound = client
        .exchange(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    Node {
        tx,
        inbound,
        packed,
        refs,
        tables: Default::default(),
        resolved: 0,
    }
}

async fn node(addr: SocketAddr, node_id: &str) -> Node {
    node_accepting(addr, node_id, &[]).await
}

async fn node_accepting(addr: SocketAddr, node_id: &str, accepts: &[&str]) -> Node {
    let mut n = open(addr, hello_accepting(node_id, SLOT_MS, accepts)).await;
    let first = n.recv().await.unwrap();
    assert!(matches!(
        first,
        central_message::Kind::Welcome(v1::Welcome {
            slot_ms: SLOT_MS,
            ..
        })
    ));
    n
}

fn current_slot() -> i64 {
    SlotLength::from_ms(SLOT_MS)
        .unwrap()
        .slot_at(SystemClock.now_ms())
}

fn report(node: &str, slot: i64, consumption: &str, rejection: &str) -> v1::Report {
    report_from_json(&format!(
        r#"{{"node_id": "{node}", "slot_number": {slot}, "consumption": {{"front": {consumption}}}, "rejection": {{"front": {rejection}}}}}"#
    ))
    .unwrap()
}

impl Node {
    /// The next message but block lists and limits (a new stream hears
    /// one of each per service, empty ones included).
    async fn recv(&mut self) -> Result<central_message::Kind, tonic::Status> {
        let mut kind = loop {
            let m = tokio::time::timeout(Duration::from_secs(5), self.inbound.message())
                .await
                .expect("no message within 5 s")?;
            match m.and_then(|m| m.kind).expect("stream ended") {
                central_message::Kind::Blocks(_)
                | central_message::Kind::Limits(_)
                | central_message::Kind::Bound(_) => continue,
                kind => break kind,
            }
        };
        if let central_message::Kind::Quota(q) = &mut kind {
            if self.packed {
                assert!(q.services.is_empty(), "not packed: {q:?}");
                assert!(
                    !q.packed.is_empty() || !q.refs.is_empty(),
                    "no table: {q:?}"
                );
                q.unpack().unwrap();
            } else {
                assert!(
                    q.packed.is_empty(),
                    "packed for a node that did not ask: {q:?}"
                );
            }
            assert!(
                self.refs || q.refs.is_empty(),
                "refs for a node that did not ask: {q:?}"
            );
            for (service, sq) in &q.services {
                for (slot, users) in &sq.slots {
                    self.tables.insert((service.clone(), *slot), users.clone());
                }
            }
            for r in std::mem::take(&mut q.refs) {
                let Some(table) = self.tables.get(&(r.service.clone(), r.from_slot)).cloned()
                else {
                    panic!("{r:?} names no table this stream delivered");
                };
                self.tables
                    .insert((r.service.clone(), r.slot), table.clone());
                let sq = q.services.entry(r.service).or_default();
                sq.slots.insert(r.slot, table);
                self.resolved += 1;
            }
        }
        Ok(kind)
    }

    async fn send(&self, r: v1::Report) {
        self.tx
            .send(v1::NodeMessage {
                kind: Some(node_message::Kind::Report(r)),
            })
            .await
            .unwrap();
    }

    /// Sends a report and returns the quota that answers it, skipping pushes.
    async fn exchange(&mut self, r: v1::Report) -> Result<v1::Quota, tonic::Status> {
        let slot = r.slot_number;
        self.send(r).await;
        loop {
            if let central_message::Kind::Quota(q) = self.recv().await?
                && q.report_slot == Some(slot)
            {
                return Ok(q);
            }
        }
    }

    /// The next pushed quota for `user` in service front: (slot, requests).
    async fn next_push(&mut self, user: &str) -> (i64, f64) {
        loop {
            if let Ok(central_message::Kind::Quota(q)) = self.recv().await
                && q.report_slot.is_none()
            {
                for (slot, uq) in &q.services["front"].slots {
                    if let Some(r) = uq.users.get(user) {
                        return (*slot, r.resources["requests"]);
                    }
                }
            }
        }
    }
}

async fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    let out = http_get_all(addr, path).await;
    let status = out[9..12].parse().unwrap();
    let body = out
        .split_once("\r\n\r\n")
        .map(|x| x.1.to_owned())
        .unwrap_or_default();
    (status, body)
}

async fn json(central: &RunningCentral, path: &str) -> Value {
    let (status, body) = http_get(central.http_addr().unwrap(), path).await;
    assert_eq!(status, 200, "{path}: {body}");
    serde_json::from_str(&body).unwrap()
}

#[tokio::test]
async fn hello_welcome_report_quota() {
    let central = start(Central::builder()).await;
    let mut n = node(central.grpc_addr(), "n1").await;
    let s = current_slot();
    let q = n
        .exchange(report("n1", s, r#"{"alice": {"requests": 3}}"#, "{}"))
        .await
        .unwrap();
    assert_eq!(q.report_slot, Some(s));
    assert!(
        q.services["front"].slots[&(s + 1)].users.is_empty(),
        "{{S+1: {{}}}} with no limits"
    );
    let sums = json(&central, "/v1/monitor/consumption_sum").await;
    assert_eq!(sums["front"][(s - 1).to_string()]["alice"]["requests"], 3);
    let conns = json(&central, "/v1/monitor/connections").await;
    assert_eq!(conns["connections"][0]["node_id"], "n1");
    let reported = json(
        &central,
        &format!("/v1/monitor/reported?start_slot={}", s - 1),
    )
    .await;
    assert_eq!(reported[(s - 1).to_string()][0], "n1");
    central.shutdown().await;
}

/// A report written packed, as throttle's nodes write them for a central
/// whose Welcome accepts it, is filed as the same report written as maps.
#[tokio::test]
async fn a_packed_report_is_filed_as_the_report_it_stands_for() {
    let central = start(Central::builder()).await;
    let mut n = open(central.grpc_addr(), hello("n1", SLOT_MS)).await;
    match n.recv().await.unwrap() {
        central_message::Kind::Welcome(w) => {
            assert_eq!(w.accepts, [throttle_proto::PACKED_REPORTS]);
        }
        other => panic!("{other:?}"),
    }
    let s = current_slot();
    // alice 3 requests and 7 bytes up; bob 2 requests refused.
    let table = |rejection: bool, users: Vec<(&str, Vec<u8>)>, amounts: Vec<i64>| v1::PackedUsage {
        service: "front".into(),
        rejection,
        resources: vec!["requests".into(), "traffic_up".into()],
        users: users
            .into_iter()
            .map(|(user, bits)| v1::PackedUser {
                user: user.into(),
                resources: bits,
            })
            .collect(),
        amounts,
    };
    let report = v1::Report {
        node_id: "n1".into(),
        slot_number: s,
        packed: vec![
            table(false, vec![("alice", vec![0b11])], vec![3, 7]),
            table(true, vec![("bob", vec![0b01])], vec![2]),
        ],
        ..v1::Report::default()
    };
    let q = n.exchange(report).await.unwrap();
    assert_eq!(q.report_slot, Some(s));
    let sums = json(&central, "/v1/monitor/consumption_sum").await;
    let slot = (s - 1).to_string();
    assert_eq!(sums["front"][&slot]["alice"]["requests"], 3);
    assert_eq!(sums["front"][&slot]["alice"]["traffic_up"], 7);
    let refused = json(&central, "/v1/monitor/rejection_sum").await;
    assert_eq!(refused["front"][&slot]["bob"]["requests"], 2);
    central.shutdown().await;
}

#[tokio::test]
async fn reports_after_an_assign_are_answered_ahead_of_filing() {
    answered_ahead(&[]).await;
}

/// As above, for a node that accepts refs: the answers ahead name the
/// push before them instead of repeating it, and say the same.
#[tokio::test]
async fn answers_ahead_refer_to_the_push_before_them() {
    let n = answered_ahead(&[PACKED_QUOTAS, QUOTA_REFS]).await;
    assert!(n.resolved >= 12 - 4, "{} refs", n.resolved);
}

async fn answered_ahead(accepts: &[&str]) -> Node {
    let central = start(Central::builder().limits(limits(
        "[[limit]]\nservice = \"front\"\nuser = \"alice\"\nper_second = { requests = 1000 }\n",
    )))
    .await;
    let mut n = node_accepting(central.grpc_addr(), "n1", accepts).await;
    let slot = SlotLength::from_ms(SLOT_MS).unwrap();
    // Every report after the first mid-slot assign is answered ahead. The
    // stream decides before it queues the report, so the ledger, woken by
    // it, cannot take it first (it used to, for 7 reports in 10).
    let reports: u64 = 12;
    let mut c = Value::Null;
    for done in 1..=reports {
        // Just after the boundary, as a reporter does: the assign of the
        // mid-slot before has rendered this report's answer.
        tokio::time::sleep(slot.until_next(SystemClock.now_ms()) + Duration::from_millis(5)).await;
        let s = current_slot();
        let q = n
            .exchange(report("n1", s, r#"{"alice": {"requests": 3}}"#, "{}"))
            .await
            .unwrap();
        assert_eq!(q.report_slot, Some(s));
        let alice = q.services["front"].slots[&(s + 1)].users.get("alice");
        if done > 1 {
            assert!(
                alice.is_some_and(|a| a.resources["requests"] > 0.0),
                "{q:?}"
            );
        }
        let conns = json(&central, "/v1/monitor/connections").await;
        c = conns["connections"][0].clone();
        assert_eq!(c["reports"], done);
    }
    // The first report (before the node's service was known) and, on a
    // loaded machine, a few whose mid-slot assign ran late are not.
    let ahead = c["answered_ahead"].as_u64().unwrap();
    assert!(
        ahead >= reports - 4,
        "{ahead} of {reports} reports answered ahead: {c}"
    );
    // Every report was filed, those answered ahead included.
    let sums = json(&central, "/v1/monitor/consumption_sum").await;
    let filed: i64 = sums["front"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v["alice"]["requests"].as_i64().unwrap())
        .sum();
    assert_eq!(filed, 3 * reports as i64);
    assert_eq!(c["refs"], accepts.contains(&QUOTA_REFS));
    central.shutdown().await;
    n
}

#[tokio::test]
async fn an_answer_ahead_still_means_filed_when_the_central_shuts_down() {
    let slot = SlotLength::from_ms(SLOT_MS).unwrap();
    let mut answered = 0;
    for round in 0..6 {
        let central = start(Central::builder()).await;
        let mut n = node(central.grpc_addr(), "n1").await;
        // Past a mid-slot assign, then just after the boundary: the report
        // is answered ahead, while the central node shuts down.
        tokio::time::sleep(
            Duration::from_millis(u64::from(SLOT_MS)) + slot.until_next(SystemClock.now_ms()),
        )
        .await;
        let s = current_slot();
        n.send(report("n1", s, r#"{"alice": {"requests": 7}}"#, "{}"))
            .await;
        // Shut down at varied points around the report's arrival.
        tokio::time::sleep(Duration::from_micros(200 * round)).await;
        let snapshot = central
            .shutdown_with_snapshot(Subject::ConsumptionSum)
            .await
            .unwrap();
        let mut got_answer = false;
        while let Ok(central_message::Kind::Quota(q)) = n.recv().await {
            got_answer |= q.report_slot == Some(s);
        }
        let filed = snapshot["front"][(s - 1).to_string()]["alice"]["requests"].as_i64();
        if got_answer {
            answered += 1;
            assert_eq!(filed, Some(7), "answered but not filed: {snapshot}");
        } else {
            assert_eq!(filed, None, "filed but not answered: {snapshot}");
        }
    }
    assert!(answered > 0, "no report was answered before the shutdown");
}

#[tokio::test]
async fn assign_pushes_classic_shares_to_each_node() {
    pushes_classic_shares(&[]).await;
}

/// The same, `b` taking its quotas packed: the same content reaches it.
#[tokio::test]
async fn a_node_that_accepts_packed_quotas_gets_the_same_content_packed() {
    pushes_classic_shares(&[PACKED_QUOTAS]).await;
}

#[test]
fn a_default_policy_is_named_as_in_the_limits_file() {
    assert!(Central::builder().default_policy("static-split").is_ok());
    let per_service = Central::builder().default_policy("hierarchical").err();
    assert_eq!(per_service.map(|e| e.0), Some("hierarchical".to_owned()));
    let unknown = Central::builder().default_policy("fastest").err();
    assert_eq!(unknown.map(|e| e.0), Some("fastest".to_owned()));
}

async fn pushes_classic_shares(b_accepts: &[&str]) {
    let classic = Central::builder().default_policy("classic").unwrap();
    let central = start(classic.limits(limits(
        "[[limit]]\nservice = \"front\"\nuser = \"alice\"\nper_second = { requests = 1000 }\n",
    )))
    .await;
    let mut a = node(central.grpc_addr(), "a").await;
    let mut b = node_accepting(central.grpc_addr(), "b", b_accepts).await;
    let s = current_slot();
    a.exchange(report("a", s, r#"{"alice": {"requests": 30}}"#, "{}"))
        .await
        .unwrap();
    b.exchange(report("b", s, r#"{"alice": {"requests": 10}}"#, "{}"))
        .await
        .unwrap();
    // The first assign after both reports pushes both. One may run between
    // them on a loaded machine and push to `a` alone: read on to the
    // pushes of one assign.
    let (mut slot_a, mut qa) = a.next_push("alice").await;
    let (mut slot_b, mut qb) = b.next_push("alice").await;
    for _ in 0..5 {
        match slot_a.cmp(&slot_b) {
            std::cmp::Ordering::Less => (slot_a, qa) = a.next_push("alice").await,
            std::cmp::Ordering::Greater => (slot_b, qb) = b.next_push("alice").await,
            std::cmp::Ordering::Equal => break,
        }
    }
    assert_eq!(slot_a, slot_b, "pushed from the same assign");
    assert!(slot_a >= s + 2);
    // Consumption 3:1, no rejections: shares 0.75 / 0.25 of the same stored amount.
    assert!((qa / qb - 3.0).abs() < 1e-9, "{qa} / {qb}");
    assert!(qa + qb <= 1000.0 * 10.0 + 1e-6);
    let quota = json(&central, "/v1/monitor/quota").await;
    assert!(quota["front"][slot_a.to_string()]["a"]["alice"]["requests"].is_number());
    let conns = json(&central, "/v1/monitor/connections").await;
    let form = |node: &str| {
        let conns = conns["connections"].as_array().unwrap();
        let c = conns.iter().find(|c| c["node_id"] == node).unwrap();
        c["quotas"].as_str().unwrap().to_owned()
    };
    assert_eq!(form("a"), "classic");
    assert_eq!(
        form("b"),
        if b_accepts.is_empty() {
            "classic"
        } else {
            "packed"
        }
    );
    let dist = json(&central, "/v1/monitor/distribution").await;
    assert_eq!(
        dist["front"]["alice"]["requests"]["nodes"]["a"]["consumption"],
        30
    );
    assert_eq!(dist["front"]["alice"]["requests"]["bucket"]["rate"], 1000.0);
    central.shutdown().await;
}

#[tokio::test]
async fn limits_file_is_reloaded_and_bad_edits_keep_the_old_limits() {
    let dir = std::env::temp_dir().join(format!("throttle-central-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("limits.toml");
    let write = |rate: u32| {
        let text = format!(
            "[[limit]]\nservice = \"front\"\nuser = \"alice\"\nper_second = {{ requests = {rate} }}\n"
        );
        std::fs::write(&path, text).unwrap();
    };
    write(100);
    let file = Arc::new(FileLimits::open(&path).unwrap());
    let central = start(Central::builder().limits_file(file)).await;
    let rate = |v: &Value| v["limits"]["front"][0]["per_second"]["requests"].clone();
    assert_eq!(rate(&json(&central, "/v1/limits").await), 100.0);
    write(5);
    // Two slots are 200 ms; allow for a slow machine.
    let mut ok = false;
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(SLOT_MS as u64)).await;
        if rate(&json(&central, "/v1/limits").await) == 5.0 {
            ok = true;
            break;
        }
    }
    assert!(ok, "new limit not loaded");
    std::fs::write(&path, "[[limit]]\nservice = \"front\"\nuser = \n").unwrap();
    let mut err = Value::Null;
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(SLOT_MS as u64)).await;
        err = json(&central, "/v1/limits").await;
        if err["last_error"].is_string() {
            break;
        }
    }
    assert!(
        err["last_error"].as_str().unwrap().contains("line 3"),
        "{err}"
    );
    assert_eq!(rate(&err), 5.0, "previous limits stay");
    let (_, metrics) = http_get(central.http_addr().unwrap(), "/metrics").await;
    assert!(
        metrics.contains("throttle_central_limits_reload_errors_total"),
        "{metrics}"
    );
    central.shutdown().await;
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A Hello naming `n` services.
fn many_services(n: usize) -> v1::NodeMessage {
    let mut h = hello("n1", SLOT_MS);
    if let Some(node_message::Kind::Hello(hello)) = &mut h.kind {
        hello.services = (0..n).map(|i| format!("s{i}")).collect();
    }
    h
}

async fn refused(first: v1::NodeMessage) -> tonic::Status {
    let central = start(Central::builder()).await;
    let mut n = open(central.grpc_addr(), first).await;
    let status = n.recv().await.unwrap_err();
    central.shutdown().await;
    status
}

#[tokio::test]
async fn bad_hellos_are_invalid_argument() {
    let first_report = v1::NodeMessage {
        kind: Some(node_message::Kind::Report(report(
            "n1",
            current_slot(),
            "{}",
            "{}",
        ))),
    };
    for (first, needle) in [
        (first_report, "Hello"),
        (hello("", SLOT_MS), "node_id"),
        (hello(&"n".repeat(257), SLOT_MS), "node_id"),
        (hello("n1", 1000), "slot_ms"),
        (v1::NodeMessage { kind: None }, "Hello"),
        (many_services(1_001), "services"),
    ] {
        let status = refused(first).await;
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
        assert!(
            status.message().contains(needle),
            "{needle}: {}",
            status.message()
        );
    }
}

#[tokio::test]
async fn bad_entries_are_dropped_and_the_rest_is_kept() {
    let central = start(Central::builder()).await;
    let mut n = node(central.grpc_addr(), "n1").await;
    let s = current_slot();
    let long = "u".repeat(257);
    let r = report(
        "n1",
        s,
        &format!(
            r#"{{"ok": {{"requests": 2}}, "neg": {{"requests": -4}}, "{long}": {{"requests": 1}}}}"#
        ),
        "{}",
    );
    n.exchange(r).await.unwrap();
    let sums = json(&central, "/v1/monitor/consumption_sum").await;
    let users = sums["front"][(s - 1).to_string()].as_object().unwrap();
    assert_eq!(users.len(), 1, "{users:?}");
    assert_eq!(users["ok"]["requests"], 2);
    let (_, metrics) = http_get(central.http_addr().unwrap(), "/metrics").await;
    assert!(metrics.contains("throttle_central_dropped_entries_total{reason=\"negative_amount\"}"));
    assert!(metrics.contains("throttle_central_dropped_entries_total{reason=\"bad_name\"}"));
    central.shutdown().await;
}

#[tokio::test]
async fn bad_reports_close_only_their_stream() {
    let central = start(
        Central::builder()
            .max_users_per_report(2)
            .max_message_bytes(4096),
    )
    .await;
    let mut good = node(central.grpc_addr(), "good").await;
    let s = current_slot();

    let mut far = node(central.grpc_addr(), "far").await;
    let status = far
        .exchange(report("far", s + 1000, "{}", "{}"))
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status.message().contains("slots away"),
        "{}",
        status.message()
    );

    let mut many = node(central.grpc_addr(), "many").await;
    let r = report(
        "many",
        s,
        r#"{"a": {"r": 1}, "b": {"r": 1}, "c": {"r": 1}}"#,
        "{}",
    );
    let status = many.exchange(r).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(status.message().contains("users"), "{}", status.message());

    let mut other = node(central.grpc_addr(), "other").await;
    let r = report("someone-else", s, "{}", "{}");
    assert_eq!(
        other.exchange(r).await.unwrap_err().code(),
        tonic::Code::InvalidArgument
    );

    let mut big = node(central.grpc_addr(), "big").await;
    let huge = format!(r#"{{"{}": {{"r": 1}}}}"#, "x".repeat(200));
    let mut r = report("big", s, &huge, "{}");
    for i in 0..40 {
        let name = format!("user{i:03}{}", "y".repeat(200));
        r.consumption
            .get_mut("front")
            .unwrap()
            .users
            .insert(name, v1::Amounts::default());
    }
    let status = big.exchange(r).await.unwrap_err();
    assert_ne!(status.code(), tonic::Code::Ok);

    // The well-behaved node never noticed.
    let q = good
        .exchange(report("good", s, r#"{"a": {"r": 1}}"#, "{}"))
        .await
        .unwrap();
    assert_eq!(q.report_slot, Some(s));
    central.shutdown().await;
}

#[tokio::test]
async fn duplicate_reports_are_not_charged_twice() {
    let central = start(Central::builder()).await;
    let mut n = node(central.grpc_addr(), "n1").await;
    let s = current_slot();
    for _ in 0..2 {
        n.exchange(report("n1", s, r#"{"alice": {"requests": 5}}"#, "{}"))
            .await
            .unwrap();
    }
    let sums = json(&central, "/v1/monitor/consumption_sum").await;
    assert_eq!(sums["front"][(s - 1).to_string()]["alice"]["requests"], 5);
    central.shutdown().await;
}

#[tokio::test]
async fn a_follower_sends_nodes_to_the_leader() {
    let leadership = Arc::new(Follower {
        leader: Some("http://10.9.8.7:7075".into()),
    });
    let central = start(Central::builder().leadership(leadership)).await;
    let mut n = open(central.grpc_addr(), hello("n1", SLOT_MS)).await;
    match n.recv().await.unwrap() {
        central_message::Kind::NotLeader(nl) => assert_eq!(nl.leader, "http://10.9.8.7:7075"),
        other => panic!("{other:?}"),
    }
    let health = json(&central, "/healthz").await;
    assert_eq!(health["leader"], false);
    central.shutdown().await;
}

#[tokio::test]
async fn http_api_errors() {
    let central = start(Central::builder()).await;
    let addr = central.http_addr().unwrap();
    let (status, body) = http_get(addr, "/v1/monitor/nonsense").await;
    assert_eq!(status, 404);
    assert!(serde_json::from_str::<Value>(&body).unwrap()["error"].is_string());
    let (status, body) = http_get(addr, "/v1/monitor/quota?start_slot=abc").await;
    assert_eq!(status, 400);
    assert!(serde_json::from_str::<Value>(&body).unwrap()["error"].is_string());
    assert_eq!(json(&central, "/healthz").await["status"], "ok");
    central.shutdown().await;
}

/// The `Link` header's path to the next page, if the response has one.
fn next_link(response: &str) -> Option<String> {
    let head = response.split("\r\n\r\n").next()?;
    let link = head.lines().find_map(|l| l.strip_prefix("link: "))?;
    let path = link.strip_prefix('<')?.split_once('>')?.0;
    Some(path.to_owned())
}

async fn http_get_all(addr: SocketAddr, path: &str) -> String {
    let answer = common::get(addr, path).await;
    format!("{}\r\n\r\n{}", answer.head, answer.body)
}

#[tokio::test]
async fn the_monitor_answers_in_pages_linked_one_to_the_next() {
    let central = start(Central::builder()).await;
    let mut n = node(central.grpc_addr(), "n1").await;
    let users: Vec<String> = (0..5)
        .map(|i| format!(r#""u{i}": {{"requests": 1}}"#))
        .collect();
    let users = format!("{{{}}}", users.join(", "));
    n.exchange(report("n1", current_slot(), &users, "{}"))
        .await
        .unwrap();
    let http = central.http_addr().unwrap();
    let mut path = Some("/v1/monitor/distribution?limit=2".to_owned());
    let mut seen = Vec::new();
    while let Some(p) = path.take() {
        let response = http_get_all(http, &p).await;
        assert!(response.starts_with("HTTP/1.1 200"), "{response}");
        let body: Value = serde_json::from_str(response.split("\r\n\r\n").nth(1).unwrap()).unwrap();
        let page: Vec<String> = body["front"].as_object().unwrap().keys().cloned().collect();
        assert!(page.len() <= 2, "{page:?}");
        seen.extend(page);
        path = next_link(&response);
        assert!(seen.len() <= 5, "the links end");
    }
    seen.sort();
    assert_eq!(seen, ["u0", "u1", "u2", "u3", "u4"]);
    let one = json(&central, "/v1/monitor/distribution?user=u3").await;
    let users: Vec<&String> = one["front"].as_object().unwrap().keys().collect();
    assert_eq!(users, ["u3"]);
    for bad in ["limit=0", "limit=10001", "after=zz", "limit=x"] {
        let (status, body) = http_get(http, &format!("/v1/monitor/distribution?{bad}")).await;
        assert_eq!(status, 400, "{bad}: {body}");
    }
    central.shutdown().await;
}

#[tokio::test]
async fn the_limits_api_says_which_rule_limits_a_user() {
    let rules = r#"
[[limit]]
service = "front"
user = "*"
per_second = { requests = 100 }

[[limit]]
service = "front"
user = "alice"
per_day = { requests = 1000000 }

[[limit]]
service = "back"
user = "alice"
per_second = { requests = 7 }
"#;
    let central = start(Central::builder().limits(limits(rules))).await;
    let alice = json(&central, "/v1/limits?user=alice&service=front").await;
    let front = &alice["limits"]["front"];
    assert_eq!(front["rule"], "alice");
    let periods: Vec<&str> = front["resources"]["requests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["period"].as_str().unwrap())
        .collect();
    assert_eq!(
        periods,
        ["second", "day"],
        "the * rule's second and her own day"
    );
    assert!(alice["limits"].get("back").is_none(), "one service asked");
    let zoe = json(&central, "/v1/limits?user=zoe").await;
    assert_eq!(zoe["limits"]["front"]["rule"], "*");
    assert_eq!(
        zoe["limits"]["back"]["rule"],
        Value::Null,
        "no rule limits zoe there"
    );
    // The monitor answers one service when asked.
    let mut n = node(central.grpc_addr(), "n1").await;
    n.exchange(report(
        "n1",
        current_slot(),
        r#"{"zoe": {"requests": 1}}"#,
        "{}",
    ))
    .await
    .unwrap();
    let dist = json(&central, "/v1/monitor/distribution?service=back").await;
    let services: Vec<&String> = dist.as_object().unwrap().keys().collect();
    assert_eq!(services, ["back"]);
    central.shutdown().await;
}

#[tokio::test]
async fn the_top_answers_the_heaviest_users_slot_by_slot() {
    let central = start(Central::builder()).await;
    let mut n = node(central.grpc_addr(), "n1").await;
    // u0 the lightest, u4 the heaviest; only u1 refused.
    let users: Vec<String> = (0..5)
        .map(|i| format!(r#""u{i}": {{"requests": {}}}"#, i + 1))
        .collect();
    let users = format!("{{{}}}", users.join(", "));
    let s = current_slot();
    n.exchange(report("n1", s, &users, r#"{"u1": {"requests": 9}}"#))
        .await
        .unwrap();
    // The reading is of the data slots up to the one before the current.
    tokio::time::sleep(std::time::Duration::from_millis(SLOT_MS.into())).await;
    let top = json(&central, "/v1/monitor/top?n=2&slots=20").await;
    let heaviest = top["services"]["front"]["requests"].as_array().unwrap();
    let names: Vec<&str> = heaviest
        .iter()
        .map(|u| u["user"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["u4", "u3"], "{top}");
    assert_eq!(heaviest[0]["admitted"], 5);
    let series = heaviest[0]["consumption"].as_array().unwrap();
    assert_eq!(series.len(), 20, "one amount per slot");
    let to = top["to_slot"].as_i64().unwrap();
    let at = usize::try_from(19 - (to - (s - 1))).unwrap();
    assert_eq!(series[at], 5, "in the slot it was reported for: {top}");
    let refused = json(&central, "/v1/monitor/top?by=refused&n=5").await;
    let refused = refused["services"]["front"]["requests"].as_array().unwrap();
    assert_eq!(refused.len(), 1, "only users refused anything: {refused:?}");
    assert_eq!(
        (refused[0]["user"].as_str(), refused[0]["refused"].as_i64()),
        (Some("u1"), Some(9))
    );
    let http = central.http_addr().unwrap();
    for bad in ["n=0", "n=101", "slots=0", "slots=1000", "by=x", "n=x"] {
        let (status, body) = http_get(http, &format!("/v1/monitor/top?{bad}")).await;
        assert_eq!(status, 400, "{bad}: {body}");
    }
    central.shutdown().await;
}
