//! How a service's stored tokens are split between nodes.
//!
//! Each service has one [`Policy`], as each service of the legacy central
//! node was a module with `consume`, `get_quota` and `assign`. The ledger
//! calls [`Policy::consume`] after filing each report, [`Policy::assign`]
//! once per slot, and [`Policy::grants_for`] to answer a report.
//!
//! - [`Projected`]: the default; see its docs.
//! - [`Classic`]: the legacy system's algorithm, kept exactly.
//! - [`StaticSplit`]: each node gets the rate divided by the number of
//!   active nodes; a baseline for comparisons.
//! - [`Hierarchical`]: a service's capacity shared by applications
//!   ([`hierarchy`]), then users as [`Projected`] shares them.

//!
//! - `assignment`: [`Assignment`], the grants of one slot per node;
//! - `granted`: [`Granted`], what was granted for recent slots;
//! - `history`: [`QuotaHistory`], the older slots, compact;
//! - `policy`: the [`Policy`] trait.

mod assignment;
mod classic;
mod granted;
pub mod hierarchy;
mod history;
#[allow(clippy::module_inception)]
mod policy;
mod projected;
mod split;

#[cfg(test)]
mod tests;

pub use assignment::{Assignment, Grant, NodeGrants, same_keys};
pub use classic::Classic;
pub use granted::{Granted, SlotGrants};
pub use hierarchy::{AppsStatus, Hierarchical};
pub use history::{QuotaHistory, SlotQuotas};
pub use policy::Policy;
pub use projected::Projected;
pub use projected::moved;
pub use split::StaticSplit;

/// A new policy of the name a limits file or a flag gives it, one of
/// [`crate::limits::POLICY_NAMES`].
pub fn by_name(name: &str) -> Option<Box<dyn Policy>> {
    Some(match name {
        "projected" => Box::new(Projected::new()),
        "classic" => Box::new(Classic::new()),
        "static-split" => Box::new(StaticSplit::new()),
        "hierarchical" => Box::new(Hierarchical::new()),
        _ => return None,
    })
}
