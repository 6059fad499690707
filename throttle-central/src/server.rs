//! The async shell around the [`Ledger`]: gRPC streams, the assigner timer
//! and the HTTP monitor.
//!
//! One task owns the ledger and receives commands on a channel; stream tasks
//! and timers only move data to and from it, so no stream ever waits on a
//! lock held by another. Each node stream is a task of its own: a node that
//! sends garbage loses its stream, nobody else notices.
//!
//! # Examples
//!
//! ```no_run
//! use throttle_central::server::Central;
//! # async fn run() -> std::io::Result<()> {
//! let grpc = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! let http = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! let central = Central::builder().spawn(grpc, Some(http))?;
//! println!("nodes connect to http://{}", central.grpc_addr());
//! central.shutdown().await;
//! # Ok(()) }
//! ```

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use metrics::{counter, gauge};
use prost::Message as _;
use serde_json::{Value, json};
use throttle_proto::slot::{Clock, SlotLength, SystemClock};
use throttle_proto::v1::{self, central_message};
use throttle_proto::wire::server::central_server::{Central as CentralRpc, CentralServer};
use throttle_proto::wire::{Inbound, Outbound, RawReport, RawReportError};
use throttle_proto::{MAX_NAME_LEN, PACKED_REPORTS};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status, Streaming};

use crate::assigner::{Accepts, Assigner, Encoded, Filed, Push};
use crate::leadership::{AlwaysLeader, Leadership};
use crate::ledger::{
    FromNode, Ledger, LedgerConfig, NodeId, PolicyFactory, ReportError, ReportSource, SlotRange,
};
use crate::limits::{FileLimits, LimitSet, LimitSource};

/// How long a new stream may take to send its Hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// Messages queued per node stream before pushes are dropped.
const STREAM_QUEUE: usize = 32;

/// A stream's queue of messages to its node. Quotas are queued already
/// encoded ([`Encoded`]): a push to many nodes builds no message at all.
type Outgoing = mpsc::Sender<Result<Outbound, Status>>;

/// Settings and collaborators of a central node; see [`Central::builder`].
pub struct CentralBuilder {
    ledger: LedgerConfig,
    max_message_bytes: usize,
    limits: Arc<dyn LimitSource>,
    reload: Option<Arc<FileLimits>>,
    leadership: Arc<dyn Leadership>,
    clock: Arc<dyn Clock>,
    policies: Option<PolicyFactory>,
    metrics: Option<metrics_exporter_prometheus::PrometheusHandle>,
}

impl std::fmt::Debug for CentralBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CentralBuilder")
            .field("ledger", &self.ledger)
            .field("max_message_bytes", &self.max_message_bytes)
            .field("limits", &self.limits)
            .field("leadership", &self.leadership)
            .finish_non_exhaustive()
    }
}

/// Entry point: builds and spawns a central node.
#[derive(Debug, Clone, Copy)]
pub struct Central;

impl Central {
    /// A builder with the defaults: 1 s slots, 60 slots of history, no
    /// limits, always leader, the system clock, the
    /// [`Projected`](crate::policy::Projected) policy.
    pub fn builder() -> CentralBuilder {
        CentralBuilder {
            ledger: LedgerConfig::default(),
            max_message_bytes: 64 * 1024 * 1024,
            limits: Arc::new(LimitSet::new()),
            reload: None,
            leadership: Arc::new(AlwaysLeader),
            clock: Arc::new(SystemClock),
            policies: None,
            metrics: None,
        }
    }
}

impl CentralBuilder {
    /// Slot length; nodes must use the same.
    pub fn slot(mut self, slot: SlotLength) -> Self {
        self.ledger.slot = slot;
        self
    }

    /// Slots of history kept (the original's `nr_slot`).
    pub fn nr_slot(mut self, nr_slot: u32) -> Self {
        self.ledger.nr_slot = nr_slot.max(1);
        self
    }

    /// Most users one report may carry.
    pub fn max_users_per_report(mut self, max: usize) -> Self {
        self.ledger.max_users_per_report = max;
        self
    }

    /// Largest message accepted from a node, in bytes (default 64 MiB, as
    /// a node accepts from the central: a report of about 750,000 users of
    /// four resources). A node drops a report refused as too large, logs
    /// and counts it, and goes on.
    pub fn max_message_bytes(mut self, max: usize) -> Self {
        self.max_message_bytes = max;
        self
    }

    /// Where limits come from; read again every slot.
    pub fn limits(mut self, source: Arc<dyn LimitSource>) -> Self {
        self.limits = source;
        self
    }

    /// Limits from a file, checked for changes every quarter slot (at most
    /// every 250 ms); a change is assigned and pushed at once.
    pub fn limits_file(mut self, file: Arc<FileLimits>) -> Self {
        self.limits = file.clone();
        self.reload = Some(file);
        self
    }

    /// Who is leader.
    pub fn leadership(mut self, leadership: Arc<dyn Leadership>) -> Self {
        self.leadership = leadership;
        self
    }

    /// The clock slots are read from.
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// The policy of each service, by name.
    pub fn policies(mut self, factory: PolicyFactory) -> Self {
        self.policies = Some(factory);
        self
    }

    /// Serves `GET /metrics` from this Prometheus recorder.
    pub fn metrics(mut self, handle: metrics_exporter_prometheus::PrometheusHandle) -> Self {
        self.metrics = Some(handle);
        self
    }

