//! Test support: [`sim`], a deterministic simulator of a whole deployment,
//! and a [`Cluster`] for end-to-end tests: a central node (its library entry
//! point, as the binary runs it) and app nodes running the example app, each
//! with its own store and reporter, all on 127.0.0.1 with ephemeral ports.

pub mod buckets;
pub mod closed_loop;
pub mod hierarchy;
pub mod promise;
pub use throttle_test_servers as servers;
pub mod sim;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use throttle_central::SlotRange;
use throttle_central::limits::LimitSource;
use throttle_central::{Central, CentralBuilder, RunningCentral, Subject};
use throttle_clock::{Clock, SlotLength, SystemClock};
use throttle_layer::reporter::ReporterHandle;
use throttle_layer::{Fallback, Reporter, SlotStore};

/// One app node.
#[derive(Debug)]
pub struct Node {
    /// Where it serves HTTP.
    pub addr: SocketAddr,
    /// Its store.
    pub store: SlotStore,
    /// Its reporter.
    pub reporter: ReporterHandle,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for Node {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// A central node and its app nodes.
pub struct Cluster {
    /// The central node, while it runs.
    pub central: Option<RunningCentral>,
    /// Its gRPC address, kept across restarts.
    pub central_addr: SocketAddr,
    /// The app nodes.
    pub nodes: Vec<Node>,
    /// Slot length of everyone.
    pub slot: SlotLength,
    central_builder: CentralFactory,
}

/// Makes the central node's builder, at start and at each restart.
pub type CentralFactory = Arc<dyn Fn() -> CentralBuilder + Send + Sync>;

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("central", &self.central)
            .field("central_addr", &self.central_addr)
            .field("nodes", &self.nodes)
            .field("slot", &self.slot)
            .finish_non_exhaustive()
    }
}

/// Starts a central node from `builder` on `addr` (port 0 for any), its
/// HTTP API on any port of 127.0.0.1.
///
/// # Errors
///
/// When the address cannot be bound.
pub async fn start_central(
    addr: SocketAddr,
    slot: SlotLength,
    builder: CentralBuilder,
) -> anyhow::Result<RunningCentral> {
    let grpc = tokio::net::TcpListener::bind(addr).await?;
    let http = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    Ok(builder.slot(slot).spawn(grpc, Some(http))?)
}

/// `GET path` of the HTTP server at `addr`: the status and the body read
/// as JSON (`Null` if it is not).
///
/// # Errors
///
/// When the server cannot be reached or answers no HTTP.
pub async fn get_json(addr: SocketAddr, path: &str) -> anyhow::Result<(u16, Value)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    let request = format!("GET {path} HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n");
    s.write_all(request.as_bytes()).await?;
    let mut out = String::new();
    s.read_to_string(&mut out).await?;
    let status = out
        .get(9..12)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("not HTTP: {out:?}"))?;
    let body = out.split_once("\r\n\r\n").map_or("", |x| x.1);
    Ok((status, serde_json::from_str(body).unwrap_or(Value::Null)))
}

impl Cluster {
    /// A central node with `limits` and `nodes` app nodes, all with slots of
    /// `slot_ms`, the nodes falling back to `fallback`.
    ///
    /// # Errors
    ///
    /// When a socket cannot be bound or a node cannot be built.
    pub async fn start(
        nodes: usize,
        slot_ms: u32,
        limits: Arc<dyn LimitSource>,
        fallback: Fallback,
    ) -> anyhow::Result<Self> {
        Self::start_spread(nodes, slot_ms, limits, fallback, Duration::ZERO).await
    }

    /// As [`Cluster::start`], the nodes' reports spread over `spread` after
    /// the report delay
    /// ([`throttle_layer::reporter::ReporterBuilder::report_spread`]).
    ///
    /// # Errors
    ///
    /// When a socket cannot be bound or a node cannot be built.
    pub async fn start_spread(
        nodes: usize,
        slot_ms: u32,
        limits: Arc<dyn LimitSource>,
        fallback: Fallback,
        spread: Duration,
    ) -> anyhow::Result<Self> {
        let central: CentralFactory = Arc::new(move || Central::builder().limits(limits.clone()));
        Self::start_inner(nodes, slot_ms, central, fallback, spread).await
    }

    /// As [`Cluster::start`], with the central node built by `central`.
    ///
    /// # Errors
    ///
    /// When a socket cannot be bound or a node cannot be built.
    pub async fn start_with(
        nodes: usize,
        slot_ms: u32,
        central: CentralFactory,
        fallback: Fallback,
    ) -> anyhow::Result<Self> {
        Self::start_inner(nodes, slot_ms, central, fallback, Duration::ZERO).await
    }

