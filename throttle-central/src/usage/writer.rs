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
/// The default of `--usage-buffer` (`UsageConfig::buffer`): entries kept
/// while the store is down (about 150 bytes each), twice a batch.
pub const DEFAULT_BUFFER: usize = 2 * BATCH_ENTRIES;

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
            // Past a batch the rest waits in the queue while the store
            // takes writes; while it does not, the buffer holds more.
            while (pending.entries() < self.batch() || Instant::now() < retry_at)
                && let Ok(report) = self.rx.try_recv()
            {
                self.keep(&mut pending, &report);
            }
            let now = Instant::now();
            let due = last_write.elapsed() >= WRITE_EVERY || pending.entries() >= self.batch();
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
            let batch = pending.next_batch(self.batch());
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

    /// Most entries a transaction writes: [`BATCH_ENTRIES`], or half the
    /// buffer if that is less, so that the reports drained while a batch
    /// fills always have room.
    fn batch(&self) -> usize {
        BATCH_ENTRIES.min(self.buffer / 2).max(1)
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::mpsc::sync_channel;

    use parking_lot::Mutex;
    use throttle_clock::ManualClock;
    use throttle_proto::v1;

    use super::*;
    use crate::usage::{RowsQuery, TopQuery, TopRow, UsageError, UsageRow, Written};

    /// A store that records the entries of each batch it is given.
    #[derive(Default)]
    struct Recorded(Mutex<Vec<usize>>);

    impl UsageStore for Recorded {
        fn write(&self, batch: &[FiledUsage]) -> Result<Written, UsageError> {
            let entries = batch.iter().map(|r| r.entries.len()).sum();
            self.0.lock().push(entries);
            Ok(Written {
                reports: batch.len(),
                repeated: 0,
                rows: entries,
            })
        }
        fn prune(&self, _: &Retention, _: i64) -> Result<u64, UsageError> {
            Ok(0)
        }
        fn rows(&self, _: &RowsQuery) -> Result<Vec<UsageRow>, UsageError> {
            Ok(Vec::new())
        }
        fn top(&self, _: &TopQuery) -> Result<Vec<TopRow>, UsageError> {
            Ok(Vec::new())
        }
        fn resources(&self, _: &TopQuery) -> Result<Vec<String>, UsageError> {
            Ok(Vec::new())
        }
    }

    /// A node's report of one user's request in slot `slot`.
    fn report(node: usize, slot: i64) -> OwnedReport {
        let amounts = v1::Amounts {
            resources: BTreeMap::from([("requests".to_owned(), 1)]),
        };
        let usage = v1::Usage {
            users: BTreeMap::from([("alice".to_owned(), amounts)]),
        };
        OwnedReport::Decoded(v1::Report {
            node_id: format!("node-{node}"),
            slot_number: slot,
            consumption: BTreeMap::from([("front".to_owned(), usage)]),
            ..Default::default()
        })
    }

    #[test]
    fn a_queue_longer_than_the_buffer_is_written_in_batches_and_nothing_lost() {
        let (tx, rx) = sync_channel(64);
        for node in 0..12 {
            tx.send(report(node, 100)).expect("queued");
        }
        drop(tx);
        let store = Arc::new(Recorded::default());
        let writer = UsageWriter {
            store: store.clone(),
            rx,
            slot: SlotLength::from_ms(1000).expect("a slot"),
            max_amount: 1_000_000,
            retention: Retention::default(),
            clock: Arc::new(ManualClock::new(101_000)),
            buffer: 10,
        };
        writer.run();
        let batches = store.0.lock().clone();
        // Half the buffer a batch, and all twelve written, where draining
        // the queue whole into a buffer of ten would lose two.
        assert!(batches.iter().all(|&n| n <= 5), "{batches:?}");
        assert_eq!(batches.iter().sum::<usize>(), 12, "{batches:?}");
    }
}
