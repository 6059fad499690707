//! Envoy proxies as nodes: the real `throttle-central`, two real Envoys
//! configured by the YAML of `docs/guides/envoy.md` (its ports changed) and
//! one `axum-node` at its default flags, all serving alice and bob.
//!
//! Run alone: `cargo test -p throttle-examples --test envoy -- --nocapture`
//! prints each second.

use std::net::SocketAddr;
use std::time::Duration;

use throttle_examples::load::{Load, Tallies, unix_second};
use throttle_test_servers::{
    AppProcess, CentralProcess, Envoy, Pki, TempDir, free_port, wait_listening,
};

const LIMITS: &str = r#"
[[limit]]
service = "front"
user = "alice"
per_second = { requests = 100 }

[[limit]]
service = "front"
user = "bob"
per_second = { requests = 50 }

[[limit]]
service = "front"
user = "dave"
per_second = { requests = 40 }

[[limit]]
service = "front"
user = "erin"
per_second = { requests = 100 }
burst_seconds = 1
"#;

/// One test at a time: each measures seconds on two cores.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The `n`th YAML block of the Envoy guide.
fn guide_yaml(n: usize) -> String {
    let guide = include_str!("../../docs/guides/envoy.md");
    let block = guide.split("```yaml\n").nth(n + 1);
    let block = block.and_then(|b| b.split("```").next());
    block.expect("the guide's YAML").to_owned()
}

/// The guide's YAML blocks: the whole configuration, its cluster of two
/// centrals, and its cluster over TLS.
const WHOLE: usize = 0;
const TWO_CENTRALS: usize = 1;
const OVER_TLS: usize = 2;

/// The guide's Envoy configuration for `node_id`, listening on `listen`
/// (admin on `admin`), in front of `app`, its stream to `centrals` (gRPC
/// and HTTP ports) through the guide's cluster of two centrals when there
/// are two.
fn envoy_yaml(node_id: &str, listen: u16, admin: u16, app: u16, centrals: &[(u16, u16)]) -> String {
    let cluster = (centrals.len() == 2).then_some(TWO_CENTRALS);
    envoy_yaml_with(node_id, (listen, admin, app), centrals, cluster)
}

/// [`envoy_yaml`], with the guide's YAML block `cluster` as the RLQS
/// cluster (`None`: the whole configuration's own).
fn envoy_yaml_with(
    node_id: &str,
    (listen, admin, app): (u16, u16, u16),
    centrals: &[(u16, u16)],
    cluster: Option<usize>,
) -> String {
    let mut yaml = guide_yaml(WHOLE);
    if let Some(cluster) = cluster {
        let at = yaml
            .find("  - name: throttle_central")
            .expect("the RLQS cluster");
        yaml.truncate(at);
        yaml.push_str(
            &guide_yaml(cluster)
                .replace("10.0.0.11", "127.0.0.1")
                .replace("10.0.0.12", "127.0.0.1"),
        );
    }
    let mut ports = vec![(9901, admin), (10000, listen), (8080, app)];
    ports.extend(
        centrals
            .iter()
            .flat_map(|(grpc, http)| [(7075, *grpc), (7076, *http)]),
    );
    for (from, to) in ports {
        let from = format!("port_value: {from} ");
        assert!(yaml.contains(&from), "the guide's YAML names {from}");
        yaml = yaml.replacen(&from, &format!("port_value: {to} "), 1);
    }
    assert!(yaml.contains("envoy-1"), "the guide's YAML names envoy-1");
    yaml.replace("envoy-1", node_id)
}

/// Two Envoys, `envoy-1` and `envoy-2`, in front of `app`, their streams
/// to `centrals`; `None` (skipped) without `envoy`.
fn envoys(
    test: &str,
    app: SocketAddr,
    centrals: &[(u16, u16)],
) -> Option<Vec<(Envoy, SocketAddr)>> {
    let mut envoys = Vec::new();
    for id in ["envoy-1", "envoy-2"] {
        let (listen, admin) = (free_port(), free_port());
        let yaml = envoy_yaml(id, listen, admin, app.port(), centrals);
        let envoy = Envoy::start(test, &yaml, SocketAddr::from(([127, 0, 0, 1], admin)))?;
        let listen = SocketAddr::from(([127, 0, 0, 1], listen));
        wait_listening(listen);
        envoys.push((envoy, listen));
    }
    Some(envoys)
}