    async fn start_inner(
        nodes: usize,
        slot_ms: u32,
        central: CentralFactory,
        fallback: Fallback,
        spread: Duration,
    ) -> anyhow::Result<Self> {
        let slot = SlotLength::from_ms(slot_ms)?;
        let running = start_central("127.0.0.1:0".parse()?, slot, central()).await?;
        let central_addr = running.grpc_addr();
        let mut cluster = Self {
            central: Some(running),
            central_addr,
            nodes: Vec::new(),
            slot,
            central_builder: central,
        };
        for i in 0..nodes {
            let store = SlotStore::builder().slot(slot).build();
            let router = throttle_examples::app::router(&store, fallback)?;
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
            let addr = listener.local_addr()?;
            let reporter = Reporter::builder(&store, &format!("node-{}", i + 1))
                .central(format!("http://{central_addr}"))
                .report_delay(Duration::from_millis(u64::from(slot_ms / 20).max(1)))
                .report_spread(spread)
                .backoff(Duration::from_millis(20), Duration::from_millis(200))
                .connect_timeout(Duration::from_millis(500))
                .spawn()?;
            let server = tokio::spawn(async move {
                let _ = axum::serve(listener, router).await;
            });
            cluster.nodes.push(Node {
                addr,
                store,
                reporter,
                server,
            });
        }
        Ok(cluster)
    }

    /// Waits until every node's reporter is connected.
    pub async fn connected(&self) {
        for n in &self.nodes {
            n.reporter.wait_for(|s| s.connected).await;
        }
    }

    /// The current slot.
    pub fn current_slot(&self) -> i64 {
        self.slot.slot_at(SystemClock.now_ms())
    }

    /// Asks the running central node.
    pub async fn monitor(&self, subject: Subject) -> Value {
        match &self.central {
            Some(c) => c
                .monitor(subject, SlotRange::default())
                .await
                .unwrap_or(Value::Null),
            None => Value::Null,
        }
    }

    /// Stops the central node; returns its consumption sums as they stood
    /// when it closed the streams.
    pub async fn stop_central(&mut self) -> Value {
        match self.central.take() {
            Some(c) => c
                .shutdown_with_snapshot(Subject::ConsumptionSum)
                .await
                .unwrap_or(Value::Null),
            None => Value::Null,
        }
    }

    /// Starts a fresh central node on the same address.
    ///
    /// # Errors
    ///
    /// When the address cannot be bound again.
    pub async fn restart_central(&mut self) -> anyhow::Result<()> {
        let c = start_central(self.central_addr, self.slot, (self.central_builder)()).await?;
        self.central = Some(c);
        Ok(())
    }

    /// Waits `n` slots.
    pub async fn slots(&self, n: u32) {
        tokio::time::sleep(self.slot.as_duration() * n).await;
    }
}

/// A tokio runtime of one worker thread named `name`: the benchmark
/// programs give each side (server, load, central, nodes) its own, so each
/// has about one core and its CPU can be read from its thread.
///
/// # Errors
///
/// When the runtime cannot be built.
pub fn one_worker(name: &str) -> std::io::Result<tokio::runtime::Runtime> {
    workers(name, 1)
}

/// A runtime of `n` worker threads (at least one) named `name`.
pub fn workers(name: &str, n: usize) -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(n.max(1))
        .thread_name(name)
        .enable_all()
        .build()
}

/// The fleet the central node's benchmark programs (`central-scale`,
/// `ledger-slot`) simulate: every node reports `users` users x 4
/// resources, and each user is on 3 nodes, as with sticky load balancing.
pub mod fleet {
    use throttle_central::limits::{Limit, LimitSet};
    use throttle_proto::v1;

    /// The resources every user reports.
    pub const RESOURCES: [&str; 4] = ["requests", "traffic_up", "traffic_down", "database_read"];

    /// Users over the fleet: each on 3 of `nodes` nodes.
    pub fn total_users(nodes: u64, users: u64) -> u64 {
        (nodes * users / 3).max(users)
    }

    /// The name of node `n`.
    pub fn node_id(n: u64) -> String {
        format!("node-{n:04}")
    }

    /// What node `node` reports for each slot: `users` of the `total`
    /// users, 1 to 5 of each resource.
    pub fn usage(node: u64, users: u64, total: u64) -> v1::Usage {
        usage_in_slot(node, users, total, 1, None)
    }

    /// [`usage`], with every resource but `requests` `scale` times larger
    /// (bytes rather than requests), in one slot: with `Some(slot)`, each
    /// user's 1 to 5 of each resource on each node is drawn anew for every
    /// slot, as a user's use moves from second to second, rather than the
    /// same every slot.
    pub fn usage_in_slot(
        node: u64,
        users: u64,
        total: u64,
        scale: i64,
        slot: Option<i64>,
    ) -> v1::Usage {
        let users = (0..users)
            .map(|j| {
                let u = (node * users + j) % total;
                let resources = RESOURCES
                    .iter()
                    .zip(0u64..)
                    .map(|(r, i)| {
                        let draw = slot.map_or(u, |s| mix(u, s as u64, i + 4 * node));
                        let n = 1 + (draw % 5) as i64;
                        let n = if *r == "requests" {
                            n
                        } else {
                            n.saturating_mul(scale)
                        };
                        (r.to_string(), n)
                    })
                    .collect();
                (format!("user-{u:07}"), v1::Amounts { resources })
            })
            .collect();
        v1::Usage { users }
    }

