//! [`Reporter`]: its builder, its handle and its status.

use std::time::Duration;

use throttle_proto::auth::Credentials;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tonic::transport::ClientTlsConfig;

use crate::store::SlotStore;

/// Entry point: [`Reporter::builder`].
#[derive(Debug, Clone, Copy)]
pub struct Reporter;

/// Configures the reporter task.
#[derive(Debug)]
pub struct ReporterBuilder {
    pub(super) store: SlotStore,
    pub(super) node_id: String,
    pub(super) endpoints: Vec<String>,
    pub(super) report_delay: Duration,
    pub(super) report_spread: Duration,
    pub(super) max_buffered: usize,
    pub(super) connect_timeout: Duration,
    pub(super) backoff_min: Duration,
    pub(super) backoff_max: Duration,
    pub(super) max_message_bytes: usize,
    pub(super) credentials: Option<Credentials>,
    pub(super) tls: Option<ClientTlsConfig>,
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
    /// A central's address has no scheme (`127.0.0.1:7075`): tonic would
    /// accept it and fail at every connect.
    #[error("central endpoint {0:?} has no scheme: write http://{0} (https:// with TLS)")]
    NoScheme(String),
    /// TLS is set but a central's address is not `https://`.
    #[error("central endpoint {0:?} must be https:// when TLS is set")]
    TlsNeedsHttps(String),
    /// A central's address is `https://` but no TLS is set
    /// ([`ReporterBuilder::tls`]).
    #[error("central endpoint {0:?} is https://: set the CA with .tls(..)")]
    HttpsNeedsTls(String),
    /// tonic refused the TLS settings.
    #[error("TLS settings: {0}")]
    Tls(String),
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
#[must_use = "dropping the handle stops the reporter: keep it as long as the app serves"]
pub struct ReporterHandle {
    pub(super) task: JoinHandle<()>,
    pub(super) status: watch::Receiver<ReporterStatus>,
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
            backoff_max: Duration::from_millis(500),
            max_message_bytes: 64 << 20,
            credentials: None,
            tls: None,
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
    /// (default 0: every node reports at the same moment, as the legacy system
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

    /// Most reports kept (default 60), answered or not; older ones are
    /// dropped (an unanswered one dropped is counted and logged). The
    /// answered ones go again to a central with a new ledger, which sums
    /// the kept history from them: a node of large reports spends this
    /// many reports' bytes of memory on them.
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

    /// Connects over TLS (every central must then be `https://`): the CA
    /// that the central's certificate chains to and, for a central that
    /// requires client certificates, this node's identity, e.g.
    /// `ClientTlsConfig::new().ca_certificate(ca).identity(identity)`.
    pub fn tls(mut self, tls: ClientTlsConfig) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Backoff bounds between attempts that failed (default 100 ms to
    /// 500 ms: a central that comes back is reached within half a second,
    /// and an attempt at an address nobody listens on costs next to
    /// nothing). A standby's redirect is followed after the least backoff,
    /// and does not lengthen the next one.
    pub fn backoff(mut self, min: Duration, max: Duration) -> Self {
        self.backoff_min = min;
        self.backoff_max = max.max(min);
        self
    }
}

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
pub(super) fn spread_offset(node_id: &str, spread: Duration) -> Duration {
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