    /// Starts serving node streams on `grpc` and, if given, the monitor API
    /// on `http`. Must be called within a Tokio runtime.
    ///
    /// # Errors
    ///
    /// When the listeners' addresses cannot be read.
    pub fn spawn(
        self,
        grpc: TcpListener,
        http: Option<TcpListener>,
    ) -> std::io::Result<RunningCentral> {
        let grpc_addr = grpc.local_addr()?;
        let http_addr = http.as_ref().map(TcpListener::local_addr).transpose()?;
        let slot = self.ledger.slot;
        let config = self.ledger.clone();
        let ledger = match self.policies {
            Some(f) => Ledger::with_policies(self.ledger, f),
            None => Ledger::new(self.ledger),
        };
        let (commands, rx) = mpsc::channel(4096);
        let (stop_tx, stop_rx) = watch::channel(false);
        let actor = Actor {
            assigner: Assigner::new(ledger, self.limits.clone()),
            me: commands.clone(),
            clock: self.clock.clone(),
            conns: BTreeMap::new(),
            next_conn: 0,
            started: Instant::now(),
        };
        let mut tasks = vec![spawn_ledger(actor.run(rx, stop_rx.clone()))?];
        tasks.push(tokio::spawn(assigner(
            commands.clone(),
            self.clock.clone(),
            slot,
            stop_rx.clone(),
        )));
        if let Some(file) = self.reload {
            tasks.push(tokio::spawn(reloader(
                commands.clone(),
                file,
                slot,
                stop_rx.clone(),
            )));
        }
        let service = CentralService {
            commands: commands.clone(),
            leadership: self.leadership.clone(),
            slot,
            config,
            clock: self.clock.clone(),
        };
        // Answers are small writes right after a large read: without
        // TCP_NODELAY, Nagle's algorithm holds them until the node's delayed
        // ACK (milliseconds on loopback, 40 ms across hosts). Tonic applies
        // its own `tcp_nodelay` only to sockets it binds itself.
        let incoming = TcpIncoming::from(grpc).with_nodelay(Some(true));
        let server = tonic::transport::Server::builder()
            .add_service(
                CentralServer::new(service).max_decoding_message_size(self.max_message_bytes),
            )
            .serve_with_incoming_shutdown(incoming, stopped(stop_rx.clone()));
        tasks.push(tokio::spawn(async move {
            if let Err(e) = server.await {
                tracing::error!(error = %e, "gRPC server failed");
            }
        }));
        tracing::info!(%grpc_addr, slot_ms = slot.as_ms(), "central node listening for nodes");
        if let Some(http) = http {
            let state = crate::http::HttpState {
                commands: commands.clone(),
                limits: self.limits,
                leadership: self.leadership,
                metrics: self.metrics,
            };
            let router = crate::http::router(state);
            let stop = stopped(stop_rx);
            tracing::info!(http_addr = ?http_addr, "monitor API listening");
            tasks.push(tokio::spawn(async move {
                if let Err(e) = axum::serve(http, router).with_graceful_shutdown(stop).await {
                    tracing::error!(error = %e, "HTTP server failed");
                }
            }));
        }
        Ok(RunningCentral {
            grpc_addr,
            http_addr,
            commands,
            stop: stop_tx,
            tasks,
        })
    }
}

/// The name of the ledger's thread.
pub const LEDGER_THREAD: &str = "throttle-ledger";

/// Runs the ledger's task (`run`) on a thread of its own; the handle ends
/// with it. It returns once the stop is sent or its sender dropped, so a
/// [killed](RunningCentral::kill) or dropped central's ledger stops too.
///
/// Filing, assigning and rendering quotas are CPU work in long runs (a
/// burst of 1,000 reports is tens of milliseconds of it). On a runtime
/// worker they would hold up the streams' reads and answers queued behind
/// them; on their own thread the operating system shares the cores between
/// the two, and the streams answer while the ledger files.
fn spawn_ledger(run: impl Future<Output = ()> + Send + 'static) -> std::io::Result<JoinHandle<()>> {
    let runtime = tokio::runtime::Builder::new_current_thread().build()?;
    let (done, finished) = oneshot::channel::<()>();
    std::thread::Builder::new()
        .name(LEDGER_THREAD.into())
        .spawn(move || {
            runtime.block_on(run);
            drop(done);
        })?;
    Ok(tokio::spawn(async move {
        let _ = finished.await;
    }))
}

async fn stopped(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|s| *s).await;
}

