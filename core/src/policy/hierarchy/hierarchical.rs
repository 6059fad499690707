//! The hierarchical policy: a service's capacity split between its
//! applications, each application's share between its users, each user's
//! between nodes.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

use super::fill::fill;
use super::group::Group;
use super::split::{Ask, Scratch, Share, split};
use super::status::{AppStatus, AppsStatus, ResourceStatus};
use crate::arena::{KeyId, NodeId, ServiceState};
use crate::limits::Hierarchy;
use crate::policy::assignment::{Assignment, Grant};
use crate::policy::granted::Granted;
use crate::policy::policy::Policy;
use crate::policy::projected::{Newest, Projected, WINDOW};

/// Splits a service's capacity ([`Hierarchy`]) between its applications
/// each slot (guarantees first, by priority; then bursts; what is left
/// lent as headroom: see [`split`]), each application's share between
/// its users in proportion to their demand, and each user's between the
/// nodes. Users' own limits still hold: a user's demand counts only up
/// to what the [`Projected`] policy would grant them, and the nodes'
/// shares follow Projected's split.
///
/// Resources the capacity does not name, and services without one, are
/// assigned exactly as [`Projected`] assigns them.
///
/// A user nobody used lately (no report of theirs in the last 5 slots)
/// gets no quota of a resource under a capacity: their first requests
/// on a node are allowed, as the legacy system allows a user it has no quota
/// for, and count from their first report on. Where keys keep arriving
/// (two data slots in a row each with users new in it, as from a client
/// rotating its key), what the newest of them consumed is set aside from
/// the capacity before it is split: the grants of a slot and what the
/// users new in it take add up to the capacity.
#[derive(Debug, Default)]
pub struct Hierarchical {
    inner: Projected,
    /// Projected's assignment, kept for its memory.
    scratch: Option<Assignment>,
    /// (application, or "" for users in none; resource) -> its state.
    groups: HashMap<(String, String), Group>,
    status: Option<AppsStatus>,
    split: Scratch,
    order: Vec<usize>,
}

impl Hierarchical {
    /// The policy.
    pub fn new() -> Self {
        Self::default()
    }
}

/// One key of a resource under the capacity, as this slot sees it.
struct KeyAsk {
    id: KeyId,
    /// Its application's index (the last for users in none).
    group: usize,
    /// Its demand, no more than `cap`.
    want: f64,
    /// What its own limits allow (what Projected granted), or infinity.
    cap: f64,
    /// Its nodes' demands, in `Slot::demands`.
    nodes: Range<usize>,
}

/// What one assign reads of the service.
struct Slot<'a> {
    state: &'a ServiceState,
    hierarchy: &'a Hierarchy,
    slot: i64,
    slot_secs: f64,
    /// Each node's newest data slot.
    newest: Newest,
    /// Per key id, the sum of Projected's grants, if it granted any.
    projected: Vec<Option<f64>>,
    /// (node, demand) of every key's recent entries.
    demands: Vec<(NodeId, f64)>,
}

impl Slot<'_> {
    /// The keys of `resource`, their demands read into `self.demands`;
    /// and per group, what its users consumed in the nodes' latest
    /// reports.
    fn asks(&mut self, resource: &str, groups: usize) -> (Vec<KeyAsk>, Vec<f64>) {
        let state = self.state;
        let recent = self.slot - 1 - WINDOW;
        let mut keys = Vec::new();
        let mut consumed = vec![0.0; groups];
        self.demands.clear();
        for (id, key) in state.keys().filter(|(_, k)| k.resource() == resource) {
            let group = self.hierarchy.app_of(key.user()).unwrap_or(groups - 1);
            let start = self.demands.len();
            let mut total = 0.0;
            for e in key.nodes().iter().filter(|e| e.slot > recent) {
                let (d, _) = self.newest.demand(state, key, e);
                if self.newest.get(e.node) == Some(e.slot) {
                    consumed[group] += e.consumption as f64;
                }
                self.demands.push((e.node, d));
                total += d;
            }
            let cap = self.projected[id.index()].unwrap_or(f64::INFINITY);
            keys.push(KeyAsk {
                id,
                group,
                want: total.min(cap),
                cap,
                nodes: start..self.demands.len(),
            });
        }
        (keys, consumed)
    }
}

