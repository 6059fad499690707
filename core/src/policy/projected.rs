//! The default policy: quotas from the projected bucket level, split by
//! demand, one slot ahead.

use super::assignment::{Assignment, Grant};
use super::granted::{Granted, SlotGrants};
use super::policy::Policy;
use crate::arena::first_shares::FirstShare;
use crate::arena::{Key, NodeId, NodeUsage, ServiceState};

/// Data slots a node's latest report stays relevant.
pub(super) const WINDOW: i64 = 5;
/// Slots before the one assigned whose grants are weighed.
const GRANTS: i64 = 4;
/// A node with rejections wants at least this much more than it consumed.
const HUNGRY_GROWTH: f64 = 1.2;
/// The longest lag of a node that reports every few slots that the
/// grants weighed follow (a proxy reporting every 5 s at 100 ms slots
/// lags 50).
const MAX_LAG: i64 = 60;
/// The part of a key's slack (the budget its busy nodes' demand leaves)
/// that its idle nodes share, as the legacy system shares a tenth of the bucket.
const IDLE_RESERVE: f64 = 0.1;
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
///    user) a tenth of the slack, the budget the busy nodes' demand leaves,
///    shared as if every node had its even part of it, and at least a small
///    floor: a user under its limit who arrives at another node is not
///    refused there while the next slot's quota catches up, and one at its
///    limit leaves no slack, so its busy nodes keep the whole budget. A user
///    nobody used lately gets, on every active node, an even split of the
///    budget (up to 10,000 such keys), so a burst after a quiet period is
///    throttled from its first request instead of failing open, and one
///    who arrives on every node at once is held to the bucket. A node's
///    grant of a slot it has not reported is counted as spent whole where
///    the user had no use there yet: the slot after a user's first is
///    granted before their first report.
/// 4. Counts a proxy (a node that reports every few slots, such as Envoy)
///    as its token bucket admits: it is granted whole requests a second,
///    kept while the new grant is within a tenth of it, which is what its
///    stream tells it; and a bucket new to it, told its share of the
///    user's rule before its first report (its *first share*), is counted
///    at that share until the proxy reports those slots.
/// 5. Runs at mid-slot for the *next* slot and re-assigns the *current*
///    slot as soon as every active node has reported the previous one
///    (pushed at once over the streams), so a shift of load between nodes is
///    followed within the slot after it. A report's answer carries the
///    node's current grants as a stand-in for the next slot until that slot
///    is assigned.
#[derive(Debug, Default)]
pub struct Projected;

impl Projected {
    /// The policy.
    pub fn new() -> Self {
        Self
    }
}

/// What a node would have used, from its latest entry of `key`: consumption
/// plus rejections times the cost of one request; and that cost (1 where
/// it refused nothing).
fn demand(state: &ServiceState, key: &Key, entry: &NodeUsage) -> (f64, f64) {
    let c = entry.consumption as f64;
    if entry.rejection == 0 {
        return (c, 1.0);
    }
    let unit = if key.resource() == "requests" {
        1.0
    } else {
        // The cost of one request: this resource per request, on that node
        // in that slot.
        state
            .find(key.user(), "requests")
            .and_then(|r| {
                state
                    .key(r)
                    .nodes()
                    .iter()
                    .find(|n| n.node == entry.node && n.slot == entry.slot)
            })
            .filter(|n| n.consumption > 0)
            .map_or(1.0, |n| c / n.consumption as f64)
    };
    let wanted = (c + entry.rejection as f64 * unit).max(c * HUNGRY_GROWTH);
    (wanted, unit)
}

/// What a node that wants `demand` is expected to admit on a grant of
/// `grant`: a node admits while what it counted is within its quota, so
/// one held by it admits the request that crosses it too (51 requests on
/// a quota of 50, 50 on 49.6). `over` is by how much it crossed its grant
/// in its newest reported slot, if it was held then; the same is expected
/// again.
fn admits_on(grant: f64, demand: f64, over: Option<f64>) -> f64 {
    if demand <= grant {
        demand
    } else {
        demand.min(grant + over.unwrap_or(0.0))
    }
}

