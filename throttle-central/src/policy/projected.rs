//! The default policy: quotas from the projected bucket level, split by
//! demand, one slot ahead.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::{Assignment, Grant, Policy};
use crate::ledger::{Map, NodeId, NodeUsage, ServiceState};

/// Data slots a node's latest report stays relevant.
const WINDOW: i64 = 5;
/// Slots of grants remembered per node.
const GRANTS: usize = 4;
/// A node with rejections wants at least this much more than it consumed.
const HUNGRY_GROWTH: f64 = 1.2;
/// Up to this many limited keys, every active node gets a quota for every
/// key: a floor where it has no recent use, an even split of keys nobody used
/// lately. A user arriving on a node is then throttled from the first
/// request. Beyond it (a grant per key and node would be too many), only the
/// nodes that used a key get a quota for it and the rest fail open as in the
/// original.
const MAX_IDLE_KEYS: usize = 10_000;

/// Quotas from the bucket level *projected* past what was granted but not
/// yet reported, split between the nodes by their demand.
///
/// The original algorithm ([`Classic`](super::Classic)) offers the whole
/// bucket again every slot and plans two slots ahead from data that is
/// already old, so it overshoots after a burst and then starves. This policy:
///
/// 1. *Projects* the bucket: its level, minus what each node was granted for
///    slots whose reports have not arrived yet (capped by what that node is
///    expected to use), plus the refill until the end of the target slot.
///    What is granted each slot therefore tracks the rate exactly, and any
///    over- or under-use comes back through the bucket a slot or two later.
/// 2. *Splits* that budget in proportion to each node's demand: its last
///    consumption plus its rejections in the resource's units (a refused
///    request would have cost the node's average per request), at least 20%
///    more than it consumed when it refused anything. Every node then refuses
///    the same fraction of its demand, and all of the budget is usable.
/// 3. Gives *idle* nodes (active in the service, nothing recent for this
///    user) a small floor, so a user who moves to another node is not refused
///    outright there while the next slot's quota catches up. A user nobody
///    used lately gets, on every active node, a slot's worth of its rate (or
///    an even split of the budget, if larger; up to 10,000 such keys), so a
///    burst after a quiet period is throttled from its first request instead
///    of failing open, and a user who lives on one node is not refused under
///    its limit.
/// 4. Runs at mid-slot for the *next* slot and re-assigns the *current*
///    slot as soon as every active node has reported the previous one
///    (pushed at once over the streams), so a shift of load between nodes is
///    followed within the slot after it. A report's answer carries the
///    node's current grants as a stand-in for the next slot until that slot
///    is assigned.
#[derive(Debug, Default)]
pub struct Projected {
    /// user -> resource -> per node, recent grants.
    grants: Map<Arc<str>, Map<Arc<str>, Vec<NodeGrants>>>,
}

#[derive(Debug, Clone, Copy)]
struct NodeGrants {
    node: NodeId,
    slots: [(i64, f64); GRANTS],
}

impl NodeGrants {
    fn get(&self, slot: i64) -> Option<f64> {
        let (s, g) = self.slots[slot.rem_euclid(GRANTS as i64) as usize];
        (s == slot).then_some(g)
    }

    fn set(&mut self, slot: i64, grant: f64) {
        self.slots[slot.rem_euclid(GRANTS as i64) as usize] = (slot, grant);
    }
}

impl Projected {
    /// The policy.
    pub fn new() -> Self {
        Self::default()
    }
}

/// What a node would have used, from its latest entry: consumption plus
/// rejections times the cost of one request.
fn demand(entry: &NodeUsage, unit: f64) -> f64 {
    let c = entry.consumption as f64;
    if entry.rejection == 0 {
        return c;
    }
    (c + entry.rejection as f64 * unit).max(c * HUNGRY_GROWTH)
}

