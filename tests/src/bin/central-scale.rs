//! The central node under many nodes: real tonic streams on loopback, each
//! node reporting `--users` users x 4 resources every slot.
//!
//! Run with: `cargo run --release -p throttle-tests --bin central-scale -- --nodes 1000 --users 100`
//!
//! Prints the report -> answer round trip (p50, p99), reports answered,
//! quota pushes that arrived after their slot had begun (an assigner that
//! cannot keep up), the central node's CPU time, and the process's CPU time
//! and resident memory. The central node runs on a runtime of one worker
//! thread and the simulated nodes on another, so each has about one of this
//! machine's two cores, and the central's own CPU share is measured on its
//! thread.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use throttle_central::Central;
use throttle_central::limits::{Limit, LimitSet, StaticLimits};
use throttle_proto::slot::{Clock, CoarseClock, SlotLength};
use throttle_proto::v1::central_client::CentralClient;
use throttle_proto::v1::{self, central_message, node_message};

const RESOURCES: [&str; 4] = ["requests", "traffic_up", "traffic_down", "database_read"];

fn usage(node: u64, users: u64, total: u64) -> v1::Usage {
    let users = (0..users)
        .map(|j| {
            let u = (node * users + j) % total;
            let resources = RESOURCES
                .iter()
                .map(|r| (r.to_string(), 1 + (u % 5) as i64))
                .collect();
            (format!("user-{u:07}"), v1::Amounts { resources })
        })
        .collect();
    v1::Usage { users }
}

fn cpu_seconds() -> f64 {
    // utime + stime of this process, in clock ticks (100 Hz on Linux).
    std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| stat_cpu_seconds(&s))
        .unwrap_or(0.0)
}

/// User + system seconds from a `/proc/.../stat` line.
fn stat_cpu_seconds(stat: &str) -> Option<f64> {
    let after = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = after.split_whitespace().collect();
    Some((f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?) / 100.0)
}

/// CPU seconds of this process's threads named `name`.
fn threads_cpu_seconds(name: &str) -> f64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0.0;
    };
    tasks
        .filter_map(|t| {
            let dir = t.ok()?.path();
            let comm = std::fs::read_to_string(dir.join("comm")).ok()?;
            (comm.trim() == name).then_some(())?;
            stat_cpu_seconds(&std::fs::read_to_string(dir.join("stat")).ok()?)
        })
        .sum()
}

fn rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let line = s.lines().find(|l| l.starts_with("VmRSS:"))?;
            line.split_whitespace().nth(1)?.parse::<f64>().ok()
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

