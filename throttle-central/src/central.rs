//! [`Central`]: a central node's builder, and the node it spawns.
//!
//! # Examples
//!
//! ```no_run
//! use throttle_central::Central;
//! # async fn run() -> std::io::Result<()> {
//! let grpc = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! let http = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! let central = Central::builder().spawn(grpc, Some(http))?;
//! println!("nodes connect to http://{}", central.grpc_addr());
//! central.shutdown().await;
//! # Ok(()) }
//! ```

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::RateLimitQuotaServiceServer;
use serde_json::Value;
use throttle_clock::{Clock, SlotLength, SystemClock};
use throttle_proto::wire::server::central_server::CentralServer;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, mpsc, oneshot, watch};
use tokio::task::JoinHandle;

use crate::assigner::Assigner;
use crate::ha::leadership::{AlwaysLeader, Leadership};
use crate::ha::state::StateStore;
use crate::http::{self, HttpState};
use crate::keys::NodeKeys;
use crate::ledger::{Ledger, LedgerConfig, Page, PolicyFactory, SlotRange};
use crate::ledger_task::{
    Actor, Command, Keeper, MonitorView, Subject, ask, follow_etcd, reloader, ticker,
};
use crate::limits::{
    DEFAULT_POLICY_NAMES, Editable, EtcdLimits, FileLimits, LimitSet, LimitSource, UnknownPolicy,
};
use crate::net::{self, ConnectionLimits, ServerTls};
use crate::nodes::grpc::CentralService;
use crate::nodes::legacy::Endpoint;
use crate::nodes::rlqs::{self, Rlqs, StreamSettings};
use crate::policy::{self, Projected};
use crate::usage::UsageConfig;

/// Settings and collaborators of a central node; see [`Central::builder`].
pub struct CentralBuilder {
    ledger: LedgerConfig,
    max_message_bytes: usize,
    limits: Arc<dyn LimitSource>,
    editable: Option<Editable>,
    keys: Option<Arc<NodeKeys>>,
    leadership: Arc<dyn Leadership>,
    clock: Arc<dyn Clock>,
    policies: Option<PolicyFactory>,
    metrics: Option<metrics_exporter_prometheus::PrometheusHandle>,
    http_token: Option<Arc<str>>,
    tls: Option<ServerTls>,
    connections: ConnectionLimits,
    state: Option<Arc<dyn StateStore>>,
    checkpoint_every: Duration,
    rlqs_ttl: Duration,
    legacy: Option<TcpListener>,
    usage: Option<UsageConfig>,
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
    /// `projected` policy.
    pub fn builder() -> CentralBuilder {
        CentralBuilder {
            ledger: LedgerConfig::default(),
            max_message_bytes: 64 * 1024 * 1024,
            limits: Arc::new(LimitSet::new()),
            editable: None,
            keys: None,
            leadership: Arc::new(AlwaysLeader),
            clock: Arc::new(SystemClock),
            policies: None,
            metrics: None,
            http_token: None,
            tls: None,
            connections: ConnectionLimits::default(),
            state: None,
            checkpoint_every: Duration::from_secs(1),
            rlqs_ttl: rlqs::DEFAULT_TTL,
            legacy: None,
            usage: None,
        }
    }
}

impl CentralBuilder {
    /// Slot length; nodes must use the same.
    pub fn slot(mut self, slot: SlotLength) -> Self {
        self.ledger.slot = slot;
        self
    }

    /// Slots of history kept (the legacy system's `nr_slot`).
    pub fn nr_slot(mut self, nr_slot: u32) -> Self {
        self.ledger.nr_slot = nr_slot.max(1);
        self
    }

    /// Most users one report may carry.
    pub fn max_users_per_report(mut self, max: usize) -> Self {
        self.ledger.max_users_per_report = max;
        self
    }

    /// Most services the central tracks (default 10,000): a node naming a
    /// new one past it gets no quotas for it, and its reports' entries for
    /// it are dropped, counted and logged.
    pub fn max_services(mut self, max: usize) -> Self {
        self.ledger.max_services = max;
        self
    }

    /// Most (user, resource) keys the central holds over every service
    /// (default [`MAX_KEYS`](crate::ledger::MAX_KEYS)): an entry of a
    /// report that would add one past it is dropped, counted and logged.
    pub fn max_keys(mut self, max: usize) -> Self {
        self.ledger.max_keys = max;
        self
    }