/// What each of `nodes` is granted of a key nobody used lately, of a
/// `budget`, `per_slot` its rate a slot: an even split, so that a user
/// who arrives everywhere at once is held to the bucket (one who lives on
/// one node gets the rest after their first report). A proxy keeps its
/// grant for every slot until its report, so the proxies share the budget
/// and the refill of those slots: together they admit no more than the
/// bucket allows.
fn first_come<'n>(
    nodes: &'n [(NodeId, f64)],
    newest: &'n Newest,
    budget: f64,
    per_slot: f64,
) -> impl Fn(NodeId) -> f64 + 'n {
    let lag = nodes.iter().map(|(n, _)| newest.lag(*n)).max().unwrap_or(0);
    let proxies = nodes.iter().filter(|(n, _)| newest.lag(*n) > 0).count();
    let each = budget / nodes.len() as f64;
    let spread =
        (budget + per_slot * (lag - 1).max(0) as f64) / (proxies.max(1) as i64 * lag.max(1)) as f64;
    move |node| match newest.lag(node) {
        0 => each,
        _ => each.min(spread),
    }
}

/// Whether a proxy's token bucket of `before` requests a second is told
/// `after` instead: a move of more than a tenth, and of more than one
/// request a second. Smaller moves are neither granted nor told.
pub fn moved(before: f64, after: f64) -> bool {
    (after - before).abs() > (before / 10.0).max(1.0)
}

/// A proxy's grant of `grant` requests a slot, as the whole number of
/// requests a second its token bucket is told; `before`, its grant of the
/// slot before, where the new one has not [`moved`] from it: what the
/// policy counts of the proxy is then what the proxy keeps to.
fn steady(grant: f64, before: Option<f64>, slot_secs: f64) -> f64 {
    let per_second = grant / slot_secs;
    if per_second.is_nan() || per_second <= 0.0 {
        return 0.0;
    }
    let whole = per_second.round().max(1.0);
    match before.map(|b| b / slot_secs) {
        Some(b) if b > 0.0 && !moved(b, whole) => b * slot_secs,
        _ => whole * slot_secs,
    }
}

/// Each node's newest reported data slot, and its lag
/// ([`ServiceState::lag`], at most [`MAX_LAG`]), by node index: read for
/// every entry of every key.
pub(super) struct Newest {
    newest: Vec<Option<i64>>,
    lags: Vec<i64>,
}

impl Newest {
    /// The newest data slot each node of `state` reported, and its lag.
    pub(super) fn of(state: &ServiceState) -> Self {
        let mut newest = Vec::new();
        for (n, s) in &state.last_report {
            if n.index() >= newest.len() {
                newest.resize(n.index() + 1, None);
            }
            newest[n.index()] = Some(*s);
        }
        let mut lags = Vec::new();
        for (n, lag) in &state.lags {
            if n.index() >= lags.len() {
                lags.resize(n.index() + 1, 0);
            }
            lags[n.index()] = (*lag).min(MAX_LAG);
        }
        Self { newest, lags }
    }

    /// `node`'s newest data slot, if it reported any.
    #[inline]
    pub(super) fn get(&self, node: NodeId) -> Option<i64> {
        self.newest.get(node.index()).copied().flatten()
    }

    /// `node`'s lag: 0 for a node that reports every slot.
    #[inline]
    pub(super) fn lag(&self, node: NodeId) -> i64 {
        self.lags.get(node.index()).copied().unwrap_or(0)
    }

    /// The longest lag of any node.
    fn most_lag(&self) -> i64 {
        self.lags.iter().copied().max().unwrap_or(0)
    }

