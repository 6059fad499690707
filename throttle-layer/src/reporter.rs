//! The reporter: the node's one stream to the central node.
//!
//! A Tokio task that
//!
//! - holds one `Exchange` stream: `Hello`, then at every slot boundary +
//!   50 ms the report of the slot that just ended, written straight from the
//!   store ([`SlotStore::collect_encoded`]); with
//!   [`ReporterBuilder::report_spread`] each node of a fleet sends at its
//!   own moment of a window after that instead, so that the central node
//!   does not meet every report of the fleet at once;
//! - installs every `Quota` as soon as it arrives, answers and pushes alike,
//!   read where it arrived ([`SlotStore::apply_raw_quota`]); a quota that is
//!   not valid protobuf is logged, counted and ignored, and the stream goes
//!   on;
//! - knows several central endpoints: it sticks to the one that works,
//!   follows `NotLeader { leader }`, and otherwise tries the next, with
//!   exponential backoff and jitter (100 ms up to 5 s);
//! - keeps every report until the central node has answered it (the last 60
//!   slots at most) and sends them again, in order, after reconnecting, so a
//!   short outage loses no consumption. The central node ignores a report it
//!   has already filed.
//!
//! While no quota arrives for the current slot, each layer's
//! [`Fallback`](crate::Fallback) decides.
//!
//! Metrics: `throttle_reporter_connected` (gauge), `throttle_report_rtt_seconds`
//! (histogram), `throttle_reports_buffered` (gauge),
//! `throttle_reports_dropped_total`, `throttle_reporter_connect_failures_total`,
//! `throttle_quotas_malformed_total`.

use std::collections::VecDeque;
use std::time::Duration;

use bytes::Bytes;
use metrics::{counter, gauge, histogram};
use prost::Message;
use throttle_proto::auth::{Credentials, Signed};
use throttle_proto::v1;
use throttle_proto::wire::client::central_client::CentralClient;
use throttle_proto::wire::{Answer, Inbound, RawQuota};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Endpoint;

use crate::store::SlotStore;

/// Entry point: [`Reporter::builder`].
#[derive(Debug, Clone, Copy)]
pub struct Reporter;

/// Configures the reporter task.
#[derive(Debug)]
pub struct ReporterBuilder {
    store: SlotStore,
    node_id: String,
    endpoints: Vec<String>,
    report_delay: Duration,
    report_spread: Duration,
    max_buffered: usize,
    connect_timeout: Duration,
    backoff_min: Duration,
    backoff_max: Duration,
    max_message_bytes: usize,
    credentials: Option<Credentials>,
}

/// Why the reporter could not start.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReporterError {
    /// No central endpoint was given.
    #[error("no central endpoint: call .central(\"http://host:7075\")")]
    NoEndpoint,
    /// An endpoint is not a valid URI.
    #[error("invalid central endpoint {0:?}")]
    InvalidEndpoint(String),
    /// The node id is empty or longer than 256 bytes.
    #[error("node id must be 1 to 256 bytes")]
    InvalidNodeId,
    /// The report delay and spread reach mid-slot, when the central node
    /// assigns the quotas: a report sent then may miss the assign.
    #[error(
        "report delay {delay:?} + spread {spread:?} must end before mid-slot ({half_slot:?}), when the central node assigns"
    )]
    ReportsPastMidSlot {
        /// [`ReporterBuilder::report_delay`].
        delay: Duration,
        /// [`ReporterBuilder::report_spread`].
        spread: Duration,
        /// Half the store's slot length.
        half_slot: Duration,
    },
}

/// What the reporter is doing, for health checks and tests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReporterStatus {
    /// A stream to a central node is open.
    pub connected: bool,
    /// The endpoint in use or being tried.
    pub endpoint: String,
    /// Reports not yet answered by a central node.
    pub buffered: usize,
    /// Reports sent (including re-sent ones).
    pub reports_sent: u64,
    /// Quota messages received.
    pub quotas_received: u64,
    /// Times a stream was opened.
    pub connections: u64,
}