    /// Largest amount a node may report for one (user, resource) in one
    /// slot (default [`MAX_AMOUNT`](crate::ledger::MAX_AMOUNT)); an entry
    /// above it is dropped, counted and logged, and the rest of the report
    /// is filed.
    pub fn max_amount(mut self, max: i64) -> Self {
        self.ledger.max_amount = max;
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
        self.editable = Some(Editable::File(file));
        self
    }

    /// Limits kept in etcd ([`EtcdLimits`]), followed with a watch; a
    /// change is assigned and pushed at once.
    pub fn limits_etcd(mut self, etcd: Arc<EtcdLimits>) -> Self {
        self.limits = etcd.clone();
        self.editable = Some(Editable::Etcd(etcd));
        self
    }

    /// Node keys, read again when the file changes: a stream that does not
    /// prove one of them ([`throttle_proto::auth`]) ends with
    /// `UNAUTHENTICATED` before anything it sent is read. Without them any
    /// process that reaches the gRPC address is a node.
    pub fn node_keys(mut self, keys: Arc<NodeKeys>) -> Self {
        self.keys = Some(keys);
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

    /// The quota policy of every service the limits file sets none for
    /// (`[service.NAME] policy`), by its name there: one of
    /// [`DEFAULT_POLICY_NAMES`], `projected` by default.
    pub fn default_policy(mut self, name: &str) -> Result<Self, UnknownPolicy> {
        if !DEFAULT_POLICY_NAMES.contains(&name) {
            return Err(UnknownPolicy(name.to_owned()));
        }
        let name = name.to_owned();
        self.policies = Some(Box::new(move |_| {
            policy::by_name(&name).unwrap_or_else(|| Box::new(Projected::new()))
        }));
        Ok(self)
    }

    /// The policy of each service, by name, from `factory` (the core's
    /// policies, or one of the embedder's).
    pub fn policies(mut self, factory: PolicyFactory) -> Self {
        self.policies = Some(factory);
        self
    }

    /// Every HTTP route but `/healthz` requires `Authorization: Bearer
    /// <token>`; others get 401.
    pub fn http_token(mut self, token: impl Into<String>) -> Self {
        self.http_token = Some(Arc::from(token.into()));
        self
    }

    /// Serves both gRPC and HTTP over TLS; with a client CA in `tls`, a
    /// node must show a certificate that chains to it (mutual TLS).
    pub fn tls(mut self, tls: ServerTls) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Bounds on open connections (see [`ConnectionLimits`]).
    pub fn connection_limits(mut self, limits: ConnectionLimits) -> Self {
        self.connections = limits;
        self
    }

    /// Keeps the leader's checkpoint in `store` (see [`crate::ha::state`]):
    /// restored at the start of each leadership, before the first node
    /// stream is welcomed, and written every
    /// [`checkpoint_every`](Self::checkpoint_every). Without one, a new
    /// leader or a restarted central starts with new buckets.
    pub fn state(mut self, store: Arc<dyn StateStore>) -> Self {
        self.state = Some(store);
        self
    }

    /// Time between two checkpoints (default 1 s). Nodes keep 60 slots of
    /// reports, which must span a checkpoint and a takeover: keep it well
    /// under 60 slots less the takeover time.
    pub fn checkpoint_every(mut self, every: Duration) -> Self {
        self.checkpoint_every = every.max(Duration::from_millis(10));
        self
    }

    /// How long an Envoy proxy keeps an assignment it is not sent again
    /// (default [`DEFAULT_RLQS_TTL`](crate::DEFAULT_RLQS_TTL), three of
    /// Envoy's 5 s reports): once
    /// the central is gone, the proxies apply their
    /// `no_assignment_behavior` this long after their last assignment.
    /// Whole seconds, from 6 s (above Envoy's report interval) to an
    /// hour; assignments are sent again every half of it.
    pub fn rlqs_ttl(mut self, ttl: Duration) -> Self {
        self.rlqs_ttl = ttl.clamp(rlqs::MIN_TTL, rlqs::MAX_TTL);
        self
    }

    /// Serves `GET /metrics` from this Prometheus recorder, every metric
    /// described ([`crate::telemetry`]).
    pub fn metrics(mut self, handle: metrics_exporter_prometheus::PrometheusHandle) -> Self {
        crate::telemetry::describe();
        self.metrics = Some(handle);
        self
    }

    /// Keeps every user's usage per minute, hour and day in `usage`'s
    /// store, written by the leader as reports are filed; see
    /// [`crate::usage`].
    pub fn usage(mut self, usage: UsageConfig) -> Self {
        self.usage = Some(usage);
        self
    }

    /// Serves the legacy nodes (lua-resty-throttle) on `listener`: their
    /// WebSocket at `/throttle`, over TLS when [`CentralBuilder::tls`] is
    /// set, their URLs checked against [`CentralBuilder::node_keys`].
    /// Legacy nodes count 1 s slots: [`CentralBuilder::spawn`] refuses
    /// another slot length.
    pub fn legacy_listener(mut self, listener: TcpListener) -> Self {
        self.legacy = Some(listener);
        self
    }

    /// Starts serving node streams on `grpc` and, if given, the monitor API
    /// on `http`. Must be called within a Tokio runtime.
    ///
    /// # Errors
    ///
    /// When the listeners' addresses cannot be read, tonic refuses the
    /// TLS configuration, or legacy nodes are served with slots other than
    /// 1 s.
    pub fn spawn(
        self,
        grpc: TcpListener,
        http: Option<TcpListener>,
    ) -> std::io::Result<RunningCentral> {
        let grpc_addr = grpc.local_addr()?;
        let http_addr = http.as_ref().map(TcpListener::local_addr).transpose()?;
        let legacy_addr = self
            .legacy
            .as_ref()
            .map(TcpListener::local_addr)
            .transpose()?;
        if legacy_addr.is_some() && self.ledger.slot.as_ms() != 1_000 {
            let why = "legacy nodes count 1 s slots: serve them with a slot of 1000 ms";
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, why));
        }
        let slot = self.ledger.slot;
        let config = self.ledger.clone();
        let ledger = match self.policies {
            Some(f) => Ledger::with_policies(self.ledger, f),
            None => Ledger::new(self.ledger),
        };
        let (commands, rx) = mpsc::channel(4096);
        let (stop_tx, stop_rx) = watch::channel(false);
        // An elected central updates it with each change of role.
        let leads = f64::from(u8::from(self.leadership.is_leader()));
        metrics::gauge!("throttle_central_leader").set(leads);
        let mut assigner = Assigner::new(ledger, self.limits.clone());
        let mut tasks = Vec::new();
        if let Some(usage) = &self.usage {
            let (tap, writer) = usage.start(slot, config.max_amount, self.clock.clone())?;
            assigner.tap_usage(tap);
            // Ends once the ledger's task has, after writing what is left.
            tasks.push(tokio::task::spawn_blocking(move || {
                let _ = writer.join();
            }));
        }
        let actor = Actor::new(
            assigner,
            commands.clone(),
            self.clock.clone(),
            self.leadership.clone(),
        );
        tasks.push(spawn_ledger(actor.run(rx, stop_rx.clone()))?);
        tasks.push(tokio::spawn(ticker(
            commands.clone(),
            self.clock.clone(),
            slot,
            stop_rx.clone(),
        )));
        match self.editable.clone() {
            Some(Editable::File(file)) => {
                let tick = Some(commands.clone());
                tasks.push(tokio::spawn(reloader(file, tick, slot, stop_rx.clone())));
            }
            Some(Editable::Etcd(etcd)) => {
                tasks.push(tokio::spawn(follow_etcd(
                    etcd,
                    commands.clone(),
                    slot,
                    stop_rx.clone(),
                )));
            }
            None => {}
        }
        match &self.keys {
            Some(keys) => {
                tasks.push(tokio::spawn(reloader(
                    keys.clone(),
                    None,
                    slot,
                    stop_rx.clone(),
                )));
            }
            None => tracing::warn!(
                "no node keys: any process that reaches the gRPC or legacy address is accepted as a node (or proxy)"
            ),
        }
        let restored = self.state.clone().map(|store| {
            let (restored, gate) = watch::channel(None);
            let keeper = Keeper {
                store,
                leadership: self.leadership.clone(),
                commands: commands.clone(),
                restored,
                every: self.checkpoint_every,
            };
            tasks.push(tokio::spawn(keeper.run(stop_rx.clone())));
            gate
        });
        if let (Some(listener), Some(addr)) = (self.legacy, legacy_addr) {
            let endpoint = Endpoint {
                commands: commands.clone(),
                leadership: self.leadership.clone(),
                keys: self.keys.clone(),
                clock: self.clock.clone(),
                restored: restored.clone(),
                max_users_per_report: config.max_users_per_report,
                sessions: Arc::new(Semaphore::new(self.connections.max_node_connections.max(1))),
            };
            let tls = self.tls.as_ref().map(ServerTls::http);
            let stop = stopped(stop_rx.clone());
            tasks.push(endpoint.serve(listener, tls, self.connections, stop));
            tracing::info!(legacy_addr = %addr, tls = self.tls.is_some(), "listening for legacy nodes");
        }
        let service = CentralService {
            commands: commands.clone(),
            leadership: self.leadership.clone(),
            keys: self.keys,
            slot,
            config,
            clock: self.clock.clone(),
            restored,
            // Never 0, which says "no incarnation".
            incarnation: rand::random::<u64>() | 1,
        };
        let rlqs = Rlqs {
            settings: StreamSettings {
                commands: commands.clone(),
                leadership: self.leadership.clone(),
                clock: self.clock.clone(),
                slot,
                restored: service.restored.clone(),
                max_amount: service.config.max_amount,
                limits: self.limits.clone(),
                ttl_s: i64::try_from(self.rlqs_ttl.as_secs()).unwrap_or(i64::MAX),
            },
            keys: service.keys.clone(),
        };
        let grpc_server = GrpcServer {
            max_message_bytes: self.max_message_bytes,
            tls: self.tls.clone(),
            limits: self.connections,
        };
        tasks.push(grpc_server.spawn(grpc, service, rlqs, &stop_rx)?);
        tracing::info!(%grpc_addr, slot_ms = slot.as_ms(), "central node listening for nodes");
        if let Some(http) = http {
            let state = HttpState {
                commands: commands.clone(),
                limits: self.limits,
                leadership: self.leadership,
                metrics: self.metrics,
                token: self.http_token,
                editable: self.editable.clone(),
                slot_ms: slot.as_ms(),
                monitor_places: HttpState::monitor_places(),
                usage: self.usage.clone(),
                clock: self.clock.clone(),
            };
            if let Some(http_addr) = http_addr {
                tracing::info!(%http_addr, "monitor API listening");
            }
            let router = http::router(state);
            let tls = self.tls.as_ref().map(ServerTls::http);
            let stop = stopped(stop_rx.clone());
            let serve = net::serve_http(http, router, tls, self.connections, stop);
            tasks.push(tokio::spawn(serve));
        }
        Ok(RunningCentral {
            grpc_addr,
            http_addr,
            legacy_addr,
            commands,
            stop: stop_tx,
            tasks,
        })
    }
}