/// The limits file, in `dir`.
fn limits_file(dir: &TempDir) -> String {
    let limits = dir.path().join("limits.toml");
    std::fs::write(&limits, LIMITS).expect("limits written");
    limits.display().to_string()
}

/// An app answering 200 to everything, behind the Envoys.
async fn upstream() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bound");
    let addr = listener.local_addr().expect("address");
    let app = axum::Router::new().fallback(|| async { "ok" });
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

/// `user`'s admitted and refused counts in second `s`, on every node.
fn counted(tallies: &Tallies, user: &str, s: i64) -> (u64, u64) {
    let row = tallies.get(&s).into_iter().flat_map(|r| r.iter());
    row.filter(|((u, _), _)| u == user)
        .fold((0, 0), |t, (_, c)| (t.0 + c.admitted, t.1 + c.rejected))
}

/// `user`'s admitted count in second `s` on node `node`.
fn on_node(tallies: &Tallies, user: &str, node: usize, s: i64) -> u64 {
    let row = tallies
        .get(&s)
        .and_then(|r| r.get(&(user.to_owned(), node)));
    row.map_or(0, |t| t.admitted)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_envoys_and_an_axum_node_hold_alice_to_one_limit() {
    let test = "two_envoys_and_an_axum_node_hold_alice_to_one_limit";
    let _one = ONE_AT_A_TIME.lock().await;
    let Some(bin) = throttle_test_servers::central_beside(env!("CARGO_BIN_EXE_axum-node"), test)
    else {
        return;
    };
    let dir = TempDir::new("envoy");
    let central = CentralProcess::start(&bin, &["--limits".to_owned(), limits_file(&dir)]);
    let app = upstream().await;
    let Some(envoys) = envoys(test, app, &[(central.grpc, central.http.port())]) else {
        return;
    };
    let url = central.url();
    let rust = AppProcess::start(
        env!("CARGO_BIN_EXE_axum-node"),
        &["--node-id", "rust-1", "--log", "warn", "--central", &url],
    );
    let nodes = vec![envoys[0].1, envoys[1].1, rust.addr];
    let load = Load::new(nodes, "/");
    for node in 0..3 {
        load.flow("alice", node, 100.0);
        load.flow("bob", node, 10.0);
    }
    for envoy in 0..2 {
        load.flow("carol", envoy, 5.0);
    }
    // dave, on one Envoy only.
    load.flow("dave", 0, 60.0);
    let start = unix_second() + 1;
    let running = load.clone();
    let run = tokio::spawn(async move { running.run(Duration::from_secs(42)).await });
    // carol, blocked 30 s in: refused by both Envoys within 6 s.
    tokio::time::sleep(Duration::from_secs(30)).await;
    let blocked_at = unix_second();
    let put = tokio::task::spawn_blocking(move || {
        central.put("/v1/blocks/front/carol").map(|s| (s, central))
    });
    let (status, central) = put.await.expect("PUT ran").expect("the central answers");
    assert_eq!(status, 200, "carol blocked");
    run.await.expect("the load ran");
    let tallies = load.tallies();
    let window = start + 10..start + 40;
    let mut alice = 0;
    for s in start - 1..start + 42 {
        let per_node: Vec<u64> = (0..3).map(|n| on_node(&tallies, "alice", n, s)).collect();
        let (bob, bob_refused) = counted(&tallies, "bob", s);
        let measured = if window.contains(&s) {
            "measured"
        } else {
            "warm-up"
        };
        println!(
            "second {s} ({measured}): alice {per_node:?} = {}, bob {bob} ({bob_refused} refused)",
            per_node.iter().sum::<u64>()
        );
        if window.contains(&s) {
            alice += per_node.iter().sum::<u64>();
        }
    }
    println!("alice admitted {alice} in 30 s of a limit of 3000");
    let dave: u64 = window
        .clone()
        .map(|s| on_node(&tallies, "dave", 0, s))
        .sum();
    println!("dave, on envoy-1 only, admitted {dave} in 30 s of a limit of 1200");
    assert!(
        ONE_ENVOY.contains(&dave),
        "dave admitted {dave} in 30 s on one Envoy, limit 1200"
    );
    // Over the whole run, never more than the refill and the burst.
    let seconds = start - 1..start + 43;
    let dave_run: u64 = seconds.map(|s| on_node(&tallies, "dave", 0, s)).sum();
    println!("dave, over the 44 s of the run: {dave_run}, at most 40 x 44 + 400");
    assert!(
        dave_run <= 40 * 44 + 400,
        "dave admitted {dave_run} in 44 s"
    );
    assert!(
        BESIDE_A_NODE.contains(&alice),
        "alice admitted {alice} in 30 s, limit 3000"
    );
    for (s, row) in &tallies {
        for ((user, node), t) in row
            .iter()
            .filter(|((u, _), t)| u == "bob" && t.rejected > 0)
        {
            println!("second {s}: {user} refused {} on node {node}", t.rejected);
        }
    }
    let bob_refused: u64 = (start..start + 40)
        .map(|s| counted(&tallies, "bob", s).1)
        .sum();
    assert_eq!(bob_refused, 0, "bob, under his limit, is never refused");
    let carol: Vec<u64> = (blocked_at..start + 42)
        .map(|s| counted(&tallies, "carol", s).0)
        .collect();
    println!("carol admitted from her block on: {carol:?}");
    assert!(
        carol[7..].iter().all(|n| *n == 0),
        "carol refused by both Envoys within 6 s: {carol:?}"
    );
    drop(central);
    let envoy = |n: usize| -> u64 {
        window
            .clone()
            .map(|s| on_node(&tallies, "alice", n, s))
            .sum()
    };
    assert!(
        envoy(0) >= alice / 10 && envoy(1) >= alice / 10,
        "both Envoys serve alice: {} and {} of {alice}",
        envoy(0),
        envoy(1)
    );
}

/// How long after alice's load moved from one Envoy to the other every
/// 5 s holds 90%..110% of her limit: the target, 15 s. The Envoy she
/// moves to admits its first share of her rule (50/s) until its first
/// report, and her bucket keeps what that leaves of the refill, which her
/// next seconds spend at up to 200/s; the Envoy she left reports her
/// bucket idle, and is filed as stopped.
const FOLLOWED: i64 = 15;

/// alice, offered 200/s on one Envoy, then moved whole to the other: from
/// `FOLLOWED` after the move on, every 5 s holds 90%..110% of her
/// limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_load_moved_from_one_envoy_to_the_other_is_followed_within_15_s() {
    let test = "a_load_moved_from_one_envoy_to_the_other_is_followed_within_15_s";
    let _one = ONE_AT_A_TIME.lock().await;
    let Some(bin) = throttle_test_servers::central_beside(env!("CARGO_BIN_EXE_axum-node"), test)
    else {
        return;
    };
    let dir = TempDir::new("envoy-shift");
    let central = CentralProcess::start(&bin, &["--limits".to_owned(), limits_file(&dir)]);
    let app = upstream().await;
    let Some(envoys) = envoys(test, app, &[(central.grpc, central.http.port())]) else {
        return;
    };
    let load = Load::new(envoys.iter().map(|e| e.1).collect(), "/");
    let first = load.flow("alice", 0, 200.0);
    let second = load.flow("alice", 1, 0.0);
    let running = load.clone();
    let run = tokio::spawn(async move { running.run(Duration::from_secs(56)).await });
    tokio::time::sleep(Duration::from_secs(20)).await;
    let moved = unix_second();
    first.set_rate(0.0);
    second.set_rate(200.0);
    run.await.expect("the load ran");
    drop(central);
    let tallies = load.tallies();
    let on = |n: usize, s: i64| on_node(&tallies, "alice", n, s);
    for s in moved - 5..moved + 35 {
        let mark = if s == moved { " (moved)" } else { "" };
        println!("second {s}{mark}: alice {} + {}", on(0, s), on(1, s));
    }
    let window = |from: i64| -> u64 { (from..from + 5).map(|s| on(0, s) + on(1, s)).sum() };
    let followed = (moved..moved + 31).find(|&from| {
        (from..=moved + 31)
            .step_by(5)
            .all(|w| (450..=550).contains(&window(w)))
    });
    println!("every 5 s within 90%..110% from {followed:?}, moved at {moved}");
    let from = moved + FOLLOWED;
    let windows: Vec<u64> = (from..=moved + 31).step_by(5).map(window).collect();
    assert!(
        windows.iter().all(|w| (450..=550).contains(w)),
        "the 5 s windows from {FOLLOWED} s after the move, of 500: {windows:?}"
    );
    assert!(
        (moved + 15..moved + 35).map(|s| on(1, s)).sum::<u64>() >= 1_800,
        "the Envoy she moved to serves her"
    );
}

