//! How a service's stored tokens are split between nodes.
//!
//! Each service has one [`Policy`], as each service of the original central
//! node was a module with `consume`, `get_quota` and `assign`. The ledger
//! calls [`Policy::consume`] after filing each report, [`Policy::assign`]
//! once per slot, and [`Policy::quota_for`] to answer a report.
//!
//! - [`Classic`]: the original algorithm, kept exactly.

mod classic;

use std::collections::BTreeMap;
use std::fmt;

pub use classic::Classic;
use throttle_proto::v1;

use crate::ledger::{Map, NodeId, ServiceState};

/// Quotas of one slot: node -> user -> resource -> amount.
pub type Assignment = Map<NodeId, v1::UserQuotas>;

/// A quota strategy for one service; see the [module docs](self).
pub trait Policy: Send + fmt::Debug {
    /// Short name, for logs and the monitor.
    fn name(&self) -> &'static str;

    /// Called after the ledger filed a report of `node` for data slot `slot`.
    fn consume(&mut self, state: &ServiceState, node: NodeId, slot: i64, now_ms: i64) {
        let _ = (state, node, slot, now_ms);
    }

    /// Computes every node's quota for `slot`.
    fn assign(&mut self, state: &ServiceState, slot: i64, now_ms: i64) -> Assignment;

    /// The quota of `node` for `slot`; by default what [`Policy::assign`]
    /// computed, found in `book` (slot -> assignment).
    fn quota_for(
        &mut self,
        state: &ServiceState,
        book: &BTreeMap<i64, Assignment>,
        node: NodeId,
        slot: i64,
        now_ms: i64,
    ) -> Option<v1::UserQuotas> {
        let _ = (state, now_ms);
        book.get(&slot)?.get(&node).cloned()
    }

    /// Drops whatever the policy keeps about slots before `slot`.
    fn forget_before(&mut self, slot: i64) {
        let _ = slot;
    }
}
