//! [`StreamSettings`]: what every proxy stream of the RLQS service reads.

use std::sync::Arc;

use throttle_clock::{Clock, SlotLength};
use tokio::sync::{mpsc, watch};

use crate::ha::leadership::Leadership;
use crate::ledger_task::Command;
use crate::limits::LimitSource;

/// The bucket id entry that names the user, unless a service sets
/// another (`[service.NAME] envoy_user_key`).
pub(super) const USER_KEY: &str = "user";

/// What every proxy stream reads: the ledger's task, the leadership, the
/// clock and slot, and the limits.
#[derive(Clone)]
pub(crate) struct StreamSettings {
    pub(crate) commands: mpsc::Sender<Command>,
    pub(crate) leadership: Arc<dyn Leadership>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) slot: SlotLength,
    /// With a state store: the epoch whose checkpoint is restored.
    pub(crate) restored: Option<watch::Receiver<Option<u64>>>,
    /// The largest count one bucket may report.
    pub(crate) max_amount: i64,
    /// The limits, which may name a service's user entry
    /// (`envoy_user_key`).
    pub(crate) limits: Arc<dyn LimitSource>,
    /// Seconds an assignment lives ([`super::DEFAULT_TTL`] unless set).
    pub(crate) ttl_s: i64,
}
