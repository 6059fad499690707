//! [`ServiceStore`]: one service's users, resources and quota ring.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use arc_swap::ArcSwap;
use compact_str::CompactString;
use metrics::counter;
use parking_lot::Mutex;
use throttle_clock::{Clock, SlotLength};
use throttle_proto::{MAX_NAME_LEN, v1};

use super::blocked::Blocked;
use super::budgets::Budgets;
use super::limits::{Allowance, Bound, ServiceLimits};
use super::resource::MAX_RESOURCES;
use super::resource::ResourceId;
use super::user::Overflow;
use super::users::Users;

/// Slots of quota history a user keeps besides the current and coming ones.
pub(super) const QUOTA_RING: usize = 16;

pub(super) const SLOT_BITS: u32 = 40;

pub(super) const SLOT_MASK: u64 = (1 << SLOT_BITS) - 1;

pub(super) const VERSION_MASK: u64 = (1 << (64 - SLOT_BITS)) - 1;

/// Counters and quotas of one service; get it from [`SlotStore::service`](super::SlotStore::service).
pub struct ServiceStore {
    pub(super) name: Arc<str>,
    pub(super) clock: Arc<dyn Clock>,
    /// The clock is [`CoarseClock`], read directly ([`Clock::is_coarse`]):
    /// every decision reads the clock, and the call through `dyn Clock`
    /// reads its vtable, a line no other part of the request touches, so
    /// mostly an L1 miss between requests.
    pub(super) coarse_clock: bool,
    pub(super) slot: SlotLength,
    pub(super) keys: Arc<AtomicUsize>,
    pub(super) max_keys: usize,
    /// Made at the first use, when the resources the layer counts are known.
    pub(super) users: OnceLock<Users>,
    pub(super) resources: ArcSwap<Vec<Arc<str>>>,
    pub(super) register: Mutex<()>,
    /// `slot & SLOT_MASK << 24 | version` of the quota tables received.
    pub(super) ring: [AtomicU64; QUOTA_RING],
    /// The newest slot a table was received for (`i64::MIN`: none yet),
    /// so the last-known fallback finds it without a search.
    pub(super) newest: AtomicI64,
    /// Counts a user's roll could not keep in its cells: slots that rolled
    /// over before they were collected, and charges that came after.
    pub(super) overflow: Mutex<Overflow>,
    /// Registered once: a flood of new users at the cap must not build a
    /// labelled metric key per request.
    pub(super) at_cap: metrics::Counter,
    /// The users the central has blocked.
    pub(super) blocked: Blocked,
    /// The service's limits, as the central sent them last.
    pub(super) limits: ArcSwap<ServiceLimits>,
    /// Whether `limits` has a default quota: checked first.
    pub(super) has_default: AtomicBool,
    /// The keys bound now by a longer period, as the central sent them.
    pub(super) bound: ArcSwap<Bound>,
    /// What the users closest to spending a longer period may still be
    /// admitted of it, as the central sent it.
    pub(super) budgets: ArcSwap<Budgets>,
    /// Whether `budgets` has any: checked first.
    pub(super) has_budgets: AtomicBool,
}

impl ServiceStore {
    /// Whether the central has blocked `user`: every request of theirs is
    /// refused, whatever their quota.
    #[inline]
    pub fn is_blocked(&self, user: &str) -> bool {
        self.blocked.contains(user)
    }

    /// Makes `users` the blocked users (the central's `Blocks`).
    #[doc(hidden)]
    pub fn set_blocked(&self, users: Vec<String>) {
        let count = users.len();
        self.blocked.set(users);
        metrics::gauge!("throttle_blocked_users", "service" => self.name.to_string())
            .set(count as f64);
    }