/// A central node serving in the background.
#[derive(Debug)]
pub struct RunningCentral {
    grpc_addr: SocketAddr,
    http_addr: Option<SocketAddr>,
    commands: mpsc::Sender<Command>,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl RunningCentral {
    /// Where nodes connect.
    pub fn grpc_addr(&self) -> SocketAddr {
        self.grpc_addr
    }

    /// Where the monitor API listens, if it does.
    pub fn http_addr(&self) -> Option<SocketAddr> {
        self.http_addr
    }

    /// Asks the ledger a monitor question (see [`Subject`]).
    pub async fn monitor(&self, subject: Subject, range: SlotRange) -> Option<Value> {
        monitor(&self.commands, subject, range).await
    }

    /// Closes every node stream with `UNAVAILABLE`, stops the servers and
    /// waits up to 2 s for them, then ends whatever is left.
    pub async fn shutdown(self) {
        self.shutdown_with(None).await;
    }

    /// As [`RunningCentral::shutdown`], and answers `subject` as the ledger
    /// stood when the streams closed: reports not in that answer were not
    /// acknowledged, so nodes still hold them and will send them again.
    pub async fn shutdown_with_snapshot(self, subject: Subject) -> Option<Value> {
        let (reply, rx) = oneshot::channel();
        self.shutdown_with(Some((subject, reply))).await;
        rx.await.ok()
    }

    async fn shutdown_with(self, snapshot: Option<Snapshot>) {
        let _ = self.commands.send(Command::CloseAll { snapshot }).await;
        let _ = self.stop.send(true);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
        for mut task in self.tasks {
            if tokio::time::timeout_at(deadline, &mut task).await.is_err() {
                task.abort();
            }
        }
    }

    /// Stops at once, as a crash would: connections drop without a word.
    pub fn kill(self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// What the monitor API can be asked about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subject {
    /// Connected node streams.
    Connections,
    /// Which nodes reported each slot.
    Reported,
    /// Summed consumption per slot.
    ConsumptionSum,
    /// Summed rejections per slot.
    RejectionSum,
    /// Latest entry per node and the bucket, per key.
    Distribution,
    /// Assigned quotas per slot and node.
    Quota,
}

impl std::str::FromStr for Subject {
    type Err = ();

    fn from_str(s: &str) -> Result<Self, ()> {
        Ok(match s {
            "connections" => Self::Connections,
            "reported" => Self::Reported,
            "consumption_sum" => Self::ConsumptionSum,
            "rejection_sum" => Self::RejectionSum,
            "distribution" => Self::Distribution,
            "quota" => Self::Quota,
            _ => return Err(()),
        })
    }
}

pub(crate) async fn monitor(
    commands: &mpsc::Sender<Command>,
    subject: Subject,
    range: SlotRange,
) -> Option<Value> {
    let (reply, rx) = oneshot::channel();
    commands
        .send(Command::Monitor {
            subject,
            range,
            reply,
        })
        .await
        .ok()?;
    rx.await.ok()
}

#[derive(Debug)]
pub(crate) enum Command {
    Connect {
        hello: v1::Hello,
        addr: Option<SocketAddr>,
        tx: Outgoing,
        ahead: Arc<AnswerAhead>,
        reply: oneshot::Sender<u64>,
    },
    Disconnect {
        conn: u64,
    },
    Report {
        conn: u64,
        report: Received,
        /// `Ok` once the report is filed and, unless the stream answered
        /// it, its answer queued; the report comes back, to be freed on the
        /// stream's task rather than the ledger's.
        reply: oneshot::Sender<(Result<(), Status>, Received)>,
        /// The stream answered the report ahead of filing (see
        /// [`AnswerAhead`]): the ledger files it and answers nothing.
        answered: bool,
    },
    Tick,
    Reassign {
        service: String,
    },
    Monitor {
        subject: Subject,
        range: SlotRange,
        reply: oneshot::Sender<Value>,
    },
    CloseAll {
        snapshot: Option<Snapshot>,
    },
}

/// A monitor question to answer as the ledger stands when it closes.
pub(crate) type Snapshot = (Subject, oneshot::Sender<Value>);

#[derive(Debug)]
struct Conn {
    node_id: String,
    node: NodeId,
    /// The forms its Hello accepts.
    accepts: Accepts,
    addr: Option<SocketAddr>,
    since: Instant,
    reports: u64,
    /// Reports of this stream answered ahead of filing ([`AnswerAhead`]).
    answered_ahead: u64,
    tx: Outgoing,
    ahead: Arc<AnswerAhead>,
}

/// A stream's answer to its node's next report, rendered ahead by the
/// ledger task, so that the stream answers a report as soon as it has read
/// it, rather than after the ledger has filed every report queued before
/// it: at each slot boundary every node reports at once, and the ledger is
/// one task.
///
/// At each mid-slot, after assigning, the ledger renders each connected
/// node's answer to the report due at the next boundary
/// ([`Assigner::prepare`]). Filing a report changes no grant, so the answer
/// is the one the ledger would give; whatever does change grants (an
/// assign, a re-assign, a connect that re-assigns) replaces or clears these
/// answers, under this lock, before its pushes are queued. The stream holds
/// the lock from checking the answer to queuing it, so an answer never
/// overtakes a newer push.
///
/// An answer still acknowledges a filed report, as the original's did:
///
/// - the stream queues the report for the ledger first, marked as answered,
///   and answers only once it is queued;
/// - the ledger files every report it was queued, those queued while it
///   shuts down included: it closes its queue first, so that queuing
///   fails from then on, then files what the queue holds, and only then
///   closes the streams ([`Actor::close`]).
///
/// The stream decides before queuing, rather than racing the ledger for
/// the answer after: the ledger's thread, woken by the report, would
/// usually take the report first when it is idle (the scheduler runs the
/// woken thread ahead of the one that woke it), and answer it only after
/// filing.
///
/// A report the stream cannot answer ahead (an older slot, a service
/// outside the prepared answer, a check the ledger would fail) goes the way
/// every report went before: filed, then answered by the ledger.
///
/// For a node that accepts refs ([`QUOTA_REFS`](throttle_proto::QUOTA_REFS)),
/// the answer names the tables of the push queued just before it on the
/// same stream instead of repeating them (the answer to the report after
/// an assign holds the grants that assign pushed). Such an answer is kept
/// only on a stream that took the push; the others answer after filing,
/// in full.
#[derive(Debug, Default)]
pub(crate) struct AnswerAhead {
    ready: parking_lot::Mutex<Option<Ready>>,
}

/// An answer rendered ahead: for the report of `report_slot`, covering
/// `services`.
#[derive(Debug, Clone)]
struct Ready {
    report_slot: i64,
    services: Arc<[String]>,
    quota: bytes::Bytes,
}

struct Actor {
    assigner: Assigner<Encoded>,
    /// The ledger task's own queue, for work that waits behind the
    /// commands already there.
    me: mpsc::Sender<Command>,
    clock: Arc<dyn Clock>,
    conns: BTreeMap<u64, Conn>,
    next_conn: u64,
    started: Instant,
}

/// A report as it reaches the ledger task.
#[derive(Debug)]
pub(crate) enum Received {
    /// Read in place (the reports of throttle's own nodes).
    Raw(RawReport),
    /// Decoded by prost: encoded otherwise than prost encodes (see
    /// [`RawReportError::Unordered`]).
    Decoded(v1::Report),
}

impl Received {
    /// Reads a report's bytes in place, or decodes them with prost where
    /// reading in place would not say the same; on the stream's task.
    fn read(bytes: bytes::Bytes) -> Result<Self, Status> {
        match RawReport::parse(bytes.clone()) {
            Ok(raw) => Ok(Self::Raw(raw)),
            Err(why) => match v1::Report::decode(bytes) {
                Ok(mut report) => {
                    if why == RawReportError::Unordered {
                        counter!("throttle_central_reports_decoded_total").increment(1);
                    }
                    // Packed usages as the maps the ledger reads.
                    if let Err(e) = report.unpack() {
                        counter!("throttle_central_invalid_messages_total", "reason" => "packed")
                            .increment(1);
                        return Err(Status::invalid_argument(format!("unreadable report: {e}")));
                    }
                    Ok(Self::Decoded(report))
                }
                Err(e) => {
                    counter!("throttle_central_invalid_messages_total", "reason" => "decode")
                        .increment(1);
                    Err(Status::invalid_argument(format!("unreadable report: {e}")))
                }
            },
        }
    }

    fn node_id(&self) -> &str {
        match self {
            Self::Raw(r) => r.node_id(),
            Self::Decoded(r) => &r.node_id,
        }
    }

    fn slot_number(&self) -> i64 {
        match self {
            Self::Raw(r) => r.slot_number(),
            Self::Decoded(r) => r.slot_number,
        }
    }

    /// The ledger's own check ([`LedgerConfig::check`]), for `node_id`.
    fn check(&self, config: &LedgerConfig, node_id: &str, now_ms: i64) -> Result<(), ReportError> {
        match self {
            Self::Raw(r) => config.check(&FromNode(node_id, r), now_ms),
            Self::Decoded(r) => config.check(&FromNode(node_id, r), now_ms),
        }
    }

    /// Whether every service the report names is one of `services`.
    fn services_within(&self, services: &[String]) -> bool {
        let known = |name: &str| services.iter().any(|s| s == name);
        match self {
            Self::Raw(r) => r.usages().all(|(name, ..)| known(name)),
            Self::Decoded(r) => r
                .consumption
                .keys()
                .chain(r.rejection.keys())
                .all(|name| known(name)),
        }
    }
}

/// Files `report` and answers it, or only files it when its answer went
/// out ahead.
fn file_report<R: ReportSource>(
    assigner: &mut Assigner<Encoded>,
    node: NodeId,
    report: &R,
    now_ms: i64,
    answered: bool,
) -> Result<(Filed, Option<bytes::Bytes>), ReportError> {
    if answered {
        return assigner.file(node, report, now_ms).map(|f| (f, None));
    }
    assigner.report(node, report, now_ms).map(|a| {
        let filed = Filed {
            complete: a.complete,
            ingested: a.ingested,
        };
        (filed, Some(a.quota))
    })
}

impl Actor {
    async fn run(mut self, mut rx: mpsc::Receiver<Command>, mut stop: watch::Receiver<bool>) {
        self.assigner.refresh_limits(self.clock.now_ms());
        loop {
            let next = tokio::select! {
                // Commands queued before the stop (e.g. a closing snapshot)
                // are answered first.
                biased;
                cmd = rx.recv() => Some(cmd),
                _ = stop.wait_for(|s| *s) => None,
            };
            let cmd = match next {
                Some(Some(cmd)) => cmd,
                // Every sender is gone.
                Some(None) => return,
                None => {
                    self.close(&mut rx, None).await;
                    return;
                }
            };
            if matches!(cmd, Command::Reassign { .. }) {
                // Let the streams write the answers just queued before the
                // re-assignment takes this thread.
                tokio::task::yield_now().await;
            }
            if let Some(snapshot) = self.handle(cmd) {
                self.close(&mut rx, snapshot).await;
                return;
            }
        }
    }

    /// Closes the queue, so that no stream can queue a report any more,
    /// files every report it still holds (a stream answered some of them
    /// ahead: see [`AnswerAhead`]), then answers `snapshot` and closes every
    /// stream with `UNAVAILABLE`.
    async fn close(&mut self, rx: &mut mpsc::Receiver<Command>, snapshot: Option<Snapshot>) {
        rx.close();
        let mut snapshots: Vec<_> = snapshot.into_iter().collect();
        // Ends once the queue is empty and no sender holds a reserved slot.
        while let Some(cmd) = rx.recv().await {
            if let Some(snapshot) = self.handle(cmd) {
                snapshots.extend(snapshot);
            }
        }
        for (subject, reply) in snapshots {
            let _ = reply.send(self.monitor(subject, SlotRange::default()));
        }
        // Waits for each stream that answers ahead to queue its answer
        // (it holds this lock until then), so that no answer follows the
        // close.
        self.forget_answers();
        for (_, c) in std::mem::take(&mut self.conns) {
            self.assigner.disconnect(c.node, c.accepts);
            let _ =
                c.tx.try_send(Err(Status::unavailable("central node shutting down")));
        }
        gauge!("throttle_central_connections").set(0.0);
    }

    /// Carries out `cmd`; for a close, returns its snapshot's request, for
    /// [`Actor::close`].
    fn handle(&mut self, cmd: Command) -> Option<Option<Snapshot>> {
        match cmd {
            Command::Connect {
                hello,
                addr,
                tx,
                ahead,
                reply,
            } => {
                let conn = self.next_conn;
                self.next_conn += 1;
                let accepts = Accepts::from_hello(&hello.accepts);
                let ledger = self.assigner.ledger();
                let was_packed = ledger
                    .find_node(&hello.node_id)
                    .is_some_and(|n| ledger.is_packed(n));
                let (node, pushes) = self.assigner.connect(
                    &hello.node_id,
                    &hello.services,
                    accepts,
                    self.clock.now_ms(),
                );
                tracing::info!(node_id = %hello.node_id, ?addr, services = ?hello.services, packed = accepts.packed, refs = accepts.refs, "node connected");
                self.conns.insert(
                    conn,
                    Conn {
                        node_id: hello.node_id,
                        node,
                        accepts,
                        addr,
                        since: Instant::now(),
                        reports: 0,
                        answered_ahead: 0,
                        tx,
                        ahead,
                    },
                );
                gauge!("throttle_central_connections").set(self.conns.len() as f64);
                if !pushes.is_empty() || self.assigner.ledger().is_packed(node) != was_packed {
                    // A service was re-assigned, or the node's quotas
                    // change form: answers rendered before are stale.
                    self.forget_answers();
                }
                self.deliver(pushes);
                let _ = reply.send(conn);
            }
            Command::Disconnect { conn } => {
                if let Some(c) = self.conns.remove(&conn) {
                    let was_packed = self.assigner.ledger().is_packed(c.node);
                    self.assigner.disconnect(c.node, c.accepts);
                    if self.assigner.ledger().is_packed(c.node) != was_packed {
                        self.forget_answers();
                    }
                    tracing::info!(node_id = %c.node_id, reports = c.reports, "node disconnected");
                }
                gauge!("throttle_central_connections").set(self.conns.len() as f64);
            }
            Command::Report {
                conn,
                report,
                reply,
                answered,
            } => {
                // Unless the stream answered ahead, the answer is queued
                // here, by the ledger's own task, so it precedes anything the
                // ledger sends this stream later (such as the close on
                // shutdown): a node that saw no answer knows its report was
                // not filed, and sends it again.
                let result = self.report(conn, &report, answered).and_then(|quota| {
                    let Some(quota) = quota else { return Ok(()) };
                    let tx = self.conns.get(&conn).map(|c| &c.tx);
                    let msg = Ok(Outbound::Encoded(quota));
                    match tx.map(|tx| tx.try_send(msg)) {
                        Some(Ok(())) => Ok(()),
                        _ => {
                            counter!("throttle_central_pushes_dropped_total").increment(1);
                            Err(Status::resource_exhausted("node is not reading its stream"))
                        }
                    }
                });
                let _ = reply.send((result, report));
            }
            Command::Tick => self.tick(),
            Command::Reassign { service } => self.reassign(&service),
            Command::Monitor {
                subject,
                range,
                reply,
            } => {
                let _ = reply.send(self.monitor(subject, range));
            }
            Command::CloseAll { snapshot } => return Some(snapshot),
        }
        None
    }

    /// Files a report and returns its answer, or `None` when the stream
    /// answered it ahead.
    fn report(
        &mut self,
        conn: u64,
        report: &Received,
        answered: bool,
    ) -> Result<Option<bytes::Bytes>, Status> {
        let now = self.clock.now_ms();
        let Self {
            conns, assigner, ..
        } = self;
        let Some(c) = conns.get_mut(&conn) else {
            return Err(Status::failed_precondition("stream is not registered"));
        };
        // A report may leave out its node id: it is the stream's.
        let claimed = report.node_id();
        if !claimed.is_empty() && claimed != c.node_id {
            counter!("throttle_central_invalid_messages_total", "reason" => "node_id_mismatch")
                .increment(1);
            return Err(Status::invalid_argument(format!(
                "report node_id {:?} differs from the stream's {:?}",
                claimed, c.node_id
            )));
        }
        c.reports += 1;
        c.answered_ahead += u64::from(answered);
        let (node, node_id) = (c.node, c.node_id.as_str());
        let filed = match report {
            Received::Raw(r) => file_report(assigner, node, &FromNode(node_id, r), now, answered),
            Received::Decoded(r) => {
                file_report(assigner, node, &FromNode(node_id, r), now, answered)
            }
        };
        let (answer, quota) = match filed {
            Ok(a) => a,
            Err(e) => {
                counter!("throttle_central_invalid_messages_total", "reason" => "report")
                    .increment(1);
                // The stream answers ahead only what passes the same check
                // (`LedgerConfig::check`), so `answered` here means the two
                // checks disagreed: say so.
                tracing::warn!(%node_id, error = %e, answered, "report refused");
                return Err(Status::invalid_argument(e.to_string()));
            }
        };
        if answered {
            counter!("throttle_central_answers_ahead_total").increment(1);
        }
        let out = &answer.ingested;
        counter!("throttle_central_reports_total").increment(1);
        counter!("throttle_central_report_entries_total").increment(out.entries as u64);
        if out.duplicate {
            counter!("throttle_central_duplicate_reports_total").increment(1);
            tracing::debug!(%node_id, slot = report.slot_number(), "duplicate report ignored");
        }
        for (reason, key) in &out.dropped {
            counter!("throttle_central_dropped_entries_total", "reason" => reason.as_str())
                .increment(1);
            tracing::warn!(%node_id, reason = reason.as_str(), key = %truncate(key), "report entry dropped");
        }
        // Re-assign after the answers already queued: the ledger task takes
        // its commands in order.
        for service in answer.complete {
            // A closed queue means the ledger is filing its last reports
            // before it closes: nothing is skipped that anyone would read.
            if let Err(mpsc::error::TrySendError::Full(_)) =
                self.me.try_send(Command::Reassign { service })
            {
                counter!("throttle_central_reassigns_skipped_total").increment(1);
                tracing::warn!("re-assign skipped: the ledger's queue is full");
            }
        }
        Ok(quota)
    }

    /// Clears every stream's answer rendered ahead: grants changed.
    fn forget_answers(&self) {
        for c in self.conns.values() {
            *c.ahead.ready.lock() = None;
        }
    }

    /// Each node's streams, found once rather than by a scan per push.
    fn streams(conns: &BTreeMap<u64, Conn>) -> BTreeMap<NodeId, Vec<&Conn>> {
        let mut streams: BTreeMap<NodeId, Vec<&Conn>> = BTreeMap::new();
        for c in conns.values() {
            streams.entry(c.node).or_default().push(c);
        }
        streams
    }

    /// Queues `quota` on every stream in `streams`, never waiting. Encoded
    /// once; a node with two streams (for a moment, while it reconnects)
    /// shares the bytes. Returns whether every stream took it.
    fn push(streams: &[&Conn], quota: &bytes::Bytes) -> bool {
        let mut all = true;
        for c in streams {
            if c.tx.try_send(Ok(Outbound::Encoded(quota.clone()))).is_err() {
                counter!("throttle_central_pushes_dropped_total").increment(1);
                tracing::warn!(node_id = %c.node_id, "quota push dropped: stream queue full");
                all = false;
            }
        }
        all
    }

    /// Queues each push on every stream of its node.
    fn deliver(&self, pushes: Vec<Push<bytes::Bytes>>) {
        if pushes.is_empty() {
            return;
        }
        let streams = Self::streams(&self.conns);
        for (node, quota) in pushes {
            Self::push_to(&streams, node, &quota);
        }
    }

    /// Queues `quota` on every stream of `node` in `streams`.
    fn push_to(streams: &BTreeMap<NodeId, Vec<&Conn>>, node: NodeId, quota: &bytes::Bytes) {
        Self::push(streams.get(&node).map_or(&[][..], Vec::as_slice), quota);
    }

    /// Re-assigns `service`: the answers rendered ahead are cleared, and
    /// each node's push is queued as soon as it is rendered.
    fn reassign(&mut self, service: &str) {
        self.forget_answers();
        let now = self.clock.now_ms();
        let streams = Self::streams(&self.conns);
        self.assigner.reassign_each(service, now, |node, quota| {
            Self::push_to(&streams, node, &quota);
        });
    }

    /// The mid-slot assign. Node by node, as each is rendered: its streams
    /// get the answer to the node's report due at the next slot boundary
    /// (see [`AnswerAhead`]; none if none was rendered), then its push is
    /// queued (in that order, so an answer never overtakes a newer push).
    /// Only one node's push and answer are held here at a time, and the
    /// first nodes' go out while the others' are rendered.
    fn tick(&mut self) {
        let now = self.clock.now_ms();
        let report_slot = self.assigner.ledger().config().slot.slot_at(now) + 1;
        let mut streams = Self::streams(&self.conns);
        self.assigner.tick_each(now, |node, quota, answer| {
            let refers = answer.as_ref().is_some_and(|a| a.refers);
            let ready = answer.map(|a| Ready {
                report_slot,
                services: a.services.into(),
                quota: a.quota,
            });
            for c in streams.remove(&node).unwrap_or_default() {
                let mut ahead = c.ahead.ready.lock();
                // An answer that refers to the push goes only where the
                // push went: otherwise the ledger answers after filing.
                let pushed = Self::push(&[c], &quota);
                *ahead = ready.clone().filter(|_| pushed || !refers);
            }
        });
        // Streams of a node the assigner no longer serves answer nothing
        // ahead.
        for c in streams.into_values().flatten() {
            *c.ahead.ready.lock() = None;
        }
    }

    fn monitor(&mut self, subject: Subject, range: SlotRange) -> Value {
        let now = self.clock.now_ms();
        match subject {
            Subject::Connections => {
                let conns: Vec<Value> = self
                    .conns
                    .values()
                    .map(|c| {
                        json!({
                            "node_id": c.node_id,
                            "addr": c.addr.map(|a| a.to_string()),
                            "services": self.assigner.services_of(c.node),
                            "connected_seconds": c.since.elapsed().as_secs_f64(),
                            "reports": c.reports,
                            "answered_ahead": c.answered_ahead,
                            // The form its quotas are written in: packed
                            // while every stream of the node accepts it.
                            "quotas": if self.assigner.ledger().is_packed(c.node) {
                                "packed"
                            } else {
                                "classic"
                            },
                            // Its answers may name the push before them.
                            "refs": c.accepts.refs,
                        })
                    })
                    .collect();
                json!({"connections": conns, "uptime_seconds": self.started.elapsed().as_secs_f64()})
            }
            Subject::Reported => self.assigner.ledger().monitor_reported(range),
            Subject::ConsumptionSum => self.assigner.ledger().monitor_sums(range, false),
            Subject::RejectionSum => self.assigner.ledger().monitor_sums(range, true),
            Subject::Distribution => self.assigner.ledger_mut().monitor_distribution(range, now),
            Subject::Quota => self.assigner.ledger().monitor_quota(range),
        }
    }
}

fn truncate(s: &str) -> &str {
    let mut end = s.len().min(80);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Ticks the ledger at every mid-slot.
async fn assigner(
    commands: mpsc::Sender<Command>,
    clock: Arc<dyn Clock>,
    slot: SlotLength,
    mut stop: watch::Receiver<bool>,
) {
    let half = i64::from(slot.as_ms() / 2);
    loop {
        let now = clock.now_ms();
        let wait = slot.until_next(now - half);
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stop.changed() => return,
        }
        if commands.send(Command::Tick).await.is_err() {
            return;
        }
    }
}

/// Checks the limits file every quarter slot (at most every 250 ms); a
/// change, once read the same twice, is applied and assigned at once.
async fn reloader(
    commands: mpsc::Sender<Command>,
    file: Arc<FileLimits>,
    slot: SlotLength,
    mut stop: watch::Receiver<bool>,
) {
    let period =
        (slot.as_duration() / 4).clamp(Duration::from_millis(5), Duration::from_millis(250));
    let mut interval = tokio::time::interval(period);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = interval.tick() => {}
            _ = stop.changed() => return,
        }
        let path = file.path().display().to_string();
        let result = {
            let file = file.clone();
            tokio::task::spawn_blocking(move || file.poll()).await
        };
        match result {
            Ok(Ok(true)) => {
                tracing::info!(%path, "limits reloaded");
                gauge!("throttle_central_limits_reload_ok").set(1.0);
                if commands.send(Command::Tick).await.is_err() {
                    return;
                }
            }
            Ok(Ok(false)) => {}
            Ok(Err(e)) => {
                counter!("throttle_central_limits_reload_errors_total").increment(1);
                gauge!("throttle_central_limits_reload_ok").set(0.0);
                tracing::error!(%path, error = %e, "limits reload failed; keeping the previous limits");
            }
            Err(e) => tracing::error!(error = %e, "limits reload task failed"),
        }
    }
}

