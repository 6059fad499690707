//! The [`Policy`] trait: what a service's strategy answers.

use std::collections::BTreeMap;
use std::fmt;

use super::assignment::{Assignment, NodeGrants};
use super::granted::Granted;
use super::hierarchy::AppsStatus;
use crate::arena::{NodeId, ServiceState};

/// A quota strategy for one service; see the [module docs](crate::policy).
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
    /// (default: no, as the legacy system).
    fn reassign_when_reported(&self) -> bool {
        false
    }

    /// Computes every node's quota for `slot` into `out` and returns it.
    ///
    /// `out` is empty: an assignment the book let go, cleared, whose
    /// vectors keep their capacity, and begun like the book's newest
    /// ([`Assignment::clear_like`]), so an assign in the steady state
    /// allocates nothing: push each node's grants in key order.
    ///
    /// `granted` holds what nodes were granted for recent slots before
    /// `slot` (and, when `slot` is re-assigned, what it was assigned).
    fn assign(
        &mut self,
        state: &ServiceState,
        granted: Granted<'_>,
        slot: i64,
        now_ms: i64,
        out: Assignment,
    ) -> Assignment;

    /// The grants of `node` for `slot`, to answer a report or push: what
    /// [`Policy::assign`] computed, found in `book` (slot -> assignment).
    ///
    /// A slot not assigned yet has none (as the legacy system), except for a
    /// policy that assigns one slot ahead ([`Policy::lead`] 1): a report is
    /// answered before its next slot is assigned, so until then the node's
    /// grants of the slot before stand in, a safety net should the coming
    /// push be lost. Answering never runs an assign, so reports arriving
    /// together do not queue behind one.
    fn grants_for<'a>(
        &self,
        book: &'a BTreeMap<i64, Assignment>,
        node: NodeId,
        slot: i64,
    ) -> Option<NodeGrants<'a>> {
        match book.get(&slot) {
            Some(a) => a.get(node),
            None if self.lead() <= 1 => book.get(&(slot - 1))?.get(node),
            None => None,
        }
    }

    /// How the policy split the service's capacity between applications
    /// in its latest assign, if it shares one ([`Hierarchical`](super::Hierarchical)).
    fn apps(&self) -> Option<&AppsStatus> {
        None
    }

    /// Drops whatever the policy keeps about slots before `slot`.
    fn forget_before(&mut self, slot: i64) {
        let _ = slot;
    }
}
