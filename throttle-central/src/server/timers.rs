//! The ledger's timers: the mid-slot tick, and the limits file's reloads.

use std::sync::Arc;
use std::time::Duration;

use metrics::{counter, gauge};
use throttle_clock::{Clock, SlotLength};
use tokio::sync::{mpsc, watch};

use super::command::Command;
use crate::limits::FileLimits;

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

/// Checks the limits file every quarter slot (at most every 250 ms); a
/// change, once read the same twice, is applied and assigned at once.
pub(crate) async fn reloader(
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
