//! The ledger's timers: the mid-slot tick, the limits file's reloads, and
//! the watch of limits kept in etcd.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use metrics::{counter, gauge};
use throttle_clock::{Clock, SlotLength};
use tokio::sync::{mpsc, watch};

use super::command::Command;
use crate::keys::NodeKeys;
use crate::limits::{EtcdLimits, FileLimits, Snapshots};

/// Ticks the ledger at every mid-slot.
pub(crate) async fn ticker(
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

/// A file the central reads again when it changes.
pub(crate) trait Reloadable: Send + Sync + 'static {
    /// What it holds, for logs.
    const WHAT: &'static str;
    /// The file.
    fn path(&self) -> &Path;
    /// Reads it again (see [`Watched::poll`](crate::watched::Watched::poll)).
    fn poll(&self) -> Result<bool, String>;
    /// Whether the last read left no error standing.
    fn healthy(&self) -> bool;
    /// Records a reload's outcome in the metrics.
    fn count(ok: bool);
}

impl Reloadable for FileLimits {
    const WHAT: &'static str = "limits";

    fn path(&self) -> &Path {
        FileLimits::path(self)
    }

    fn poll(&self) -> Result<bool, String> {
        FileLimits::poll(self).map_err(|e| e.to_string())
    }

    fn healthy(&self) -> bool {
        self.snapshot_error().is_none()
    }

    fn count(ok: bool) {
        if !ok {
            counter!("throttle_central_limits_reload_errors_total").increment(1);
        }
        gauge!("throttle_central_limits_reload_ok").set(f64::from(u8::from(ok)));
    }
}

impl Reloadable for NodeKeys {
    const WHAT: &'static str = "node keys";

    fn path(&self) -> &Path {
        NodeKeys::path(self)
    }

    fn poll(&self) -> Result<bool, String> {
        NodeKeys::poll(self).map_err(|e| e.to_string())
    }

    fn healthy(&self) -> bool {
        self.last_error().is_none()
    }

    fn count(ok: bool) {
        if !ok {
            counter!("throttle_central_node_keys_reload_errors_total").increment(1);
        }
        gauge!("throttle_central_node_keys_reload_ok").set(f64::from(u8::from(ok)));
    }
}

/// Checks `file` every quarter slot (at most every 250 ms); a change, once
/// read the same twice, is applied, and the ledger's task is sent a tick
/// on `tick` (so new limits are assigned at once), if given.
pub(crate) async fn reloader<F: Reloadable>(
    file: Arc<F>,
    tick: Option<mpsc::Sender<Command>>,
    slot: SlotLength,
    mut stop: watch::Receiver<bool>,
) {
    let period =
        (slot.as_duration() / 4).clamp(Duration::from_millis(5), Duration::from_millis(250));
    let mut interval = tokio::time::interval(period);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The last poll failed: the next good one says so, and sets the gauge.
    let mut failing = false;
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
                failing = false;
                tracing::info!(%path, what = F::WHAT, "file reloaded");
                F::count(true);
                if let Some(commands) = &tick
                    && commands.send(Command::Tick).await.is_err()
                {
                    return;
                }
            }
            Ok(Ok(false)) => {
                if failing && file.healthy() {
                    failing = false;
                    tracing::info!(%path, what = F::WHAT, "file readable again, unchanged");
                    F::count(true);
                }
            }
            Ok(Err(e)) => {
                F::count(false);
                // Once per failure, not once per poll while it lasts.
                if !std::mem::replace(&mut failing, true) {
                    tracing::error!(%path, what = F::WHAT, error = %e, "reload failed; keeping the previous version");
                }
            }
            Err(e) => tracing::error!(error = %e, what = F::WHAT, "reload task failed"),
        }
    }
}

/// Follows the limits kept in etcd until `stop`; a change sends the
/// ledger's task a tick (so new limits are assigned at once). A watch that
/// fails is started again after a slot (at least 100 ms, at most 1 s).
pub(crate) async fn follow_etcd(
    etcd: Arc<EtcdLimits>,
    commands: mpsc::Sender<Command>,
    slot: SlotLength,
    stop: watch::Receiver<bool>,
) {
    // A tick lost to a full queue is made up by the next slot's own.
    let changed = move || {
        let _ = commands.try_send(Command::Tick);
    };
    let retry = slot
        .as_duration()
        .clamp(Duration::from_millis(100), Duration::from_secs(1));
    etcd.follow(changed, retry, stop).await;
}
