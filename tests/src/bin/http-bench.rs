//! The HTTP path side by side: the same axum hello-world app bare, behind
//! `ThrottleLayer` (with a live central node, and alone: no central, no
//! reporter), and behind tower_governor's `GovernorLayer` keyed per user,
//! under the same closed-loop load.
//!
//! Run with: `cargo run --release -p throttle-tests --bin http-bench`
//! (`-- --seconds 3 --rounds 3 --connections 32 --warmup 0.5
//! --server-threads 1` are the defaults; `--only
//! bare,through,throttle,alone,floor,governor` runs only the variants named, to
//! profile one). `through` is a layer that does nothing: what axum's
//! plumbing for a layered route costs any layer. `floor` is the least a
//! layer that decides per user costs: the `store` bench's `slot-quota`
//! floor (its `benches/shared/floor.rs`) in front of the app.
//!
//! The server and the load generator each get one core (two single-worker
//! runtimes on a 2-core machine). `--server-threads 2` gives the server a
//! runtime of two workers instead, as `#[tokio::main]` gives an app on
//! this machine: its workers then serve requests at the same time and
//! share whatever the layer writes. The throttled app's reporter runs on the
//! server's runtime, as in production; its central node runs on a third
//! runtime (in production it is another machine). Variants alternate within
//! each round, each round starting with the next variant (so over as many
//! rounds as variants each runs once in every position), and the table
//! shows medians over rounds.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use throttle_central::Central;
use throttle_central::limits::{Limit, LimitSet, StaticLimits};
use throttle_clock::CoarseClock;
use throttle_layer::{Reporter, SlotStore, ThrottleLayer, UserKey};
use throttle_tests::closed_loop::{Run, load, median};
use tower_governor::GovernorLayer;
use tower_governor::governor::GovernorConfigBuilder;
use tower_governor::key_extractor::KeyExtractor;

#[path = "../../../throttle-layer/benches/shared/floor.rs"]
mod floor;

const USERS: usize = 3000;
/// Per-user limit, requests per second: far above what one user sends in
/// the throughput runs, so every request is allowed there.
const LIMIT: u32 = 1000;
/// The limit of the attacking user in the reject-path runs.
const ATTACK_LIMIT: u32 = 100;

#[derive(Clone, Debug)]
struct HeaderKey;

impl KeyExtractor for HeaderKey {
    type Key = String;

