//! What the central sends a service besides quotas, installed: its
//! limits (`Limits`), its keys bound by a longer period and their budgets
//! (`Bound`), its blocked users (`Blocks`); and the configured allowance a
//! refusal names, read from them. See the comment on the `impl` block.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use throttle_proto::v1;

use super::budgets::Budgets;
use super::limits::{Allowance, Bound, ServiceLimits};
use super::resource::ResourceId;
use super::service::ServiceStore;
use super::users::used_in;

// The central's messages besides quotas, as the reporter installs them,
// and what the headers of a response read back from them.
impl ServiceStore {
    /// Makes `users` the blocked users (the central's `Blocks`).
    #[cfg_attr(feature = "sim", visibility::make(pub))]
    pub(crate) fn set_blocked(&self, users: Vec<String>) {
        let count = users.len();
        self.blocked.set(users);
        metrics::gauge!("throttle_blocked_users", "service" => self.name.to_string())
            .set(count as f64);
    }

    /// Makes `limits` the service's limits (the central's `Limits`).
    #[cfg_attr(feature = "sim", visibility::make(pub))]
    pub(crate) fn set_limits(&self, limits: v1::Limits) {
        let _g = self.register.lock();
        let limits = ServiceLimits::from_message(limits, |r| self.resource_locked(r));
        let has_default = limits.has_default();
        let has_newcomers = limits.newcomers().is_limited();
        self.limits.store(Arc::new(limits));
        self.has_default.store(has_default, Ordering::Release);
        self.has_newcomers.store(has_newcomers, Ordering::Release);
    }

    /// `user`'s configured allowance of `resource` that binds now: the one
    /// the central says binds, else the one with the shortest window; if
    /// the central's limits give one. Without a reference count or a
    /// copy: a refusal asks.
    pub(crate) fn configured(&self, user: &str, resource: ResourceId) -> Option<Allowance> {
        let limits = self.limits.load();
        if limits.is_empty() {
            return None;
        }
        let names = self.resources.load();
        let name = names.get(resource.index())?;
        let bound = self.bound.load();
        let told = (!bound.is_empty())
            .then(|| bound.window(user, name))
            .flatten();
        let window = match told {
            Some(w) => Some(w),
            None if self.has_budgets.load(Ordering::Relaxed) => {
                self.budgets
                    .load()
                    .spent_window(user, resource, self.now_ms())
            }
            None => None,
        };
        if let Some(window) = window
            && let Some(allowance) = limits.over(user, name, window)
        {
            return Some(allowance);
        }
        limits.shortest(user, name)
    }

    /// Makes `bound` the service's keys bound by a longer period, and its
    /// budgets the ones it spends while it has no quota (the central's
    /// `Bound`).
    #[cfg_attr(feature = "sim", visibility::make(pub))]
    pub(crate) fn set_bound(&self, mut bound: v1::Bound) {
        let list = std::mem::take(&mut bound.budgets);
        let now = self.now_ms();
        let slot = self.slot.slot_at(now);
        let budgets = Budgets::from_message(list, now, |r| self.find_resource(r));
        // What the central told was left before this slot's admissions,
        // which it has not heard of yet: they are spent from it.
        budgets.spend_each(|user, r| used_in(self.user_map(), user, r, slot));
        self.has_budgets
            .store(!budgets.is_empty(), Ordering::Relaxed);
        self.budgets.store(Arc::new(budgets));
        self.bound.store(Arc::new(Bound::from_message(bound)));
    }

    /// How many users are blocked.
    #[cfg(any(test, feature = "sim"))]
    #[cfg_attr(feature = "sim", visibility::make(pub))]
    pub(crate) fn blocked_count(&self) -> usize {
        self.blocked.len()
    }
}
