//! Outages as an operator meets them: the real `throttle-central` and
//! `axum-node` binaries at their default flags (1 s slots, the reporter's
//! default backoff, the default fallback), on 127.0.0.1, a real etcd where
//! there is an election. alice is limited to 100 requests a second with
//! 2 s of burst and offered 300 a second over two nodes; every second from
//! the event to 10 s after it must admit 70%..130% of her limit, and the
//! 30 s around it 90%..110%.
//!
//! Run alone: `cargo test -p throttle-examples --test outages -- --nocapture`
//! prints each second. The central's binary is the one `cargo test
//! --workspace` builds beside `axum-node`.

use std::time::Duration;

use throttle_examples::load::{Load, unix_second};
use throttle_test_servers::{AppProcess, CentralProcess, Etcd, TempDir, free_port, until};

/// The example node's binary, run at its default flags.
const AXUM_NODE: &str = env!("CARGO_BIN_EXE_axum-node");

const LIMIT: i64 = 100;

const LIMITS: &str = r#"
[[limit]]
service = "front"
user = "alice"
per_second = { requests = 100 }
burst_seconds = 2

[[limit]]
service = "front"
user = "hourly"
per_second = { requests = 50 }
per_hour = { requests = 600 }
"#;

/// One scenario at a time: each measures seconds on two cores.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The central's binary, beside `axum-node`; `None` (skipped) if it was
/// not built.
fn central_bin(test: &str) -> Option<String> {
    throttle_test_servers::central_beside(env!("CARGO_BIN_EXE_axum-node"), test)
}

/// The limits file, in `dir`.
fn limits_file(dir: &TempDir) -> String {
    let path = dir.path().join("limits.toml");
    std::fs::write(&path, LIMITS).expect("limits written");
    path.display().to_string()
}

/// alice's load: 150 a second on each node, from now on for `seconds`.
fn offer(nodes: &[AppProcess], seconds: u64) -> (Load, tokio::task::JoinHandle<()>) {
    let load = Load::new(nodes.iter().map(|n| n.addr).collect(), "/");
    for i in 0..nodes.len() {
        load.flow("alice", i, 300.0 / nodes.len() as f64);
    }
    let running = load.clone();
    let task = tokio::spawn(async move { running.run(Duration::from_secs(seconds)).await });
    (load, task)
}

/// alice's admitted count per Unix second, from `from` to `to`.
fn admitted(load: &Load, from: i64, to: i64) -> Vec<i64> {
    let tallies = load.tallies();
    (from..=to)
        .map(|s| {
            let row = tallies.get(&s).into_iter().flat_map(|r| r.values());
            row.map(|t| i64::try_from(t.admitted).unwrap_or(0)).sum()
        })
        .collect()
}

/// The target for every second around an outage, of a limit of 100.
const TARGET: std::ops::RangeInclusive<i64> = 70..=130;

/// Checks the seconds around an event at Unix second `event` that lasted
/// `lasted` seconds: each from it to 10 s after it ended within
/// [`TARGET`], the 30 s from 15 s before it within 90%..110%.
fn assert_unnoticed(what: &str, load: &Load, event: i64, lasted: i64) {
    let last = event + lasted + 10;
    let seconds = admitted(load, event - 15, last.max(event + 14));
    let shown: Vec<String> = (event - 15..)
        .zip(&seconds)
        .map(|(s, n)| format!("{:+}:{n}", s - event))
        .collect();
    println!(
        "{what}: admitted per second around the event: {}",
        shown.join(" ")
    );
    let after = &seconds[15..=usize::try_from(last - event + 15).unwrap_or(25)];
    let worst = |f: fn(&i64, &i64) -> std::cmp::Ordering| after.iter().copied().max_by(f);
    let (low, high) = (worst(|a, b| b.cmp(a)), worst(i64::cmp));
    let total: i64 = seconds[..30].iter().sum();
    let ratio = total as f64 / (30 * LIMIT) as f64;
    println!("{what}: lowest {low:?}, highest {high:?} of {LIMIT}; 30 s window {ratio:.3}");
    for (i, n) in after.iter().enumerate() {
        assert!(
            TARGET.contains(n),
            "{what}: second +{i} admitted {n}, not {TARGET:?} ({shown:?})"
        );
    }
    assert!(
        (0.90..=1.10).contains(&ratio),
        "{what}: 30 s window {ratio:.3} of the limit ({shown:?})"
    );
}

