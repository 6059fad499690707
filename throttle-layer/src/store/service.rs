//! [`ServiceStore`]: one service's users, resources and quota ring.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use arc_swap::ArcSwap;
use compact_str::CompactString;
use metrics::counter;
use parking_lot::Mutex;
use throttle_clock::{Clock, CoarseClock, SlotLength};
use throttle_proto::MAX_NAME_LEN;

use super::blocked::Blocked;
use super::budgets::Budgets;
use super::decision::{Basis, Decision, Tightest};
use super::fallback::Fallback;
use super::limits::{Bound, ServiceLimits};
use super::resource::{MAX_RESOURCES, ResourceId};
use super::user::{Overflow, UserState};
use super::users::{Entry, Guard, Name, UserGuard, UserLock, UserMap, Users, with_users};

/// Slots of quota history a user keeps besides the current and coming ones.
pub(super) const QUOTA_RING: usize = 16;

pub(super) const SLOT_BITS: u32 = 40;

pub(super) const SLOT_MASK: u64 = (1 << SLOT_BITS) - 1;

pub(super) const VERSION_MASK: u64 = (1 << (64 - SLOT_BITS)) - 1;
/// Set beside a table's version when it came ahead, in an answer to a
/// report for a slot to come (`quota.rs`, `Ahead`).
pub(super) const AHEAD_BIT: u64 = 1 << 16;

/// The version of a default row: above any table's, so it is current for
/// every table of its slot until a row of the user's own replaces it.
pub(super) const DEFAULT_VERSION: u16 = u16::MAX;

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
    /// Whether `limits` holds the users without a row together: checked
    /// by a decision on a default row.
    pub(super) has_newcomers: AtomicBool,
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

/// The result of [`ServiceStore::admit`]: the decision and, when asked for,
/// a handle to add amounts known later.
#[derive(Debug)]
pub struct Admission {
    /// Allowed or refused, and why.
    pub decision: Decision,
    /// Set by [`ServiceStore::admit_with_handle`] for a tracked user.
    pub handle: Option<UserHandle>,
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
    pub fn consume(&self, resource: ResourceId, amount: u64) {
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
    #[cfg(any(test, feature = "sim"))]
    #[cfg_attr(feature = "sim", visibility::make(pub))]
    pub(crate) fn has_quota(&self, slot: i64) -> bool {
        self.quota_version(slot).is_some()
    }

    /// The resources a user's counters have room for in its map node, fixed
    /// at the service's first user (`None` before it); a user counting more
    /// moves its counters to a separate allocation.
    #[cfg(any(test, feature = "sim"))]
    #[cfg_attr(feature = "sim", visibility::make(pub))]
    pub(crate) fn cells_per_user(&self) -> Option<usize> {
        self.users.get().map(Users::class)
    }

    /// Number of users tracked.
    #[cfg_attr(feature = "sim", visibility::make(pub))]
    pub(crate) fn users(&self) -> usize {
        self.users.get().map_or(0, Users::len)
    }
}

// The decision on the request path: a user's entry found and locked,
// its quota row read, the request admitted or refused.
impl ServiceStore {
    #[inline]
    pub(super) fn current_slot(&self) -> i64 {
        self.slot.slot_at(self.now_ms())
    }

    /// The store's clock, in ms.
    #[inline]
    pub(super) fn now_ms(&self) -> i64 {
        if self.coarse_clock {
            CoarseClock::now()
        } else {
            self.clock.now_ms()
        }
    }

    /// The version of the quota table for `slot`, if one was received.
    #[inline]
    pub(super) fn quota_version(&self, slot: i64) -> Option<u16> {
        // `apply` publishes versions up to `u16::MAX` only.
        self.published(slot).map(|v| (v & VERSION_MASK) as u16)
    }

    /// Whether the table for `slot` was received and did not come ahead
    /// (`quota.rs`, `Ahead`): a quota the budgets do not hold on.
    pub(super) fn has_pushed_quota(&self, slot: i64) -> bool {
        self.published(slot).is_some_and(|v| v & AHEAD_BIT == 0)
    }

    /// What the ring holds for `slot`'s table, if one was received.
    #[inline]
    fn published(&self, slot: i64) -> Option<u64> {
        let v = self.ring[slot.rem_euclid(QUOTA_RING as i64) as usize].load(Ordering::Acquire);
        (v != 0 && v >> (64 - SLOT_BITS) == slot as u64 & SLOT_MASK).then_some(v)
    }

