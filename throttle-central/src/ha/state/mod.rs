//! Where the leader keeps its checkpoint (`Ledger::checkpoint`), so
//! that a new leader, or the same central restarted, does not hand every
//! throttled user a fresh burst.
//!
//! - [`FileState`]: a file, for a lone central (`--state PATH`);
//! - [`EtcdState`]: etcd, beside the election, for centrals that take over
//!   from one another (`--etcd ... --state etcd`).
//!
//! The leader writes a checkpoint every few slots; the next leader reads
//! the last one before it accepts a node stream, and nodes send again the
//! reports they kept (see `Report.answered`), which bring back the sums
//! and whatever was charged after the checkpoint.

mod etcd;
mod file;

use std::fmt;

use bytes::Bytes;
use futures_util::future::BoxFuture;

pub use etcd::EtcdState;
pub use file::FileState;

/// Why a checkpoint could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// The file could not be read or written.
    #[error("{path}: {error}")]
    Io {
        /// The file.
        path: String,
        /// What the system said.
        error: std::io::Error,
    },
    /// etcd could not be reached, or refused.
    #[error("etcd: {0}")]
    Etcd(String),
    /// This central no longer leads: another one writes the checkpoint.
    #[error("not the leader any more; the checkpoint is left to the new one")]
    Deposed,
    /// What was read is not a checkpoint.
    #[error("the stored checkpoint is unreadable: {0}")]
    Corrupt(String),
}

/// A place that holds one checkpoint (the encoded `v1::Checkpoint`).
pub trait StateStore: Send + Sync + fmt::Debug + 'static {
    /// The last checkpoint saved, if there is one.
    fn load(&self) -> BoxFuture<'_, Result<Option<Bytes>, StateError>>;
    /// Replaces the checkpoint with `checkpoint`.
    fn save(&self, checkpoint: Bytes) -> BoxFuture<'_, Result<(), StateError>>;
    /// Where it is, for logs.
    fn describe(&self) -> String;
}