/// What the 30 s around a leader's kill hold with Envoys alone, of a
/// limit of 3,000: the target, 90%..110%. The first Envoy on the new
/// leader is granted the whole limit while the other keeps its last share
/// until it reconnects at its next report (up to 8 s); the seconds their
/// lost reports covered are charged when they are back.
const ENVOYS_ALONE: std::ops::RangeInclusive<u64> = 2700..=3300;

/// What alice, offered 300/s over two Envoys and an `axum-node`, is to be
/// admitted over 30 s, of 3,000: 95%..105% (99.1%..100.0% in six runs).
const BESIDE_A_NODE: std::ops::RangeInclusive<u64> = 2850..=3150;

/// What a user limited to 40/s and offered 60/s on one Envoy only is
/// admitted over 30 s, of 1,200: at least the 95% the target asks, and
/// up to the limit plus the burst its bucket starts with (10 s of rate,
/// 400), which the window spends because the Envoy's first seconds held
/// it to its share of the rule, 13/s.
const ONE_ENVOY: std::ops::RangeInclusive<u64> = 1140..=1600;

/// Whether both Envoys have a stream open on `central`.
fn both_envoys_on(central: &CentralProcess) -> bool {
    let ids = central.streams();
    ids.iter().any(|i| i == "envoy-1") && ids.iter().any(|i| i == "envoy-2")
}

