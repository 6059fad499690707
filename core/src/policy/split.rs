//! A baseline: the rate divided evenly between the active nodes.

use super::assignment::{Assignment, Grant};
use super::granted::Granted;
use super::policy::Policy;
use crate::arena::ServiceState;

/// Each node that used a limited (user, resource) lately gets
/// `rate x slot / nodes`, where `nodes` counts those nodes; no bucket, no
/// burst.
/// Exact under perfectly even load, wasteful under skew: it is here to be
/// compared with.
#[derive(Debug, Default, Clone)]
pub struct StaticSplit;

impl StaticSplit {
    /// The policy.
    pub fn new() -> Self {
        Self
    }
}

impl Policy for StaticSplit {
    fn name(&self) -> &'static str {
        "static-split"
    }

    fn lead(&self) -> i64 {
        1
    }

    fn assign(
        &mut self,
        state: &ServiceState,
        _granted: Granted<'_>,
        slot: i64,
        _now_ms: i64,
        mut out: Assignment,
    ) -> Assignment {
        let recent = slot - 7;
        let slot_secs = f64::from(state.slot.as_ms()) / 1000.0;
        for (id, key) in state.keys() {
            let Some(bucket) = key.bucket() else { continue };
            let users = key.nodes().iter().filter(|n| n.slot > recent).count();
            if users == 0 {
                continue;
            }
            let share = bucket.rate() * slot_secs / users as f64;
            for n in key.nodes().iter().filter(|n| n.slot > recent) {
                out.push(n.node, Grant::new(id, share));
            }
        }
        out
    }
}