impl Policy for Projected {
    fn name(&self) -> &'static str {
        "projected"
    }

    fn lead(&self) -> i64 {
        1
    }

    fn reassign_when_reported(&self) -> bool {
        true
    }

    fn assign(
        &mut self,
        state: &ServiceState,
        _book: &BTreeMap<i64, Assignment>,
        slot: i64,
        now_ms: i64,
    ) -> Assignment {
        let slot_secs = f64::from(state.slot.as_ms()) / 1000.0;
        let until_end = (state.slot.end_ms(slot) - now_ms).max(0) as f64 / 1000.0;
        let recent = slot - 1 - WINDOW;
        let mut active: Vec<NodeId> = state
            .last_report
            .iter()
            .filter(|(_, s)| **s > recent)
            .map(|(n, _)| *n)
            .collect();
        active.sort_unstable();
        // Only "more than MAX_IDLE_KEYS or not" matters: stop counting
        // there rather than touch every key an extra time.
        let few_keys = state
            .users
            .values()
            .flat_map(|r| r.values())
            .filter(|r| r.bucket.is_some())
            .take(MAX_IDLE_KEYS + 1)
            .count()
            <= MAX_IDLE_KEYS;
        let mut out = Assignment::default();
        let mut nodes: Vec<(NodeId, f64)> = Vec::new();
        for (user, resources) in &state.users {
            let requests = resources.get("requests");
            for (resource, rs) in resources {
                let Some(bucket) = &rs.bucket else { continue };
                nodes.clear();
                for e in rs.nodes.iter().filter(|e| e.slot > recent) {
                    // A node that reported newer slots without this key has
                    // moved on: its demand is zero now.
                    let newest = state.last_report.get(&e.node).copied().unwrap_or(e.slot);
                    let d = if e.slot < newest {
                        0.0
                    } else {
                        let unit = if &**resource == "requests" {
                            1.0
                        } else {
                            requests
                                .and_then(|r| {
                                    r.nodes
                                        .iter()
                                        .find(|n| n.node == e.node && n.slot == e.slot)
                                })
                                .filter(|n| n.consumption > 0)
                                .map_or(1.0, |n| e.consumption as f64 / n.consumption as f64)
                        };
                        demand(e, unit)
                    };
                    nodes.push((e.node, d));
                }
                if nodes.is_empty() && (active.is_empty() || !few_keys) {
                    // Nobody used it lately and there are too many such keys
                    // to hand out: no quota, the nodes allow (as the
                    // original); the bucket will charge what they admit.
                    continue;
                }
                // Floors for idle nodes cost a grant per (key, node): only
                // while the keys are few (see MAX_IDLE_KEYS).
                if few_keys {
                    for &n in &active {
                        if !nodes.iter().any(|(m, _)| *m == n) {
                            nodes.push((n, 0.0));
                        }
                    }
                }
                let level = bucket.level_at(now_ms);
                let rate = bucket.rate();
                // One lookup of this key's grant history, used to read the
                // outstanding grants and then to record the new ones.
                let entry = self
                    .grants
                    .entry(user.clone())
                    .or_default()
                    .entry(resource.clone())
                    .or_default();
                let mut outstanding = 0.0;
                for &(node, d) in &nodes {
                    let last = state.last_report.get(&node).copied().unwrap_or(slot - 2);
                    let first = (last + 1).max(slot - GRANTS as i64);
                    let grants = entry.iter().find(|g| g.node == node);
                    for y in first..slot {
                        outstanding += match grants.and_then(|g| g.get(y)) {
                            Some(g) => g.min(d),
                            None => d,
                        };
                    }
                }
                let ceiling = bucket.capacity().max(rate * slot_secs);
                let budget = (level - outstanding + rate * until_end).clamp(0.0, ceiling);
                let total: f64 = nodes.iter().map(|(_, d)| d).sum();
                let floor = (rate * slot_secs * 0.01).max(1.0);
                let busy = nodes.iter().filter(|(_, d)| *d > 0.0).count().max(1) as f64;
                for &(node, d) in &nodes {
                    let grant = if total > 0.0 {
                        if d > 0.0 {
                            budget * d / total
                        } else {
                            floor.min(budget / busy).max(1.0)
                        }
                    } else {
                        // Nobody used it lately: wherever the user shows up
                        // first may take a slot's worth of the rate (or the
                        // even split, if larger). A user who lives on one
                        // node is then not refused under its limit; one who
                        // arrives everywhere at once borrows from the bucket.
                        (budget / nodes.len() as f64).max(budget.min(rate * slot_secs))
                    };
                    match entry.iter_mut().find(|g| g.node == node) {
                        Some(g) => g.set(slot, grant),
                        None => {
                            let mut g = NodeGrants {
                                node,
                                slots: [(i64::MIN, 0.0); GRANTS],
                            };
                            g.set(slot, grant);
                            entry.push(g);
                        }
                    }
                    out.entry(node).or_default().push(Grant {
                        user: user.clone(),
                        resource: resource.clone(),
                        amount: grant,
                    });
                }
            }
        }
        out
    }

    fn quota_for(
        &mut self,
        _state: &ServiceState,
        book: &mut BTreeMap<i64, Assignment>,
        node: NodeId,
        slot: i64,
        _now_ms: i64,
    ) -> Option<throttle_proto::v1::UserQuotas> {
        super::quota_or_previous(book, node, slot)
    }

    fn forget_before(&mut self, slot: i64) {
        self.grants.retain(|_, resources| {
            resources.retain(|_, nodes| {
                nodes.retain(|g| g.slots.iter().any(|(s, _)| *s >= slot));
                !nodes.is_empty()
            });
            !resources.is_empty()
        });
    }
}