/// alice offered 100/s on each of `envoys` for `secs`, running.
fn alice_on_both(envoys: &[(Envoy, SocketAddr)], secs: u64) -> (Load, tokio::task::JoinHandle<()>) {
    let load = Load::new(envoys.iter().map(|e| e.1).collect(), "/");
    load.flow("alice", 0, 100.0);
    load.flow("alice", 1, 100.0);
    let running = load.clone();
    let run = tokio::spawn(async move { running.run(Duration::from_secs(secs)).await });
    (load, run)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoys_follow_a_new_leader_through_the_health_checked_cluster() {
    let test = "envoys_follow_a_new_leader_through_the_health_checked_cluster";
    let _one = ONE_AT_A_TIME.lock().await;
    let Some(bin) = throttle_test_servers::central_beside(env!("CARGO_BIN_EXE_axum-node"), test)
    else {
        return;
    };
    let Some(etcd) = throttle_test_servers::Etcd::start(test) else {
        return;
    };
    let dir = TempDir::new("envoy-ha");
    let limits = limits_file(&dir);
    let mut centrals: Vec<CentralProcess> = (0..2)
        .map(|_| {
            let grpc = free_port();
            let url = format!("http://127.0.0.1:{grpc}");
            let args = [
                "--etcd",
                &etcd.url(),
                "--advertise",
                &url,
                "--limits",
                &limits,
                "--state",
                "etcd",
            ];
            CentralProcess::start_on(&bin, grpc, &args.map(str::to_owned))
        })
        .collect();
    let leader = tokio::task::block_in_place(|| {
        throttle_test_servers::until(Duration::from_secs(10), "a leader", || {
            centrals
                .iter()
                .any(|c| c.role().as_deref() == Some("leader"))
        });
        usize::from(centrals[0].role().as_deref() != Some("leader"))
    });
    let standby = 1 - leader;
    let app = upstream().await;
    let ports: Vec<(u16, u16)> = centrals.iter().map(|c| (c.grpc, c.http.port())).collect();
    let Some(envoys) = envoys(test, app, &ports) else {
        return;
    };
    let (load, run) = alice_on_both(&envoys, 47);
    tokio::time::sleep(Duration::from_secs(27)).await;
    let event = unix_second();
    centrals[leader].kill();
    let on_new = tokio::task::block_in_place(|| {
        throttle_test_servers::until(
            Duration::from_secs(15),
            "both Envoys on the new leader",
            || both_envoys_on(&centrals[standby]),
        )
    });
    println!("leader killed: both Envoys on the new leader {on_new:.2?} after");
    run.await.expect("the load ran");
    let tallies = load.tallies();
    let mut total = 0;
    for s in event - 15..event + 15 {
        let (admitted, refused) = counted(&tallies, "alice", s);
        println!(
            "second {s}{}: alice {admitted} ({refused} refused)",
            if s == event { " (kill)" } else { "" }
        );
        total += admitted;
    }
    println!("alice admitted {total} in the 30 s around the kill, of a limit of 3000");
    assert!(
        on_new <= Duration::from_secs(10),
        "on the new leader {on_new:?} after the kill"
    );
    assert!(
        ENVOYS_ALONE.contains(&total),
        "alice admitted {total} in 30 s, limit 3000"
    );
}

/// What the 10 s from 2 s after the Envoys are back on a restarted
/// central hold, of 1,000: no burst, at most a tenth over the limit.
/// Envoy drops the reports due while its stream is down; the central
/// charges the seconds they lost at the rate of their first report back,
/// out of the refill its bucket kept over the outage (see the Envoy
/// guide), so that refill is not granted again.
/// Some runs lose a second to a dip a few seconds after they are back,
/// paying for what the Envoys admitted over it as they came back (812,
/// 849 and 974 in three runs): the lower bound allows it.
const AFTER_RESTART: std::ops::RangeInclusive<u64> = 750..=1100;

/// The guide's two Envoys on a lone central with `--state FILE`, alice
/// offered 100/s on each against her 100/s: the central killed, the
/// Envoys keep their last shares until the assignments' TTL (15 s by
/// default, sent again every 7 s) and then let her through
/// (`no_assignment_behavior: ALLOW_ALL`); the central started again on
/// its state, they are back on it at their next report and held to the
/// limit again (see `AFTER_RESTART`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoys_keep_their_share_until_the_ttl_and_come_back_without_a_burst() {
    let test = "envoys_keep_their_share_until_the_ttl_and_come_back_without_a_burst";
    let _one = ONE_AT_A_TIME.lock().await;
    let Some(bin) = throttle_test_servers::central_beside(env!("CARGO_BIN_EXE_axum-node"), test)
    else {
        return;
    };
    let dir = TempDir::new("envoy-ttl");
    let state = dir.path().join("state").display().to_string();
    let args = [
        "--limits".to_owned(),
        limits_file(&dir),
        "--state".to_owned(),
        state,
    ];
    let mut central = CentralProcess::start(&bin, &args);
    let app = upstream().await;
    let Some(envoys) = envoys(test, app, &[(central.grpc, central.http.port())]) else {
        return;
    };
    let (load, run) = alice_on_both(&envoys, 72);
    tokio::time::sleep(Duration::from_secs(20)).await;
    let killed = unix_second();
    central.kill();
    tokio::time::sleep(Duration::from_secs(25)).await;
    let restarted = unix_second();
    central.restart();
    let back = tokio::task::block_in_place(|| {
        throttle_test_servers::until(Duration::from_secs(12), "both Envoys back", || {
            both_envoys_on(&central)
        })
    });
    println!("central restarted: both Envoys back {back:.2?} after");
    run.await.expect("the load ran");
    let tallies = load.tallies();
    let second = |s: i64| counted(&tallies, "alice", s).0;
    for s in killed - 5..restarted + 27 {
        let mark = match s {
            _ if s == killed => " (killed)",
            _ if s == restarted => " (restarted)",
            _ => "",
        };
        let (admitted, refused) = counted(&tallies, "alice", s);
        println!("second {s}{mark}: alice {admitted} ({refused} refused)");
    }
    // Their last shares for at least the TTL less the refresh period.
    let kept: Vec<u64> = (killed + 1..killed + 8).map(second).collect();
    assert!(
        kept.iter().all(|n| (70..=130).contains(n)),
        "the last shares kept after the kill: {kept:?}"
    );
    // Then ALLOW_ALL: both Envoys' 100/s, from 16 s after the kill on.
    let open: Vec<u64> = (killed + 17..restarted).map(second).collect();
    assert!(
        open.iter().all(|n| *n >= 170),
        "no assignment: allowed, once the TTL is past: {open:?}"
    );
    // Back at the next report (every 5 s), then the limit, no burst.
    assert!(
        back <= Duration::from_secs(7),
        "back {back:?} after the restart"
    );
    let on_it = restarted + i64::try_from(back.as_secs()).unwrap_or(0) + 2;
    let after: Vec<u64> = (on_it..on_it + 10).map(second).collect();
    let total: u64 = after.iter().sum();
    println!("the 10 s from 2 s after they were back: {after:?} = {total}");
    assert!(
        AFTER_RESTART.contains(&total),
        "alice admitted {total} in the 10 s after the Envoys were back: {after:?}"
    );
}