/// What became of a report offered to [`CentralService::answer_ahead`].
enum Ahead {
    /// Queued for filing, and answered.
    Queued,
    /// Queued for filing, but the node's stream queue is full.
    Full(Status),
    /// Not queued: the caller queues it and the ledger answers after filing.
    Later(Command),
}

#[derive(Clone)]
struct CentralService {
    commands: mpsc::Sender<Command>,
    leadership: Arc<dyn Leadership>,
    slot: SlotLength,
    /// The ledger's settings, for its check before answering ahead.
    config: LedgerConfig,
    clock: Arc<dyn Clock>,
}

fn message(kind: central_message::Kind) -> Result<Outbound, Status> {
    Ok(Outbound::Message(v1::CentralMessage { kind: Some(kind) }))
}

fn invalid(reason: &'static str, msg: String) -> Status {
    counter!("throttle_central_invalid_messages_total", "reason" => reason).increment(1);
    tracing::warn!(reason, "{msg}");
    Status::invalid_argument(msg)
}

impl CentralService {
    fn check_hello(&self, first: Option<Result<Inbound, Status>>) -> Result<v1::Hello, Status> {
        let hello = match first {
            Some(Ok(Inbound::Hello(h))) => h,
            Some(Ok(_)) => {
                return Err(invalid(
                    "no_hello",
                    "the first message must be Hello".into(),
                ));
            }
            Some(Err(s)) => {
                return Err(invalid(
                    "decode",
                    format!("unreadable first message: {}", s.message()),
                ));
            }
            None => return Err(invalid("no_hello", "stream closed before Hello".into())),
        };
        if hello.node_id.is_empty() || hello.node_id.len() > MAX_NAME_LEN {
            return Err(invalid(
                "hello",
                format!("node_id must be 1 to {MAX_NAME_LEN} bytes"),
            ));
        }
        if hello.slot_ms != self.slot.as_ms() {
            return Err(invalid(
                "hello",
                format!(
                    "slot_ms {} differs from the central's {}",
                    hello.slot_ms,
                    self.slot.as_ms()
                ),
            ));
        }
        if let Some(s) = hello
            .services
            .iter()
            .find(|s| s.is_empty() || s.len() > MAX_NAME_LEN)
        {
            return Err(invalid(
                "hello",
                format!(
                    "service name {:?} must be 1 to {MAX_NAME_LEN} bytes",
                    truncate(s)
                ),
            ));
        }
        Ok(hello)
    }