/// Waits for the start of a Unix second plus `after`, so events fall in
/// the middle of seconds whatever the test's start.
async fn at_second_plus(after: Duration) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let into = Duration::from_nanos(u64::from(now.subsec_nanos()));
    let wait = (Duration::from_secs(1) - into) + after;
    tokio::time::sleep(wait).await;
}

/// The high-availability setup of `docs/guides/operations.md`: two centrals with
/// `--etcd --advertise --limits FILE --state etcd` on one etcd, and two
/// example nodes listing both, all at their default flags.
struct Pair {
    centrals: Vec<CentralProcess>,
    nodes: [AppProcess; 2],
    etcd: Etcd,
    _dir: TempDir,
}

impl Pair {
    fn start(test: &str) -> Option<Self> {
        let bin = central_bin(test)?;
        let etcd = Etcd::start(test)?;
        let dir = TempDir::new("outages");
        let limits = limits_file(&dir);
        let ports = [free_port(), free_port()];
        let urls = ports.map(|p| format!("http://127.0.0.1:{p}"));
        let centrals: Vec<CentralProcess> = (0..2)
            .map(|i| {
                let args = ["--etcd", &etcd.url(), "--advertise", &urls[i]];
                let more = ["--limits", &limits, "--state", "etcd"];
                let args: Vec<String> = args.iter().chain(&more).map(|s| s.to_string()).collect();
                CentralProcess::start_on(&bin, ports[i], &args)
            })
            .collect();
        let pair = Self {
            nodes: [
                AppProcess::node(AXUM_NODE, "node-a", &urls),
                AppProcess::node(AXUM_NODE, "node-b", &urls),
            ],
            centrals,
            etcd,
            _dir: dir,
        };
        until(Duration::from_secs(10), "both nodes on the leader", || {
            pair.leader()
                .is_some_and(|l| pair.centrals[l].streams().len() == 2)
        });
        Some(pair)
    }

