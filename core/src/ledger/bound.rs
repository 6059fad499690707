//! The keys bound by a longer period than their shortest ([`v1::Bound`]):
//! a user who spent a per-minute or daily quota is refused by that
//! bucket, and the nodes' refusals name it. Read from the keys of several
//! periods after each assign binds them; unchanged, it is the very same
//! `Arc`, so a stream compares pointers to know it has it.
//!
//! With them go the [`v1::Budget`]s of the keys closest to spending a
//! longer period: what its bucket still holds, which a node keeps to while
//! the central is away. A node with last slot's quota would otherwise
//! admit at that pace through the whole outage, whatever the hour or the
//! day had left. So, too, for the keys whose newest quotas, all nodes
//! together, hold more than a slot of their per-second rate: a stored
//! burst, which a node repeating its last quota would take again every
//! slot.

use std::sync::Arc;

use throttle_proto::v1;

use super::told::{ACTIVE_SLOTS, told_nodes};
use crate::arena::ids::KeyId;
use crate::arena::key::NodeUsage;
use crate::arena::state::ServiceState;
use crate::limits::Period;
use crate::policy::Assignment;

/// Most keys one [`v1::Bound`] lists.
pub const MAX_BOUND_KEYS: usize = 100_000;

/// A key with a per-second bucket is given a budget when one of its
/// longer buckets holds less than this many seconds of its per-second
/// rate: an outage this long at that rate cannot spend the others.
pub(super) const BUDGET_SECONDS: f64 = 120.0;

/// A key's per-second bucket is given a budget when its newest grants, all
/// nodes together, are more than this many slots of its rate.
pub(super) const BURST_SLOTS: f64 = 1.05;

/// A service's bound keys as last read: each key's id, generation and
/// binding window, and the message built from them.
#[derive(Debug, Default)]
pub(crate) struct Bound {
    keys: Vec<(KeyId, u32, u32)>,
    budgets: Vec<v1::Budget>,
    message: Option<Arc<v1::Bound>>,
    /// Per key, what the newest assignment grants it over all nodes:
    /// scratch kept from one read to the next.
    granted: Vec<f64>,
}

impl Bound {
    /// The keys of `service` (its keys: `state`, its newest assignment:
    /// `newest`) bound now by a longer period than their shortest. Asked
    /// every tick: the keys are compared by id first, and the message is
    /// built (names copied) only when they or the budgets changed.
    pub(crate) fn read(
        &mut self,
        service: &str,
        state: &ServiceState,
        newest: Option<&Assignment>,
        now_ms: i64,
    ) -> Option<Arc<v1::Bound>> {
        let active = told_nodes(state, now_ms) as u32;
        let mut budgets = budgets(state, active, now_ms);
        if let Some(newest) = newest {
            granted_by_key(newest, state.key_count(), &mut self.granted);
            bursts(state, &self.granted, active, now_ms, &mut budgets);
        }
        budgets.sort_unstable_by(|a, b| {
            let (ka, kb) = ((&a.user, &a.resource), (&b.user, &b.resource));
            (ka, a.window_seconds).cmp(&(kb, b.window_seconds))
        });
        let keys: Vec<(KeyId, u32, u32)> = (state.longer.iter())
            .map(|&id| (id, state.key(id)))
            .filter(|(_, key)| {
                let shortest = key.buckets().map(|(p, _)| p).min();
                shortest.is_some_and(|p| p != key.period())
            })
            .map(|(id, key)| (id, key.generation(), key.period().window_seconds()))
            .take(MAX_BOUND_KEYS)
            .collect();
        let bound = self;
        if bound.message.is_none() || bound.keys != keys || bound.budgets != budgets {
            let mut listed: Vec<v1::BoundKey> = (keys.iter())
                .map(|&(id, _, window_seconds)| v1::BoundKey {
                    user: state.key(id).user().to_owned(),
                    resource: state.key(id).resource().to_owned(),
                    window_seconds,
                })
                .collect();
            listed.sort_unstable_by(|a, b| (&a.user, &a.resource).cmp(&(&b.user, &b.resource)));
            let service = service.to_owned();
            bound.message = Some(Arc::new(v1::Bound {
                service,
                keys: listed,
                budgets: budgets.clone(),
            }));
            bound.keys = keys;
            bound.budgets = budgets;
        }
        bound.message.clone()
    }
}

