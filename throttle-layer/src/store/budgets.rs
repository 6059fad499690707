//! [`Budgets`]: what this node may still admit of a user's periods while
//! it has no quota for the slot, as the central last told it
//! ([`v1::Budget`]).
//!
//! The central lists only the keys whose longer buckets (a minute, an
//! hour, a day) hold less than two minutes at their shortest rate, and
//! the keys whose last quotas were more than their per-second rate (a
//! stored burst being spent, which a last-known quota would repeat every
//! slot). Each node keeps to its share of what is left (`remaining /
//! nodes`) and of the refill since (`refill / nodes` a second): a token
//! bucket of its own. Every admission of such a user is spent from it,
//! quota or not, so that the budget in hand when the central goes away
//! is what was left then; it refuses only while the node has no quota
//! for the slot. The next `Bound` replaces it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};

use smallvec::SmallVec;
use throttle_proto::v1;

use super::resource::ResourceId;

/// One longer period's budget of one of a user's resources.
#[derive(Debug)]
struct Left {
    resource: ResourceId,
    window_seconds: u32,
    /// Whole units this node may still admit, before the refill.
    left: AtomicI64,
    /// This node's share of the refill, per millisecond.
    refill_per_ms: f64,
}

impl Left {
    /// What may be admitted `elapsed_ms` after the budget came: what is
    /// left and the refill since, in whole units.
    fn at(&self, elapsed_ms: i64) -> i64 {
        let refill = self.refill_per_ms * elapsed_ms.max(0) as f64;
        let refill = if refill.is_finite() {
            refill.floor() as i64
        } else {
            0
        };
        self.left.load(Ordering::Relaxed).saturating_add(refill)
    }
}

/// A service's budgets: user -> their budgets, one per (resource, period).
#[derive(Debug, Default)]
pub(crate) struct Budgets {
    users: HashMap<Box<str>, SmallVec<[Left; 2]>, foldhash::fast::RandomState>,
    /// When they came (the node's clock, ms): the refill counts from then.
    since_ms: i64,
}

impl Budgets {
    /// The budgets of `list`, come at `since_ms`, with resources numbered
    /// by `id` (those this node does not count are left out).
    pub(super) fn from_message(
        list: Vec<v1::Budget>,
        since_ms: i64,
        mut id: impl FnMut(&str) -> Option<ResourceId>,
    ) -> Self {
        let mut users: HashMap<Box<str>, SmallVec<[Left; 2]>, _> = HashMap::default();
        for b in list {
            let Some(resource) = id(&b.resource) else {
                continue;
            };
            let nodes = f64::from(b.nodes.max(1));
            let share = b.remaining.max(0.0) / nodes;
            let refill = b.refill.max(0.0) / nodes / 1000.0;
            let left = Left {
                resource,
                window_seconds: b.window_seconds,
                left: AtomicI64::new(share.floor() as i64),
                refill_per_ms: if refill.is_finite() { refill } else { 0.0 },
            };
            users.entry(b.user.into_boxed_str()).or_default().push(left);
        }
        Self { users, since_ms }
    }

    /// Whether no user has a budget.
    pub(crate) fn is_empty(&self) -> bool {
        self.users.is_empty()
    }

    /// The first of `costs` that `user`'s budgets cannot pay at `now_ms`,
    /// with what is left of it; else the first of their budgets that is
    /// spent, of a resource charged after the response (bytes sent, say):
    /// its cost is not known yet, and nothing of it is left.
    pub(super) fn short(
        &self,
        user: &str,
        costs: &[(ResourceId, i64)],
        now_ms: i64,
    ) -> Option<(ResourceId, i64)> {
        let budgets = self.users.get(user)?;
        let elapsed = now_ms.saturating_sub(self.since_ms);
        let by_cost = costs.iter().find_map(|&(r, amount)| {
            let tightest = budgets.iter().filter(|b| b.resource == r);
            let left = tightest.map(|b| b.at(elapsed)).min()?;
            (amount > 0 && left < amount).then_some((r, left))
        });
        by_cost.or_else(|| {
            budgets.iter().find_map(|b| {
                let left = b.at(elapsed);
                (left < 1).then_some((b.resource, left))
            })
        })
    }

    /// Spends `costs` from `user`'s budgets. The caller holds the user's
    /// lock, so a load and a store do not race with another admission.
    pub(super) fn spend(&self, user: &str, costs: &[(ResourceId, i64)]) {
        let Some(budgets) = self.users.get(user) else {
            return;
        };
        for &(r, amount) in costs {
            for b in budgets.iter().filter(|b| b.resource == r) {
                let left = b.left.load(Ordering::Relaxed);
                b.left.store(left.saturating_sub(amount), Ordering::Relaxed);
            }
        }
    }

    /// Spends from each budget what `used(user, resource)` says.
    pub(super) fn spend_each(&self, mut used: impl FnMut(&str, ResourceId) -> i64) {
        for (user, budgets) in &self.users {
            for b in budgets {
                let spent = used(user, b.resource);
                if spent != 0 {
                    b.left.fetch_sub(spent, Ordering::Relaxed);
                }
            }
        }
    }

