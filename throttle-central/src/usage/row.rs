//! One stored row ([`UsageRow`]).

use super::cursor::RowCursor;

/// One stored row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageRow {
    /// The start of its minute, hour or day (Unix seconds, UTC).
    pub start_s: i64,
    /// The user.
    pub user: String,
    /// The resource.
    pub resource: String,
    /// Amount admitted.
    pub admitted: i64,
    /// Amount refused.
    pub refused: i64,
}

impl UsageRow {
    /// The cursor that asks for the rows after this one.
    pub fn cursor(&self) -> RowCursor {
        RowCursor {
            start_s: self.start_s,
            user: self.user.clone(),
            resource: self.resource.clone(),
        }
    }
}