    async fn run_stream(
        self,
        mut inbound: Streaming<Inbound>,
        addr: Option<SocketAddr>,
        tx: Outgoing,
    ) {
        let first = tokio::time::timeout(HELLO_TIMEOUT, inbound.next())
            .await
            .unwrap_or(None);
        let hello = match self.check_hello(first) {
            Ok(h) => h,
            Err(status) => {
                let _ = tx.send(Err(status)).await;
                return;
            }
        };
        let welcome = central_message::Kind::Welcome(v1::Welcome {
            slot_ms: self.slot.as_ms(),
            epoch: 0,
            accepts: vec![PACKED_REPORTS.to_owned()],
        });
        // Welcome goes out before the stream is registered for pushes.
        if tx.send(message(welcome)).await.is_err() {
            return;
        }
        let node_id = hello.node_id.clone();
        let ahead = Arc::new(AnswerAhead::default());
        let (reply, rx) = oneshot::channel();
        let connect = Command::Connect {
            hello,
            addr,
            tx: tx.clone(),
            ahead: ahead.clone(),
            reply,
        };
        if self.commands.send(connect).await.is_err() {
            return;
        }
        let Ok(conn) = rx.await else { return };
        loop {
            let next = tokio::select! {
                next = inbound.next() => next,
                // The response stream is gone (closed by the central node):
                // stop reading, so the connection can wind down.
                () = tx.closed() => break,
            };
            let status = match next {
                None => break,
                Some(Err(s)) => {
                    counter!("throttle_central_invalid_messages_total", "reason" => "decode")
                        .increment(1);
                    tracing::warn!(?addr, status = %s, "node stream failed");
                    // Tell the node why (e.g. a message over the size limit).
                    Status::new(s.code(), s.message().to_owned())
                }
                Some(Ok(Inbound::Report(bytes))) => {
                    if !self.leadership.is_leader() {
                        let leader = self.leadership.leader().unwrap_or_default();
                        let _ = tx
                            .send(message(central_message::Kind::NotLeader(v1::NotLeader {
                                leader,
                            })))
                            .await;
                        break;
                    }
                    let report = match Received::read(bytes) {
                        Ok(r) => r,
                        Err(status) => {
                            let _ = tx.send(Err(status)).await;
                            break;
                        }
                    };
                    let (reply, rx) = oneshot::channel();
                    match self.answer_ahead(conn, &node_id, &ahead, &tx, report, reply) {
                        Ahead::Queued => {}
                        Ahead::Full(status) => {
                            let _ = tx.send(Err(status)).await;
                            break;
                        }
                        Ahead::Later(command) => {
                            if self.commands.send(command).await.is_err() {
                                break;
                            }
                        }
                    }
                    match rx.await {
                        Ok((Ok(()), _report)) => continue,
                        Ok((Err(status), _report)) => status,
                        Err(_) => break,
                    }
                }
                Some(Ok(_)) => invalid("unexpected", "expected a Report after Hello".into()),
            };
            let _ = tx.send(Err(status)).await;
            break;
        }
        let _ = self.commands.send(Command::Disconnect { conn }).await;
    }

