//! The leader's checkpoints (see [`crate::ha::state`]): the last one restored
//! at the start of each leadership, before any node stream is welcomed
//! under it, and a new one written every few slots while it lasts.

use std::sync::Arc;
use std::time::Duration;

use metrics::{counter, gauge, histogram};
use prost::Message;
use throttle_proto::v1;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

use super::command::Command;
use crate::ha::leadership::Leadership;
use crate::ha::state::{StateError, StateStore};
use crate::log::Throttled;

/// How often the keeper looks at the leadership.
const LOOK: Duration = Duration::from_millis(20);

/// Attempts at reading the checkpoint before leading without it.
const LOAD_ATTEMPTS: u32 = 3;

/// Lines about failed writes, at most once a second.
static SAVE_FAILED: Throttled = Throttled::new();

/// The longest a stream waits for a new leadership's checkpoint to be
/// restored before it is refused (the node tries again).
const RESTORE_WAIT: Duration = Duration::from_secs(2);

/// Waits until the checkpoint of the leadership of `epoch` is back in the
/// ledger (a report filed before it would be charged twice), at most
/// [`RESTORE_WAIT`]; true once it is, or when there is no checkpoint to
/// wait for (`restored` is `None`: no state store).
pub(crate) async fn restored(restored: Option<&watch::Receiver<Option<u64>>>, epoch: u64) -> bool {
    let Some(restored) = restored else {
        return true;
    };
    let mut restored = restored.clone();
    let wait = restored.wait_for(|r| *r == Some(epoch));
    matches!(tokio::time::timeout(RESTORE_WAIT, wait).await, Ok(Ok(_)))
}

/// Restores and writes checkpoints; see the module docs.
pub(crate) struct Keeper {
    pub(crate) store: Arc<dyn StateStore>,
    pub(crate) leadership: Arc<dyn Leadership>,
    pub(crate) commands: mpsc::Sender<Command>,
    /// The epoch whose leadership has its checkpoint restored: streams
    /// wait for it before their Welcome.
    pub(crate) restored: watch::Sender<Option<u64>>,
    /// Time between two checkpoints.
    pub(crate) every: Duration,
}

impl Keeper {
    /// Runs until `stop`; a leader then writes one last checkpoint.
    pub(crate) async fn run(self, mut stop: watch::Receiver<bool>) {
        let mut next_save = Instant::now();
        loop {
            if self.leadership.is_leader() {
                let epoch = self.leadership.epoch();
                if *self.restored.borrow() != Some(epoch) {
                    self.restore(epoch).await;
                    next_save = Instant::now() + self.every;
                } else if Instant::now() >= next_save {
                    self.save().await;
                    next_save += self.every;
                    next_save = next_save.max(Instant::now());
                }
            }
            tokio::select! {
                () = tokio::time::sleep(LOOK) => {}
                _ = stop.wait_for(|s| *s) => break,
            }
        }
        if self.leadership.is_leader() && self.restored.borrow().is_some() {
            let last = self.save();
            let _ = tokio::time::timeout(Duration::from_secs(1), last).await;
        }
    }

    /// Puts the stored checkpoint in the ledger (or leads without one, if
    /// it cannot be read), then lets streams of `epoch` in.
    async fn restore(&self, epoch: u64) {
        let started = Instant::now();
        let mut loaded = self.store.load().await;
        for _ in 1..LOAD_ATTEMPTS {
            if loaded.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            loaded = self.store.load().await;
        }
        let checkpoint = loaded.and_then(|bytes| {
            bytes
                .map(|b| v1::Checkpoint::decode(b).map_err(|e| StateError::Corrupt(e.to_string())))
                .transpose()
        });
        match checkpoint {
            Ok(Some(checkpoint)) => self.put_back(checkpoint).await,
            Ok(None) => tracing::info!(
                store = self.store.describe(),
                "no checkpoint; starting afresh"
            ),
            Err(error) => {
                counter!("throttle_central_state_errors_total", "op" => "load").increment(1);
                tracing::error!(store = self.store.describe(), %error, "checkpoint not restored; leading without it");
            }
        }
        histogram!("throttle_central_restore_seconds").record(started.elapsed().as_secs_f64());
        self.restored.send_replace(Some(epoch));
    }

    /// Has the ledger restore `checkpoint`.
    async fn put_back(&self, checkpoint: v1::Checkpoint) {
        let taken_ms = checkpoint.taken_ms;
        let (reply, rx) = oneshot::channel();
        let restore = Command::Restore {
            checkpoint: Box::new(checkpoint),
            reply,
        };
        if self.commands.send(restore).await.is_err() {
            return;
        }
        match rx.await {
            Ok(Ok(r)) => tracing::info!(
                store = self.store.describe(),
                taken_ms,
                buckets = r.buckets,
                skipped = r.skipped,
                "checkpoint restored"
            ),
            Ok(Err(error)) => {
                counter!("throttle_central_state_errors_total", "op" => "restore").increment(1);
                tracing::error!(%error, "checkpoint not restored; leading without it");
            }
            Err(_) => {}
        }
    }

    /// Writes the ledger's checkpoint.
    async fn save(&self) {
        let (reply, rx) = oneshot::channel();
        if self
            .commands
            .send(Command::Checkpoint { reply })
            .await
            .is_err()
        {
            return;
        }
        let Ok(checkpoint) = rx.await else {
            return;
        };
        let bytes = checkpoint.encode_to_vec();
        gauge!("throttle_central_checkpoint_bytes").set(bytes.len() as f64);
        let started = Instant::now();
        match self.store.save(bytes.into()).await {
            Ok(()) => {
                histogram!("throttle_central_checkpoint_seconds")
                    .record(started.elapsed().as_secs_f64());
            }
            Err(error) => {
                counter!("throttle_central_state_errors_total", "op" => "save").increment(1);
                if let Some(skipped) = SAVE_FAILED.allow_now() {
                    tracing::warn!(store = self.store.describe(), %error, skipped, "checkpoint not written");
                }
            }
        }
    }
}
