//! Usage accounting as an operator meets it: the real `throttle-central`
//! and two `axum-node`s at their default flags on 127.0.0.1, under load
//! for a little over a minute with an outage in the middle; the minute
//! rows the central stored must equal, to the unit, what the load
//! generator was admitted and received, per user and minute.
//!
//! Run alone: `cargo test -p throttle-examples --test usage -- --nocapture`.
//! The PostgreSQL test needs `etcd` and PostgreSQL's binaries (on `PATH`
//! or Debian's `/usr/lib/postgresql/*/bin`).

use std::collections::BTreeMap;
use std::time::Duration;

use throttle_examples::load::{Load, Tallies, unix_second};
use throttle_test_servers::{
    AppProcess, CentralProcess, Etcd, Postgres, TempDir, free_port, until,
};

/// The example node's binary, run at its default flags.
const AXUM_NODE: &str = env!("CARGO_BIN_EXE_axum-node");

const LIMITS: &str = r#"
[[limit]]
service = "front"
user = "alice"
per_second = { requests = 100 }
burst_seconds = 2
"#;

/// Bytes each download answers.
const BODY: u64 = 100;

/// One scenario at a time: each measures a minute on two cores.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn central_bin(test: &str) -> Option<String> {
    throttle_test_servers::central_beside(env!("CARGO_BIN_EXE_axum-node"), test)
}

/// alice offered 300 a second (3x her limit) and bob 40 (no limit), over
/// both nodes, downloading `BODY` bytes each time.
fn offer(nodes: &[AppProcess]) -> Load {
    let path = format!("/download?bytes={BODY}");
    let load = Load::new(nodes.iter().map(|n| n.addr).collect(), &path);
    load.quiet_around_minutes(Duration::from_millis(150));
    for i in 0..nodes.len() {
        load.flow("alice", i, 150.0);
        load.flow("bob", i, 20.0);
    }
    load
}

/// (minute start, user) -> (requests admitted, bytes received).
type PerMinute = BTreeMap<(i64, String), (i64, i64)>;

fn seen(tallies: &Tallies) -> PerMinute {
    let mut out = PerMinute::new();
    for (second, row) in tallies {
        for ((user, _), t) in row {
            let minute = second - second.rem_euclid(60);
            let sum = out.entry((minute, user.clone())).or_default();
            sum.0 += i64::try_from(t.admitted).unwrap_or(i64::MAX);
            sum.1 += i64::try_from(t.bytes).unwrap_or(i64::MAX);
        }
    }
    out
}

/// The minute rows `central` stored from `from` on.
fn stored(central: &CentralProcess, from: i64, to: i64) -> PerMinute {
    let path = format!("/v1/usage?service=front&step=minute&from={from}&to={to}&limit=10000");
    let body = central
        .get(&path, Duration::from_secs(5))
        .expect("the usage API answers");
    let v: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    let mut out = PerMinute::new();
    for row in v["rows"].as_array().expect("rows") {
        let key = (
            row["start_s"].as_i64().expect("start_s"),
            row["user"].as_str().expect("user").to_owned(),
        );
        let sum = out.entry(key).or_default();
        let admitted = row["admitted"].as_i64().expect("admitted");
        match row["resource"].as_str() {
            Some("requests") => sum.0 += admitted,
            Some("traffic_down") => sum.1 += admitted,
            other => panic!("unexpected resource {other:?}"),
        }
    }
    out
}

