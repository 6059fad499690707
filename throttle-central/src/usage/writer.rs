//! The thread that writes filed usage to the store ([`UsageWriter`]).

use std::sync::Arc;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use throttle_clock::{Clock, SlotLength};

use super::filed::FiledUsage;
use super::pending::Pending;
use super::retention::Retention;
use super::store::UsageStore;
use crate::ledger::OwnedReport;
use crate::log::Throttled;
use throttle_core::usage_tap::lost;

/// How often waiting reports are written: well within the two slots a
/// minute's rows may lag its last report.
pub(super) const WRITE_EVERY: Duration = Duration::from_millis(250);
/// Most entries one transaction writes. A transaction's upserts are its
/// rows, not its entries (see `Rollup`), so a large batch costs the
/// database no more than its keys: a slot of 1,000 nodes x 1,000 users x
/// 4 resources is 4 M entries but 12,000 rows.
pub const BATCH_ENTRIES: usize = 1_000_000;
/// The wait after a failed write, doubled up to [`MAX_BACKOFF`].
const MIN_BACKOFF: Duration = Duration::from_millis(250);
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// How often rows past their retention are deleted.
const PRUNE_EVERY: Duration = Duration::from_secs(60);
/// The default bound of [`Pending`]: entries kept while the store is
/// down.
pub(super) const DEFAULT_BUFFER: usize = 1_000_000;

static FAILED: Throttled = Throttled::new();

/// Takes filed reports from the ledger's tap, keeps them in a bounded
/// buffer and writes them in batches; a failed write is tried again after
/// a backoff, the reports kept meanwhile.
pub(crate) struct UsageWriter {
    pub(super) store: Arc<dyn UsageStore>,
    pub(super) rx: Receiver<OwnedReport>,
    /// The slot length: a data slot's minute.
    pub(super) slot: SlotLength,
    /// The ledger's most amount: larger ones are left out, as it does.
    pub(super) max_amount: i64,
    pub(super) retention: Retention,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) buffer: usize,
}

impl UsageWriter {
    /// Runs until every tap is dropped, then writes what is left.
    pub(crate) fn run(self) {
        let mut pending = Pending::new(self.buffer);
        let mut backoff = MIN_BACKOFF;
        let mut retry_at = Instant::now();
        let mut last_write = Instant::now();
        let mut next_prune = Instant::now();
        loop {
            let open = match self.rx.recv_timeout(WRITE_EVERY) {
                Ok(report) => {
                    self.keep(&mut pending, &report);
                    true
                }
                Err(RecvTimeoutError::Timeout) => true,
                Err(RecvTimeoutError::Disconnected) => false,
            };
            while let Ok(report) = self.rx.try_recv() {
                self.keep(&mut pending, &report);
            }
            let now = Instant::now();
            let due = last_write.elapsed() >= WRITE_EVERY || pending.entries() >= BATCH_ENTRIES;
            let may = now >= retry_at || !open;
            if (due || !open) && may && !pending.is_empty() {
                last_write = now;
                match self.write_all(&mut pending) {
                    Ok(()) => backoff = MIN_BACKOFF,
                    Err(()) => {
                        retry_at = now + backoff;
                        backoff = (backoff * 2).min(MAX_BACKOFF);
                    }
                }
            }
            metrics::gauge!("throttle_central_usage_pending_entries").set(pending.entries() as f64);
            if !open {
                if !pending.is_empty() {
                    lost(pending.len(), "stopped");
                }
                return;
            }
            if now >= next_prune {
                next_prune = now + PRUNE_EVERY;
                self.prune();
            }
        }
    }

    /// Writes every waiting report, a batch at a time, until one fails.
    fn write_all(&self, pending: &mut Pending) -> Result<(), ()> {
        pending.settle();
        while !pending.is_empty() {
            let batch = pending.next_batch(BATCH_ENTRIES);
            match self.store.write(batch) {
                Ok(w) => {
                    metrics::counter!("throttle_central_usage_reports_written_total")
                        .increment(w.reports as u64);
                    metrics::counter!("throttle_central_usage_reports_repeated_total")
                        .increment(w.repeated as u64);
                    metrics::counter!("throttle_central_usage_rows_written_total")
                        .increment(w.rows as u64);
                    let n = batch.len();
                    pending.written(n);
                }
                Err(e) => {
                    metrics::counter!("throttle_central_usage_write_errors_total").increment(1);
                    if let Some(skipped) = FAILED.allow_now() {
                        let waiting = pending.entries();
                        tracing::warn!(error = %e, waiting, skipped, "usage store write failed; kept to write again");
                    }
                    return Err(());
                }
            }
        }
        Ok(())
    }

    fn prune(&self) {
        let now_s = self.clock.now_ms().div_euclid(1000);
        if let Err(e) = self.store.prune(&self.retention, now_s) {
            metrics::counter!("throttle_central_usage_write_errors_total").increment(1);
            if let Some(skipped) = FAILED.allow_now() {
                tracing::warn!(error = %e, skipped, "usage store retention failed; tried again later");
            }
        }
    }
}

impl UsageWriter {
    /// Reads `report`'s entries into `pending`, or counts it as lost when
    /// there is no room.
    fn keep(&self, pending: &mut Pending, report: &OwnedReport) {
        let slot_number = match report {
            OwnedReport::Raw(_, raw) => raw.slot_number(),
            OwnedReport::Decoded(decoded) => decoded.slot_number,
        };
        let start_ms = self.slot.start_ms(slot_number - 1);
        let usage = FiledUsage::of_owned(report, start_ms, self.max_amount);
        if !usage.entries.is_empty() && pending.push(usage).is_err() {
            lost(1, "buffer_full");
        }
    }
}
