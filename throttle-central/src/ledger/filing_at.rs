//! [`Filing`]: where a report's entries go.

use super::ids::NodeId;

/// Where a usage's entries are filed: by which node, for which data slot,
/// as consumption or rejection, and when.
#[derive(Debug, Clone, Copy)]
pub(super) struct Filing {
    pub(super) node: NodeId,
    pub(super) slot: i64,
    pub(super) is_rejection: bool,
    /// Whether the buckets are charged (see `Ledger::charges`).
    pub(super) charge: bool,
    /// A slot that has passed: its report comes after a gap, and is
    /// charged first to the refill the buckets spilled meanwhile.
    pub(super) late: bool,
    /// A slot before the ledger began (`Ledger::before_start`).
    pub(super) before_start: bool,
    pub(super) max_amount: i64,
    pub(super) now_ms: i64,
}
