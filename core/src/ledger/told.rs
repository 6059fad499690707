//! What a service's nodes are told of its limits ([`v1::Limits`]): the
//! default quota, the `*` rule's rate for a slot split over the service's
//! nodes, which a node applies to a user it has no quota row for (a user
//! new to it) until that user's own quota arrives; and each rule's
//! allowances, which the nodes' refusals and headers name; and, under a
//! service's capacity, what the users a node has no quota row for may take
//! of it together there (the capacity split over the nodes). Built again
//! only when the rules, the capacity or the number of nodes change; unchanged, it is the very
//! same `Arc`, so a stream compares pointers to know it has it.

use std::collections::BTreeMap;
use std::sync::Arc;

use throttle_proto::v1;

use crate::arena::rules::ServiceRules;
use crate::arena::state::ServiceState;
use crate::limits::{Hierarchy, Limit, limited_resources, resolve};

/// Most users with a rule of their own one [`v1::Limits`] lists.
pub const MAX_TOLD_USERS: usize = 100_000;

/// Slots a node that has neither reported nor connected since counts as
/// one of the service's nodes.
pub(super) const ACTIVE_SLOTS: i64 = 5;

/// Slots a node that has neither reported nor connected since still takes
/// its part of what the nodes are told: a node on the default fallback
/// (the last known quotas for 60 slots) keeps applying it that long, out
/// of the central's sight. Counting only the nodes active lately would
/// give the first nodes back after an outage the whole of it each.
const TOLD_SLOTS: i64 = 60;

/// How many nodes of `state`'s service share what the nodes are told at
/// `now_ms`: those heard from in the last [`TOLD_SLOTS`].
pub(super) fn told_nodes(state: &ServiceState, now_ms: i64) -> usize {
    let recent = state.slot.slot_at(now_ms) - 1 - TOLD_SLOTS;
    (state.last_report.iter())
        .filter(|(n, s)| **s + state.lag(**n) > recent)
        .count()
}

/// A service's [`v1::Limits`], as last built.
#[derive(Debug, Default)]
pub(crate) struct Told {
    message: Option<Arc<v1::Limits>>,
    /// The rules changed since it was built.
    stale: bool,
    /// The nodes it was built for.
    nodes: usize,
}

impl Told {
    /// Marks the message out of date: the rules or the capacity changed.
    pub(crate) fn rules_changed(&mut self) {
        self.stale = true;
    }

    /// What the nodes of `service` are told of its `rules` and its
    /// capacity (`hierarchy`), split over `nodes` (those active now):
    /// built again only when those changed.
    pub(crate) fn read(
        &mut self,
        service: &str,
        (rules, hierarchy): (&ServiceRules, Option<&Hierarchy>),
        nodes: usize,
        slot_ms: u32,
    ) -> Option<Arc<v1::Limits>> {
        if let Some(m) = &self.message
            && !self.stale
            && self.nodes == nodes
        {
            return Some(m.clone());
        }
        let mut built = build(service, rules, nodes.max(1), slot_ms);
        built.newcomers = newcomers(hierarchy, nodes.max(1), slot_ms);
        self.stale = false;
        self.nodes = nodes;
        match &self.message {
            Some(m) if **m == built => {}
            _ => self.message = Some(Arc::new(built)),
        }
        self.message.clone()
    }
}

/// The message for `rules`, the default quotas split over `nodes`.
fn build(service: &str, rules: &ServiceRules, nodes: usize, slot_ms: u32) -> v1::Limits {
    let every = rules.every();
    let share = f64::from(slot_ms) / 1000.0 / nodes as f64;
    let mut users: Vec<v1::UserLimits> = rules
        .own()
        .map(|(user, own)| v1::UserLimits {
            user: user.to_owned(),
            allowances: allowances(Some(own), every),
            default_quota: default_quota(Some(own), every, share),
        })
        .collect();
    users.sort_unstable_by(|a, b| a.user.cmp(&b.user));
    let users_truncated = users.len() > MAX_TOLD_USERS;
    if users_truncated {
        metrics::counter!("throttle_central_told_users_truncated_total").increment(1);
        tracing::warn!(%service, users = users.len(), sent = MAX_TOLD_USERS, "too many users with rules of their own to tell the nodes; the rest are told the * rule");
        users.truncate(MAX_TOLD_USERS);
    }
    v1::Limits {
        service: service.to_owned(),
        default_quota: default_quota(None, every, share),
        every: every.map(|e| allowances(None, Some(e))).unwrap_or_default(),
        users,
        users_truncated,
        newcomers: BTreeMap::new(),
    }
}

/// Per resource of the capacity, its amount for a slot split over `nodes`.
fn newcomers(hierarchy: Option<&Hierarchy>, nodes: usize, slot_ms: u32) -> BTreeMap<String, f64> {
    let share = f64::from(slot_ms) / 1000.0 / nodes as f64;
    let capacity = hierarchy.map(|h| &h.capacity).into_iter().flatten();
    capacity.map(|(r, c)| (r.clone(), c * share)).collect()
}

/// Per resource, `share` of a second of the tightest rate that limits a
/// user whose own rule is `own` (if any), where the `*` rule is `every`.
fn default_quota(own: Option<&Limit>, every: Option<&Limit>, share: f64) -> BTreeMap<String, f64> {
    limited_resources(own, every)
        .into_iter()
        .filter_map(|r| {
            let rate = resolve(own, every, r)
                .allowances
                .iter()
                .map(|a| a.rate)
                .reduce(f64::min)?;
            Some((r.to_owned(), rate * share))
        })
        .collect()
}

/// Every allowance of a user whose own rule is `own`, where the `*` rule
/// is `every`: resource by resource, period by period.
fn allowances(own: Option<&Limit>, every: Option<&Limit>) -> Vec<v1::Allowance> {
    let mut out = Vec::new();
    for resource in limited_resources(own, every) {
        for a in resolve(own, every, resource).allowances {
            out.push(v1::Allowance {
                resource: resource.to_owned(),
                window_seconds: a.period.window_seconds(),
                amount: a.amount(),
            });
        }
    }
    out
}