    /// What `entry`, of `key`, wants now, and the cost of one of its
    /// requests: its [`demand`], or nothing when its node has reported
    /// newer slots without this key (it has moved on).
    #[inline]
    pub(super) fn demand(&self, state: &ServiceState, key: &Key, entry: &NodeUsage) -> (f64, f64) {
        if entry.slot < self.get(entry.node).unwrap_or(entry.slot) {
            (0.0, 1.0)
        } else {
            demand(state, key, entry)
        }
    }
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
        granted: Granted<'_>,
        slot: i64,
        now_ms: i64,
        mut out: Assignment,
    ) -> Assignment {
        let slot_secs = f64::from(state.slot.as_ms()) / 1000.0;
        let until_end = (state.slot.end_ms(slot) - now_ms).max(0) as f64 / 1000.0;
        let recent = slot - 1 - WINDOW;
        // A node that reports every few slots is as recent as its lag
        // allows, and its grants for that many more slots are weighed.
        let newest = Newest::of(state);
        let mut active: Vec<NodeId> = state
            .last_report
            .iter()
            .filter(|(n, s)| **s + newest.lag(**n) > recent)
            .map(|(n, _)| *n)
            .collect();
        let back = GRANTS + newest.most_lag();
        active.sort_unstable();
        // Only "more than MAX_IDLE_KEYS or not" matters: stop counting
        // there rather than touch every key an extra time.
        let few_keys = state
            .keys()
            .filter(|(_, k)| k.bucket().is_some())
            .take(MAX_IDLE_KEYS + 1)
            .count()
            <= MAX_IDLE_KEYS;
        // What each node was granted for the slots before this one, read
        // beside the keys (see `SlotGrants`); the oldest first.
        let mut earlier: Vec<SlotGrants<'_>> =
            (slot - back..slot).map(|y| granted.slot(y)).collect();
        let mut nodes: Vec<(NodeId, f64)> = Vec::new();
        // What each node of `nodes` admitted in its newest slot, and that
        // slot with the cost of a request if its grant held it there.
        let mut used: Vec<(f64, Option<(i64, f64)>)> = Vec::new();
        for (id, key) in state.keys() {
            let Some(bucket) = key.bucket() else { continue };
            nodes.clear();
            used.clear();
            for e in key
                .nodes()
                .iter()
                .filter(|e| e.slot + newest.lag(e.node) > recent)
            {
                let (d, unit) = newest.demand(state, key, e);
                nodes.push((e.node, d));
                let consumed = if d > 0.0 { e.consumption as f64 } else { 0.0 };
                let held = (e.rejection > 0 && e.slot >= slot - back).then_some((e.slot, unit));
                used.push((consumed, held));
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
            // Proxies whose new bucket of the user holds its first share.
            let first_shares = match key.resource() {
                "requests" => state.first_shares.of(key.user()),
                _ => &[],
            };
            for n in first_shares.iter().map(FirstShare::node) {
                if !nodes.iter().any(|(m, _)| *m == n) {
                    nodes.push((n, 0.0));
                }
            }
            let level = bucket.level_at(now_ms);
            let rate = bucket.rate();
            let mut outstanding = 0.0;
            // Of it, what proxies were granted: their reports are charged
            // first to the refill the bucket's capacity turned away.
            let (mut batched, mut batched_from) = (0.0, slot);
            for (i, &(node, d)) in nodes.iter().enumerate() {
                let first_share = first_shares.iter().find(|s| s.node() == node);
                let last = newest
                    .get(node)
                    .unwrap_or_else(|| first_share.map_or(slot - 2, |s| s.first() - 1));
                let first = (last + 1).max(slot - GRANTS - newest.lag(node));
                // Without a grant, a node that refused nothing fails open
                // (it admits its demand), and one that refused keeps to
                // what held it (its last quotas, a hold's): its last use.
                let (ungranted, held) = used.get(i).copied().unwrap_or((d, None));
                // A node of this library counts against its quota; a
                // proxy that reports every few slots keeps to its token
                // bucket.
                let every_slot = newest.lag(node) == 0;
                // How far past its grant it went where it was held: read
                // only for a node with unreported slots.
                let over = held
                    .filter(|_| every_slot && first < slot)
                    .and_then(|(at, unit)| {
                        let g = earlier[(at - (slot - back)) as usize].get(node, id)?;
                        Some((ungranted - f64::from(g)).clamp(0.0, unit))
                    });
                for y in first..slot {
                    let grant = earlier[(y - (slot - back)) as usize].get(node, id);
                    let grant = grant.map(f64::from);
                    let told = first_share.and_then(|s| s.in_slot(y, 1.0 / slot_secs));
                    let admits = match (told, grant) {
                        (Some(told), _) => told,
                        // A node with nothing reported of the user may
                        // spend its whole grant: a user new to it.
                        (None, Some(g)) if every_slot && d <= 0.0 => g,
                        (None, Some(g)) if every_slot => admits_on(g, d, over),
                        (None, Some(g)) => g.min(d),
                        (None, None) => ungranted,
                    };
                    outstanding += admits;
                    if !every_slot {
                        batched += admits;
                        batched_from = batched_from.min(y);
                    }
                }
            }
            // Only what was turned away since the oldest of those slots
            // began: older refill was nobody's use. (Read only for a key
            // with a proxy's unreported slots.)
            let spilled = if batched > 0.0 {
                let since = (now_ms - state.slot.start_ms(batched_from)).max(0) as f64 / 1000.0;
                bucket.spilled_at(now_ms).min(batched).min(rate * since)
            } else {
                0.0
            };
            let ceiling = bucket.capacity().max(rate * slot_secs);
            let budget = (level + spilled - outstanding + rate * until_end).clamp(0.0, ceiling);
            let total: f64 = nodes.iter().map(|(_, d)| d).sum();
            let floor = (rate * slot_secs * 0.01).max(1.0);
            let busy = nodes.iter().filter(|(_, d)| *d > 0.0).count();
            // Idle nodes share a tenth of what the busy ones will not use
            // (the legacy system's reserve, taken from the slack rather than the
            // whole bucket), each as much as its share of all the nodes;
            // the busy ones split the rest, never less than their demand.
            let each_idle = IDLE_RESERVE * (budget - total).max(0.0) / nodes.len() as f64;
            // Read only for a key nobody used lately.
            let first_come =
                (total <= 0.0).then(|| first_come(&nodes, &newest, budget, rate * slot_secs));
            let shared = budget - each_idle * (nodes.len() - busy) as f64;
            let idle_grant = each_idle.max(floor.min(budget / busy.max(1) as f64).max(1.0));
            for &(node, d) in &nodes {
                let grant = if total > 0.0 {
                    if d > 0.0 {
                        shared * d / total
                    } else {
                        idle_grant
                    }
                } else {
                    first_come.as_ref().map_or(0.0, |f| f(node))
                };
                let grant = if newest.lag(node) > 0 {
                    let before = earlier.last_mut().and_then(|s| s.get(node, id));
                    steady(grant, before.map(f64::from), slot_secs)
                } else {
                    grant
                };
                out.push(node, Grant::new(id, grant));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::{admits_on, steady};

    #[test]
    fn a_proxy_is_granted_whole_requests_a_second_that_move_by_more_than_a_tenth() {
        // Whole requests a second, at least one while above 0.
        assert_eq!(steady(33.6, None, 1.0), 34.0);
        assert_eq!(steady(0.2, None, 1.0), 1.0);
        assert_eq!(steady(0.0, Some(5.0), 1.0), 0.0);
        assert_eq!(steady(f64::NAN, None, 1.0), 0.0);
        // Per slot of 100 ms: 3.36 a slot is 34 a second.
        assert!((steady(3.36, None, 0.1) - 3.4).abs() < 1e-9);
        // Within a tenth, or one request a second, of the grant before: kept.
        assert_eq!(steady(43.0, Some(40.0), 1.0), 40.0);
        assert_eq!(steady(36.4, Some(40.0), 1.0), 40.0);
        assert_eq!(steady(3.0, Some(2.0), 1.0), 2.0);
        // Further: the new one.
        assert_eq!(steady(45.0, Some(40.0), 1.0), 45.0);
        assert_eq!(steady(4.0, Some(2.0), 1.0), 4.0);
        // A denied proxy is told its first token.
        assert_eq!(steady(1.0, Some(0.0), 1.0), 1.0);
    }

    #[test]
    fn a_node_held_by_its_quota_crosses_it_as_it_did_last() {
        // More granted than wanted: what it wants.
        assert_eq!(admits_on(60.0, 50.0, Some(0.35)), 50.0);
        // Held: as far past the grant as it went in its newest slot.
        assert_eq!(admits_on(49.65, 150.0, Some(0.35)), 50.0);
        assert_eq!(admits_on(50.0, 150.0, Some(1.0)), 51.0);
        // Not held then, or no grant known: the grant.
        assert_eq!(admits_on(50.0, 150.0, None), 50.0);
        // Never more than it wants.
        assert_eq!(admits_on(50.0, 50.2, Some(1.0)), 50.2);
    }
}