    /// The central that says it leads.
    fn leader(&self) -> Option<usize> {
        (0..2).find(|&i| self.centrals[i].role().as_deref() == Some("leader"))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_leader_is_not_noticed() {
    let _one = ONE_AT_A_TIME.lock().await;
    let Some(mut pair) = Pair::start("a_killed_leader_is_not_noticed") else {
        return;
    };
    let leader = pair.leader().expect("a leader");
    let standby = 1 - leader;
    let (load, running) = offer(&pair.nodes, 32);
    tokio::time::sleep(Duration::from_secs(15)).await;
    at_second_plus(Duration::from_millis(300)).await;
    let event = unix_second();
    pair.centrals[leader].kill();
    let took_over = until(Duration::from_secs(10), "the standby leads", || {
        pair.leader() == Some(standby)
    });
    let both = until(
        Duration::from_secs(10),
        "both nodes on the new leader",
        || pair.centrals[standby].streams().len() == 2,
    );
    let quotas = until(
        Duration::from_secs(10),
        "the new leader's quotas for both nodes",
        || quotas_for_both(&pair.centrals[standby]),
    );
    let quotas = (took_over + both + quotas).as_secs_f64();
    let (took_over, both) = (took_over.as_secs_f64(), (took_over + both).as_secs_f64());
    println!(
        "leader killed: the standby led {took_over:.2} s after, both nodes on it {both:.2} s after, its quotas for both {quotas:.2} s after"
    );
    assert!(
        both <= 3.0,
        "nodes on the new leader {both:.2} s after the kill"
    );
    assert!(
        quotas <= 3.0 && quotas - took_over <= 1.0,
        "the new leader's quotas for both nodes {quotas:.2} s after the kill, {:.2} s after its takeover",
        quotas - took_over
    );
    let late = both - took_over;
    assert!(
        late <= 1.0,
        "nodes on the new leader {late:.2} s after its takeover"
    );
    running.await.expect("the load ran");
    assert_unnoticed("leader kill -9", &load, event, 0);
}

/// Whether `central`'s `/v1/monitor/quota` holds quotas of both nodes
/// for the current slot or a later one.
fn quotas_for_both(central: &CentralProcess) -> bool {
    let Some(body) = central.get("/v1/monitor/quota", Duration::from_millis(300)) else {
        return false;
    };
    let json: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
    has_both(&json, unix_second())
}

/// Whether `v` holds, under a slot from `now` on, both nodes.
fn has_both(v: &serde_json::Value, now: i64) -> bool {
    let Some(map) = v.as_object() else {
        return false;
    };
    map.iter().any(|(k, v)| {
        let slot = k.parse::<i64>().is_ok_and(|s| s >= now);
        let both = ["node-a", "node-b"].iter().all(|n| v.get(n).is_some());
        (slot && both) || has_both(v, now)
    })
}

/// etcd stopped (SIGSTOP) for 10 s, then resumed: the leader stands by
/// at its lease's deadline, a leader is elected again once etcd is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcd_stopped_for_10_s_is_not_noticed() {
    let test = "an_etcd_stopped_for_10_s_is_not_noticed";
    let stop = |etcd: &mut Etcd| etcd.signal("STOP");
    let resume = |etcd: &mut Etcd| etcd.signal("CONT");
    etcd_away(test, "etcd SIGSTOP 10 s", (10, 10), stop, resume).await;
}

/// etcd killed, and started again on its data directory 20 s later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcd_killed_for_20_s_is_not_noticed() {
    let test = "an_etcd_killed_for_20_s_is_not_noticed";
    etcd_away(
        test,
        "etcd SIGKILL 20 s",
        (20, 15),
        Etcd::kill,
        Etcd::restart,
    )
    .await;
}

/// etcd taken `away` for `seconds`, then brought `back`, 15 s into alice's
/// load: both nodes on a leader within `within` seconds of that, every
/// second held to [`TARGET`].
async fn etcd_away(
    test: &str,
    what: &str,
    (seconds, within): (u64, u64),
    away: impl FnOnce(&mut Etcd),
    back: impl FnOnce(&mut Etcd),
) {
    let _one = ONE_AT_A_TIME.lock().await;
    let Some(mut pair) = Pair::start(test) else {
        return;
    };
    let (load, running) = offer(&pair.nodes, 32 + seconds);
    tokio::time::sleep(Duration::from_secs(15)).await;
    at_second_plus(Duration::from_millis(300)).await;
    let event = unix_second();
    away(&mut pair.etcd);
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    back(&mut pair.etcd);
    let on_leader = until(
        Duration::from_secs(within),
        "both nodes on a leader",
        || {
            pair.leader()
                .is_some_and(|l| pair.centrals[l].streams().len() == 2)
        },
    );
    println!(
        "{what}: both nodes on a leader {:.2} s after etcd was back",
        on_leader.as_secs_f64()
    );
    running.await.expect("the load ran");
    let lasted = i64::try_from(seconds).unwrap_or(i64::MAX);
    assert_unnoticed(what, &load, event, lasted);
}