fn assert_equal(what: &str, seen: &PerMinute, stored: &PerMinute) {
    for ((minute, user), (requests, bytes)) in seen {
        println!(
            "{what}: minute {minute} {user}: seen {requests} requests {bytes} bytes, stored {:?}",
            stored.get(&(*minute, user.clone()))
        );
    }
    assert_eq!(stored, seen, "{what}: stored minute rows against the load");
    let bytes: i64 = seen.values().map(|v| v.1).sum();
    assert!(bytes > 0, "{what}: the load received nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_central_restarted_on_sqlite_keeps_usage_to_the_unit() {
    let test = "a_lone_central_restarted_on_sqlite_keeps_usage_to_the_unit";
    let _one = ONE_AT_A_TIME.lock().await;
    let Some(bin) = central_bin(test) else { return };
    let dir = TempDir::new("usage");
    let limits = dir.path().join("limits.toml");
    std::fs::write(&limits, LIMITS).expect("limits written");
    let file = |name: &str| dir.path().join(name).display().to_string();
    let args = [
        "--limits".to_owned(),
        limits.display().to_string(),
        "--state".to_owned(),
        file("checkpoint"),
        "--usage".to_owned(),
        format!("sqlite:{}", file("usage.db")),
    ];
    let mut central = CentralProcess::start(&bin, &args);
    let url = [central.url()];
    let nodes = [
        AppProcess::node(AXUM_NODE, "node-a", &url),
        AppProcess::node(AXUM_NODE, "node-b", &url),
    ];
    until(Duration::from_secs(10), "both nodes connected", || {
        central.streams().len() == 2
    });
    let load = offer(&nodes);
    let from = unix_second();
    let running = load.clone();
    let task = tokio::spawn(async move { running.run(Duration::from_secs(70)).await });
    tokio::time::sleep(Duration::from_millis(32_300)).await;
    central.kill();
    tokio::time::sleep(Duration::from_secs(5)).await;
    central.restart();
    task.await.expect("the load ran");
    // The last slot's reports, then the writer's quarter second.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let to = unix_second() + 60;
    assert_equal(
        test,
        &seen(&load.tallies()),
        &stored(&central, from - 60, to),
    );
}

fn leader(centrals: &[CentralProcess]) -> Option<usize> {
    (0..centrals.len()).find(|&i| centrals[i].role().as_deref() == Some("leader"))
}

/// alice's requests admitted in each Unix second from `from` to `to`.
fn alice_per_second(tallies: &Tallies, from: i64, to: i64) -> Vec<u64> {
    (from..=to)
        .map(|s| {
            let row = tallies.get(&s).into_iter().flat_map(|r| r.iter());
            row.filter(|((u, _), _)| u == "alice")
                .map(|(_, t)| t.admitted)
                .sum()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_and_a_postgres_outage_keep_usage_to_the_unit() {
    let test = "a_failover_and_a_postgres_outage_keep_usage_to_the_unit";
    let _one = ONE_AT_A_TIME.lock().await;
    let Some(bin) = central_bin(test) else { return };
    let Some(etcd) = Etcd::start(test) else {
        return;
    };
    let Some(mut pg) = Postgres::start(test) else {
        return;
    };
    let dir = TempDir::new("usage");
    let limits = dir.path().join("limits.toml");
    std::fs::write(&limits, LIMITS).expect("limits written");
    let ports = [free_port(), free_port()];
    let urls = ports.map(|p| format!("http://127.0.0.1:{p}"));
    let mut centrals: Vec<CentralProcess> = (0..2)
        .map(|i| {
            let args = [
                "--etcd",
                &etcd.url(),
                "--advertise",
                &urls[i],
                "--state",
                "etcd",
                "--limits",
                &limits.display().to_string(),
                "--usage",
                &pg.url(),
            ];
            let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
            CentralProcess::start_on(&bin, ports[i], &args)
        })
        .collect();
    until(Duration::from_secs(10), "both centrals up", || {
        centrals.iter().all(|c| c.role().is_some())
    });
    let nodes = [
        AppProcess::node(AXUM_NODE, "node-a", &urls),
        AppProcess::node(AXUM_NODE, "node-b", &urls),
    ];
    until(Duration::from_secs(10), "both nodes on the leader", || {
        leader(&centrals).is_some_and(|l| centrals[l].streams().len() == 2)
    });
    let load = offer(&nodes);
    let from = unix_second();
    let running = load.clone();
    let task = tokio::spawn(async move { running.run(Duration::from_secs(70)).await });
    tokio::time::sleep(Duration::from_millis(20_300)).await;
    let killed = leader(&centrals).expect("a leader");
    centrals[killed].kill();
    println!("{test}: leader {killed} killed");
    tokio::time::sleep(Duration::from_secs(20)).await;
    let down = unix_second();
    pg.stop();
    tokio::time::sleep(Duration::from_secs(10)).await;
    pg.restart();
    println!("{test}: PostgreSQL down from second {down} for 10 s");
    task.await.expect("the load ran");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let tallies = load.tallies();
    let during = alice_per_second(&tallies, down + 1, down + 9);
    println!("{test}: alice admitted each second of the outage: {during:?}");
    assert!(
        during.iter().all(|n| (70..=130).contains(n)),
        "admission changed while the store was down: {during:?}"
    );
    let mut now = None;
    until(Duration::from_secs(10), "a leader after the run", || {
        now = leader(&centrals);
        now.is_some()
    });
    let now = now.expect("a leader");
    let to = unix_second() + 60;
    assert_equal(
        test,
        &seen(&tallies),
        &stored(&centrals[now], from - 60, to),
    );
}
