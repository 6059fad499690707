//! A small open-loop HTTP load generator: requests go out at a fixed rate
//! whatever the answers, as real users would send them, and every answer is
//! counted per second, user and node.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use parking_lot::Mutex;

/// Answers counted in one second for one (user, node).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    /// Requests sent.
    pub offered: u64,
    /// Answered 2xx.
    pub admitted: u64,
    /// Answered 429.
    pub rejected: u64,
    /// Failed or answered anything else.
    pub errors: u64,
    /// Body bytes received with the 2xx answers.
    pub bytes: u64,
}

/// Tallies by second, then (user, node index).
pub type Tallies = BTreeMap<i64, BTreeMap<(String, usize), Tally>>;

/// One stream of requests: a user hitting one node at a changeable rate.
#[derive(Debug)]
pub struct Flow {
    /// The user (`x-user` header).
    pub user: String,
    /// Index of the node in the generator's node list.
    pub node: usize,
    /// Requests per second, in thousandths (so it can change while running).
    rate_milli: AtomicU64,
}

impl Flow {
    /// Sets the rate in requests per second.
    pub fn set_rate(&self, per_second: f64) {
        self.rate_milli
            .store((per_second.max(0.0) * 1000.0) as u64, Ordering::Relaxed);
    }

    fn rate(&self) -> f64 {
        self.rate_milli.load(Ordering::Relaxed) as f64 / 1000.0
    }
}

/// Sends `GET path` for every flow until stopped.
#[derive(Debug, Clone)]
pub struct Load {
    nodes: Arc<[SocketAddr]>,
    path: Arc<str>,
    flows: Arc<Mutex<Vec<Arc<Flow>>>>,
    tallies: Arc<Mutex<Tallies>>,
    /// Milliseconds either side of each minute's start in which no request
    /// is sent, so every request falls in one minute for whoever counts it.
    quiet_ms: Arc<AtomicU64>,
}

/// The current Unix second: what [`Tallies`] are keyed by.
pub fn unix_second() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

impl Load {
    /// A generator against `nodes`, requesting `path`.
    pub fn new(nodes: Vec<SocketAddr>, path: &str) -> Self {
        Self {
            nodes: nodes.into(),
            path: path.into(),
            flows: Arc::default(),
            tallies: Arc::default(),
            quiet_ms: Arc::default(),
        }
    }

    /// Sends nothing within `quiet` of each minute's start (the flows
    /// pause), so that each request is counted in the minute it was sent
    /// in by the generator and the node alike.
    pub fn quiet_around_minutes(&self, quiet: Duration) {
        let ms = u64::try_from(quiet.as_millis()).unwrap_or(u64::MAX);
        self.quiet_ms.store(ms, Ordering::Relaxed);
    }

    /// Whether now is within the quiet time around a minute's start.
    fn quiet_now(&self) -> bool {
        let quiet = self.quiet_ms.load(Ordering::Relaxed);
        let now = SystemTime::now().duration_since(UNIX_EPOCH);
        let into = now.map_or(0, |d| (d.as_millis() % 60_000) as u64);
        quiet > 0 && (into < quiet || into >= 60_000 - quiet)
    }

    /// Adds a flow of `per_second` requests as `user` to node `node`.
    pub fn flow(&self, user: &str, node: usize, per_second: f64) -> Arc<Flow> {
        let f = Arc::new(Flow {
            user: user.to_owned(),
            node,
            rate_milli: AtomicU64::new(0),
        });
        f.set_rate(per_second);
        self.flows.lock().push(f.clone());
        f
    }

    /// What was counted so far.
    pub fn tallies(&self) -> Tallies {
        self.tallies.lock().clone()
    }

    /// What was counted so far of `user`, by second, over all nodes.
    pub fn user_tallies(&self, user: &str) -> BTreeMap<i64, Tally> {
        let tallies = self.tallies.lock();
        let of_user = |row: &BTreeMap<(String, usize), Tally>| {
            let mut sum = Tally::default();
            for t in row.iter().filter(|((u, _), _)| u == user).map(|(_, t)| t) {
                sum.offered += t.offered;
                sum.admitted += t.admitted;
                sum.rejected += t.rejected;
                sum.errors += t.errors;
                sum.bytes += t.bytes;
            }
            sum
        };
        tallies.iter().map(|(s, row)| (*s, of_user(row))).collect()
    }

    /// Sends requests for `duration`, then waits for the answers in flight.
    pub async fn run(&self, duration: Duration) {
        let client: Client<HttpConnector, Empty<Bytes>> = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(64)
            .build_http();
        let tick = Duration::from_millis(10);
        let end = tokio::time::Instant::now() + duration;
        let mut interval = tokio::time::interval(tick);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
        let mut owed: BTreeMap<usize, f64> = BTreeMap::new();
        let mut inflight = tokio::task::JoinSet::new();
        while tokio::time::Instant::now() < end {
            interval.tick().await;
            if self.quiet_now() {
                continue;
            }
            let flows = self.flows.lock().clone();
            for (i, flow) in flows.iter().enumerate() {
                let due = owed.entry(i).or_default();
                *due += flow.rate() * tick.as_secs_f64();
                while *due >= 1.0 {
                    *due -= 1.0;
                    inflight.spawn(self.clone().one(client.clone(), flow.clone()));
                }
            }
            while inflight.try_join_next().is_some() {}
        }
        while inflight.join_next().await.is_some() {}
    }

    async fn one(self, client: Client<HttpConnector, Empty<Bytes>>, flow: Arc<Flow>) {
        let second = unix_second();
        let Some(addr) = self.nodes.get(flow.node) else {
            return;
        };
        let uri = format!("http://{addr}{}", self.path);
        let req = http::Request::get(uri)
            .header("x-user", flow.user.as_str())
            .body(Empty::new());
        let outcome = match req {
            Ok(req) => match client.request(req).await {
                Ok(res) => {
                    let status = res.status();
                    // Read the body so the connection goes back to the pool.
                    let body = res.into_body().collect().await;
                    let len = body.map_or(0, |b| b.to_bytes().len() as u64);
                    Some((status, len))
                }
                Err(_) => None,
            },
            Err(_) => None,
        };
        let mut t = self.tallies.lock();
        let tally = t
            .entry(second)
            .or_default()
            .entry((flow.user.clone(), flow.node))
            .or_default();
        tally.offered += 1;
        match outcome {
            Some((s, len)) if s.is_success() => {
                tally.admitted += 1;
                tally.bytes += len;
            }
            Some((http::StatusCode::TOO_MANY_REQUESTS, _)) => tally.rejected += 1,
            _ => tally.errors += 1,
        }
    }
}