    /// Makes `limits` the service's limits (the central's `Limits`).
    #[doc(hidden)]
    pub fn set_limits(&self, limits: v1::Limits) {
        let _g = self.register.lock();
        let limits = ServiceLimits::from_message(limits, |r| self.resource_locked(r));
        let has_default = limits.has_default();
        self.limits.store(Arc::new(limits));
        self.has_default.store(has_default, Ordering::Release);
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
                self.budgets.load().spent_window(user, resource)
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
    #[doc(hidden)]
    pub fn set_bound(&self, mut bound: v1::Bound) {
        let list = std::mem::take(&mut bound.budgets);
        let budgets = Budgets::from_message(list, |r| self.find_resource(r));
        self.has_budgets
            .store(!budgets.is_empty(), Ordering::Relaxed);
        self.budgets.store(Arc::new(budgets));
        self.bound.store(Arc::new(Bound::from_message(bound)));
    }

    /// How many users are blocked.
    #[doc(hidden)]
    pub fn blocked_count(&self) -> usize {
        self.blocked.len()
    }
}

impl fmt::Debug for ServiceStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServiceStore")
            .field("name", &self.name)
            .field("users", &self.users())
            .field("resources", &self.resources.load())
            .finish_non_exhaustive()
    }
}

/// A tracked user of one service, to add amounts after the decision.
///
/// It names the user rather than pointing at its entry: entries live in the
/// map's nodes, and a user forgotten while a handle is held is counted under
/// a fresh entry.
#[derive(Clone)]
pub struct UserHandle {
    pub(super) service: Arc<ServiceStore>,
    pub(super) user: CompactString,
}

impl fmt::Debug for UserHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UserHandle")
            .field("service", &self.service.name)
            .field("user", &self.user)
            .finish()
    }
}

impl UserHandle {
    /// Adds `amount` of `resource` to the current slot.
    pub fn consume(&self, resource: ResourceId, amount: i64) {
        self.service.consume(&self.user, resource, amount);
    }

    /// The service this user belongs to.
    pub fn service(&self) -> &Arc<ServiceStore> {
        &self.service
    }

    /// The user's name.
    pub fn user(&self) -> &str {
        &self.user
    }
}

impl ServiceStore {
    /// The service's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The id of `resource`, registering it if new.
    ///
    /// Returns `None` when the service already counts [`MAX_RESOURCES`]
    /// resources or the name is empty or longer than 256 bytes.
    pub fn resource(&self, name: &str) -> Option<ResourceId> {
        if let Some(id) = self.find_resource(name) {
            return Some(id);
        }
        let _g = self.register.lock();
        self.resource_locked(name)
    }

    pub(crate) fn find_resource(&self, name: &str) -> Option<ResourceId> {
        let list = self.resources.load();
        list.iter()
            .position(|r| &**r == name)
            .map(|i| ResourceId(i as u8))
    }

    /// The name of a resource id.
    pub fn resource_name(&self, id: ResourceId) -> Option<Arc<str>> {
        self.resources.load().get(id.index()).cloned()
    }

    /// [`ServiceStore::resource`] for a caller already holding `register`.
    pub(super) fn resource_locked(&self, name: &str) -> Option<ResourceId> {
        if let Some(id) = self.find_resource(name) {
            return Some(id);
        }
        if name.is_empty() || name.len() > MAX_NAME_LEN {
            return None;
        }
        let mut list = Vec::clone(&self.resources.load());
        if list.len() >= MAX_RESOURCES {
            counter!("throttle_resources_over_limit_total", "service" => self.name.to_string())
                .increment(1);
            tracing::warn!(service = %self.name, resource = name, max = MAX_RESOURCES, "too many resources; not counted");
            return None;
        }
        list.push(name.into());
        let id = ResourceId((list.len() - 1) as u8);
        self.resources.store(Arc::new(list));
        Some(id)
    }

    /// Whether a quota table for `slot` has been received.
    #[doc(hidden)]
    pub fn has_quota(&self, slot: i64) -> bool {
        self.quota_version(slot).is_some()
    }

    /// The resources a user's counters have room for in its map node, fixed
    /// at the service's first user (`None` before it); a user counting more
    /// moves its counters to a separate allocation.
    #[doc(hidden)]
    pub fn cells_per_user(&self) -> Option<usize> {
        self.users.get().map(Users::class)
    }

    /// Number of users tracked.
    #[doc(hidden)]
    pub fn users(&self) -> usize {
        self.users.get().map_or(0, Users::len)
    }
}
