//! The heaviest users of a range: the query ([`TopQuery`]) and one
//! user's totals ([`TopRow`]).

use super::step::Step;

/// The `n` users of `service` with the most admitted of `resource` over
/// `[from_s, to_s)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopQuery {
    /// The table read.
    pub step: Step,
    /// The service.
    pub service: String,
    /// The resource ranked.
    pub resource: String,
    /// The first start included (Unix seconds).
    pub from_s: i64,
    /// The first start left out.
    pub to_s: i64,
    /// Most users answered.
    pub n: usize,
}

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
