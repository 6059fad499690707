//! A page of rows asked of the usage store ([`RowsQuery`]).

use super::cursor::RowCursor;
use super::step::Step;

/// Rows of one service over `[from_s, to_s)`, in (start, user, resource)
/// order, a page at a time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowsQuery {
    /// The table read.
    pub step: Step,
    /// The service.
    pub service: String,
    /// Only this user's rows, if set.
    pub user: Option<String>,
    /// Only this resource's rows, if set.
    pub resource: Option<String>,
    /// The first start included (Unix seconds).
    pub from_s: i64,
    /// The first start left out.
    pub to_s: i64,
    /// Rows after this one only: the last row of the page before.
    pub after: Option<RowCursor>,
    /// Most rows answered.
    pub limit: usize,
}
