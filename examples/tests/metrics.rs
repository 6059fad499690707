//! Metrics as Prometheus scrapes them: two real `axum-node` processes and
//! a central on 127.0.0.1, alice offered three times her limit and bob
//! under his. Each node's `/metrics` and the central's count what the load
//! generator saw admitted and refused, to the request, with `# HELP`; the
//! Grafana dashboard in `examples/grafana/` asks only for names that are
//! there; and every metric the code names is described.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use throttle_central::Central;
use throttle_central::limits::{LimitSet, StaticLimits};
use throttle_clock::SlotLength;
use throttle_examples::load::Load;
use throttle_test_servers::{AppProcess, until};

const SLOT_MS: u32 = 100;

const LIMITS: &str = r#"
[[limit]]
service = "front"
user = "alice"
per_second = { requests = 50 }
burst_seconds = 1

[[limit]]
service = "front"
user = "*"
per_second = { requests = 200 }
"#;

/// An `axum-node` reporting to `central` as `id`.
fn node(central: SocketAddr, id: &str) -> AppProcess {
    let central = format!("http://{central}");
    let slot_ms = SLOT_MS.to_string();
    let args = [
        "--node-id",
        id,
        "--central",
        &central,
        "--slot-ms",
        &slot_ms,
        "--log",
        "warn",
    ];
    AppProcess::start(env!("CARGO_BIN_EXE_axum-node"), &args)
}

/// The body of `GET path` at `addr`.
fn get(addr: SocketAddr, path: &str) -> String {
    let mut s = TcpStream::connect(addr).expect("connects");
    write!(s, "GET {path} HTTP/1.0\r\nhost: t\r\n\r\n").expect("writes");
    let mut text = String::new();
    s.read_to_string(&mut text).expect("reads");
    text.split_once("\r\n\r\n")
        .map(|x| x.1.to_owned())
        .unwrap_or_default()
}

/// The sum of `name`'s samples in a scrape whose labels include `labels`.
fn sample(scrape: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    let mut sum = 0.0;
    for line in scrape.lines() {
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        let (set, value) = match rest.strip_prefix('{') {
            Some(r) => r.split_once("} ").unwrap_or(("", "")),
            None => ("", rest.strip_prefix(' ').unwrap_or("")),
        };
        let has: BTreeMap<&str, &str> = set
            .split(',')
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k, v.trim_matches('"')))
            .collect();
        if labels.iter().all(|(k, v)| has.get(k) == Some(v)) {
            sum += value.parse::<f64>().unwrap_or(0.0);
        }
    }
    sum
}