/// The running reporter; dropping it stops the task.
#[derive(Debug)]
pub struct ReporterHandle {
    task: JoinHandle<()>,
    status: watch::Receiver<ReporterStatus>,
}

impl ReporterHandle {
    /// The current status.
    pub fn status(&self) -> ReporterStatus {
        self.status.borrow().clone()
    }

    /// Waits until `f` holds for the status.
    pub async fn wait_for(&self, f: impl FnMut(&ReporterStatus) -> bool) {
        let mut rx = self.status.clone();
        let _ = rx.wait_for(f).await;
    }

    /// Stops the task (what is buffered is lost).
    pub fn shutdown(self) {
        self.task.abort();
    }
}

impl Drop for ReporterHandle {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Reporter {
    /// A reporter for `store`, identifying itself as `node_id`.
    ///
    /// Its Hello names the store's services, and the central node pushes a
    /// new node the current slot's quotas for those at once. A service
    /// registered later (a layer built after the reporter was spawned) is
    /// announced by opening a new stream, at least 200 ms after the last
    /// one opened; until its quotas arrive it fails open, or as its fallback
    /// says. Building the layers first avoids that moment.
    pub fn builder(store: &SlotStore, node_id: &str) -> ReporterBuilder {
        ReporterBuilder {
            store: store.clone(),
            node_id: node_id.to_owned(),
            endpoints: Vec::new(),
            report_delay: Duration::from_millis(50),
            report_spread: Duration::ZERO,
            max_buffered: 60,
            connect_timeout: Duration::from_secs(1),
            backoff_min: Duration::from_millis(100),
            backoff_max: Duration::from_secs(5),
            max_message_bytes: 64 << 20,
            credentials: None,
        }
    }
}

impl ReporterBuilder {
    /// Adds a central endpoint, e.g. `http://127.0.0.1:7075`; the first one
    /// is tried first.
    pub fn central(mut self, endpoint: impl Into<String>) -> Self {
        self.endpoints.push(endpoint.into());
        self
    }

    /// How long after a slot boundary the report is sent (default 50 ms).
    pub fn report_delay(mut self, delay: Duration) -> Self {
        self.report_delay = delay;
        self
    }

    /// Spreads a fleet's reports over `spread` after the report delay
    /// (default 0: every node reports at the same moment, as the original
    /// node did). The node sends each report at its own fixed point of the
    /// window, taken from its node id, so its reports stay one slot apart,
    /// and a fleet's nodes fall evenly over the window.
    ///
    /// The central node then meets the fleet's reports one after another
    /// instead of all at once. Its answers are ready before the reports
    /// arrive, so a report's round trip is then its own transfer and check,
    /// not a queue behind the whole fleet's: on loopback, 1,000 nodes of 100
    /// users each had a p99 round trip of 54 ms reporting together and
    /// 1.4 ms spread over 300 ms (`docs/performance.md`). The delay and the
    /// spread must end before mid-slot, when the central node assigns.
    ///
    /// The price: the central node re-assigns the current slot once every
    /// node has reported, so spread, a load that moves between nodes is
    /// followed up to a slot later (3 slots against 2 in the simulator's
    /// scenario 11, `docs/accuracy.md`).
    pub fn report_spread(mut self, spread: Duration) -> Self {
        self.report_spread = spread;
        self
    }

    /// When after each slot boundary this node sends its report
    /// ([`report_point`] of its id, delay and spread).
    pub fn report_at(&self) -> Duration {
        report_point(&self.node_id, self.report_delay, self.report_spread)
    }

    /// Most unanswered reports kept (default 60); older ones are dropped.
    pub fn max_buffered(mut self, max: usize) -> Self {
        self.max_buffered = max.max(1);
        self
    }