    /// The window of `user`'s budget of `resource` spent at `now_ms`, if
    /// one is.
    pub(crate) fn spent_window(
        &self,
        user: &str,
        resource: ResourceId,
        now_ms: i64,
    ) -> Option<u32> {
        let budgets = self.users.get(user)?;
        let elapsed = now_ms.saturating_sub(self.since_ms);
        let spent = budgets.iter().filter(|b| b.resource == resource);
        let spent = spent.filter(|b| b.at(elapsed) < 1);
        spent.map(|b| b.window_seconds).max()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(
        user: &str,
        resource: &str,
        window_seconds: u32,
        remaining: f64,
        nodes: u32,
    ) -> v1::Budget {
        v1::Budget {
            user: user.into(),
            resource: resource.into(),
            window_seconds,
            remaining,
            nodes,
            refill: 0.0,
        }
    }

    fn ids(name: &str) -> Option<ResourceId> {
        match name {
            "requests" => Some(ResourceId(0)),
            "bytes" => Some(ResourceId(1)),
            _ => None,
        }
    }

    const REQ: ResourceId = ResourceId(0);
    const BYTES: ResourceId = ResourceId(1);

    #[test]
    fn a_budget_is_a_nodes_share_spent_down_to_what_no_cost_fits() {
        let b = Budgets::from_message(vec![budget("ann", "requests", 3600, 201.0, 2)], 0, ids);
        assert!(!b.is_empty());
        // 201 for two nodes: 100 here.
        for _ in 0..100 {
            assert_eq!(b.short("ann", &[(REQ, 1)], 0), None);
            b.spend("ann", &[(REQ, 1)]);
        }
        assert_eq!(b.short("ann", &[(REQ, 1)], 0), Some((REQ, 0)));
        assert_eq!(b.spent_window("ann", REQ, 0), Some(3600));
        // Others are not held; ann is, whatever her request costs: what
        // it costs of a spent budget may be charged after the response.
        assert_eq!(b.short("bob", &[(REQ, 1)], 0), None);
        assert_eq!(b.short("ann", &[(BYTES, 1_000)], 0), Some((REQ, 0)));
    }

    #[test]
    fn the_tightest_of_several_periods_decides_and_each_is_spent() {
        let list = vec![
            budget("ann", "requests", 60, 10.0, 1),
            budget("ann", "requests", 86_400, 5.0, 1),
            budget("ann", "gpu", 60, 0.0, 1),
        ];
        let b = Budgets::from_message(list, 0, ids);
        assert_eq!(b.short("ann", &[(REQ, 6)], 0), Some((REQ, 5)));
        b.spend("ann", &[(REQ, 5)]);
        assert_eq!(b.spent_window("ann", REQ, 0), Some(86_400));
        assert_eq!(b.short("ann", &[(REQ, 1)], 0), Some((REQ, 0)));
        // A cost of nothing does not fit a spent budget either.
        assert_eq!(b.short("ann", &[(REQ, 0)], 0), Some((REQ, 0)));
    }

    #[test]
    fn a_spent_budget_of_a_resource_charged_later_refuses() {
        let b = Budgets::from_message(vec![budget("ann", "bytes", 3600, 2_048.0, 1)], 0, ids);
        assert_eq!(b.short("ann", &[(REQ, 1)], 0), None);
        b.spend("ann", &[(BYTES, 2_048)]);
        assert_eq!(b.short("ann", &[(REQ, 1)], 0), Some((BYTES, 0)));
    }

    #[test]
    fn a_budget_refills_at_its_share_of_the_rate_from_when_it_came() {
        // 30 left and 100 a second for two nodes: 15 here, 50 a second.
        let mut told = budget("ann", "requests", 1, 30.0, 2);
        told.refill = 100.0;
        let b = Budgets::from_message(vec![told], 10_000, ids);
        b.spend("ann", &[(REQ, 15)]);
        assert_eq!(b.short("ann", &[(REQ, 1)], 10_000), Some((REQ, 0)));
        assert_eq!(b.spent_window("ann", REQ, 10_000), Some(1));
        // 10 ms buys half a request; 20 ms one.
        assert_eq!(b.short("ann", &[(REQ, 1)], 10_010), Some((REQ, 0)));
        assert_eq!(b.short("ann", &[(REQ, 1)], 10_020), None);
        // A second later 50 more, no more.
        assert_eq!(b.short("ann", &[(REQ, 50)], 11_000), None);
        assert_eq!(b.short("ann", &[(REQ, 51)], 11_000), Some((REQ, 50)));
        // A clock before the budget came counts no refill.
        assert_eq!(b.short("ann", &[(REQ, 1)], 9_000), Some((REQ, 0)));
    }

    #[test]
    fn nothing_left_or_no_nodes_told_is_read_safely() {
        let list = vec![
            budget("ann", "requests", 60, -4.0, 0),
            budget("bob", "requests", 60, f64::NAN, 3),
            v1::Budget {
                refill: f64::INFINITY,
                ..budget("cat", "requests", 1, 0.0, 1)
            },
        ];
        let b = Budgets::from_message(list, 0, ids);
        assert_eq!(b.short("ann", &[(REQ, 1)], 0), Some((REQ, 0)));
        assert_eq!(b.short("bob", &[(REQ, 1)], 0), Some((REQ, 0)));
        assert_eq!(b.short("cat", &[(REQ, 1)], 5_000), Some((REQ, 0)));
    }
}
