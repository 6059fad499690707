//! Legacy nodes (lua-resty-throttle in nginx) on the real `throttle-central`
//! binary, through a client written for the tests that speaks their
//! protocol byte for byte (`throttle_test_servers::LegacyNode`): TLS 1.2, a
//! presigned URL computed apart from the central's code, one frame per
//! report, a 200 ms deadline, a reused connection, a report resent on a new
//! one; and a user served by two legacy nodes and one `axum-node` at its
//! default flags, held to one limit.
//!
//! Run alone: `cargo test -p throttle-examples --test legacy -- --nocapture`
//! prints each second and the round trips.

use std::net::SocketAddr;
use std::time::{Duration, SystemTime};

use serde_json::Value;
use throttle_examples::load::{Load, unix_second};
use throttle_test_servers::{
    ANSWER_WAIT, AppProcess, CentralProcess, LegacyClient, LegacyNode, TempDir, free_port,
    presigned_query,
};

/// One scenario at a time: the shared-limit one measures seconds.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const LIMITS: &str = r#"
[[limit]]
service = "front"
user = "alice"
per_second = { requests = 100 }

[[limit]]
service = "front"
user = "*"
per_second = { requests = 50 }
"#;

const KEYS: &str = r#"
[[key]]
access_key = "AKIDLUANODES"
secret_key = "the nginx fleet's secret"
node_ids = ["lua-*"]
"#;

/// The central's binary, beside `axum-node`; `None` (skipped) if it was
/// not built.
fn central_bin(test: &str) -> Option<String> {
    throttle_test_servers::central_beside(env!("CARGO_BIN_EXE_axum-node"), test)
}

/// A central serving legacy nodes on a free port, with `extra` flags; its
/// limits file and anything else `files` names are written in `dir`.
fn central(
    bin: &str,
    dir: &TempDir,
    files: &[(&str, &str)],
    extra: &[&str],
) -> (CentralProcess, SocketAddr) {
    for (name, text) in files {
        std::fs::write(dir.path().join(name), text).expect("file written");
    }
    let legacy = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let mut args = vec![
        "--legacy-listen".to_owned(),
        legacy.to_string(),
        "--limits".to_owned(),
        dir.path().join("limits.toml").display().to_string(),
    ];
    args.extend(extra.iter().map(|a| (*a).to_owned()));
    let central = CentralProcess::start(bin, &args);
    throttle_test_servers::wait_listening(legacy);
    (central, legacy)
}

/// The central's consumption sums of alice's requests, in slot `slot`.
fn filed(central: &CentralProcess, slot: i64) -> i64 {
    let path = format!("/v1/monitor/consumption_sum?start_slot={slot}&end_slot={slot}");
    let body = central
        .get(&path, Duration::from_secs(1))
        .unwrap_or_default();
    let sums: Value = serde_json::from_str(&body).unwrap_or_default();
    sums["front"][slot.to_string()]["alice"]["requests"]
        .as_i64()
        .unwrap_or(0)
}

fn report(node_id: &str, slot: i64, requests: i64) -> String {
    format!(
        r#"{{"node_id": "{node_id}", "slot_number": {slot}, "consumption": {{"front": {{"alice": {{"requests": {requests}}}}}}}, "rejection": {{"front": {{}}}}}}"#
    )
}

const SECRET: &str = "the nginx fleet's secret";

/// A connection to `legacy` signed with `secret` at `at`.
fn connect(
    legacy: SocketAddr,
    tls: bool,
    secret: &str,
    at: SystemTime,
) -> Result<LegacyClient, u16> {
    let host = legacy.to_string();
    let query = presigned_query("AKIDLUANODES", secret, &host, "/throttle", at);
    LegacyClient::connect(legacy, tls, &query)
}

