//! [`Filing`]: where a report's entries go.

use super::charge::Charge;
use super::ids::NodeId;

/// Where a usage's entries are filed: by which node, for which data slot,
/// as consumption or rejection, and when.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Filing {
    pub(crate) node: NodeId,
    pub(crate) slot: i64,
    pub(crate) is_rejection: bool,
    /// How the buckets are charged (see `Ledger::charge_of`).
    pub(crate) charge: Charge,
    /// The slots before this one that its node never reported (a proxy's
    /// lost stream), charged again late at this slot's amounts (see
    /// `ledger::gaps`).
    pub(crate) gap: i64,
    pub(crate) max_amount: i64,
    pub(crate) now_ms: i64,
    /// When the buckets of a key this filing meets first start: the
    /// slot's start for a slot that has passed ([`Charge::Late`]), whose
    /// refill since then the capacity turns away and keeps for it, as
    /// for a key met on time; `now_ms` otherwise.
    pub(crate) met_ms: i64,
}