/// erin (100/s, a burst of one second), offered 150/s through one Envoy
/// whose stream to the central runs over mutual TLS, through the guide's
/// TLS cluster: held to her limit once her burst is spent (without the
/// stream, `ALLOW_ALL` would let all of it through).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_envoy_over_mutual_tls_is_held_to_the_limit() {
    let test = "an_envoy_over_mutual_tls_is_held_to_the_limit";
    let _one = ONE_AT_A_TIME.lock().await;
    let Some(bin) = throttle_test_servers::central_beside(env!("CARGO_BIN_EXE_axum-node"), test)
    else {
        return;
    };
    let dir = TempDir::new("envoy-tls");
    let pki = Pki::new(&["envoy-1"]);
    let write = |name: &str, pem: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, pem).expect("PEM written");
        path.display().to_string()
    };
    let ca = write("ca.pem", &pki.ca);
    let args = [
        "--limits".to_owned(),
        limits_file(&dir),
        "--tls-cert".to_owned(),
        write("central.pem", &pki.server.0),
        "--tls-key".to_owned(),
        write("central.key", &pki.server.1),
        "--tls-client-ca".to_owned(),
        ca.clone(),
    ];
    let central = CentralProcess::start(&bin, &args);
    let app = upstream().await;
    let (listen, admin) = (free_port(), free_port());
    let centrals = [(central.grpc, central.http.port())];
    let yaml = envoy_yaml_with(
        "envoy-1",
        (listen, admin, app.port()),
        &centrals,
        Some(OVER_TLS),
    )
    .replace("/etc/throttle/ca.pem", &ca)
    .replace(
        "/etc/throttle/envoy-1.pem",
        &write("envoy-1.pem", &pki.client.0),
    )
    .replace(
        "/etc/throttle/envoy-1.key",
        &write("envoy-1.key", &pki.client.1),
    );
    let Some(_envoy) = Envoy::start(test, &yaml, SocketAddr::from(([127, 0, 0, 1], admin))) else {
        return;
    };
    let listen = SocketAddr::from(([127, 0, 0, 1], listen));
    wait_listening(listen);
    let load = Load::new(vec![listen], "/");
    load.flow("erin", 0, 150.0);
    let start = unix_second() + 1;
    load.run(Duration::from_secs(14)).await;
    let tallies = load.tallies();
    let seconds: Vec<u64> = (start + 6..start + 12)
        .map(|s| counted(&tallies, "erin", s).0)
        .collect();
    let total: u64 = seconds.iter().sum();
    println!("erin over mutual TLS, 6 s from 6 s in: {seconds:?} = {total} of 600");
    assert!(
        (540..=660).contains(&total),
        "erin admitted {total} in 6 s through an Envoy over mutual TLS, limit 600: {seconds:?}"
    );
}
