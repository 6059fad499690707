//! [`Built`]: a built layer, shared by its services: its settings and
//! the state of its parts.

use super::config::Config;
use super::cost::CostFn;
use super::local::LocalZones;
use super::refusal_cache::RefusalCache;
use super::shared::SharedLimits;

/// What every service of one layer decides with.
#[derive(Debug)]
pub(crate) struct Built {
    pub(crate) config: Config,
    /// Costs computed from each request's head, if any.
    pub(crate) cost_fns: Box<[CostFn]>,
    /// Limits decided on this node alone, if any.
    pub(crate) local: Option<LocalZones>,
    /// Limits shared through a bucket store, if any.
    pub(crate) shared: Option<SharedLimits>,
    /// The last refusal's headers, for the next with the same figures.
    pub(crate) refusals: RefusalCache,
}
