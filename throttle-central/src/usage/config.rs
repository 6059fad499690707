//! A central's usage store and its settings ([`UsageConfig`]).

use std::path::Path;
use std::sync::Arc;
use std::sync::mpsc::sync_channel;

use throttle_clock::{Clock, SlotLength};

use super::error::UsageError;
use super::postgres::PostgresUsage;
use super::retention::Retention;
use super::sqlite::SqliteUsage;
use super::store::UsageStore;
use super::writer::{DEFAULT_BUFFER, UsageWriter};
use throttle_core::usage_tap::{QUEUE, UsageTap};

/// Where usage is kept and for how long, for
/// [`CentralBuilder::usage`](crate::CentralBuilder::usage).
#[derive(Clone)]
pub struct UsageConfig {
    /// The store.
    pub store: Arc<dyn UsageStore>,
    /// How long each resolution is kept.
    pub retention: Retention,
    /// Most entries kept while the store cannot be written.
    pub buffer: usize,
}

impl std::fmt::Debug for UsageConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UsageConfig")
            .field("retention", &self.retention)
            .field("buffer", &self.buffer)
            .finish_non_exhaustive()
    }
}

impl UsageConfig {
    /// Opens the store `url` names: `sqlite:PATH` or
    /// `postgres://user@host:port/db` (`postgresql://` too), with the
    /// default retention and buffer. It blocks: call it off async tasks.
    ///
    /// # Errors
    ///
    /// An unknown scheme, or a store that cannot be opened.
    pub fn open(url: &str) -> Result<Self, UsageError> {
        let store: Arc<dyn UsageStore> = if let Some(path) = url.strip_prefix("sqlite:") {
            Arc::new(SqliteUsage::open(Path::new(path))?)
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Arc::new(PostgresUsage::open(url)?)
        } else {
            return Err(UsageError::BadUrl(url.to_owned()));
        };
        Ok(Self {
            store,
            retention: Retention::default(),
            buffer: DEFAULT_BUFFER,
        })
    }

    /// Starts the writer's thread; answers the tap the ledger files
    /// into. The thread ends, after writing what is left, once every tap
    /// is dropped.
    ///
    /// # Errors
    ///
    /// When the thread cannot be started.
    pub(crate) fn start(
        &self,
        slot: SlotLength,
        max_amount: i64,
        clock: Arc<dyn Clock>,
    ) -> std::io::Result<(UsageTap, std::thread::JoinHandle<()>)> {
        let (tx, rx) = sync_channel(QUEUE);
        let mut retention = self.retention;
        // Marks outlive any report a node may send again.
        retention.marks = retention.marks.max(super::retention::MIN_MARKS_KEPT);
        let writer = UsageWriter {
            store: self.store.clone(),
            rx,
            slot,
            max_amount,
            retention,
            clock,
            buffer: self.buffer,
        };
        let thread = std::thread::Builder::new()
            .name("usage-writer".into())
            .spawn(move || writer.run())?;
        Ok((UsageTap::new(tx), thread))
    }
}