    fn extract<T>(&self, req: &http::Request<T>) -> Result<String, tower_governor::GovernorError> {
        req.headers()
            .get("x-user")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
            .ok_or(tower_governor::GovernorError::UnableToExtractKey)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Variant {
    Bare,
    /// A layer that does nothing: what axum's plumbing for a layered
    /// route costs any layer.
    Through,
    Throttle,
    /// The same layer with no central and no reporter (every request
    /// allowed by the fallback): the layer's own cost, without the
    /// reporter's work on the server's runtime.
    ThrottleAlone,
    /// The least a per-user decision costs (see `floor`).
    Floor,
    Governor,
}

impl Variant {
    /// The variant's name in `--only`.
    fn key(self) -> &'static str {
        match self {
            Self::Bare => "bare",
            Self::Through => "through",
            Self::Throttle => "throttle",
            Self::ThrottleAlone => "alone",
            Self::Floor => "floor",
            Self::Governor => "governor",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Bare => "bare axum",
            Self::Through => "a layer doing nothing",
            Self::Throttle => "throttle (ThrottleLayer)",
            Self::ThrottleAlone => "throttle, no central",
            Self::Floor => "the least deciding layer",
            Self::Governor => "tower_governor",
        }
    }
}

fn app() -> Router {
    Router::new().route("/", get(|| async { "hello" }))
}

struct Server {
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
    _keep: Option<(
        throttle_layer::reporter::ReporterHandle,
        throttle_central::RunningCentral,
    )>,
}

async fn limits(attack_limit: u32) -> LimitSet {
    let mut set = LimitSet::new();
    for u in 0..USERS {
        set.insert(
            "front",
            Limit {
                user: user_name(u),
                per_second: [("requests".to_string(), f64::from(LIMIT))].into(),
                burst_seconds: 1.0,
                max_debt_seconds: None,
                per_period: Default::default(),
            },
        );
    }
    set.insert(
        "front",
        Limit {
            user: "attacker".into(),
            per_second: [("requests".to_string(), f64::from(attack_limit))].into(),
            burst_seconds: 1.0,
            max_debt_seconds: None,
            per_period: Default::default(),
        },
    );
    set
}

/// Starts `variant` on the server runtime; a central node, if the variant
/// needs one, on its own (in production it is on another machine).
async fn start(
    server_rt: &tokio::runtime::Handle,
    central_rt: &tokio::runtime::Handle,
    variant: Variant,
) -> Server {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let mut keep = None;
    let router = match variant {
        Variant::Bare => app(),
        Variant::Through => app().layer(tower_layer::layer_fn(|s| s)),
        Variant::Throttle => {
            let limits = Arc::new(StaticLimits::new(limits(ATTACK_LIMIT).await));
            let central = central_rt
                .spawn(async move {
                    let grpc = tokio::net::TcpListener::bind("127.0.0.1:0")
                        .await
                        .expect("bind");
                    Central::builder()
                        .limits(limits)
                        .spawn(grpc, None)
                        .expect("central")
                })
                .await
                .expect("central task");
            let store = SlotStore::default();
            // The layer first, as an app builds its router before it
            // serves: the reporter's Hello then names the service.
            let layer = ThrottleLayer::builder(&store, "front")
                .user(UserKey::header("x-user"))
                .build()
                .expect("layer");
            // The reporter runs where the app runs, as in production.
            let (node_store, url) = (store.clone(), format!("http://{}", central.grpc_addr()));
            let reporter = server_rt
                .spawn(async move {
                    Reporter::builder(&node_store, "bench-node")
                        .central(url)
                        .spawn()
                        .expect("reporter")
                })
                .await
                .expect("reporter task");
            reporter.wait_for(|s| s.connected).await;
            keep = Some((reporter, central));
            app().layer(layer)
        }
        Variant::ThrottleAlone => {
            let store = SlotStore::default();
            let layer = ThrottleLayer::builder(&store, "front")
                .user(UserKey::header("x-user"))
                .build()
                .expect("layer");
            app().layer(layer)
        }
        Variant::Floor => {
            let names: Vec<String> = (0..USERS).map(user_name).collect();
            let counts = floor::SlotCounts::new(&names, LIMIT, Arc::new(CoarseClock));
            // It knows the bench's users, so every request is decided.
            assert_eq!(counts.admit(&user_name(0)), Some(true), "the floor decides");
            assert_eq!(counts.admit("attacker"), None);
            // Decides for each request's user, and passes it on (every
            // request is allowed: the users stay far under LIMIT).
            app().layer(tower_layer::layer_fn(move |inner| {
                floor::Floored(counts.clone(), inner)
            }))
        }
        Variant::Governor => {
            let mut builder = GovernorConfigBuilder::default();
            builder
                .period(Duration::from_nanos(1_000_000_000 / u64::from(LIMIT)))
                .burst_size(LIMIT);
            let config = builder.key_extractor(HeaderKey).finish().expect("config");
            app().layer(GovernorLayer::new(config))
        }
    };
    let task = server_rt.spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    Server {
        addr,
        task,
        _keep: keep,
    }
}

fn spread_users(c: usize, i: u64) -> String {
    // Every connection walks all users, from a different start.
    user_name((c * 97 + i as usize * 31) % USERS)
}

fn user_name(u: usize) -> String {
    format!("user-{u:04}")
}

fn attacker(_: usize, _: u64) -> String {
    "attacker".to_string()
}

/// CPU time the server runtime's threads have used so far: from `/proc`,
/// or where it cannot tell, the clock of the one worker's thread.
async fn server_cpu(server_rt: &tokio::runtime::Handle) -> Option<Duration> {
    if let Some(cpu) = throttle_tests::threads_cpu_time(SERVER_THREADS) {
        return Some(cpu);
    }
    if server_rt.metrics().num_workers() != 1 {
        return None;
    }
    server_rt
        .spawn(async { throttle_tests::thread_cpu_time() })
        .await
        .ok()
        .flatten()
}

/// The name of the server runtime's threads.
const SERVER_THREADS: &str = "server";

/// One figure compared round by round.
struct Measure {
    what: &'static str,
    of: fn(&Run) -> Option<f64>,
    higher_is_better: bool,
}

/// One variant against another round by round: within a round the two
/// ran seconds apart, so the machine's slower and faster spells, which
/// move whole runs by a few percent, cancel in each round's ratio.
fn paired(name: &str, ours: &[Run], other: &str, theirs: &[Run]) -> String {
    let n = ours.len().min(theirs.len());
    let mut out = format!("{name} against {other}, round by round ({n} rounds):\n");
    let rows: [Measure; 2] = [
        Measure {
            what: "req/s",
            of: |r| Some(r.rps()),
            higher_is_better: true,
        },
        Measure {
            what: "server CPU per request",
            of: Run::cpu_us_per_request,
            higher_is_better: false,
        },
    ];
    for Measure {
        what,
        of: measure,
        higher_is_better,
    } in rows
    {
        let ratios: Vec<f64> = ours[..n]
            .iter()
            .zip(&theirs[..n])
            .filter_map(|(a, b)| Some(measure(a)? / measure(b)?))
            .filter(|r| r.is_finite())
            .collect();
        if ratios.is_empty() {
            continue;
        }
        let wins = ratios
            .iter()
            .filter(|&&r| if higher_is_better { r > 1.0 } else { r < 1.0 })
            .count();
        let better = if higher_is_better { "higher" } else { "lower" };
        let lo = ratios.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = ratios.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        out += &format!(
            "  {what}: median {:.1}% of {other}'s ({:.1}%..{:.1}%); {better} in {wins} of {} rounds (one-sided sign test p = {:.3})\n",
            100.0 * median(ratios.clone()),
            100.0 * lo,
            100.0 * hi,
            ratios.len(),
            sign_test(wins, ratios.len()),
        );
    }
    out
}

/// The chance of `wins` or more of `n` fair coin flips: how likely a
/// record this good is if neither layer were ahead.
fn sign_test(wins: usize, n: usize) -> f64 {
    // C(n, k) / 2^n, summed over k >= wins, built up term by term.
    let mut term = 0.5f64.powi(n as i32);
    let mut tail = 0.0;
    for k in 0..=n {
        if k >= wins {
            tail += term;
        }
        term *= (n - k) as f64 / (k + 1) as f64;
    }
    tail.min(1.0)
}

fn main() {
    let seconds = throttle_tests::arg("--seconds", 3.0);
    let rounds = throttle_tests::arg("--rounds", 3.0) as usize;
    let connections = throttle_tests::arg("--connections", 32.0) as usize;
    let warmup = throttle_tests::arg("--warmup", 0.5);
    let only: Option<Vec<String>> =
        throttle_tests::arg_text("--only").map(|v| v.split(',').map(str::to_owned).collect());
    let server_threads = (throttle_tests::arg("--server-threads", 1.0) as usize).max(1);
    let server_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(server_threads)
        .thread_name(SERVER_THREADS)
        .enable_all()
        .build()
        .expect("runtime");
    let central_rt = throttle_tests::one_worker("central").expect("runtime");
    let load_rt = throttle_tests::one_worker("load").expect("runtime");
    let server = match server_threads {
        1 => "server and load on one core each".to_string(),
        n => format!("server on {n} worker threads, load on one"),
    };
    println!(
        "{rounds} rounds x {seconds} s, {connections} keep-alive connections, {USERS} users, {server}\n"
    );
    for (title, user, variants) in [
        (
            "throughput: every request allowed",
            spread_users as fn(usize, u64) -> String,
            vec![
                Variant::Bare,
                Variant::Through,
                Variant::Throttle,
                Variant::ThrottleAlone,
                Variant::Floor,
                Variant::Governor,
            ],
        ),
        (
            "reject path: one user far over its limit",
            attacker as fn(usize, u64) -> String,
            vec![Variant::Throttle, Variant::Governor],
        ),
    ] {
        let mut results: Vec<(Variant, Vec<Run>)> = variants
            .iter()
            .filter(|v| only.as_ref().is_none_or(|o| o.iter().any(|k| k == v.key())))
            .map(|v| (*v, Vec::new()))
            .collect();
        let n = results.len();
        if n == 0 {
            continue;
        }
        for round in 0..rounds {
            // Each round starts with the next variant, so over n rounds each
            // runs once in every position (first after a warm-up, last).
            for i in 0..n {
                let (variant, runs) = &mut results[(round + i) % n];
                let run = load_rt.block_on(async {
                    let server = start(server_rt.handle(), central_rt.handle(), *variant).await;
                    // Warm up, then measure.
                    load(server.addr, connections, warmup, user).await;
                    let before = server_cpu(server_rt.handle()).await;
                    let mut run = load(server.addr, connections, seconds, user).await;
                    let after = server_cpu(server_rt.handle()).await;
                    run.server_cpu = after.zip(before).map(|(a, b)| a.saturating_sub(b));
                    server.task.abort();
                    run
                });
                runs.push(run);
            }
        }
        println!("{title}");
        println!(
            "| {:<26} | {:>10} | {:>8} | {:>9} | {:>9} | {:>13} | {:>9} | {:>7} |",
            "variant",
            "req/s",
            "vs first",
            "p50 us",
            "p99 us",
            "server us/req",
            "refused %",
            "errors"
        );
        println!(
            "|{:-<28}|{:->12}|{:->10}|{:->11}|{:->11}|{:->15}|{:->11}|{:->9}|",
            "", "", "", "", "", "", "", ""
        );
        let first = median(results[0].1.iter().map(Run::rps).collect());
        for (variant, runs) in &results {
            let rps = median(runs.iter().map(Run::rps).collect());
            let p50 = median(runs.iter().map(|r| r.percentile(0.5)).collect());
            let p99 = median(runs.iter().map(|r| r.percentile(0.99)).collect());
            let refused = median(
                runs.iter()
                    .map(|r| 100.0 * r.refused as f64 / (r.ok + r.refused).max(1) as f64)
                    .collect(),
            );
            let errors: u64 = runs.iter().map(|r| r.errors).sum();
            let cpu = median(runs.iter().filter_map(Run::cpu_us_per_request).collect());
            println!(
                "| {:<26} | {:>10.0} | {:>7.1}% | {:>9.0} | {:>9.0} | {:>13.3} | {:>8.1}% | {:>7} |",
                variant.name(),
                rps,
                100.0 * rps / first,
                p50,
                p99,
                cpu,
                refused,
                errors
            );
        }
        println!();
        let runs_of = |v: Variant| results.iter().find(|(w, _)| *w == v).map(|(_, r)| r);
        // Each throttle variant against tower_governor; the layer with its
        // reporter against the layer alone (what the reporter's work on the
        // server's runtime costs the requests); the layer alone and
        // tower_governor against the floor of deciding (how far above
        // it each is, so how much either could still gain).
        for (ours, other) in [
            (Variant::Throttle, Variant::Governor),
            (Variant::ThrottleAlone, Variant::Governor),
            (Variant::Throttle, Variant::ThrottleAlone),
            (Variant::ThrottleAlone, Variant::Floor),
            (Variant::Governor, Variant::Floor),
        ] {
            if let (Some(runs), Some(theirs)) = (runs_of(ours), runs_of(other)) {
                println!("{}", paired(ours.name(), runs, other.name(), theirs));
            }
        }
    }
}
