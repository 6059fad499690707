//! A [`Case`] run with the real binaries: `throttle-central` and the
//! example `axum-node`s at their default flags on 127.0.0.1 (`World`,
//! `world.rs`), an open-loop HTTP load, and the faults the case names.
//! What each user was admitted per Unix second is read by the same
//! oracle as the simulator's.

use std::sync::Arc;
use std::time::{Duration, Instant};

use throttle_examples::load::{Flow, Load, unix_second};
use throttle_test_servers::TempDir;

pub use super::binaries::Binaries;
use super::case::{Case, Fault, Resource};
use super::generate::generate;
use super::oracle::{Verdict, check_after};
use super::world::World;

/// Seconds a live case runs.
pub const SECONDS: i64 = 12;
/// Most requests a second a live case offers in all (two cores serve the
/// load, the nodes and the central).
const MOST_OFFERED: f64 = 1_200.0;
/// Most nodes of a live case.
const MOST_NODES: usize = 3;
/// Most rotated keys of a live case.
const MOST_KEYS: usize = 10;

/// The case of `seed` cut to what two cores run live: requests only, at
/// most three nodes, [`SECONDS`] long, at most 1,200 requests a second in
/// all (rates and amounts scaled together), ten rotated keys. Its faults
/// are the simulator's: a central stopped (`SIGSTOP`) and continued where
/// it is cut off, killed and started again with or without `--state`;
/// etcd stopped and continued, or killed and started again on its data,
/// under two centrals; a node killed and started again, or cut off from
/// the central by a [`Relay`](throttle_test_servers::Relay) while it
/// serves.
pub fn live_case(seed: u64) -> Case {
    let mut case = generate(seed);
    let time = (SECONDS * 1000) as f64 / (case.seconds * 1000) as f64;
    let at = |ms: i64| (ms as f64 * time).round() as i64;
    let bytes = case.resource.cost;
    case.resource = Resource {
        name: "requests",
        cost: 1,
    };
    case.nodes = case.nodes.min(MOST_NODES);
    case.seconds = SECONDS;
    let mut keys = 0;
    case.loads.retain(|l| {
        let key = l.user.starts_with("key-");
        keys += usize::from(key);
        !key || keys <= MOST_KEYS
    });
    let nodes = case.nodes;
    for l in &mut case.loads {
        l.from_ms = at(l.from_ms);
        l.to_ms = at(l.to_ms).max(l.from_ms + 1_000);
        l.shares = fold(&l.shares, nodes);
        if let Some((when, shares)) = &mut l.moved {
            *when = at(*when);
            *shares = fold(shares, nodes);
        }
    }
    let offered: f64 = case.loads.iter().map(|l| l.rate).sum();
    let scale = (MOST_OFFERED / offered.max(1.0)).min(1.0);
    for l in &mut case.loads {
        l.rate *= scale;
    }
    for r in &mut case.rules {
        for (_, amount) in &mut r.amounts {
            *amount = (*amount / bytes as f64 * scale).round().max(1.0);
        }
    }
    case.faults.retain(|f| match *f {
        Fault::Central { .. } | Fault::Etcd { .. } => true,
        Fault::Node { node, .. } => node < nodes,
    });
    for f in &mut case.faults {
        let (from_ms, to_ms) = match f {
            Fault::Central { from_ms, to_ms, .. }
            | Fault::Etcd { from_ms, to_ms, .. }
            | Fault::Node { from_ms, to_ms, .. } => (from_ms, to_ms),
        };
        *from_ms = at(*from_ms).max(2_000);
        *to_ms = at(*to_ms).max(*from_ms + 1_000).min(SECONDS * 1000 - 3_000);
    }
    case
}

/// `shares` over the first `nodes` nodes, the rest folded onto them.
fn fold(shares: &[f64], nodes: usize) -> Vec<f64> {
    let mut out = vec![0.0; nodes];
    for (i, s) in shares.iter().enumerate() {
        out[i % nodes] += s;
    }
    let total: f64 = out.iter().sum();
    match total > 0.0 {
        true => out.iter().map(|s| s / total).collect(),
        false => vec![1.0 / nodes as f64; nodes],
    }
}

/// What a live run admitted and offered, per user of [`Case::users`] and
/// second, and the oracle's verdict.
#[derive(Debug, Clone)]
pub struct LiveRun {
    /// Per user, per second.
    pub admitted: Vec<Vec<i64>>,
    /// Per user, per second.
    pub offered: Vec<Vec<i64>>,
    /// What the oracle found.
    pub verdict: Verdict,
}

/// Runs `case` with `bins`.
///
/// # Panics
///
/// If a binary does not start, or the nodes do not connect within 10 s.
pub async fn run(case: &Case, bins: &Binaries) -> LiveRun {
    let dir = TempDir::new("promise");
    let limits = dir.path().join("limits.toml");
    std::fs::write(&limits, case.limits_toml()).expect("limits written");
    let spawned = Instant::now();
    let mut world = World::start(case, bins, &limits);
    let nodes = &world.nodes;
    let load = Load::new(nodes.iter().map(|n| n.addr).collect(), "/");
    let flows: Vec<Vec<Arc<Flow>>> = (case.loads.iter())
        .map(|l| {
            (0..case.nodes)
                .map(|n| load.flow(&l.user, n, 0.0))
                .collect()
        })
        .collect();
    next_second().await;
    let first = unix_second();
    let started = Instant::now();
    let running = load.clone();
    let seconds = Duration::from_secs(case.seconds as u64);
    let task = tokio::spawn(async move { running.run(seconds).await });
    let mut down = vec![false; case.faults.len()];
    while started.elapsed() < seconds {
        let t = started.elapsed().as_millis() as i64;
        for (l, flows) in case.loads.iter().zip(&flows) {
            for (n, f) in flows.iter().enumerate() {
                f.set_rate(l.at(t, n));
            }
        }
        for (f, down) in case.faults.iter().zip(&mut down) {
            let (from_ms, to_ms) = f.applied_ms();
            if !*down && (from_ms..to_ms).contains(&t) {
                *down = true;
            } else if *down && t >= to_ms {
                *down = false;
            } else {
                continue;
            }
            tokio::task::block_in_place(|| world.apply(f, *down));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    task.await.expect("the load ran");
    let (admitted, offered) = read(case, &load, first);
    let lead = started.duration_since(spawned).as_secs_f64();
    let verdict = check_after(case, &admitted, &offered, lead);
    LiveRun {
        admitted,
        offered,
        verdict,
    }
}

/// Waits for the next Unix second, and 50 ms into it.
async fn next_second() {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let into = Duration::from_nanos(u64::from(now.subsec_nanos()));
    tokio::time::sleep(Duration::from_secs(1) - into + Duration::from_millis(50)).await;
}

/// Per user, per second from `first`: admitted and offered.
fn read(case: &Case, load: &Load, first: i64) -> (Vec<Vec<i64>>, Vec<Vec<i64>>) {
    let slots = case.seconds as usize;
    let units = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    let (mut admitted, mut offered) = (Vec::new(), Vec::new());
    for user in case.users() {
        let (mut a, mut o) = (vec![0; slots], vec![0; slots]);
        for (second, t) in load.user_tallies(&user) {
            if let Some(slot) = usize::try_from(second - first).ok().filter(|&s| s < slots) {
                (a[slot], o[slot]) = (units(t.admitted), units(t.offered));
            }
        }
        admitted.push(a);
        offered.push(o);
    }
    (admitted, offered)
}