    /// A well-mixed number from three (splitmix64's finalizer).
    fn mix(a: u64, b: u64, c: u64) -> u64 {
        let mut z = a
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .wrapping_add(b.wrapping_mul(0xBF58_476D_1CE4_E5B9))
            .wrapping_add(c.wrapping_mul(0x94D0_49BB_1331_11EB));
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A limit of 1,000 per second on every resource for each of `total`
    /// users of service `front`.
    pub fn limits(total: u64) -> LimitSet {
        let mut limits = LimitSet::new();
        for u in 0..total {
            limits.insert(
                "front",
                Limit {
                    user: format!("user-{u:07}"),
                    per_second: RESOURCES.iter().map(|r| (r.to_string(), 1000.0)).collect(),
                    burst_seconds: 10.0,
                    max_debt_seconds: None,
                    per_period: Default::default(),
                },
            );
        }
        limits
    }
}

/// CPU time the calling thread has used, to the nanosecond; `None` where
/// the platform has no per-thread CPU clock. Read it from a task on a
/// one-worker runtime to know what that runtime's thread used.
pub fn thread_cpu_time() -> Option<std::time::Duration> {
    #[cfg(unix)]
    {
        let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
        let secs = u64::try_from(t.tv_sec).ok()?;
        let nanos = u32::try_from(t.tv_nsec).ok()?;
        Some(std::time::Duration::new(secs, nanos))
    }
    #[cfg(not(unix))]
    {
        None
    }
}

/// CPU time used so far by this process's threads named `name` (a tokio
/// runtime's threads all take its `thread_name`), to the nanosecond, from
/// the scheduler's count in `/proc/self/task/*/schedstat`: unlike
/// [`thread_cpu_time`], it reads threads other than the caller, so it
/// measures a runtime of several workers. `None` where `/proc` cannot tell.
pub fn threads_cpu_time(name: &str) -> Option<std::time::Duration> {
    tasks_cpu_time("/proc/self/task", Some(name))
}

/// CPU time used so far by every thread of process `pid` (a server the
/// benchmark started), to the nanosecond, as [`threads_cpu_time`] counts.
pub fn process_cpu_time(pid: u32) -> Option<std::time::Duration> {
    tasks_cpu_time(&format!("/proc/{pid}/task"), None)
}

/// The scheduler's CPU time of the threads under `tasks`, those named
/// `name` where given.
fn tasks_cpu_time(tasks: &str, name: Option<&str>) -> Option<std::time::Duration> {
    let tasks = std::fs::read_dir(tasks).ok()?;
    let mut total = std::time::Duration::ZERO;
    let mut found = false;
    for task in tasks.flatten() {
        let dir = task.path();
        // A thread that ended since the listing has no files left to read.
        let Ok(comm) = std::fs::read_to_string(dir.join("comm")) else {
            continue;
        };
        if name.is_some_and(|name| comm.trim_end() != name) {
            continue;
        }
        let Some(ns) = std::fs::read_to_string(dir.join("schedstat"))
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        else {
            continue;
        };
        found = true;
        total += std::time::Duration::from_nanos(ns);
    }
    // None where no such thread could be read (no such thread, or a
    // kernel without scheduler statistics).
    found.then_some(total)
}

/// Resident memory of this process, in MiB (0 where `/proc` cannot tell).
pub fn rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let line = s.lines().find(|l| l.starts_with("VmRSS:"))?;
            line.split_whitespace().nth(1)?.parse::<f64>().ok()
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

/// The number after `--name` on the command line, or `default`; for the
/// benchmark programs.
pub fn arg(name: &str, default: f64) -> f64 {
    arg_text(name)
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The word after `--name` on the command line, if any.
pub fn arg_text(name: &str) -> Option<String> {
    let mut args = std::env::args().skip_while(|a| a != name);
    args.nth(1)
}

/// Sum of `service/*/user/resource` over slots `from..=to` of a
/// `consumption_sum` answer.
pub fn sum(sums: &Value, service: &str, user: &str, resource: &str, from: i64, to: i64) -> i64 {
    sums.get(service)
        .and_then(Value::as_object)
        .map(|slots| {
            slots
                .iter()
                .filter(|(s, _)| s.parse::<i64>().is_ok_and(|s| (from..=to).contains(&s)))
                .filter_map(|(_, users)| users.get(user)?.get(resource)?.as_i64())
                .sum()
        })
        .unwrap_or(0)
}

/// Per slot `from..=to`, the amount of `service/user/resource`.
pub fn per_slot(
    sums: &Value,
    service: &str,
    user: &str,
    resource: &str,
    from: i64,
    to: i64,
) -> Vec<i64> {
    (from..=to)
        .map(|s| sum(sums, service, user, resource, s, s))
        .collect()
}