/// A lone central killed, and started again 5 s later with the same
/// arguments: with `--state FILE`, or without.
async fn lone_central_restarted(test: &str, state: bool) {
    let _one = ONE_AT_A_TIME.lock().await;
    let Some(bin) = central_bin(test) else { return };
    let dir = TempDir::new("outages");
    let mut args = vec!["--limits".to_owned(), limits_file(&dir)];
    if state {
        let file = dir.path().join("checkpoint").display().to_string();
        args.extend(["--state".to_owned(), file]);
    }
    let mut central = CentralProcess::start(&bin, &args);
    let url = [central.url()];
    let nodes = [
        AppProcess::node(AXUM_NODE, "node-a", &url),
        AppProcess::node(AXUM_NODE, "node-b", &url),
    ];
    until(Duration::from_secs(10), "both nodes connected", || {
        central.streams().len() == 2
    });
    let (load, running) = offer(&nodes, 35);
    tokio::time::sleep(Duration::from_secs(13)).await;
    at_second_plus(Duration::from_millis(300)).await;
    let event = unix_second();
    central.kill();
    tokio::time::sleep(Duration::from_secs(5)).await;
    central.restart();
    let back = until(Duration::from_secs(10), "both nodes back", || {
        central.streams().len() == 2
    });
    println!(
        "central restarted: both nodes back {:.2} s after",
        back.as_secs_f64()
    );
    assert!(
        back <= Duration::from_secs(2),
        "nodes back {back:?} after the restart"
    );
    running.await.expect("the load ran");
    assert_unnoticed(test, &load, event, 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_central_restarted_on_its_checkpoint_is_not_noticed() {
    let test = "a_lone_central_restarted_on_its_checkpoint_is_not_noticed";
    lone_central_restarted(test, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_central_restarted_without_state_is_not_noticed() {
    let test = "a_lone_central_restarted_without_state_is_not_noticed";
    lone_central_restarted(test, false).await;
}

/// All `load` admitted so far.
fn admitted_in_all(load: &Load) -> u64 {
    let tallies = load.tallies();
    tallies
        .values()
        .flat_map(|r| r.values())
        .map(|t| t.admitted)
        .sum()
}

/// A lone central down 30 s while a user with 600 an hour, 50 a second,
/// has about 200 left: the nodes keep to what the central last told them
/// of the hour, and do not admit 50 a second through the outage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_central_down_30_s_keeps_an_hourly_budget() {
    let test = "a_lone_central_down_30_s_keeps_an_hourly_budget";
    let _one = ONE_AT_A_TIME.lock().await;
    let Some(bin) = central_bin(test) else { return };
    let dir = TempDir::new("outages");
    let mut central = CentralProcess::start(&bin, &["--limits".to_owned(), limits_file(&dir)]);
    let url = [central.url()];
    let nodes = [
        AppProcess::node(AXUM_NODE, "node-a", &url),
        AppProcess::node(AXUM_NODE, "node-b", &url),
    ];
    until(Duration::from_secs(10), "both nodes connected", || {
        central.streams().len() == 2
    });
    let load = Load::new(nodes.iter().map(|n| n.addr).collect(), "/");
    load.flow("hourly", 0, 30.0);
    load.flow("hourly", 1, 30.0);
    let running = load.clone();
    let task = tokio::spawn(async move { running.run(Duration::from_secs(45)).await });
    until(Duration::from_secs(20), "400 of the hour spent", || {
        admitted_in_all(&load) >= 400
    });
    let before = admitted_in_all(&load);
    central.kill();
    tokio::time::sleep(Duration::from_secs(30)).await;
    let during = admitted_in_all(&load) - before;
    println!("{before} admitted before the central went away, {during} in the 30 s it was");
    task.abort();
    // What was left of the hour (600 less what was admitted, and the
    // hour's refill, 1 every 6 s), and a slot of 50 on quota that the
    // last budget did not see yet.
    let left = 600 - before.min(600) + 8;
    assert!(during <= left + 50, "{during} admitted of the {left} left");
    assert!(during >= left / 2, "{during} admitted of the {left} left");
}