impl Policy for Hierarchical {
    fn name(&self) -> &'static str {
        crate::limits::HIERARCHICAL
    }

    fn lead(&self) -> i64 {
        self.inner.lead()
    }

    fn reassign_when_reported(&self) -> bool {
        self.inner.reassign_when_reported()
    }

    fn assign(
        &mut self,
        state: &ServiceState,
        granted: Granted<'_>,
        slot: i64,
        now_ms: i64,
        mut out: Assignment,
    ) -> Assignment {
        let Some(hierarchy) = state.hierarchy().map(Arc::clone) else {
            self.status = None;
            return self.inner.assign(state, granted, slot, now_ms, out);
        };
        let mut scratch = self.scratch.take().unwrap_or_default();
        scratch.clear();
        let scratch = self.inner.assign(state, granted, slot, now_ms, scratch);
        let mut ctx = Slot {
            state,
            hierarchy: &hierarchy,
            slot,
            slot_secs: f64::from(state.slot.as_ms()) / 1000.0,
            newest: Newest::of(state),
            projected: vec![None; state.id_bound()],
            demands: Vec::new(),
        };
        for (_, grants) in scratch.iter() {
            for g in grants.iter() {
                *ctx.projected[g.key.index()].get_or_insert(0.0) += g.amount();
            }
        }
        self.groups.retain(|(app, resource), _| {
            let known = app.is_empty() || hierarchy.apps.iter().any(|a| a.name == *app);
            known && hierarchy.capacity.contains_key(resource)
        });
        // Per key id: the factor Projected's grants are scaled by (NaN:
        // dropped); keys it granted nothing are split here, into `grants`.
        let mut factor = vec![1.0; state.id_bound()];
        let mut grants: Vec<(NodeId, KeyId, f64)> = Vec::new();
        let mut status = AppsStatus {
            slot,
            resources: Vec::new(),
        };
        for (resource, &capacity) in &hierarchy.capacity {
            let shown = self.share(&mut ctx, resource, capacity, &mut factor, &mut grants);
            status.resources.push(shown);
        }
        for (node, node_grants) in scratch.iter() {
            for g in node_grants.iter() {
                let f = factor[g.key.index()];
                if !f.is_nan() {
                    grants.push((node, g.key, g.amount() * f));
                }
            }
        }
        // Each node's grants in key order, as an assignment takes them.
        grants.sort_unstable_by_key(|&(n, k, _)| (n.index(), k.index()));
        for (node, key, amount) in grants {
            out.push(node, Grant::new(key, amount));
        }
        self.scratch = Some(scratch);
        self.status = Some(status);
        out
    }

    fn forget_before(&mut self, slot: i64) {
        self.inner.forget_before(slot);
    }

    fn apps(&self) -> Option<&AppsStatus> {
        self.status.as_ref()
    }
}

impl Hierarchical {
    /// Splits one resource's capacity for the slot: between groups, then
    /// users; sets the factors of keys Projected granted, pushes the
    /// grants of the others. Returns what the monitor shows of it.
    fn share(
        &mut self,
        ctx: &mut Slot<'_>,
        resource: &str,
        capacity: f64,
        factor: &mut [f64],
        grants: &mut Vec<(NodeId, KeyId, f64)>,
    ) -> ResourceStatus {
        let apps = &ctx.hierarchy.apps;
        let groups = apps.len() + 1;
        let (keys, consumed) = ctx.asks(resource, groups);
        let mut demand = vec![0.0; groups];
        let mut users = vec![0; groups];
        for k in &keys {
            demand[k.group] += k.want;
            users[k.group] += usize::from(!k.nodes.is_empty());
        }
        let per_slot = ctx.slot_secs;
        let timing = (ctx.slot, per_slot);
        let mut states = self.take_groups(ctx.hierarchy, resource);
        count_consumed(ctx, &keys, &mut states);
        let asks: Vec<Ask> = (states.iter_mut().enumerate())
            .map(|(g, s)| s.ask(apps.get(g), resource, timing, capacity, demand[g]))
            .collect();
        let whole = capacity * per_slot;
        let arriving = arriving(ctx, &keys, groups);
        let all: f64 = arriving.iter().sum();
        let scale = if all > whole { whole / all } else { 1.0 };
        let mut shares = split(whole - all * scale, &asks, &mut self.split);
        for (g, s) in states.iter_mut().enumerate() {
            let reserved = arriving[g] * scale;
            s.settle(apps.get(g), &asks[g], &mut shares[g], timing, reserved);
        }
        let left: Vec<f64> = states.iter().map(|s| s.left).collect();
        self.put_groups(ctx.hierarchy, resource, states);
        let given = self.among_users(&keys, &shares);
        for (k, &g) in keys.iter().zip(&given) {
            to_nodes(ctx, k, g, factor, grants);
        }
        let rate = |x: f64| x / per_slot;
        ResourceStatus {
            resource: resource.to_owned(),
            capacity,
            granted: rate(shares.iter().map(|s| s.granted).sum()),
            consumed: rate(consumed.iter().sum()),
            apps: (0..groups)
                .filter(|&g| g < apps.len() || users[g] > 0)
                .map(|g| AppStatus {
                    name: apps.get(g).map_or("*", |a| &a.name).to_owned(),
                    priority: asks[g].priority,
                    guaranteed: rate(asks[g].guaranteed),
                    burst: apps.get(g).map_or(capacity, |a| a.ceiling(resource)),
                    demand: rate(demand[g]),
                    granted: rate(shares[g].granted),
                    consumed: rate(consumed[g]),
                    burst_seconds_left: left[g],
                    users: users[g],
                })
                .collect(),
        }
    }