fn main() -> anyhow::Result<()> {
    let nodes = throttle_tests::arg("--nodes", 1000.0) as u64;
    let users = throttle_tests::arg("--users", 100.0) as u64;
    let seconds = throttle_tests::arg("--seconds", 10.0) as u64;
    let total_users = (nodes * users / 3).max(users);
    let central_rt = throttle_tests::one_worker("central")?;
    let rt = throttle_tests::one_worker("nodes")?;
    let on_central = central_rt.handle().clone();
    rt.block_on(async {
        let mut limits = LimitSet::new();
        for u in 0..total_users {
            limits.insert(
                "front",
                Limit {
                    user: format!("user-{u:07}"),
                    per_second: RESOURCES.iter().map(|r| (r.to_string(), 1000.0)).collect(),
                    burst_seconds: 10.0,
                },
            );
        }
        let rss_before = rss_mib();
        // Bound and spawned on the central's runtime: its streams run there.
        let central = on_central
            .spawn(async {
                let grpc = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
                Central::builder()
                    .limits(Arc::new(StaticLimits::new(limits)))
                    .spawn(grpc, None)
            })
            .await??;
        let url = format!("http://{}", central.grpc_addr());
        let slot = SlotLength::SECOND;
        let rtts: Arc<Mutex<Vec<u64>>> = Arc::default();
        let sent = Arc::new(AtomicU64::new(0));
        let answered = Arc::new(AtomicU64::new(0));
        let late_pushes = Arc::new(AtomicU64::new(0));
        let pushes = Arc::new(AtomicU64::new(0));
        let end = Instant::now() + Duration::from_secs(seconds + 2);
        let mut tasks = Vec::new();
        let started = Instant::now();
        for n in 0..nodes {
            let (url, rtts, sent, answered, late, pushes) =
                (url.clone(), rtts.clone(), sent.clone(), answered.clone(), late_pushes.clone(), pushes.clone());
            tasks.push(tokio::spawn(async move {
                let Ok(mut client) = CentralClient::connect(url).await else { return };
                let client_usage = usage(n, users, total_users);
                let (tx, rx) = tokio::sync::mpsc::channel(8);
                let hello = v1::Hello {
                    node_id: format!("node-{n:04}"),
                    slot_ms: slot.as_ms(),
                    services: vec!["front".into()],
                    version: "scale".into(),
                };
                let _ = tx.send(v1::NodeMessage { kind: Some(node_message::Kind::Hello(hello)) }).await;
                let Ok(resp) = client.exchange(tokio_stream::wrappers::ReceiverStream::new(rx)).await else { return };
                let mut inbound = resp.into_inner();
                let in_flight: Arc<Mutex<Option<(i64, Instant)>>> = Arc::default();
                let reader = {
                    let in_flight = in_flight.clone();
                    tokio::spawn(async move {
                        while let Ok(Some(m)) = inbound.message().await {
                            if let Some(central_message::Kind::Quota(q)) = m.kind {
                                let now_slot = slot.slot_at(CoarseClock.now_ms());
                                match q.report_slot {
                                    Some(s) => {
                                        if let Some((want, at)) = *in_flight.lock()
                                            && want == s
                                        {
                                            rtts.lock().push(at.elapsed().as_micros() as u64);
                                            answered.fetch_add(1, Ordering::Relaxed);
                                        }
                                    }
                                    None => {
                                        pushes.fetch_add(1, Ordering::Relaxed);
                                        let first = q.services.values().flat_map(|s| s.slots.keys()).min().copied();
                                        if first.is_some_and(|s| s < now_slot) {
                                            late.fetch_add(1, Ordering::Relaxed);
                                        }
                                    }
                                }
                            }
                        }
                    })
                };
                while Instant::now() < end {
                    let now = CoarseClock.now_ms();
                    tokio::time::sleep(slot.until_next(now) + Duration::from_millis(50)).await;
                    let s = slot.slot_at(CoarseClock.now_ms());
                    let report = v1::Report {
                        node_id: String::new(),
                        slot_number: s,
                        consumption: [("front".to_string(), client_usage.clone())].into(),
                        rejection: [("front".to_string(), v1::Usage::default())].into(),
                    };
                    *in_flight.lock() = Some((s, Instant::now()));
                    sent.fetch_add(1, Ordering::Relaxed);
                    if tx.send(v1::NodeMessage { kind: Some(node_message::Kind::Report(report)) }).await.is_err() {
                        break;
                    }
                }
                // The last report's answer is still on its way.
                tokio::time::sleep(Duration::from_millis(500)).await;
                reader.abort();
            }));
        }
        // Measure from the first full slot after everyone has connected.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let (cpu0, central0, nodes0, t0) = (
            cpu_seconds(),
            threads_cpu_seconds("central"),
            threads_cpu_seconds("nodes"),
            Instant::now(),
        );
        rtts.lock().clear();
        let (sent0, answered0, late0, pushes0) = (
            sent.load(Ordering::Relaxed),
            answered.load(Ordering::Relaxed),
            late_pushes.load(Ordering::Relaxed),
            pushes.load(Ordering::Relaxed),
        );
        for t in tasks {
            let _ = t.await;
        }
        let wall = t0.elapsed().as_secs_f64();
        let cpu = cpu_seconds() - cpu0;
        let central_cpu = threads_cpu_seconds("central") - central0;
        let nodes_cpu = threads_cpu_seconds("nodes") - nodes0;
        let mut r = rtts.lock().clone();
        r.sort_unstable();
        let pct = |p: f64| r.get(((r.len().max(1) - 1) as f64 * p) as usize).copied().unwrap_or(0) as f64 / 1000.0;
        println!(
            "{nodes} nodes x {users} users x 4 resources per report ({} entries per slot), {total_users} limited users, {seconds} s",
            nodes * users * 4
        );
        println!("| what | value |\n|---|---:|");
        println!("| report -> answer p50 | {:.2} ms |", pct(0.5));
        println!("| report -> answer p99 | {:.2} ms |", pct(0.99));
        println!(
            "| reports answered / sent | {} / {} |",
            answered.load(Ordering::Relaxed) - answered0,
            sent.load(Ordering::Relaxed) - sent0
        );
        println!(
            "| quota pushes arriving after their slot began | {} of {} |",
            late_pushes.load(Ordering::Relaxed) - late0,
            pushes.load(Ordering::Relaxed) - pushes0
        );
        println!("| ingest | {:.0} entries/s |", (nodes * users * 4) as f64 / slot.as_duration().as_secs_f64());
        println!("| central node CPU (its one worker thread) | {:.0}% of one core |", 100.0 * central_cpu / wall);
        println!("| simulated nodes CPU (their one worker thread) | {:.0}% of one core |", 100.0 * nodes_cpu / wall);
        println!("| process CPU (all threads) | {:.0}% of one core |", 100.0 * cpu / wall);
        println!("| resident memory, whole process | {:.0} MiB (+{:.0} MiB) |", rss_mib(), rss_mib() - rss_before);
        println!("| setup | {:.1} s |", started.elapsed().as_secs_f64() - wall);
        central.shutdown().await;
        Ok::<(), anyhow::Error>(())
    })
}