    /// Connect timeout per attempt (default 1 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Largest message accepted from the central node, in bytes (default
    /// 64 MiB; tonic's own default, 4 MiB, is one slot's table for about
    /// 35,000 users of four resources). An answer over it fails the
    /// stream, which reconnects.
    pub fn max_message_bytes(mut self, max: usize) -> Self {
        self.max_message_bytes = max;
        self
    }

    /// Signs every stream with this access key and secret (see
    /// [`throttle_proto::auth`]), for a central that requires node keys.
    pub fn credentials(
        mut self,
        access_key: impl Into<String>,
        secret_key: impl Into<String>,
    ) -> Self {
        self.credentials = Some(Credentials::new(access_key, secret_key));
        self
    }

    /// Backoff bounds between attempts (default 100 ms to 5 s).
    pub fn backoff(mut self, min: Duration, max: Duration) -> Self {
        self.backoff_min = min;
        self.backoff_max = max.max(min);
        self
    }

    /// Starts the task. Must be called within a Tokio runtime.
    ///
    /// # Errors
    ///
    /// [`ReporterError`] for a missing or invalid endpoint or node id.
    pub fn spawn(self) -> Result<ReporterHandle, ReporterError> {
        if self.endpoints.is_empty() {
            return Err(ReporterError::NoEndpoint);
        }
        if self.node_id.is_empty() || self.node_id.len() > throttle_proto::MAX_NAME_LEN {
            return Err(ReporterError::InvalidNodeId);
        }
        for e in &self.endpoints {
            Endpoint::from_shared(e.clone())
                .map_err(|_| ReporterError::InvalidEndpoint(e.clone()))?;
        }
        let half_slot = self.store.slot_length().as_duration() / 2;
        if self.report_delay.saturating_add(self.report_spread) >= half_slot {
            return Err(ReporterError::ReportsPastMidSlot {
                delay: self.report_delay,
                spread: self.report_spread,
                half_slot,
            });
        }
        let report_after = self.report_at();
        tracing::debug!(node = %self.node_id, after_boundary = ?report_after, "reports scheduled");
        let (status_tx, status) = watch::channel(ReporterStatus {
            endpoint: self.endpoints[0].clone(),
            ..ReporterStatus::default()
        });
        let last_collected = self.store.current_slot() - 1;
        let run = Run {
            next_tick: Instant::now(),
            report_after,
            cfg: self,
            current: 0,
            pending: VecDeque::new(),
            last_collected,
            announced: 0,
            packed_reports: false,
            status: status_tx,
        };
        let mut run = run;
        run.schedule();
        Ok(ReporterHandle {
            task: tokio::spawn(run.run()),
            status,
        })
    }
}

/// A report kept until its answer: encoded once, sent (and sent again
/// after a reconnection) as the same bytes.
struct Pending {
    slot: i64,
    report: Bytes,
    /// Written as packed usages.
    packed: bool,
    sent: Option<Instant>,
}

struct Run {
    cfg: ReporterBuilder,
    current: usize,
    pending: VecDeque<Pending>,
    last_collected: i64,
    next_tick: Instant,
    /// When after a slot boundary this node reports: the delay and its
    /// place in the spread.
    report_after: Duration,
    /// Services named in the last Hello.
    announced: usize,
    /// The last central node reached reads packed reports: reports are
    /// written packed for it (and rewritten should the next one not).
    packed_reports: bool,
    status: watch::Sender<ReporterStatus>,
}

/// The shortest life of a stream closed to announce a new service: an app
/// that registers services one after another reconnects at most five times
/// a second.
const ANNOUNCE_AFTER: Duration = Duration::from_millis(200);

/// When after each slot boundary the node `node_id` reports, given the
/// report delay and spread ([`ReporterBuilder::report_spread`]): the delay
/// plus the node's point of the spread. For simulators and harnesses that
/// place nodes as the reporter does.
pub fn report_point(node_id: &str, delay: Duration, spread: Duration) -> Duration {
    delay.saturating_add(spread_offset(node_id, spread))
}

/// Where in a report spread of `spread` the node `node_id` reports: a fixed
/// point of `[0, spread)`, the same at every slot and in every process
/// with this id, and spread evenly over a fleet's ids.
fn spread_offset(node_id: &str, spread: Duration) -> Duration {
    use std::hash::BuildHasher;
    let Ok(nanos @ 1..) = u64::try_from(spread.as_nanos()) else {
        return Duration::ZERO;
    };
    // A fixed seed: the same id gives the same point after a restart. (The
    // offset only spreads load, so a foldhash release that changed it would
    // move nodes within the window, nothing more.)
    let hash = foldhash::fast::FixedState::with_seed(0x7468_726f_7474_6c65).hash_one(node_id);
    Duration::from_nanos(hash % nanos)
}

/// Sleeps until `at`, or forever without one.
async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Why a stream ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ended {
    /// Closed, refused, redirected or stuck: reconnect after a backoff.
    Lost,
    /// A service was registered since the Hello: reconnect at once.
    Announce,
}

enum Opened {
    /// A stream, and whether its central reads packed reports.
    Stream(mpsc::Sender<Inbound>, Box<tonic::Streaming<Answer>>, bool),
    Redirect(String),
}

#[derive(Debug, thiserror::Error)]
enum OpenError {
    #[error("connect: {0}")]
    Connect(#[from] tonic::transport::Error),
    #[error("central refused the stream: {0}")]
    Status(#[from] tonic::Status),
    #[error("no Welcome from the central node")]
    NoWelcome,
    #[error("credentials cannot go in gRPC metadata (not visible ASCII)")]
    Credentials,
}

/// Puts `signed` in a stream's request metadata.
fn sign(metadata: &mut tonic::metadata::MetadataMap, signed: &Signed) -> Result<(), OpenError> {
    for (key, value) in signed.entries() {
        let value = value.parse().map_err(|_| OpenError::Credentials)?;
        metadata.insert(key, value);
    }
    Ok(())
}

async fn open(
    endpoint: String,
    timeout: Duration,
    queue: usize,
    max_message_bytes: usize,
    hello: Inbound,
    signed: Option<Signed>,
) -> Result<Opened, OpenError> {
    let channel = Endpoint::from_shared(endpoint)
        .map_err(OpenError::Connect)?
        .connect_timeout(timeout)
        .tcp_nodelay(true)
        .connect()
        .await?;
    let mut client = CentralClient::new(channel).max_decoding_message_size(max_message_bytes);
    let (tx, rx) = mpsc::channel(queue);
    let _ = tx.try_send(hello);

    let mut request = tonic::Request::new(ReceiverStream::new(rx));
    if let Some(signed) = signed {
        sign(request.metadata_mut(), &signed)?;
    }
    let mut inbound = client.exchange(request).await?.into_inner();
    let first = tokio::time::timeout(Duration::from_secs(5), inbound.message())
        .await
        .map_err(|_| OpenError::NoWelcome)??;
    match first {
        Some(Answer::Welcome(w)) => {
            let packed = w
                .accepts
                .iter()
                .any(|a| a == throttle_proto::PACKED_REPORTS);
            Ok(Opened::Stream(tx, Box::new(inbound), packed))
        }
        Some(Answer::NotLeader(nl)) => Ok(Opened::Redirect(nl.leader)),
        _ => Err(OpenError::NoWelcome),
    }
}

impl Run {
    fn endpoint(&self) -> &str {
        &self.cfg.endpoints[self.current]
    }

    /// Sets the next report time: the next slot boundary plus the delay
    /// and this node's place in the spread.
    fn schedule(&mut self) {
        let slot = self.cfg.store.slot_length();
        let until = slot.until_next(self.cfg.store.clock().now_ms());
        self.next_tick = Instant::now() + until + self.report_after;
    }

    fn publish(&self, f: impl FnOnce(&mut ReporterStatus)) {
        self.status.send_modify(|s| {
            f(s);
            s.buffered = self.pending.len();
        });
        gauge!("throttle_reports_buffered").set(self.pending.len() as f64);
    }

    /// Collects finished slots into reports and sends them if connected.
    fn tick(&mut self, tx: Option<&mpsc::Sender<Inbound>>) -> bool {
        self.schedule();
        let finished = self.cfg.store.current_slot() - 1;
        if finished <= self.last_collected {
            return true;
        }
        self.last_collected = finished;
        let packed = self.packed_reports;
        let report = self
            .cfg
            .store
            .collect_encoded_as(finished, &self.cfg.node_id, packed);
        let slot = finished + 1;
        let mut ok = true;
        let sent = match tx {
            Some(tx) => {
                ok = tx.try_send(Inbound::Report(report.clone())).is_ok();
                ok.then(Instant::now)
            }
            None => None,
        };
        self.pending.push_back(Pending {
            slot,
            report,
            packed,
            sent,
        });
        while self.pending.len() > self.cfg.max_buffered {
            if let Some(p) = self.pending.pop_front() {
                counter!("throttle_reports_dropped_total").increment(1);
                tracing::warn!(slot = p.slot, "report buffer full; oldest report dropped");
            }
        }
        self.publish(|s| s.reports_sent += u64::from(sent.is_some()));
        ok
    }

    /// Opens a stream; owns its inputs so ticks can run while it connects.
    fn open(
        &mut self,
        endpoint: String,
    ) -> impl Future<Output = Result<Opened, OpenError>> + use<> {
        let timeout = self.cfg.connect_timeout;
        let queue = self.cfg.max_buffered + 8;
        let services = self.cfg.store.service_names();
        self.announced = services.len();
        let hello = Inbound::Hello(v1::Hello {
            node_id: self.cfg.node_id.clone(),
            slot_ms: self.cfg.store.slot_length().as_ms(),
            services,
            version: throttle_proto::VERSION.to_owned(),
            // Packed: a third of the bytes. Refs: an answer that repeats
            // the push before it names that push rather than sending it
            // again. A central that knows neither sends the original form.
            accepts: vec![
                throttle_proto::PACKED_QUOTAS.to_owned(),
                throttle_proto::QUOTA_REFS.to_owned(),
            ],
        });
        let now = self.cfg.store.clock().now_ms();
        let signed = self
            .cfg
            .credentials
            .as_ref()
            .map(|c| c.sign(&self.cfg.node_id, now));
        open(
            endpoint,
            timeout,
            queue,
            self.cfg.max_message_bytes,
            hello,
            signed,
        )
    }
    fn follow(&mut self, leader: String) {
        if leader.is_empty() {
            self.current = (self.current + 1) % self.cfg.endpoints.len();
            return;
        }
        tracing::info!(from = self.endpoint(), to = %leader, "following the leader");
        self.current = match self.cfg.endpoints.iter().position(|e| *e == leader) {
            Some(i) => i,
            None => {
                self.cfg.endpoints.push(leader);
                self.cfg.endpoints.len() - 1
            }
        };
    }

    async fn sleep_ticking(&mut self, d: Duration) {
        let until = Instant::now() + d;
        loop {
            tokio::select! {
                _ = tokio::time::sleep_until(until) => return,
                _ = tokio::time::sleep_until(self.next_tick) => { self.tick(None); }
            }
        }
    }

    async fn run(mut self) {
        let mut backoff = self.cfg.backoff_min;
        loop {
            let endpoint = self.endpoint().to_owned();
            self.publish(|s| s.endpoint.clone_from(&endpoint));
            let attempt = self.open(endpoint.clone());
            tokio::pin!(attempt);
            let opened = loop {
                tokio::select! {
                    r = &mut attempt => break r,
                    _ = tokio::time::sleep_until(self.next_tick) => { self.tick(None); }
                }
            };
            match opened {
                Ok(Opened::Stream(tx, inbound, packed_reports)) => {
                    backoff = self.cfg.backoff_min;
                    self.packed_reports = packed_reports;
                    if self.connected(&endpoint, tx, inbound).await == Ended::Announce {
                        // A new stream at once: its Hello names the new
                        // service, and the central pushes its quotas.
                        continue;
                    }
                }
                Ok(Opened::Redirect(leader)) => self.follow(leader),
                Err(e) => {
                    counter!("throttle_reporter_connect_failures_total").increment(1);
                    tracing::warn!(endpoint = %endpoint, error = %e, "cannot reach central node");
                    self.current = (self.current + 1) % self.cfg.endpoints.len();
                }
            }
            // Full jitter over [backoff/2, backoff].
            let jittered = backoff.mul_f64(0.5 + rand::random::<f64>() * 0.5);
            self.sleep_ticking(jittered).await;
            backoff = (backoff * 2).min(self.cfg.backoff_max);
        }
    }

    /// Serves one stream until it ends; says why it ended.
    async fn connected(
        &mut self,
        endpoint: &str,
        tx: mpsc::Sender<Inbound>,
        mut inbound: Box<tonic::Streaming<Answer>>,
    ) -> Ended {
        tracing::info!(
            endpoint,
            buffered = self.pending.len(),
            "connected to central node"
        );
        gauge!("throttle_reporter_connected").set(1.0);
        self.replay(&tx);
        let opened = Instant::now();
        // A layer built after the Hello: only a new Hello tells the central
        // node, which then sends its quotas at once instead of after the
        // next report. The store says when a service is registered; polling
        // for it instead woke the app's runtime 50 times a second, which on
        // a runtime of two workers put some 0.13 ms on its requests' p99
        // (`http-bench --server-threads 2`).
        let mut registered = self.cfg.store.watch_services();
        let mut watching = true;
        let mut announce_at = None;
        let mut ended = Ended::Lost;
        loop {
            // The watch's value is the number of services.
            if announce_at.is_none() && *registered.borrow_and_update() > self.announced {
                announce_at = Some(opened + ANNOUNCE_AFTER);
            }
            tokio::select! {
                msg = inbound.message() => match msg {
                    Ok(Some(Answer::Quota(q))) => self.quota(q),
                    Ok(Some(Answer::NotLeader(nl))) => {
                        self.follow(nl.leader);
                        break;
                    }
                    Ok(Some(_)) => {}
                    Ok(None) => {
                        tracing::warn!(endpoint, "central node closed the stream");
                        break;
                    }
                    Err(status) => {
                        self.refused(endpoint, &status);
                        break;
                    }
                },
                _ = tokio::time::sleep_until(self.next_tick) => {
                    if !self.tick(Some(&tx)) {
                        tracing::warn!(endpoint, "stream is not draining; reconnecting");
                        break;
                    }
                }
                changed = registered.changed(), if watching => {
                    // The loop's head reads the new count; a closed
                    // channel (the store gone) has nothing more to say.
                    watching = changed.is_ok();
                }
                _ = sleep_until_some(announce_at) => {
                    tracing::info!(endpoint, "service registered; reconnecting to announce it");
                    ended = Ended::Announce;
                    break;
                }
            }
        }
        gauge!("throttle_reporter_connected").set(0.0);
        self.publish(|s| s.connected = false);
        ended
    }

    /// Sends the reports kept from before the stream opened, in order, as
    /// many as the stream's queue takes (the others stay kept).
    fn replay(&mut self, tx: &mpsc::Sender<Inbound>) {
        if !self.packed_reports {
            self.unpack_pending();
        }
        let now = Instant::now();
        let mut replayed = 0;
        for p in &mut self.pending {
            if tx.try_send(Inbound::Report(p.report.clone())).is_err() {
                break;
            }
            p.sent = Some(now);
            replayed += 1;
        }
        self.publish(|s| {
            s.connected = true;
            s.connections += 1;
            s.reports_sent += replayed;
        });
    }

    /// Rewrites the reports written packed for an earlier central node as
    /// the original maps, for one that does not read packed reports.
    fn unpack_pending(&mut self) {
        self.pending.retain_mut(|p| {
            if !p.packed {
                return true;
            }
            match throttle_proto::wire::unpacked_report(&p.report) {
                Ok(report) => {
                    p.report = report;
                    p.packed = false;
                    true
                }
                // Only a report this node did not encode could fail here.
                Err(e) => {
                    counter!("throttle_reports_dropped_total").increment(1);
                    tracing::error!(slot = p.slot, error = %e, "buffered report unreadable; dropped");
                    false
                }
            }
        });
    }

    fn quota(&mut self, bytes: Bytes) {
        let report_slot = match RawQuota::parse(&bytes) {
            Ok(quota) => {
                self.cfg.store.apply_raw_quota(&quota);
                quota.report_slot()
            }
            // Valid, but not to be read in place: as prost reads it.
            Err(throttle_proto::wire::RawQuotaError::Repeated) => {
                let quota = v1::Quota::decode(bytes).map_err(|e| e.to_string());
                let unpacked =
                    quota.and_then(|mut q| q.unpack().map(|()| q).map_err(|e| e.to_string()));
                match unpacked {
                    Ok(quota) => {
                        self.cfg.store.apply_quota(&quota);
                        quota.report_slot
                    }
                    Err(e) => return self.malformed(&e),
                }
            }
            Err(e) => return self.malformed(&e.to_string()),
        };
        if let Some(slot) = report_slot
            && let Some(i) = self.pending.iter().position(|p| p.slot == slot)
            && let Some(p) = self.pending.remove(i)
            && let Some(sent) = p.sent
        {
            histogram!("throttle_report_rtt_seconds").record(sent.elapsed().as_secs_f64());
        }
        self.publish(|s| s.quotas_received += 1);
    }

    /// A quota that is not one: nothing of it is installed, and the
    /// stream goes on (the next answer may be whole).
    fn malformed(&mut self, error: &str) {
        counter!("throttle_quotas_malformed_total").increment(1);
        tracing::error!(error, "malformed quota from the central node; ignored");
    }

    fn refused(&mut self, endpoint: &str, status: &tonic::Status) {
        // A report the central could not read, or larger than it accepts
        // (tonic's code for a message over the receiver's size limit).
        if matches!(
            status.code(),
            tonic::Code::InvalidArgument | tonic::Code::OutOfRange
        ) {
            // Answers come in order, so the refused report is the oldest one
            // sent and not answered; sending it again would be refused again.
            if let Some(i) = self.pending.iter().position(|p| p.sent.is_some())
                && let Some(p) = self.pending.remove(i)
            {
                counter!("throttle_reports_dropped_total").increment(1);
                tracing::error!(endpoint, slot = p.slot, error = %status.message(), "central node refused a report; dropped");
            }
        } else {
            tracing::warn!(endpoint, code = ?status.code(), error = %status.message(), "stream to central node failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_reports_at_a_fixed_point_of_the_spread() {
        let spread = Duration::from_millis(300);
        assert_eq!(spread_offset("node-a", Duration::ZERO), Duration::ZERO);
        let a = spread_offset("node-a", spread);
        assert!(a < spread);
        assert_eq!(a, spread_offset("node-a", spread), "the same at every slot");
        assert_ne!(a, spread_offset("node-b", spread));
        let one_ns = Duration::from_nanos(1);
        assert_eq!(spread_offset("node-a", one_ns), Duration::ZERO);
    }

    #[test]
    fn a_fleet_falls_evenly_over_the_spread() {
        let spread = Duration::from_millis(300);
        let mut tenths = [0u32; 10];
        for n in 0..1000 {
            let at = spread_offset(&format!("node-{n}"), spread);
            tenths[(at.as_nanos() * 10 / spread.as_nanos()) as usize] += 1;
        }
        // 100 expected in each; binomial spread about 9.5.
        assert!(
            tenths.iter().all(|&t| (60..=140).contains(&t)),
            "{tenths:?}"
        );
    }
}