/// The budgets of `state`'s keys of longer periods at `now_ms`: for each
/// longer bucket that the key's per-second rate could spend in
/// [`BUDGET_SECONDS`], what it holds in whole units, shared by the
/// service's active nodes. A key with no per-second bucket has no such
/// pace: a node's last quota may be all that is left, every slot, so each
/// of its buckets gets one.
fn budgets(state: &ServiceState, active: u32, now_ms: i64) -> Vec<v1::Budget> {
    let mut out = Vec::new();
    for &id in &state.longer {
        let key = state.key(id);
        let pace = (key.buckets())
            .find(|(p, _)| *p == Period::Second)
            .map_or(f64::INFINITY, |(_, b)| b.rate());
        // Every active node may serve the user while the central is
        // away, wherever they were before: each keeps to its part.
        let nodes = recent_nodes(key.nodes()).max(active);
        for (period, bucket) in key.buckets().filter(|(p, _)| *p != Period::Second) {
            let remaining = bucket.level_at(now_ms).max(0.0).floor();
            if remaining >= pace * BUDGET_SECONDS || out.len() >= MAX_BOUND_KEYS {
                continue;
            }
            out.push(v1::Budget {
                user: key.user().to_owned(),
                resource: key.resource().to_owned(),
                window_seconds: period.window_seconds(),
                remaining,
                nodes,
                refill: bucket.rate(),
            });
        }
    }
    out
}

/// Per key of `keys`, what `newest` grants it over all nodes, into
/// `granted`.
fn granted_by_key(newest: &Assignment, keys: usize, granted: &mut Vec<f64>) {
    granted.clear();
    granted.resize(keys, 0.0);
    for (_, grants) in newest.iter() {
        for (&k, &amount) in grants.keys().iter().zip(grants.amounts()) {
            if let Some(total) = granted.get_mut(k.index()) {
                *total += f64::from(amount);
            }
        }
    }
}

/// Adds to `out` the per-second budgets of `state`'s keys whose grants
/// (`granted`, by key), all nodes together, hold more than
/// [`BURST_SLOTS`] slots of their per-second rate: what the bucket holds
/// at `now_ms` and its rate, shared as [`budgets`] shares them.
fn bursts(
    state: &ServiceState,
    granted: &[f64],
    active: u32,
    now_ms: i64,
    out: &mut Vec<v1::Budget>,
) {
    let slot_seconds = f64::from(state.slot.as_ms()) / 1000.0;
    for (i, &total) in granted.iter().enumerate() {
        if total <= 0.0 || out.len() >= MAX_BOUND_KEYS {
            continue;
        }
        let key = state.key(KeyId(i as u32));
        let Some((_, bucket)) = key.buckets().find(|(p, _)| *p == Period::Second) else {
            continue;
        };
        if total <= bucket.rate() * slot_seconds * BURST_SLOTS + 1.0 {
            continue;
        }
        out.push(v1::Budget {
            user: key.user().to_owned(),
            resource: key.resource().to_owned(),
            window_seconds: Period::Second.window_seconds(),
            remaining: bucket.level_at(now_ms).max(0.0).floor(),
            nodes: recent_nodes(key.nodes()).max(active),
            refill: bucket.rate(),
        });
    }
}

/// How many nodes reported a key in the last slots of its newest report
/// (at least 1).
fn recent_nodes(nodes: &[NodeUsage]) -> u32 {
    let newest = nodes.iter().map(|n| n.slot).max().unwrap_or(0);
    let recent = nodes.iter().filter(|n| n.slot > newest - ACTIVE_SLOTS);
    (recent.count() as u32).max(1)
}
