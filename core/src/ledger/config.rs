//! The ledger's settings, and the check of a report as a whole.

use throttle_clock::SlotLength;
use throttle_proto::MAX_NAME_LEN;

use super::source::ReportSource;
use crate::arena::ids::valid_name;

/// Settings of a [`Ledger`](super::Ledger).
#[derive(Debug, Clone)]
pub struct LedgerConfig {
    /// Slot length shared with the nodes.
    pub slot: SlotLength,
    /// How many slots of history to keep (the legacy system's `nr_slot`).
    pub nr_slot: u32,
    /// Most users one report may carry, over all its services.
    pub max_users_per_report: usize,
    /// Largest amount one node may report for one (user, resource) in one
    /// slot; an entry above it is dropped ([`DropReason::AmountTooLarge`]).
    ///
    /// [`DropReason::AmountTooLarge`]: super::DropReason::AmountTooLarge
    pub max_amount: i64,
    /// Most services the ledger holds: a node's Hello or report naming a
    /// new one past it has that service refused (limits may still add
    /// services).
    pub max_services: usize,
    /// Most (user, resource) keys the ledger holds over every service: an
    /// entry of a report that would add one past it is dropped
    /// ([`DropReason::TooManyKeys`](super::DropReason::TooManyKeys)); keys
    /// idle for the whole history are forgotten, which makes room again.
    /// Limits may still add keys.
    pub max_keys: usize,
}

/// The default of the central's `CentralBuilder::max_amount`: a petabyte (or 10^15
/// requests) per node and slot, far past any real use, and far enough from
/// `i64::MAX` that no sum of reports overflows a bucket into nonsense.
pub const MAX_AMOUNT: i64 = 1_000_000_000_000_000;

/// The default of the central's `CentralBuilder::max_keys`: four million (user, resource)
/// keys, about 0.8 GB of ledger when each is reported by one node
/// (`docs/performance.md`: 188-191 B per key and node).
pub const MAX_KEYS: usize = 4_000_000;

impl LedgerConfig {
    /// Whether a report may be filed at `now_ms`, on its own: its node id,
    /// how far its slot is from now, its number of users. The ledger's own
    /// check, which the gRPC server also runs before it answers a report
    /// ahead of filing it.
    ///
    /// # Errors
    ///
    /// The [`ReportError`] the ledger would refuse the report with.
    pub fn check<R: ReportSource>(&self, report: &R, now_ms: i64) -> Result<(), ReportError> {
        if !valid_name(report.node_id()) {
            return Err(ReportError::BadNodeId);
        }
        let current = self.slot.slot_at(now_ms);
        // A report's data is of the slot before its own: data of a slot
        // not yet begun is refused, as is data older than the history.
        let slot = report.slot_number();
        if slot > current.saturating_add(1)
            || slot < current.saturating_sub(i64::from(self.nr_slot))
        {
            return Err(ReportError::SlotOutOfRange {
                slot: report.slot_number(),
                current,
                nr_slot: self.nr_slot,
            });
        }
        let users = report.user_count();
        if users > self.max_users_per_report {
            return Err(ReportError::TooManyUsers {
                users,
                max: self.max_users_per_report,
            });
        }
        Ok(())
    }
}

impl Default for LedgerConfig {
    fn default() -> Self {
        Self {
            slot: SlotLength::SECOND,
            nr_slot: 60,
            max_users_per_report: 1_000_000,
            max_amount: MAX_AMOUNT,
            max_services: 10_000,
            max_keys: MAX_KEYS,
        }
    }
}

/// Why a report was refused as a whole.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReportError {
    /// `node_id` is empty or too long.
    #[error("node_id must be 1 to {MAX_NAME_LEN} bytes")]
    BadNodeId,
    /// The slot is more than `nr_slot` slots before the central's current
    /// slot, or after the next one (its data would be of a slot not yet
    /// begun).
    #[error(
        "slot {slot} is out of range: more than {nr_slot} slots away before the current slot {current}, or after the next"
    )]
    SlotOutOfRange {
        /// The report's slot.
        slot: i64,
        /// The central's current slot.
        current: i64,
        /// The retention.
        nr_slot: u32,
    },
    /// The report names more users than allowed.
    #[error("report carries {users} users, more than the limit of {max}")]
    TooManyUsers {
        /// Users in the report.
        users: usize,
        /// The configured maximum.
        max: usize,
    },
    /// A packed usage whose bits and amounts do not match.
    #[error("packed usage: {0}")]
    Packed(#[from] throttle_proto::PackedError),
}
