//! A baseline: the rate divided evenly between the active nodes.

use std::collections::BTreeMap;

use super::{Assignment, Policy};
use crate::ledger::ServiceState;

/// Each node active in the service gets `rate x slot / nodes` of every
/// limited (user, resource) that any node used lately; no bucket, no burst.
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
        _book: &BTreeMap<i64, Assignment>,
        slot: i64,
        _now_ms: i64,
    ) -> Assignment {
        let recent = slot - 7;
        let nodes: Vec<_> = state
            .last_report
            .iter()
            .filter(|(_, s)| **s > recent)
            .map(|(n, _)| *n)
            .collect();
        let mut out = Assignment::default();
        if nodes.is_empty() {
            return out;
        }
        let slot_secs = f64::from(state.slot.as_ms()) / 1000.0;
        for (user, resources) in &state.users {
            for (resource, rs) in resources {
                let Some(bucket) = &rs.bucket else { continue };
                if !rs.nodes.iter().any(|n| n.slot > recent) {
                    continue;
                }
                let share = bucket.rate() * slot_secs / nodes.len() as f64;
                for &n in &nodes {
                    out.entry(n)
                        .or_default()
                        .users
                        .entry(user.to_string())
                        .or_default()
                        .resources
                        .insert(resource.to_string(), share);
                }
            }
        }
        out
    }
}