/// Whether `scrape` has samples of `name` (or of its summary's `_sum`).
fn has(scrape: &str, name: &str) -> bool {
    scrape.lines().any(|l| {
        l.strip_prefix(name)
            .is_some_and(|r| r.starts_with(['{', ' ']) || r.starts_with("_sum"))
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_and_central_count_what_was_admitted_and_refused() {
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .unwrap();
    let grpc = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let http = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let limits = Arc::new(StaticLimits::new(LimitSet::from_toml(LIMITS).unwrap()));
    let central = Central::builder()
        .slot(SlotLength::from_ms(SLOT_MS).unwrap())
        .limits(limits)
        .metrics(recorder)
        .spawn(grpc, Some(http))
        .unwrap();
    let (grpc, http) = (central.grpc_addr(), central.http_addr().unwrap());
    let nodes = [node(grpc, "node-1"), node(grpc, "node-2")];
    tokio::task::spawn_blocking(move || {
        until(Duration::from_secs(10), "both nodes connected", || {
            get(http, "/v1/monitor/connections")
                .matches("node_id")
                .count()
                == 2
        })
    })
    .await
    .unwrap();

    let load = Load::new(nodes.iter().map(|n| n.addr).collect(), "/");
    load.flow("alice", 0, 75.0);
    load.flow("alice", 1, 75.0);
    load.flow("bob", 1, 40.0);
    load.run(Duration::from_secs(2)).await;
    // The last slot's counts are collected at the next slot and filed.
    tokio::time::sleep(Duration::from_millis(u64::from(SLOT_MS) * 6)).await;
    let (mut admitted, mut refused) = (0.0, 0.0);
    for tally in load.tallies().values().flat_map(|t| t.values()) {
        assert_eq!(tally.errors, 0);
        admitted += tally.admitted as f64;
        refused += tally.rejected as f64;
    }
    assert!(refused > 50.0 && admitted > 100.0, "{admitted} {refused}");

    let (addrs, central_http) = ([nodes[0].addr, nodes[1].addr], http);
    let (scrapes, central_scrape) = tokio::task::spawn_blocking(move || {
        (
            addrs.map(|a| get(a, "/metrics")),
            get(central_http, "/metrics"),
        )
    })
    .await
    .unwrap();
    let front = [("service", "front"), ("resource", "requests")];
    let node_sum = |name| scrapes.iter().map(|s| sample(s, name, &front)).sum::<f64>();
    assert_eq!(node_sum("throttle_consumed_total"), admitted);
    assert_eq!(node_sum("throttle_rejected_total"), refused);
    assert_eq!(
        sample(&central_scrape, "throttle_central_consumed_total", &front),
        admitted
    );
    assert_eq!(
        sample(&central_scrape, "throttle_central_rejected_total", &front),
        refused
    );
    assert!(
        sample(
            &scrapes[0],
            "throttle_quota_tables_installed_total",
            &front[..1]
        ) > 5.0
    );
    assert_eq!(
        sample(&central_scrape, "throttle_central_connections", &[]),
        2.0
    );
    for (scrape, name) in [
        (&scrapes[0], "throttle_consumed_total"),
        (&scrapes[1], "throttle_report_rtt_seconds"),
        (&central_scrape, "throttle_central_consumed_total"),
    ] {
        assert!(
            scrape.contains(&format!("# HELP {name} ")),
            "{name}: {scrape}"
        );
    }

    // The Grafana dashboard asks for names the scrapes have.
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("grafana/throttle.json");
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut asked = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            let expr = target["expr"].as_str().unwrap();
            asked.extend(names(expr));
        }
    }
    assert!(asked.len() >= 10, "{asked:?}");
    for name in &asked {
        let found = scrapes
            .iter()
            .chain([&central_scrape])
            .any(|s| has(s, name));
        assert!(found, "the dashboard asks for {name}, which no scrape has");
    }
    drop(nodes);
    central.shutdown().await;
}

/// The `throttle_...` metric names in a PromQL expression.
fn names(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (at, _) in expr.match_indices("throttle_") {
        let rest = &expr[at..];
        let end = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        out.push(rest[..end].to_owned());
    }
    out
}

/// Every `"throttle_..."` string literal in the Rust files under `dir`.
fn literals(dir: &Path, out: &mut Vec<String>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            literals(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let text = std::fs::read_to_string(&path).unwrap();
            for (at, _) in text.match_indices("\"throttle_") {
                let name = names(&text[at + 1..]).remove(0);
                if text[at + 1 + name.len()..].starts_with('"') {
                    out.push(name);
                }
            }
        }
    }
}

#[test]
fn every_metric_the_code_names_is_described_and_no_other() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let layer = throttle_layer::telemetry::METRICS.iter().map(|m| m.0);
    let central = throttle_central::telemetry::METRICS.iter().map(|m| m.0);
    for (krate, described) in [
        ("throttle-layer", layer.collect::<Vec<_>>()),
        ("throttle-central", central.collect()),
    ] {
        let mut used = Vec::new();
        literals(&root.join(krate).join("src"), &mut used);
        used.sort();
        used.dedup();
        let mut listed: Vec<String> = described.iter().map(|m| m.to_string()).collect();
        listed.sort();
        assert_eq!(used, listed, "{krate}");
    }
}