/// How the gRPC server is set up.
struct GrpcServer {
    max_message_bytes: usize,
    tls: Option<ServerTls>,
    limits: ConnectionLimits,
}

impl GrpcServer {
    /// Serves node streams on `grpc` until the stop.
    fn spawn(
        self,
        grpc: TcpListener,
        service: CentralService,
        rlqs: Rlqs,
        stop: &watch::Receiver<bool>,
    ) -> std::io::Result<JoinHandle<()>> {
        let limits = self.limits;
        let mut builder = tonic::transport::Server::builder()
            .http2_keepalive_interval(Some(limits.keepalive))
            .http2_keepalive_timeout(Some(limits.keepalive));
        if let Some(tls) = &self.tls {
            builder = builder
                .tls_config(tls.grpc(limits.first_stream))
                .map_err(std::io::Error::other)?;
        }
        let service = CentralServer::new(service).max_decoding_message_size(self.max_message_bytes);
        let incoming = net::node_incoming(grpc, limits);
        let rlqs = RateLimitQuotaServiceServer::new(rlqs)
            .max_decoding_message_size(self.max_message_bytes);
        let server = builder
            .add_service(service)
            .add_service(rlqs)
            .serve_with_incoming_shutdown(incoming, stopped(stop.clone()));
        Ok(tokio::spawn(async move {
            if let Err(e) = server.await {
                tracing::error!(error = %e, "gRPC server failed");
            }
        }))
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
    legacy_addr: Option<SocketAddr>,
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

    /// Where legacy nodes connect, if they are served.
    pub fn legacy_addr(&self) -> Option<SocketAddr> {
        self.legacy_addr
    }

    /// Asks the ledger a monitor question (see [`Subject`]), every row
    /// of its answer.
    pub async fn monitor(&self, subject: Subject, range: SlotRange) -> Option<Value> {
        let view = ask(&self.commands, subject, range, Page::ALL).await?;
        Some(http::monitor::to_json(&view))
    }

    /// Asks the ledger a monitor question, a page of its answer.
    pub async fn monitor_page(
        &self,
        subject: Subject,
        range: SlotRange,
        page: Page,
    ) -> Option<MonitorView> {
        ask(&self.commands, subject, range, page).await
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
        rx.await.ok().map(|view| http::monitor::to_json(&view))
    }

    async fn shutdown_with(self, snapshot: Option<(Subject, oneshot::Sender<MonitorView>)>) {
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
