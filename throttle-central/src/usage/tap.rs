//! Where filed reports leave the ledger's task for the usage store
//! ([`UsageTap`]).

use std::sync::mpsc::{SyncSender, TrySendError};

use throttle_clock::SlotLength;

use super::filed::FiledUsage;
use crate::ledger::ReportSource;
use crate::log::Throttled;

/// Reports filed and not yet taken by the writer.
pub(super) const QUEUE: usize = 4_096;

/// The ledger's end of the queue to the usage writer: never waits; a
/// report the queue has no room for is counted as lost and logged.
#[derive(Debug, Clone)]
pub(crate) struct UsageTap {
    tx: SyncSender<FiledUsage>,
    slot: SlotLength,
    max_amount: i64,
}

static LOST: Throttled = Throttled::new();

/// Counts and logs (at most once a second) `entries` that could not be
/// kept, and why.
pub(crate) fn lost(entries: usize, reason: &'static str) {
    metrics::counter!("throttle_central_usage_lost_entries_total", "reason" => reason)
        .increment(entries as u64);
    if let Some(skipped) = LOST.allow_now() {
        tracing::error!(
            entries,
            reason,
            skipped,
            "usage entries lost: not written to the usage store"
        );
    }
}

impl UsageTap {
    /// A tap sending into `tx`, for a ledger of `slot` and `max_amount`.
    pub(crate) fn new(tx: SyncSender<FiledUsage>, slot: SlotLength, max_amount: i64) -> Self {
        Self {
            tx,
            slot,
            max_amount,
        }
    }

    /// Hands the usage of `report`, which the ledger took, to the writer.
    /// Sent again or not, it goes: the store decides what it has written.
    pub(crate) fn filed<R: ReportSource>(&self, report: &R) {
        let start_ms = self.slot.start_ms(report.slot_number() - 1);
        let usage = FiledUsage::of(report, start_ms, self.max_amount);
        if usage.entries.is_empty() {
            return;
        }
        match self.tx.try_send(usage) {
            Ok(()) => {}
            Err(TrySendError::Full(u)) => lost(u.entries.len(), "queue_full"),
            Err(TrySendError::Disconnected(u)) => lost(u.entries.len(), "stopped"),
        }
    }
}