    /// Queues `report` for filing and answers it at once, if its answer was
    /// rendered ahead and may be sent before filing (see [`AnswerAhead`]).
    fn answer_ahead(
        &self,
        conn: u64,
        node_id: &str,
        ahead: &AnswerAhead,
        tx: &Outgoing,
        report: Received,
        reply: oneshot::Sender<(Result<(), Status>, Received)>,
    ) -> Ahead {
        let claimed = report.node_id();
        let valid = (claimed.is_empty() || claimed == node_id)
            && report
                .check(&self.config, node_id, self.clock.now_ms())
                .is_ok();
        // Held until the answer is queued: a push of newer grants, queued
        // after the ledger clears this answer, cannot be overtaken.
        let ready = ahead.ready.lock();
        let quota = match ready.as_ref() {
            Some(r)
                if valid
                    && r.report_slot == report.slot_number()
                    && report.services_within(&r.services) =>
            {
                r.quota.clone()
            }
            _ => {
                return Ahead::Later(Command::Report {
                    conn,
                    report,
                    reply,
                    answered: false,
                });
            }
        };
        let command = Command::Report {
            conn,
            report,
            reply,
            answered: true,
        };
        if let Err(e) = self.commands.try_send(command) {
            // Not queued (a full queue, or a closed one): the caller queues
            // it, if it still can, for the ledger to file and answer.
            let mut command = e.into_inner();
            if let Command::Report { answered, .. } = &mut command {
                *answered = false;
            }
            return Ahead::Later(command);
        }
        // Queued, so the ledger files it, even if it is closing.
        if tx.try_send(Ok(Outbound::Encoded(quota))).is_err() {
            counter!("throttle_central_pushes_dropped_total").increment(1);
            return Ahead::Full(Status::resource_exhausted("node is not reading its stream"));
        }
        drop(ready);
        Ahead::Queued
    }
}

