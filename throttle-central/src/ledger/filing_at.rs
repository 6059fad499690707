//! [`Filing`]: where a report's entries go.

use super::charge::Charge;
use super::ids::NodeId;

/// Where a usage's entries are filed: by which node, for which data slot,
/// as consumption or rejection, and when.
#[derive(Debug, Clone, Copy)]
pub(super) struct Filing {
    pub(super) node: NodeId,
    pub(super) slot: i64,
    pub(super) is_rejection: bool,
    /// How the buckets are charged (see `Ledger::charge_of`).
    pub(super) charge: Charge,
    pub(super) max_amount: i64,
    pub(super) now_ms: i64,
}
