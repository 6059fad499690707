//! The decision on the request path: a user's entry found and locked, its
//! quota row read, the request admitted or refused.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use throttle_clock::{Clock, CoarseClock};

use super::fallback::Fallback;
use super::resource::ResourceId;
use super::service_store::{
    QUOTA_RING, SLOT_BITS, SLOT_MASK, ServiceStore, UserHandle, VERSION_MASK,
};
use super::user::{ROWS_PER_USER, RowTag, UserState};
use super::users::{Entry, Guard, Name, UserGuard, UserLock, UserMap, Users, with_users};

/// Why a request was allowed or refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Basis {
    /// The user's quota for the slot decided.
    Quota,
    /// A quota table exists for the slot but has no row for this user: the
    /// user is not limited.
    Unlimited,
    /// No quota for the slot: the [`Fallback`] decided.
    Fallback,
    /// The store is full and the user is new: the [`Fallback`] decided.
    AtCap,
}

/// The resource whose quota is the tightest, for rate-limit headers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tightest {
    /// The resource.
    pub resource: ResourceId,
    /// This node's quota for it in the slot.
    pub quota: f64,
    /// What this node admitted of it in the slot so far.
    pub used: i64,
}

/// The outcome of [`ServiceStore::admit`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Decision {
    pub(super) allowed: bool,
    /// Why.
    pub basis: Basis,
    /// For a refusal by quota: the exhausted resource. For an allowed request
    /// with a quota: the resource with the least left.
    pub tightest: Option<Tightest>,
}

impl Decision {
    /// True when the request may proceed.
    pub fn is_allowed(&self) -> bool {
        self.allowed
    }

    #[inline]
    pub(super) fn fallback(fallback: Fallback, basis: Basis) -> Self {
        Self {
            allowed: matches!(fallback, Fallback::Allow | Fallback::LastKnownThenAllow(_)),
            basis,
            tightest: None,
        }
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

impl UserState {
    #[inline]
    pub(super) fn row(&self, slot: i64, version: u16) -> Option<usize> {
        // A row at least as new as the published version is current: rows
        // are written before their version is published.
        (0..ROWS_PER_USER).find(|&k| {
            self.row_slot[k] == RowTag::of(slot)
                && self.row_version[k] != 0
                && self.row_version[k] >= version
        })
    }

    /// Applies row `row`: counts rejections (if `record`) and refuses, or
    /// admits and adds `costs`.
    #[inline(always)]
    pub(super) fn apply_row(
        &mut self,
        row: usize,
        costs: &[(ResourceId, i64)],
        record: bool,
    ) -> (bool, Option<Tightest>) {
        let mut refused: Option<Tightest> = None;
        let mut tightest: Option<Tightest> = None;
        for (i, cell) in self.cells_mut().iter_mut().enumerate() {
            let quota = f64::from(cell.quota[row]);
            if quota.is_nan() {
                continue;
            }
            let used = cell.used;
            let t = Tightest {
                resource: ResourceId(i as u8),
                quota,
                used,
            };
            if quota < 1.0 || used as f64 > quota {
                if record {
                    cell.rejected = cell.rejected.saturating_add(1);
                }
                refused.get_or_insert(t);
            } else if tightest.is_none_or(|b| quota - (used as f64) < b.quota - (b.used as f64)) {
                tightest = Some(t);
            }
        }
        // Shadow mode lets a refused request through, so it consumes.
        let allowed = refused.is_none();
        if allowed || !record {
            self.charge(costs);
        }
        if allowed {
            (true, tightest)
        } else {
            (false, refused)
        }
    }
}

impl ServiceStore {
    #[inline]
    pub(super) fn current_slot(&self) -> i64 {
        let ms = if self.coarse_clock {
            CoarseClock::now()
        } else {
            self.clock.now_ms()
        };
        self.slot.slot_at(ms)
    }

    /// The version of the quota table for `slot`, if one was received.
    #[inline]
    pub(super) fn quota_version(&self, slot: i64) -> Option<u16> {
        let v = self.ring[slot.rem_euclid(QUOTA_RING as i64) as usize].load(Ordering::Acquire);
        // `apply` publishes versions up to `u16::MAX` only.
        (v != 0 && v >> (64 - SLOT_BITS) == slot as u64 & SLOT_MASK)
            .then_some((v & VERSION_MASK) as u16)
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
            self.decide(st, slot, costs, fallback, record)
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
        let on_quota = self.quota_version(slot).is_some();
        if !on_quota && let Some((resource, left)) = budgets.short(user, costs) {
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
        let decision = self.decide(st, slot, costs, fallback, record);
        if decision.allowed || !record {
            budgets.spend(user, costs);
        }
        decision
    }

    #[inline(always)]
    pub(super) fn decide(
        &self,
        st: &mut UserState,
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
                let (allowed, tightest) = st.apply_row(row, costs, record);
                Decision {
                    allowed,
                    basis,
                    tightest,
                }
            }
            None => {
                st.charge(costs);
                Decision {
                    allowed: true,
                    basis: Basis::Unlimited,
                    tightest: None,
                }
            }
        }
    }

    /// Adds `amount` of `resource` for `user` to the current slot, without a
    /// decision. At the key cap the amount is not counted.
    pub fn consume(self: &Arc<Self>, user: &str, resource: ResourceId, amount: i64) {
        let slot = self.current_slot();
        self.with_entry(user, slot, |st| st.add(resource, amount));
    }
}
