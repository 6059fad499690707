//! [`Reporter`] and its builder.

use std::time::Duration;

use throttle_proto::auth::Credentials;
use tonic::transport::ClientTlsConfig;

use super::dial;
use super::error::ReporterError;
use super::handle::ReporterHandle;
use super::run::Run;
use super::settings::Settings;
use crate::store::SlotStore;

/// Entry point: [`Reporter::builder`].
#[derive(Debug, Clone, Copy)]
pub struct Reporter;

/// Configures the reporter task.
#[derive(Debug)]
pub struct ReporterBuilder {
    settings: Settings,
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
        let settings = Settings {
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
        };
        ReporterBuilder { settings }
    }
}

impl ReporterBuilder {
    /// Starts the task. Must be called within a Tokio runtime.
    ///
    /// # Errors
    ///
    /// [`ReporterError`] for a missing or invalid endpoint or node id.
    pub fn spawn(self) -> Result<ReporterHandle, ReporterError> {
        let cfg = &self.settings;
        if cfg.endpoints.is_empty() {
            return Err(ReporterError::NoEndpoint);
        }
        if cfg.node_id.is_empty() || cfg.node_id.len() > throttle_proto::MAX_NAME_LEN {
            return Err(ReporterError::InvalidNodeId);
        }
        for e in &cfg.endpoints {
            dial::endpoint(e, cfg.connect_timeout, cfg.tls.as_ref())?;
        }
        let half_slot = cfg.store.slot_length().as_duration() / 2;
        if cfg.report_delay.saturating_add(cfg.report_spread) >= half_slot {
            return Err(ReporterError::ReportsPastMidSlot {
                delay: cfg.report_delay,
                spread: cfg.report_spread,
                half_slot,
            });
        }
        let report_after = self.report_at();
        tracing::debug!(node = %cfg.node_id, after_boundary = ?report_after, "reports scheduled");
        Ok(Run::spawn(self.settings, report_after))
    }

    /// Adds a central endpoint, e.g. `http://127.0.0.1:7075`; the first one
    /// is tried first.
    pub fn central(mut self, endpoint: impl Into<String>) -> Self {
        self.settings.endpoints.push(endpoint.into());
        self
    }

    /// How long after a slot boundary the report is sent (default 50 ms).
    pub fn report_delay(mut self, delay: Duration) -> Self {
        self.settings.report_delay = delay;
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
        self.settings.report_spread = spread;
        self
    }

    /// When after each slot boundary this node sends its report
    /// ([`report_point`] of its id, delay and spread).
    pub fn report_at(&self) -> Duration {
        report_point(
            &self.settings.node_id,
            self.settings.report_delay,
            self.settings.report_spread,
        )
    }

    /// Most reports kept (default 60), answered or not; older ones are
    /// dropped (an unanswered one dropped is counted and logged). The
    /// answered ones go again to a central with a new ledger, which sums
    /// the kept history from them: a node of large reports spends this
    /// many reports' bytes of memory on them.
    pub fn max_buffered(mut self, max: usize) -> Self {
        self.settings.max_buffered = max.max(1);
        self
    }

    /// Connect timeout per attempt (default 1 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.settings.connect_timeout = timeout;
        self
    }

    /// Largest message accepted from the central node, in bytes (default
    /// 64 MiB; tonic's own default, 4 MiB, is one slot's table for about
    /// 35,000 users of four resources). An answer over it fails the
    /// stream, which reconnects.
    pub fn max_message_bytes(mut self, max: usize) -> Self {
        self.settings.max_message_bytes = max;
        self
    }

    /// Signs every stream with this access key and secret (see
    /// [`throttle_proto::auth`]), for a central that requires node keys.
    pub fn credentials(
        mut self,
        access_key: impl Into<String>,
        secret_key: impl Into<String>,
    ) -> Self {
        self.settings.credentials = Some(Credentials::new(access_key, secret_key));
        self
    }

    /// Connects over TLS (every central must then be `https://`): the CA
    /// that the central's certificate chains to and, for a central that
    /// requires client certificates, this node's identity, e.g.
    /// `ClientTlsConfig::new().ca_certificate(ca).identity(identity)`.
    pub fn tls(mut self, tls: ClientTlsConfig) -> Self {
        self.settings.tls = Some(tls);
        self
    }

    /// Backoff bounds between attempts that failed (default 100 ms to
    /// 500 ms: a central that comes back is reached within half a second,
    /// and an attempt at an address nobody listens on costs next to
    /// nothing). A standby's redirect is followed after the least backoff,
    /// and does not lengthen the next one.
    pub fn backoff(mut self, min: Duration, max: Duration) -> Self {
        self.settings.backoff_min = min;
        self.settings.backoff_max = max.max(min);
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