    /// The state of every group of `hierarchy` for `resource`, the users
    /// in no application last, taken out of the policy.
    fn take_groups(&mut self, hierarchy: &Hierarchy, resource: &str) -> Vec<Group> {
        let apps = hierarchy.apps.iter().map(Some).chain([None]);
        apps.map(|app| {
            let key = (app.map_or("", |a| &a.name).to_owned(), resource.to_owned());
            self.groups.remove(&key).unwrap_or_else(|| Group::new(app))
        })
        .collect()
    }

    /// Puts back what [`Hierarchical::take_groups`] took.
    fn put_groups(&mut self, hierarchy: &Hierarchy, resource: &str, states: Vec<Group>) {
        let names = hierarchy.apps.iter().map(|a| a.name.as_str()).chain([""]);
        for (name, state) in names.zip(states) {
            self.groups
                .insert((name.to_owned(), resource.to_owned()), state);
        }
    }

    /// Each key's part of its group's share: in proportion to demand, up
    /// to it; what is left as headroom, in proportion to demand up to the
    /// key's own limits.
    fn among_users(&mut self, keys: &[KeyAsk], shares: &[Share]) -> Vec<f64> {
        let mut given = vec![0.0; keys.len()];
        let mut members: Vec<Vec<usize>> = vec![Vec::new(); shares.len()];
        for (i, k) in keys.iter().enumerate() {
            members[k.group].push(i);
        }
        let (mut weights, mut room, mut part) = (Vec::new(), Vec::new(), Vec::new());
        for (share, members) in shares.iter().zip(&members) {
            weights.clear();
            weights.extend(members.iter().map(|&i| keys[i].want));
            part.clear();
            part.resize(members.len(), 0.0);
            let left = fill(
                share.granted,
                &weights,
                &weights,
                &mut part,
                &mut self.order,
            );
            room.clear();
            room.extend(members.iter().zip(&part).map(|(&i, p)| keys[i].cap - p));
            fill(left, &weights, &room, &mut part, &mut self.order);
            for (&i, p) in members.iter().zip(&part) {
                given[i] = *p;
            }
        }
        given
    }
}

/// Counts, for each group, what its users consumed in the data slot
/// complete by now (two before the one assigned), if not counted yet.
fn count_consumed(ctx: &Slot<'_>, keys: &[KeyAsk], states: &mut [Group]) {
    let measured = ctx.slot - 2;
    if !states.iter().any(|s| s.overshoot.wants(measured)) {
        return;
    }
    let consumed = ctx.state.consumption_in(measured);
    let mut by_group = vec![0.0; states.len()];
    for k in keys {
        by_group[k.group] += consumed(k.id) as f64;
    }
    for (s, c) in states.iter_mut().zip(by_group) {
        s.overshoot.count(measured, c);
    }
}

/// Per group, what users new in a data slot are expected to take of the
/// next: what those new in the complete data slot (two before the one
/// assigned) consumed in it, or what those new in the slot before
/// consumed, whichever is less. A key is new in a slot where it consumed
/// something, having consumed nothing in the slot before. Users who all
/// came at once (a node or a service just started) are new in one slot
/// only, and nothing is set aside for them.
fn arriving(ctx: &Slot<'_>, keys: &[KeyAsk], groups: usize) -> Vec<f64> {
    let measured = ctx.slot - 2;
    let used = [0, 1, 2].map(|back| ctx.state.consumption_in(measured - back));
    let mut newest = vec![0.0; groups];
    let mut before = vec![0.0; groups];
    for k in keys {
        let [now, last, older] = [&used[0], &used[1], &used[2]].map(|c| c(k.id));
        if last == 0 {
            newest[k.group] += now as f64;
        }
        if older == 0 {
            before[k.group] += last as f64;
        }
    }
    newest.iter().zip(&before).map(|(a, b)| a.min(*b)).collect()
}

/// Splits key `k`'s grant `amount` between its nodes: by scaling
/// Projected's grants (`factor`), or, for a key Projected granted
/// nothing, in proportion to each node's demand. A key nobody used
/// lately gets no grants.
fn to_nodes(
    ctx: &Slot<'_>,
    k: &KeyAsk,
    amount: f64,
    factor: &mut [f64],
    grants: &mut Vec<(NodeId, KeyId, f64)>,
) {
    let at = k.id.index();
    if ctx.projected[at].is_some() {
        factor[at] = match k.want > 0.0 {
            false => f64::NAN,
            true if k.cap > 0.0 => amount / k.cap,
            true => 0.0,
        };
        return;
    }
    let nodes = &ctx.demands[k.nodes.clone()];
    let total: f64 = nodes.iter().map(|(_, d)| d).sum();
    if total <= 0.0 {
        return;
    }
    for &(node, d) in nodes.iter().filter(|(_, d)| *d > 0.0) {
        grants.push((node, k.id, amount * d / total));
    }
}
