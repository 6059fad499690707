//! How a service's stored tokens are split between nodes.
//!
//! Each service has one [`Policy`], as each service of the original central
//! node was a module with `consume`, `get_quota` and `assign`. The ledger
//! calls [`Policy::consume`] after filing each report, [`Policy::assign`]
//! once per slot, and [`Policy::quota_for`] to answer a report.
//!
//! - [`Projected`]: the default; see its docs.
//! - [`Classic`]: the original algorithm, kept exactly.
//! - [`StaticSplit`]: each node gets the rate divided by the number of
//!   active nodes; a baseline for comparisons.

mod classic;
mod projected;
mod split;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

pub use classic::Classic;
pub use projected::Projected;
pub use split::StaticSplit;
use throttle_proto::v1;

use crate::ledger::{Map, NodeId, ServiceState};

/// One node's quota for one (user, resource) in one slot.
#[derive(Debug, Clone, PartialEq)]
pub struct Grant {
    /// The user (shared with the ledger's key: no allocation).
    pub user: Arc<str>,
    /// The resource.
    pub resource: Arc<str>,
    /// How much the node may admit.
    pub amount: f64,
}

/// Quotas of one slot, per node. Compact: the protobuf message for a node is
/// built only when it is sent ([`to_user_quotas`]).
pub type Assignment = Map<NodeId, Vec<Grant>>;

/// [`Policy::quota_for`] for policies that assign one slot ahead at
/// mid-slot: a report is answered before the next slot is assigned, so
/// until then the node's grants of the slot before stand in, a safety net
/// should the coming push be lost. Answering never runs an assign, so
/// reports arriving together do not queue behind one.
pub(crate) fn quota_or_previous(
    book: &BTreeMap<i64, Assignment>,
    node: NodeId,
    slot: i64,
) -> Option<v1::UserQuotas> {
    let grants = match book.get(&slot) {
        Some(a) => a.get(&node),
        None => book.get(&(slot - 1))?.get(&node),
    };
    grants.map(|g| to_user_quotas(g))
}

/// The protobuf form of one node's grants.
pub fn to_user_quotas(grants: &[Grant]) -> v1::UserQuotas {
    let mut out = v1::UserQuotas::default();
    let mut last: Option<(&Arc<str>, &mut v1::ResourceQuotas)> = None;
    for g in grants {
        // Grants come grouped by user: look the user up once per group.
        let rq = match last {
            Some((u, rq)) if Arc::ptr_eq(u, &g.user) || **u == *g.user => rq,
            _ => out.users.entry(g.user.to_string()).or_default(),
        };
        rq.resources.insert(g.resource.to_string(), g.amount);
        last = Some((&g.user, rq));
    }
    out
}

/// A quota strategy for one service; see the [module docs](self).
pub trait Policy: Send + fmt::Debug {
    /// Short name, for logs and the monitor.
    fn name(&self) -> &'static str;

    /// Called after the ledger filed a report of `node` for data slot `slot`.
    fn consume(&mut self, state: &ServiceState, node: NodeId, slot: i64, now_ms: i64) {
        let _ = (state, node, slot, now_ms);
    }

    /// How many slots ahead of the current one [`Policy::assign`] computes,
    /// when run at mid-slot.
    fn lead(&self) -> i64 {
        2
    }

    /// Whether the central node should re-assign the *current* slot and push
    /// it as soon as every active node has reported the previous one
    /// (default: no, as the original).
    fn reassign_when_reported(&self) -> bool {
        false
    }

    /// Computes every node's quota for `slot`; `book` holds the quotas
    /// already assigned (slot -> assignment).
    fn assign(
        &mut self,
        state: &ServiceState,
        book: &BTreeMap<i64, Assignment>,
        slot: i64,
        now_ms: i64,
    ) -> Assignment;

    /// The quota of `node` for `slot`; by default what [`Policy::assign`]
    /// computed, found in `book` (slot -> assignment), and none if it has
    /// not run for that slot (as the original).
    fn quota_for(
        &mut self,
        state: &ServiceState,
        book: &mut BTreeMap<i64, Assignment>,
        node: NodeId,
        slot: i64,
        now_ms: i64,
    ) -> Option<v1::UserQuotas> {
        let _ = (state, now_ms);
        book.get(&slot)?.get(&node).map(|g| to_user_quotas(g))
    }

    /// Drops whatever the policy keeps about slots before `slot`.
    fn forget_before(&mut self, slot: i64) {
        let _ = slot;
    }
}
