//! The backends' one trait ([`UsageStore`]).

use super::error::UsageError;
use super::filed::FiledUsage;
use super::retention::Retention;
use super::{RowsQuery, TopQuery, TopRow, UsageRow};

/// What one [`UsageStore::write`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Written {
    /// Reports written for the first time.
    pub reports: usize,
    /// Reports already written (sent again), left out.
    pub repeated: usize,
    /// Rows added to, over the three tables.
    pub rows: usize,
}

/// A place usage is kept: the minute, hour and day tables and the marks
/// of the reports written. Calls block; the central makes them off its
/// async tasks.
pub trait UsageStore: Send + Sync + 'static {
    /// Writes `batch` in one transaction: each report whose (node, slot)
    /// is not marked yet is marked and added to its minute, hour and day
    /// rows; the others are left out. Nothing is written on an error.
    ///
    /// # Errors
    ///
    /// When the store cannot be reached or refuses the transaction.
    fn write(&self, batch: &[FiledUsage]) -> Result<Written, UsageError>;

    /// Deletes what `retention` no longer keeps at `now_s`; answers the
    /// rows and marks deleted.
    ///
    /// # Errors
    ///
    /// As [`UsageStore::write`].
    fn prune(&self, retention: &Retention, now_s: i64) -> Result<u64, UsageError>;

    /// A page of rows.
    ///
    /// # Errors
    ///
    /// As [`UsageStore::write`].
    fn rows(&self, query: &RowsQuery) -> Result<Vec<UsageRow>, UsageError>;

    /// The heaviest users of a range.
    ///
    /// # Errors
    ///
    /// As [`UsageStore::write`].
    fn top(&self, query: &TopQuery) -> Result<Vec<TopRow>, UsageError>;

    /// The resources of `service` with rows in `query`'s table and range.
    ///
    /// # Errors
    ///
    /// As [`UsageStore::write`].
    fn resources(&self, query: &TopQuery) -> Result<Vec<String>, UsageError>;
}
