//! Costs computed from the request head
//! ([`ThrottleLayerBuilder::cost_fn`](super::ThrottleLayerBuilder::cost_fn)).

use std::fmt;
use std::sync::Arc;

use smallvec::SmallVec;

use super::config::Config;
use crate::store::{ResourceId, counted};
use crate::user::RequestHead;

/// The function of a [`CostFn`].
pub(crate) type Weigh = Arc<dyn Fn(RequestHead<'_>) -> u64 + Send + Sync>;

/// A resource's cost as a function of the request head; the resource by
/// name until the layer is built.
#[derive(Clone)]
pub(crate) struct CostFn<R = ResourceId> {
    pub(crate) resource: R,
    f: Weigh,
}

impl<R: fmt::Debug> fmt::Debug for CostFn<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CostFn")
            .field("resource", &self.resource)
            .finish_non_exhaustive()
    }
}

impl<R> CostFn<R> {
    pub(crate) fn new(resource: R, f: Weigh) -> Self {
        Self { resource, f }
    }

    /// The same function, for resource `id`.
    pub(crate) fn resolved(self, id: ResourceId) -> CostFn {
        CostFn::new(id, self.f)
    }
}

/// A request's costs, on the stack for up to 4 resources.
pub(crate) type Costs = SmallVec<[(ResourceId, i64); 4]>;

/// The request's costs: the layer's fixed ones plus what its cost
/// functions say of `head`. Out of line: a layer without cost functions
/// never comes here.
#[inline(never)]
pub(crate) fn computed(cfg: &Config, fns: &[CostFn], head: RequestHead<'_>) -> Costs {
    let mut costs: Costs = cfg.costs.iter().copied().collect();
    for c in fns {
        let amount = counted((c.f)(head));
        match costs.iter_mut().find(|(r, _)| *r == c.resource) {
            Some((_, a)) => *a = a.saturating_add(amount),
            None => costs.push((c.resource, amount)),
        }
    }
    costs
}