#[tonic::async_trait]
impl CentralRpc for CentralService {
    type ExchangeStream = ReceiverStream<Result<Outbound, Status>>;

    async fn exchange(
        &self,
        request: Request<Streaming<Inbound>>,
    ) -> Result<Response<Self::ExchangeStream>, Status> {
        let addr = request.remote_addr();
        let (tx, rx) = mpsc::channel(STREAM_QUEUE);
        if !self.leadership.is_leader() {
            let leader = self.leadership.leader().unwrap_or_default();
            tracing::info!(?addr, %leader, "not the leader; redirecting node");
            let _ = tx.try_send(message(central_message::Kind::NotLeader(v1::NotLeader {
                leader,
            })));
            return Ok(Response::new(ReceiverStream::new(rx)));
        }
        tokio::spawn(self.clone().run_stream(request.into_inner(), addr, tx));
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(amount: i64) -> v1::Report {
        v1::Report {
            node_id: "n1".into(),
            slot_number: 9,
            consumption: [(
                "front".to_string(),
                v1::Usage {
                    users: [(
                        "alice".to_string(),
                        v1::Amounts {
                            resources: [("requests".to_string(), amount)].into(),
                        },
                    )]
                    .into(),
                },
            )]
            .into(),
            ..v1::Report::default()
        }
    }

    #[test]
    fn reports_are_read_in_place_or_by_prost_or_refused() {
        let ordered = report(1).encode_to_vec();
        assert!(matches!(
            Received::read(ordered.into()),
            Ok(Received::Raw(r)) if r.node_id() == "n1" && r.slot_number() == 9
        ));
        // Two entries for one user, as another encoder may send them:
        // prost's reading (the last one counts) is used.
        let mut repeated = report(1).encode_to_vec();
        repeated.extend(report(2).encode_to_vec());
        match Received::read(repeated.into()) {
            Ok(Received::Decoded(r)) => assert_eq!(r, report(2)),
            other => panic!("{other:?}"),
        }
        let garbage = bytes::Bytes::from_static(&[0x0a, 0x05, b'a']);
        let refused = Received::read(garbage).err().map(|s| s.code());
        assert_eq!(refused, Some(tonic::Code::InvalidArgument));
    }
}
