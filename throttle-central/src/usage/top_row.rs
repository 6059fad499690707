//! One user's totals over a range ([`TopRow`]).

/// One user's totals over a [`TopQuery`](super::TopQuery)'s range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopRow {
    /// The user.
    pub user: String,
    /// Amount admitted over the range.
    pub admitted: i64,
    /// Amount refused over the range.
    pub refused: i64,
}
