//! Installing quotas: a (service, slot) table into the users' rows, or a
//! ref copying a table already installed.

use std::sync::atomic::Ordering;

use metrics::counter;
use throttle_proto::wire::RawQuota;
use throttle_proto::{MAX_NAME_LEN, v1};

use super::resource::MAX_RESOURCES;
use super::service_store::{QUOTA_RING, SLOT_BITS, SLOT_MASK, ServiceStore, VERSION_MASK};
use super::slot_store::SlotStore;
use super::user::{UserState, whole_units};
use super::users::{UserLock, Users, with_users};

impl ServiceStore {
    /// Installs one (service, slot) table: `users`, each with its
    /// (resource, quota) pairs, as prost decoded them or read in place.
    pub(super) fn apply<'a, U, R>(&self, slot: i64, users: U, now_slot: i64)
    where
        U: Iterator<Item = (&'a str, R)> + Clone,
        R: Iterator<Item = (&'a str, f64)>,
    {
        let _g = self.register.lock();
        let Some((idx, published, row_version)) = self.next_version(slot) else {
            return;
        };
        if self.users.get().is_none() {
            // The map's cell class is fixed when it is made: count this
            // table's resources first.
            for (_, resources) in users.clone() {
                for (resource, _) in resources {
                    self.resource_locked(resource);
                }
            }
        }
        let mut quotas = [f32::NAN; MAX_RESOURCES];
        with_users!(self.user_map(), map => {
            let guard = map.guard();
            for (user, resources) in users {
                if user.is_empty() || user.len() > MAX_NAME_LEN {
                    continue;
                }
                quotas.fill(f32::NAN);
                let mut len = 0;
                for (resource, q) in resources {
                    let Some(id) = self.resource_locked(resource) else {
                        continue;
                    };
                    quotas[id.index()] = whole_units(q);
                    len = len.max(id.index() + 1);
                }
                if let Some(mut st) = self.locked(map, &guard, user, now_slot) {
                    st.insert_row(slot, row_version, &quotas[..len], now_slot);
                }
            }
        });
        // Rows first, then the version: readers never see a version whose
        // rows are missing.
        self.ring[idx].store(published, Ordering::Release);
        self.newest.fetch_max(slot, Ordering::Release);
    }

    /// The next version of `slot`'s table: its index in the ring, the
    /// value to publish there once its rows are in, and the rows' version.
    /// `None` (counted and logged) past the rows' 16-bit versions. For a
    /// caller holding `register`.
    pub(super) fn next_version(&self, slot: i64) -> Option<(usize, u64, u16)> {
        let idx = slot.rem_euclid(QUOTA_RING as i64) as usize;
        let old = self.ring[idx].load(Ordering::Acquire);
        let tag = (slot as u64 & SLOT_MASK) << (64 - SLOT_BITS);
        let version = if old >> (64 - SLOT_BITS) == tag >> (64 - SLOT_BITS) {
            old & VERSION_MASK
        } else {
            0
        } + 1;
        let Ok(row_version) = u16::try_from(version) else {
            // Rows keep 16-bit versions; no central sends 65,535 tables for
            // one slot, and counting on would make older rows read as newer.
            counter!("throttle_quota_ignored_total").increment(1);
            tracing::warn!(service = %self.name, slot, "too many quota tables for one slot; ignored");
            return None;
        };
        Some((idx, tag | version, row_version))
    }

    /// Installs as `slot`'s table the one installed for `from` (a
    /// [`v1::QuotaRef`]): every user with a row of `from`'s table gets the
    /// same quotas for `slot`, as if that table had come again for `slot`.
    /// Returns whether a table for `from` is installed; without one
    /// nothing is.
    pub(super) fn copy_table(&self, slot: i64, from: i64, now_slot: i64) -> bool {
        let _g = self.register.lock();
        let Some(from_version) = self.quota_version(from) else {
            return false;
        };
        if slot == from {
            return true;
        }
        let Some((idx, published, row_version)) = self.next_version(slot) else {
            return true;
        };
        if let Some(users) = self.users.get() {
            with_users!(users, map => {
                let users = map.pin();
                let mut quotas = [f32::NAN; MAX_RESOURCES];
                for (_, entry) in users.iter() {
                    let state: &UserLock<UserState> = entry;
                    let mut st = state.lock();
                    let Some(k) = st.row(from, from_version).filter(|_| !st.evicted) else {
                        continue;
                    };
                    let cells = st.cells();
                    let len = cells.len().min(MAX_RESOURCES);
                    for (q, cell) in quotas.iter_mut().zip(cells) {
                        let rows = cell.quota;
                        *q = rows[k];
                    }
                    st.insert_row(slot, row_version, &quotas[..len], now_slot);
                }
            });
        }
        self.ring[idx].store(published, Ordering::Release);
        self.newest.fetch_max(slot, Ordering::Release);
        true
    }
}

impl SlotStore {
    /// Installs a quota from the central node: each (service, slot) table
    /// replaces any earlier one for that slot, then each of its
    /// [`refs`](v1::Quota::refs) installs a copy of a table already
    /// installed. Slots more than 16 slots in the past or future are
    /// ignored.
    pub fn apply_quota(&self, quota: &v1::Quota) {
        let now = self.current_slot();
        for (name, sq) in &quota.services {
            for (&slot, users) in &sq.slots {
                let users = users.users.iter().map(|(user, rq)| {
                    let resources = rq.resources.iter().map(|(r, &q)| (r.as_str(), q));
                    (user.as_str(), resources)
                });
                self.apply_table(name, slot, users, now);
            }
        }
        for r in &quota.refs {
            self.apply_ref(&r.service, r.slot, r.from_slot, now);
        }
    }

    /// [`SlotStore::apply_quota`] for a quota read in place, as the
    /// reporter receives it: the same tables installed, without decoding
    /// them into maps first.
    pub fn apply_raw_quota(&self, quota: &RawQuota) {
        let now = self.current_slot();
        for (name, slot, users) in quota.tables() {
            self.apply_table(name, slot, users, now);
        }
        for (name, slot, from) in quota.refs() {
            self.apply_ref(name, slot, from, now);
        }
    }

    pub(super) fn apply_table<'a, U, R>(&self, name: &str, slot: i64, users: U, now: i64)
    where
        U: Iterator<Item = (&'a str, R)> + Clone,
        R: Iterator<Item = (&'a str, f64)>,
    {
        if self.installable(name, slot, now) {
            self.service(name).apply(slot, users, now);
            counter!("throttle_quota_tables_installed_total", "service" => name.to_owned())
                .increment(1);
        }
    }

    /// Installs (`name`, `slot`) as a copy of (`name`, `from`), a
    /// [`v1::QuotaRef`]. A ref to a table this store does not hold (the
    /// central node sends one only after the table, on the same stream)
    /// installs nothing, so the slot goes to the [`Fallback`]: counted and
    /// logged.
    pub(super) fn apply_ref(&self, name: &str, slot: i64, from: i64, now: i64) {
        if !self.installable(name, slot, now) {
            return;
        }
        if self
            .served(name)
            .is_some_and(|s| s.copy_table(slot, from, now))
        {
            counter!("throttle_quota_tables_installed_total", "service" => name.to_owned())
                .increment(1);
        } else {
            counter!("throttle_quota_refs_missing_total").increment(1);
            tracing::warn!(service = %name, slot, from, "quota refers to a table this node does not hold; ignored");
        }
    }

    /// Whether a table of (`name`, `slot`) may be installed at slot `now`:
    /// a valid name, a slot within the store's reach (else counted).
    pub(super) fn installable(&self, name: &str, slot: i64, now: i64) -> bool {
        if name.is_empty() || name.len() > MAX_NAME_LEN {
            return false;
        }
        if slot.abs_diff(now) >= QUOTA_RING as u64 {
            counter!("throttle_quota_ignored_total").increment(1);
            tracing::debug!(service = %name, slot, now, "quota for a distant slot ignored");
            return false;
        }
        true
    }
}