    /// The newest table of the `n` slots before `slot`: the newest one
    /// received when it is older than `slot` (one load: without a central
    /// every request comes here), else a search back.
    #[inline]
    fn last_known(&self, slot: i64, n: u32) -> Option<(i64, u16)> {
        let newest = self.newest.load(Ordering::Acquire);
        let oldest = slot.saturating_sub(i64::from(n));
        if newest < oldest {
            return None;
        }
        if newest < slot
            && let Some(v) = self.quota_version(newest)
        {
            return Some((newest, v));
        }
        (oldest..slot)
            .rev()
            .find_map(|s| self.quota_version(s).map(|v| (s, v)))
    }

    /// The service's users, in a map made at the first use of the store.
    #[inline]
    pub(super) fn user_map(&self) -> &Users {
        self.users
            .get_or_init(|| Users::for_resources(self.resources.load().len()))
    }

    /// `user`'s entry, added if new; `None` when the store is at its key
    /// cap and the user is new.
    #[inline]
    pub(super) fn lookup<'g, const N: usize>(
        &self,
        users: &'g UserMap<N>,
        guard: &'g Guard<'_>,
        user: &str,
        slot: i64,
    ) -> Option<&'g Entry<N>> {
        match users.get(&Name(user), guard) {
            Some(entry) => Some(entry),
            None => self.add_user(users, guard, user, slot),
        }
    }

    #[cold]
    #[inline(never)]
    pub(super) fn add_user<'g, const N: usize>(
        &self,
        users: &'g UserMap<N>,
        guard: &'g Guard<'_>,
        user: &str,
        slot: i64,
    ) -> Option<&'g Entry<N>> {
        if self.keys.fetch_add(1, Ordering::Relaxed) >= self.max_keys {
            self.keys.fetch_sub(1, Ordering::Relaxed);
            self.at_cap.increment(1);
            return None;
        }
        let mut state = UserState::new(slot);
        self.give_default_row(&mut state, user, slot);
        let entry = UserLock::new(state);
        match users.try_insert(user.into(), entry, guard) {
            Ok(entry) => Some(entry),
            Err(e) => {
                // Another thread added it first.
                self.keys.fetch_sub(1, Ordering::Relaxed);
                Some(e.current)
            }
        }
    }

    /// Decides whether `user` may make a request now, with the legacy system
    /// rules (see the [module docs](crate::store)); if so, adds `costs`.
    pub fn admit(
        self: &Arc<Self>,
        user: &str,
        costs: &[(ResourceId, i64)],
        fallback: Fallback,
    ) -> Admission {
        if self.has_budgets.load(Ordering::Relaxed) {
            return self.admit_within_budget(user, costs, fallback, true, false);
        }
        self.admit_inner(user, costs, fallback, true, false)
    }

    /// As [`ServiceStore::admit`], and returns a [`UserHandle`] for amounts
    /// known later. With `record_rejection` false (shadow mode) a refusal is
    /// decided but not counted as a rejection, and the costs are charged
    /// since the request goes through anyway.
    pub fn admit_with_handle(
        self: &Arc<Self>,
        user: &str,
        costs: &[(ResourceId, i64)],
        fallback: Fallback,
        record_rejection: bool,
    ) -> Admission {
        if self.has_budgets.load(Ordering::Relaxed) {
            return self.admit_within_budget(user, costs, fallback, record_rejection, true);
        }
        self.admit_inner(user, costs, fallback, record_rejection, true)
    }

    #[inline]
    pub(super) fn admit_inner(
        self: &Arc<Self>,
        user: &str,
        costs: &[(ResourceId, i64)],
        fallback: Fallback,
        record: bool,
        want_handle: bool,
    ) -> Admission {
        self.admit_by(user, fallback, want_handle, |st, slot| {
            self.decide(st, user, slot, costs, fallback, record)
        })
    }

    /// As [`ServiceStore::admit_inner`], for a service with budgets (kept
    /// off the path of the others).
    #[cold]
    #[inline(never)]
    fn admit_within_budget(
        self: &Arc<Self>,
        user: &str,
        costs: &[(ResourceId, i64)],
        fallback: Fallback,
        record: bool,
        want_handle: bool,
    ) -> Admission {
        self.admit_by(user, fallback, want_handle, |st, slot| {
            self.decide_within_budget(st, user, slot, costs, fallback, record)
        })
    }

    /// `user`'s admission as `decide` makes it on their entry in the
    /// current slot; the fallback's at the key cap.
    #[inline(always)]
    fn admit_by(
        self: &Arc<Self>,
        user: &str,
        fallback: Fallback,
        want_handle: bool,
        decide: impl FnOnce(&mut UserState, i64) -> Decision,
    ) -> Admission {
        let slot = self.current_slot();
        let admission = self.with_entry(user, slot, |st| {
            let decision = decide(st, slot);
            let handle = want_handle.then(|| UserHandle {
                service: self.clone(),
                user: user.into(),
            });
            Admission { decision, handle }
        });
        admission.unwrap_or(Admission {
            decision: Decision::fallback(fallback, Basis::AtCap),
            handle: None,
        })
    }

    /// Runs `f` on `user`'s entry (created if new), locked and rolled on to
    /// `slot`; `None` when the store is at its key cap and the user is new.
    pub(super) fn with_entry<T>(
        &self,
        user: &str,
        slot: i64,
        f: impl FnOnce(&mut UserState) -> T,
    ) -> Option<T> {
        // Only the lookup depends on the map's class: the rest is one copy.
        let users = self.user_map();
        let guard = with_users!(users, map => map.guard());
        let mut st = with_users!(users, map => self.locked(map, &guard, user, slot))?;
        // `UserState::roll`, with the user's default row given in a new
        // slot.
        if st.slot < slot {
            self.roll_with_default(&mut st, slot, user);
        }
        Some(f(&mut st))
    }

    /// `user`'s state (created if new), locked; `None` when the store is at
    /// its key cap and the user is new.
    #[inline]
    pub(super) fn locked<'g, const N: usize>(
        &self,
        users: &'g UserMap<N>,
        guard: &'g Guard<'_>,
        user: &str,
        slot: i64,
    ) -> Option<UserGuard<'g>> {
        loop {
            let entry = self.lookup(users, guard, user, slot)?;
            let state: &UserLock<UserState> = entry;
            let st = state.lock();
            if !st.evicted {
                return Some(st);
            }
            // Forgotten by a collect after we found it: drop it from the map
            // if it is still there, and start over with a fresh one.
            drop(st);
            let _ = users.remove_if(user, |_, e| std::ptr::eq(e, entry), guard);
        }
    }

    /// As [`ServiceStore::decide`], for a service with budgets: without a
    /// quota for the slot, a cost `user`'s budget cannot pay is refused;
    /// whatever is admitted is spent from it.
    #[inline]
    fn decide_within_budget(
        &self,
        st: &mut UserState,
        user: &str,
        slot: i64,
        costs: &[(ResourceId, i64)],
        fallback: Fallback,
        record: bool,
    ) -> Decision {
        let budgets = self.budgets.load();
        let on_quota = self.has_pushed_quota(slot);
        if !on_quota && let Some((resource, left)) = budgets.short(user, costs, self.now_ms()) {
            let used = st.cell(resource.index()).used;
            if record {
                let cell = st.cell(resource.index());
                cell.rejected = cell.rejected.saturating_add(1);
            } else {
                // Shadow mode lets it through: it consumes.
                st.charge(costs);
                budgets.spend(user, costs);
            }
            let quota = left.max(0) as f64;
            return Decision {
                allowed: false,
                basis: Basis::Fallback,
                tightest: Some(Tightest {
                    resource,
                    quota,
                    used,
                }),
            };
        }
        let decision = self.decide(st, user, slot, costs, fallback, record);
        if decision.allowed || !record {
            budgets.spend(user, costs);
        }
        decision
    }

    #[inline(always)]
    pub(super) fn decide(
        &self,
        st: &mut UserState,
        user: &str,
        slot: i64,
        costs: &[(ResourceId, i64)],
        fallback: Fallback,
        record: bool,
    ) -> Decision {
        let found = match self.quota_version(slot) {
            Some(v) => Some((slot, v)),
            None => match fallback {
                Fallback::Allow | Fallback::Deny => None,
                Fallback::LastKnownThenAllow(n) | Fallback::LastKnownThenDeny(n) => {
                    self.last_known(slot, n)
                }
            },
        };
        let Some((quota_slot, version)) = found else {
            if self.has_default.load(Ordering::Acquire) {
                return self.decide_without_table(st, slot, costs, fallback, record);
            }
            let d = Decision::fallback(fallback, Basis::Fallback);
            if d.allowed {
                st.charge(costs);
            }
            return d;
        };
        let basis = if quota_slot == slot {
            Basis::Quota
        } else {
            Basis::Fallback
        };
        match st.row(quota_slot, version) {
            Some(row) => {
                let (allowed, tightest) = self.apply(st, row, slot, costs, record);
                Decision {
                    allowed,
                    basis,
                    tightest,
                }
            }
            None => self.decide_without_row(st, user, (slot, quota_slot), costs, fallback, record),
        }
    }

    /// The decision when the table that decides `slot` (that of
    /// `quota_slot`, the slot's own or the last known) has no row for
    /// the user: without the slot's own, as without a table; else their
    /// default row, if the limits give them one; else not limited.
    #[cold]
    #[inline(never)]
    fn decide_without_row(
        &self,
        st: &mut UserState,
        user: &str,
        (slot, quota_slot): (i64, i64),
        costs: &[(ResourceId, i64)],
        fallback: Fallback,
        record: bool,
    ) -> Decision {
        if quota_slot != slot {
            // A last-known table decides, and it may have been sent again
            // without them since they entered the slot on its row: their
            // default row holds them, as it would have from the slot's start.
            if st.row(slot, DEFAULT_VERSION).is_none() {
                self.install_default_row(st, user, slot);
            }
            return self.decide_without_table(st, slot, costs, fallback, record);
        }
        if self.has_default.load(Ordering::Acquire) {
            return self.decide_by_default(st, user, slot, costs, record);
        }
        Self::unlimited(st, costs)
    }

    /// Not limited: the costs are charged.
    fn unlimited(st: &mut UserState, costs: &[(ResourceId, i64)]) -> Decision {
        st.charge(costs);
        Decision {
            allowed: true,
            basis: Basis::Unlimited,
            tightest: None,
        }
    }

    /// Row `row` of `st` applied in `slot`; a default row also takes
    /// from what the users without a row may take together, if the
    /// limits hold them so.
    #[inline(always)]
    fn apply(
        &self,
        st: &mut UserState,
        row: usize,
        slot: i64,
        costs: &[(ResourceId, i64)],
        record: bool,
    ) -> (bool, Option<Tightest>) {
        if st.row_has_version(row, DEFAULT_VERSION) && self.has_newcomers.load(Ordering::Relaxed) {
            return self.apply_with_newcomers(st, row, slot, costs, record);
        }
        st.apply_row(row, costs, record)
    }

    /// As [`ServiceStore::apply`] for a default row where the users
    /// without a row are held together: refused while their pool has no
    /// room (one rejection counted), else as the row says; what is
    /// admitted is taken from the pool.
    #[cold]
    #[inline(never)]
    fn apply_with_newcomers(
        &self,
        st: &mut UserState,
        row: usize,
        slot: i64,
        costs: &[(ResourceId, i64)],
        record: bool,
    ) -> (bool, Option<Tightest>) {
        let limits = self.limits.load();
        let pool = limits.newcomers();
        if let Some(short) = pool.short(slot, costs) {
            if record {
                let cell = st.cell(short.resource.index());
                cell.rejected = cell.rejected.saturating_add(1);
            } else {
                // Shadow mode lets it through: it consumes.
                st.charge(costs);
                pool.spend(slot, costs);
            }
            return (false, Some(short));
        }
        let (allowed, tightest) = st.apply_row(row, costs, record);
        if allowed || !record {
            pool.spend(slot, costs);
        }
        (allowed, tightest)
    }

    /// `st`'s default row for `slot` applied, if it holds one.
    fn apply_default(
        &self,
        st: &mut UserState,
        slot: i64,
        costs: &[(ResourceId, i64)],
        record: bool,
        basis: Basis,
    ) -> Option<Decision> {
        let row = st.row(slot, DEFAULT_VERSION)?;
        let (allowed, tightest) = self.apply(st, row, slot, costs, record);
        Some(Decision {
            allowed,
            basis,
            tightest,
        })
    }

    /// The decision of a table for the slot that has no current row for
    /// the user (one sent before the node was serving them, say, or a row
    /// of an older table of the slot): their default row, if the limits
    /// give them one; else they are not limited.
    #[cold]
    #[inline(never)]
    fn decide_by_default(
        &self,
        st: &mut UserState,
        user: &str,
        slot: i64,
        costs: &[(ResourceId, i64)],
        record: bool,
    ) -> Decision {
        self.give_default_row(st, user, slot);
        self.apply_default(st, slot, costs, record, Basis::Quota)
            .unwrap_or_else(|| Self::unlimited(st, costs))
    }

    /// The decision without a table for the slot that has a row for the
    /// user: their default row, which [`ServiceStore::give_default_row`]
    /// installed for a user the last known table does not name, under a
    /// last-known fallback; else the fallback's.
    #[cold]
    #[inline(never)]
    fn decide_without_table(
        &self,
        st: &mut UserState,
        slot: i64,
        costs: &[(ResourceId, i64)],
        fallback: Fallback,
        record: bool,
    ) -> Decision {
        let last_known = matches!(
            fallback,
            Fallback::LastKnownThenAllow(_) | Fallback::LastKnownThenDeny(_)
        );
        if last_known && let Some(d) = self.apply_default(st, slot, costs, record, Basis::Fallback)
        {
            return d;
        }
        let d = Decision::fallback(fallback, Basis::Fallback);
        if d.allowed {
            st.charge(costs);
        }
        d
    }
}
