//! The central node's reactions, without I/O: what to answer a report, what
//! to push and when.
//!
//! The [`Assigner`] owns the [`Ledger`](crate::ledger::Ledger) and knows which nodes are connected
//! for which services. The gRPC server feeds it connects, reports and timer
//! ticks from real streams; the simulator feeds it the same from virtual
//! time. Both then deliver the [`Push`]es it returns.
//!
//! - [`Assigner::report`] files a report and answers with the node's quota
//!   for the slot after it; when the policy wants it and every active node
//!   has now reported the slot that just ended, it says so, and
//!   [`Assigner::reassign`] re-assigns the current slot and pushes it to
//!   every node of the service.
//! - [`Assigner::tick`], at each mid-slot: reads the limits again, runs every
//!   policy's assign and pushes the result to every connected node, then
//!   forgets what is older than the retention.
//!
//! Quotas come out as messages ([`Messages`], for the simulator and tests) or
//! already encoded ([`Encoded`], for the gRPC server); both say the same.

//!
//! - `assigner`: the [`Assigner`];
//! - `render`: how a node's quota is written: a message ([`Messages`]) or
//!   encoded from the grants, packed or not, with refs ([`Encoded`]).

#[allow(clippy::module_inception)]
mod assigner;
pub mod render;

#[cfg(test)]
mod catch_up_tests;
#[cfg(test)]
mod tests;

pub use assigner::{
    Accepts, Ahead, Answer, Assigner, CONNECT_REASSIGN_KEYS, Filed, Prepared, Push,
};
pub use render::{Encoded, Messages, QuotaFormat, QuotaRef};
