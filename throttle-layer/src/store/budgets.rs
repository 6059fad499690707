//! [`Budgets`]: what this node may still admit of a user's longer periods
//! (a minute, an hour, a day) while it has no quota for the slot, as the
//! central last told it ([`v1::Budget`]).
//!
//! The central lists only the keys whose longer buckets hold less than
//! two minutes at their shortest rate, and each node keeps to its share of
//! what is left (`remaining / nodes`). Every admission of such a user is
//! spent from it, quota or not, so that the budget in hand when the
//! central goes away is what was left then; it refuses only while the
//! node has no quota for the slot. The next `Bound` replaces it.

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
    /// Whole units this node may still admit.
    left: AtomicI64,
}

/// A service's budgets: user -> their budgets, one per (resource, period).
#[derive(Debug, Default)]
pub(crate) struct Budgets {
    users: HashMap<Box<str>, SmallVec<[Left; 2]>, foldhash::fast::RandomState>,
}

impl Budgets {
    /// The budgets of `list`, with resources numbered by `id` (those this
    /// node does not count are left out).
    pub(super) fn from_message(
        list: Vec<v1::Budget>,
        mut id: impl FnMut(&str) -> Option<ResourceId>,
    ) -> Self {
        let mut users: HashMap<Box<str>, SmallVec<[Left; 2]>, _> = HashMap::default();
        for b in list {
            let Some(resource) = id(&b.resource) else {
                continue;
            };
            let share = b.remaining.max(0.0) / f64::from(b.nodes.max(1));
            let left = Left {
                resource,
                window_seconds: b.window_seconds,
                left: AtomicI64::new(share.floor() as i64),
            };
            users.entry(b.user.into_boxed_str()).or_default().push(left);
        }
        Self { users }
    }

    /// Whether no user has a budget.
    pub(crate) fn is_empty(&self) -> bool {
        self.users.is_empty()
    }

    /// The first of `costs` that `user`'s budgets cannot pay, with what is
    /// left of it; else the first of their budgets that is spent, of a
    /// resource charged after the response (bytes sent, say): its cost
    /// is not known yet, and nothing of it is left.
    pub(super) fn short(
        &self,
        user: &str,
        costs: &[(ResourceId, i64)],
    ) -> Option<(ResourceId, i64)> {
        let budgets = self.users.get(user)?;
        let by_cost = costs.iter().find_map(|&(r, amount)| {
            let tightest = budgets.iter().filter(|b| b.resource == r);
            let left = tightest.map(|b| b.left.load(Ordering::Relaxed)).min()?;
            (amount > 0 && left < amount).then_some((r, left))
        });
        by_cost.or_else(|| {
            budgets.iter().find_map(|b| {
                let left = b.left.load(Ordering::Relaxed);
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

    /// The window of `user`'s spent budget of `resource`, if one is.
    pub(crate) fn spent_window(&self, user: &str, resource: ResourceId) -> Option<u32> {
        let budgets = self.users.get(user)?;
        let spent = budgets.iter().filter(|b| b.resource == resource);
        let spent = spent.filter(|b| b.left.load(Ordering::Relaxed) < 1);
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
        let b = Budgets::from_message(vec![budget("ann", "requests", 3600, 201.0, 2)], ids);
        assert!(!b.is_empty());
        // 201 for two nodes: 100 here.
        for _ in 0..100 {
            assert_eq!(b.short("ann", &[(REQ, 1)]), None);
            b.spend("ann", &[(REQ, 1)]);
        }
        assert_eq!(b.short("ann", &[(REQ, 1)]), Some((REQ, 0)));
        assert_eq!(b.spent_window("ann", REQ), Some(3600));
        // Others are not held; ann is, whatever her request costs: what
        // it costs of a spent budget may be charged after the response.
        assert_eq!(b.short("bob", &[(REQ, 1)]), None);
        assert_eq!(b.short("ann", &[(BYTES, 1_000)]), Some((REQ, 0)));
    }

    #[test]
    fn the_tightest_of_several_periods_decides_and_each_is_spent() {
        let list = vec![
            budget("ann", "requests", 60, 10.0, 1),
            budget("ann", "requests", 86_400, 5.0, 1),
            budget("ann", "gpu", 60, 0.0, 1),
        ];
        let b = Budgets::from_message(list, ids);
        assert_eq!(b.short("ann", &[(REQ, 6)]), Some((REQ, 5)));
        b.spend("ann", &[(REQ, 5)]);
        assert_eq!(b.spent_window("ann", REQ), Some(86_400));
        assert_eq!(b.short("ann", &[(REQ, 1)]), Some((REQ, 0)));
        // A cost of nothing does not fit a spent budget either.
        assert_eq!(b.short("ann", &[(REQ, 0)]), Some((REQ, 0)));
    }

    #[test]
    fn a_spent_budget_of_a_resource_charged_later_refuses() {
        let b = Budgets::from_message(vec![budget("ann", "bytes", 3600, 2_048.0, 1)], ids);
        assert_eq!(b.short("ann", &[(REQ, 1)]), None);
        b.spend("ann", &[(BYTES, 2_048)]);
        assert_eq!(b.short("ann", &[(REQ, 1)]), Some((BYTES, 0)));
    }

    #[test]
    fn nothing_left_or_no_nodes_told_is_read_safely() {
        let list = vec![
            budget("ann", "requests", 60, -4.0, 0),
            budget("bob", "requests", 60, f64::NAN, 3),
        ];
        let b = Budgets::from_message(list, ids);
        assert_eq!(b.short("ann", &[(REQ, 1)]), Some((REQ, 0)));
        assert_eq!(b.short("bob", &[(REQ, 1)]), Some((REQ, 0)));
    }
}