/// A central requiring node keys, over TLS with a self-signed certificate
/// when `tls`.
fn signed_central(bin: &str, dir: &TempDir, tls: bool) -> (CentralProcess, SocketAddr) {
    let cert = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into()]).expect("certificate");
    let (cert, key) = (cert.cert.pem(), cert.signing_key.serialize_pem());
    let files = [
        ("limits.toml", LIMITS),
        ("keys.toml", KEYS),
        ("cert.pem", cert.as_str()),
        ("key.pem", key.as_str()),
    ];
    let path = |name: &str| dir.path().join(name).display().to_string();
    let (keys, cert, key) = (path("keys.toml"), path("cert.pem"), path("key.pem"));
    let mut flags = vec!["--node-keys", keys.as_str()];
    if tls {
        flags.extend(["--tls-cert", cert.as_str(), "--tls-key", key.as_str()]);
    }
    central(bin, dir, &files, &flags)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_legacy_node_signs_in_over_tls_1_2_and_is_answered_in_time() {
    let _one = ONE_AT_A_TIME.lock().await;
    let test = "a_legacy_node_signs_in_over_tls_1_2_and_is_answered_in_time";
    let Some(bin) = central_bin(test) else { return };
    let dir = TempDir::new("legacy-tls");
    let (_central, legacy) = signed_central(&bin, &dir, true);
    let slot = unix_second();
    let mut client = connect(legacy, true, SECRET, SystemTime::now()).expect("upgraded");
    client.send_text(&report("lua-1", slot, 7)).expect("sent");
    let answer = client
        .recv_text(ANSWER_WAIT)
        .expect("answered within 200 ms");
    let answer: Value = serde_json::from_str(&answer).expect("JSON");
    let slots = answer["front"].as_object().expect("front answered");
    assert!(slots.contains_key(&slot.to_string()), "{answer}");
    assert!(slots.contains_key(&(slot + 1).to_string()), "{answer}");
    assert_eq!(answer.as_object().map(|a| a.len()), Some(1), "{answer}");
    let wrong = connect(legacy, true, "not the secret", SystemTime::now()).err();
    assert_eq!(wrong, Some(403));
    // Without TLS, nothing is upgraded.
    assert!(connect(legacy, false, SECRET, SystemTime::now()).is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_legacy_report_is_filed_once_and_a_refused_one_not_at_all() {
    let _one = ONE_AT_A_TIME.lock().await;
    let test = "a_legacy_report_is_filed_once_and_a_refused_one_not_at_all";
    let Some(bin) = central_bin(test) else { return };
    let dir = TempDir::new("legacy-signed");
    let (central, legacy) = signed_central(&bin, &dir, false);
    // A report of 7, then the next on the same connection.
    let slot = unix_second();
    let mut client = connect(legacy, false, SECRET, SystemTime::now()).expect("upgraded");
    client.send_text(&report("lua-1", slot, 7)).expect("sent");
    assert!(
        client.recv_text(ANSWER_WAIT).is_some(),
        "answered within 200 ms"
    );
    client
        .send_text(&report("lua-1", slot + 1, 3))
        .expect("sent");
    assert!(
        client.recv_text(ANSWER_WAIT).is_some(),
        "reused connection answered"
    );
    client.close();
    // The first report again, on a new connection: answered, filed once.
    let mut again = connect(legacy, false, SECRET, SystemTime::now()).expect("upgraded");
    again.send_text(&report("lua-1", slot, 7)).expect("sent");
    assert!(
        again.recv_text(ANSWER_WAIT).is_some(),
        "resent report answered"
    );
    assert_eq!(
        filed(&central, slot - 1),
        7,
        "a resent report is filed once"
    );
    assert_eq!(filed(&central, slot), 3);

    // Refused at the handshake: a wrong secret, an expired URL.
    let wrong = connect(legacy, false, "not the secret", SystemTime::now()).err();
    assert_eq!(wrong, Some(403));
    let old = SystemTime::now() - Duration::from_secs(600);
    assert_eq!(connect(legacy, false, SECRET, old).err(), Some(403));
    // Refused after it: a node id the key does not allow, a frame too big.
    let mut other = connect(legacy, false, SECRET, SystemTime::now()).expect("upgraded");
    other
        .send_text(&report("db-1", slot + 2, 50))
        .expect("sent");
    assert!(
        other.recv_text(ANSWER_WAIT).is_none(),
        "another node id is not answered"
    );
    let mut big = connect(legacy, false, SECRET, SystemTime::now()).expect("upgraded");
    let pad = format!("{{\"pad\": \"{}\", ", "x".repeat(65_536));
    let _ = big.send_text(&report("lua-1", slot + 2, 50).replacen('{', &pad, 1));
    assert!(
        big.recv_text(ANSWER_WAIT).is_none(),
        "a frame over 65,535 bytes is not answered"
    );
    assert_eq!(
        filed(&central, slot + 1),
        0,
        "nothing of the refused reports was filed"
    );
    let metrics = central
        .get("/metrics", Duration::from_secs(1))
        .unwrap_or_default();
    let counted = |reason: &str| {
        let line = |l: &&str| {
            l.starts_with("throttle_central_unauthenticated_total") && l.contains(reason)
        };
        metrics.lines().any(|l| line(&l))
    };
    for reason in ["bad_signature", "expired", "node_not_allowed"] {
        assert!(counted(reason), "{reason} counted:\n{metrics}");
    }
}

/// A legacy node offering alice `per_second` requests, reporting at each
/// second's start, for `seconds`; its admitted count per Unix second.
fn legacy_load(
    mut node: LegacyNode,
    per_second: u32,
    seconds: i64,
) -> (Vec<(i64, i64)>, LegacyNode) {
    let start = unix_second() + 1;
    let mut admitted = std::collections::BTreeMap::<i64, i64>::new();
    let mut reported = start - 1;
    let step = Duration::from_secs(1) / per_second;
    let begin = SystemTime::UNIX_EPOCH + Duration::from_secs(start as u64);
    let mut k = 0u32;
    loop {
        let due = begin + step * k;
        let now = SystemTime::now();
        if let Ok(wait) = due.duration_since(now) {
            std::thread::sleep(wait.min(Duration::from_millis(10)));
            continue;
        }
        let second = unix_second();
        if second >= start + seconds {
            break;
        }
        let into = now
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_millis());
        if second > reported && into >= 50 {
            node.report(second);
            reported = second;
        }
        if node.throttle("front", "alice", second) {
            node.consume("front", "alice", second, "requests", 1);
            *admitted.entry(second).or_default() += 1;
        }
        k += 1;
    }
    (admitted.into_iter().collect(), node)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_legacy_nodes_and_an_axum_node_hold_alice_to_one_limit() {
    let _one = ONE_AT_A_TIME.lock().await;
    let test = "two_legacy_nodes_and_an_axum_node_hold_alice_to_one_limit";
    let Some(bin) = central_bin(test) else { return };
    let dir = TempDir::new("legacy-shared");
    let (central, legacy) = central(&bin, &dir, &[("limits.toml", LIMITS)], &[]);
    let args = ["--node-id", "rust-1", "--log", "warn", "--central"];
    let url = central.url();
    let rust = AppProcess::start(
        env!("CARGO_BIN_EXE_axum-node"),
        &[&args[..], &[url.as_str()]].concat(),
    );
    const SECONDS: i64 = 25;
    let load = Load::new(vec![rust.addr], "/");
    load.flow("alice", 0, 100.0);
    let running = load.clone();
    let rust_load =
        tokio::spawn(async move { running.run(Duration::from_secs(SECONDS as u64 + 1)).await });
    let lua = |id: &str| {
        let node = LegacyNode::new(id, &[legacy], false, None, &["front"]);
        std::thread::spawn(move || legacy_load(node, 100, SECONDS))
    };
    let (first, second) = (lua("lua-1"), lua("lua-2"));
    let (first, lua_1) = first.join().expect("legacy node 1");
    let (second, lua_2) = second.join().expect("legacy node 2");
    let _ = rust_load.await;
    let start = first.first().map_or(0, |(s, _)| *s);
    let tallies = load.tallies();
    let rust_at = |s: i64| -> i64 {
        let row = tallies.get(&s).into_iter().flat_map(|r| r.values());
        row.map(|t| i64::try_from(t.admitted).unwrap_or(0)).sum()
    };
    let at =
        |list: &[(i64, i64)], s: i64| list.iter().find(|(x, _)| *x == s).map_or(0, |(_, n)| *n);
    // The 20 s after the first 5 (the nodes connect, the first quotas come).
    let window = start + 5..start + 25;
    let mut total = 0;
    for s in window.clone() {
        let (a, b, r) = (at(&first, s), at(&second, s), rust_at(s));
        println!(
            "second {s}: lua-1 {a}, lua-2 {b}, axum-node {r}, all {}",
            a + b + r
        );
        total += a + b + r;
    }
    let mut trips: Vec<Duration> = lua_1
        .round_trips
        .iter()
        .chain(&lua_2.round_trips)
        .copied()
        .collect();
    trips.sort();
    let p = |q: f64| {
        trips
            .get(((trips.len() as f64 - 1.0) * q) as usize)
            .copied()
            .unwrap_or_default()
    };
    println!(
        "alice admitted {total} in 20 s of a limit of 2000; round trips p50 {:?} p99 {:?}",
        p(0.5),
        p(0.99)
    );
    println!(
        "connections: lua-1 {}, lua-2 {}",
        lua_1.connections, lua_2.connections
    );
    assert!(
        (1900..=2100).contains(&total),
        "alice admitted {total} in 20 s, limit 2000"
    );
    assert!(rust_at(start + 10) > 0 && at(&first, start + 10) > 0 && at(&second, start + 10) > 0);
    assert_eq!(
        (lua_1.connections, lua_2.connections),
        (1, 1),
        "each kept its connection"
    );
    assert!(p(0.99) < ANSWER_WAIT, "answers within 200 ms");
}

/// The same report every second from `node`, from now until `until`
/// answers one or `within` passes; the time it took.
fn report_until_answered(node: &mut LegacyNode, within: Duration) -> Option<Duration> {
    let start = std::time::Instant::now();
    while start.elapsed() < within {
        if node.report(unix_second()) {
            return Some(start.elapsed());
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_refuses_legacy_nodes_and_they_reach_the_new_leader() {
    let _one = ONE_AT_A_TIME.lock().await;
    let test = "a_standby_refuses_legacy_nodes_and_they_reach_the_new_leader";
    let Some(bin) = central_bin(test) else { return };
    let Some(etcd) = throttle_test_servers::Etcd::start(test) else {
        return;
    };
    let dir = TempDir::new("legacy-failover");
    std::fs::write(dir.path().join("limits.toml"), LIMITS).expect("limits written");
    let limits = dir.path().join("limits.toml").display().to_string();
    // Each central on its own IP, both on the legacy nodes' one port.
    let port = free_port();
    let legacy: Vec<SocketAddr> = (1..=2)
        .map(|i| SocketAddr::from(([127, 0, 0, i], port)))
        .collect();
    let mut centrals: Vec<CentralProcess> = (0..2)
        .map(|i| {
            let grpc = free_port();
            let args = [
                "--etcd",
                &etcd.url(),
                "--advertise",
                &format!("http://127.0.0.1:{grpc}"),
                "--limits",
                &limits,
                "--legacy-listen",
                &legacy[i].to_string(),
            ];
            let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
            CentralProcess::start_on(&bin, grpc, &args)
        })
        .collect();
    let role = |c: &CentralProcess| {
        c.get("/healthz", Duration::from_millis(200))
            .unwrap_or_default()
    };
    let leads = |c: &CentralProcess| {
        let health: Value = serde_json::from_str(&role(c)).unwrap_or_default();
        health["role"] == "leader"
    };
    throttle_test_servers::until(Duration::from_secs(10), "a leader", || {
        centrals.iter().any(leads)
    });
    let leader = usize::from(!leads(&centrals[0]));
    let standby = 1 - leader;
    // The standby refuses the upgrade at once.
    let refused = LegacyClient::connect(legacy[standby], false, "");
    assert_eq!(refused.err(), Some(503));
    // A node listing the standby first reaches the leader.
    let mut node = LegacyNode::new(
        "lua-1",
        &[legacy[standby], legacy[leader]],
        false,
        None,
        &["front"],
    );
    let first =
        tokio::task::block_in_place(|| report_until_answered(&mut node, Duration::from_secs(3)));
    assert!(first.is_some(), "served by the leader");
    centrals[leader].kill();
    let back =
        tokio::task::block_in_place(|| report_until_answered(&mut node, Duration::from_secs(10)));
    println!("leader killed: a legacy node answered by the new leader {back:?} after");
    let back = back.expect("served by the new leader");
    assert!(
        back <= Duration::from_secs(5),
        "served again {back:?} after the kill"
    );
    assert!(leads(&centrals[standby]));
}

/// A report of `users` users with one request each.
fn crowd(node_id: &str, slot: i64, users: usize) -> String {
    let users: Vec<String> = (0..users)
        .map(|u| format!(r#""user-{u:04}": {{"requests": 1}}"#))
        .collect();
    format!(
        r#"{{"node_id": "{node_id}", "slot_number": {slot}, "consumption": {{"front": {{{}}}}}, "rejection": {{"front": {{}}}}}}"#,
        users.join(", ")
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_of_1000_users_from_5_nodes_are_answered_in_time() {
    let _one = ONE_AT_A_TIME.lock().await;
    let test = "reports_of_1000_users_from_5_nodes_are_answered_in_time";
    let Some(bin) = central_bin(test) else { return };
    let dir = TempDir::new("legacy-crowd");
    let (_central, legacy) = central(&bin, &dir, &[("limits.toml", LIMITS)], &[]);
    let nodes: Vec<_> = (0..5)
        .map(|n| {
            std::thread::spawn(move || {
                let mut client = LegacyClient::connect(legacy, false, "").expect("upgraded");
                let mut trips = Vec::new();
                let mut sizes = Vec::new();
                for _ in 0..6 {
                    let next = unix_second() + 1;
                    let at =
                        SystemTime::UNIX_EPOCH + Duration::from_millis(next as u64 * 1000 + 50);
                    std::thread::sleep(at.duration_since(SystemTime::now()).unwrap_or_default());
                    let sent = std::time::Instant::now();
                    client
                        .send_text(&crowd(&format!("lua-{n}"), next, 1_000))
                        .expect("sent");
                    let answer = client.recv_text(ANSWER_WAIT);
                    trips.push(sent.elapsed());
                    sizes.push(answer.map_or(0, |a| a.len()));
                }
                (trips, sizes)
            })
        })
        .collect();
    let mut trips = Vec::new();
    let mut sizes = Vec::new();
    for node in nodes {
        let (t, s) = node.join().expect("node ran");
        // The first two: before the central has seen the users.
        trips.extend(t.into_iter().skip(2));
        sizes.extend(s.into_iter().skip(2));
    }
    trips.sort();
    let p = |q: f64| trips[((trips.len() - 1) as f64 * q) as usize];
    let largest = sizes.iter().max().copied().unwrap_or(0);
    println!(
        "1,000 users a report, 5 nodes at once: round trip p50 {:?} p99 {:?}, answers up to {largest} bytes",
        p(0.5),
        p(0.99)
    );
    assert!(
        sizes.iter().all(|s| (1_000..=65_535).contains(s)),
        "answered, in one frame: {sizes:?}"
    );
    assert!(p(0.99) < ANSWER_WAIT);
}
