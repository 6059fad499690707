//! Where filed reports leave the ledger's task for the usage store
//! ([`UsageTap`]).

use std::sync::mpsc::{SyncSender, TrySendError};

use crate::ledger::{OwnedReport, ReportSource};
use crate::log::Throttled;

/// Reports filed and not yet taken by the writer.
pub const QUEUE: usize = 4_096;

/// The ledger's end of the queue to the usage writer: never waits; a
/// report the queue has no room for is counted as lost and logged. What
/// it costs the ledger's task is a copy of the report (of its bytes'
/// reading, for the reports of node streams); the writer's thread reads
/// the entries.
#[derive(Debug, Clone)]
pub struct UsageTap {
    tx: SyncSender<OwnedReport>,
}

static LOST: Throttled = Throttled::new();

/// Counts and logs (at most once a second) `reports` whose usage could
/// not be kept, and why.
pub fn lost(reports: usize, reason: &'static str) {
    metrics::counter!("throttle_central_usage_lost_reports_total", "reason" => reason)
        .increment(reports as u64);
    if let Some(skipped) = LOST.allow_now() {
        tracing::error!(
            reports,
            reason,
            skipped,
            "usage lost: reports not written to the usage store"
        );
    }
}

impl UsageTap {
    /// A tap sending into `tx`.
    pub fn new(tx: SyncSender<OwnedReport>) -> Self {
        Self { tx }
    }

    /// Hands `report`, which the ledger took, to the writer. Sent again
    /// or not, it goes: the store decides what it has written.
    pub fn filed<R: ReportSource>(&self, report: &R) {
        if report.user_count() == 0 {
            return;
        }
        match self.tx.try_send(report.to_owned_report()) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => lost(1, "queue_full"),
            Err(TrySendError::Disconnected(_)) => lost(1, "stopped"),
        }
    }
}
