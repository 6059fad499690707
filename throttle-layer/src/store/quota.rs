//! Installing quotas into one service's users ([`Install`]): a (service,
//! slot) table into the users' rows, or a ref copying a table already
//! installed.

use std::sync::atomic::Ordering;

use metrics::counter;
use throttle_proto::MAX_NAME_LEN;

use super::resource::MAX_RESOURCES;
use super::service::{AHEAD_BIT, QUOTA_RING, SLOT_BITS, SLOT_MASK, ServiceStore};
use super::user::{UserState, whole_units};
use super::users::{UserLock, Users, with_users};

/// Installs quota tables into a service's users.
#[derive(Clone, Copy)]
pub(super) struct Install<'a>(pub(super) &'a ServiceStore);

/// How a quota's tables are installed: at slot `now`, and whether those
/// of slots after it came ahead, in an answer to a report (rendered
/// before the reports of the slot before them were in, from the grants
/// of that slot; a push at the next assign replaces them). While a node
/// applies a table that came ahead, the budgets the central told it hold
/// as without a table: the grants it repeats were never meant for a slot
/// the central does not see.
#[derive(Debug, Clone, Copy)]
pub(super) struct Ahead {
    pub(super) now: i64,
    answer: bool,
}

impl Ahead {
    /// For a quota answering a report (`report_slot` given), at `now`.
    pub(super) fn of(report_slot: Option<i64>, now: i64) -> Self {
        Self {
            now,
            answer: report_slot.is_some(),
        }
    }

    /// The bit a table of `slot` is published with.
    fn bit(self, slot: i64) -> u64 {
        if self.answer && slot > self.now {
            AHEAD_BIT
        } else {
            0
        }
    }
}

impl Install<'_> {
    /// Installs one (service, slot) table: `users`, each with its
    /// (resource, quota) pairs, as prost decoded them or read in place.
    pub(super) fn apply<'a, U, R>(&self, slot: i64, users: U, ahead: Ahead)
    where
        U: Iterator<Item = (&'a str, R)> + Clone,
        R: Iterator<Item = (&'a str, f64)>,
    {
        let _g = self.0.register.lock();
        let now_slot = ahead.now;
        let Some((idx, published, row_version)) = self.next_version(slot) else {
            return;
        };
        let published = published | self.ahead_bit(slot, ahead);
        if self.0.users.get().is_none() {
            // The map's cell class is fixed when it is made: count this
            // table's resources first.
            for (_, resources) in users.clone() {
                for (resource, _) in resources {
                    self.0.resource_locked(resource);
                }
            }
        }
        let mut quotas = [f32::NAN; MAX_RESOURCES];
        with_users!(self.0.user_map(), map => {
            let guard = map.guard();
            for (user, resources) in users {
                if user.is_empty() || user.len() > MAX_NAME_LEN {
                    continue;
                }
                quotas.fill(f32::NAN);
                let mut len = 0;
                for (resource, q) in resources {
                    let Some(id) = self.0.resource_locked(resource) else {
                        continue;
                    };
                    quotas[id.index()] = whole_units(q);
                    len = len.max(id.index() + 1);
                }
                if let Some(mut st) = self.0.locked(map, &guard, user, now_slot) {
                    st.insert_row(slot, row_version, &quotas[..len], now_slot);
                }
            }
        });
        // Rows first, then the version: readers never see a version whose
        // rows are missing.
        self.0.ring[idx].store(published, Ordering::Release);
        self.0.newest.fetch_max(slot, Ordering::Release);
    }

    /// The bit a table of `slot` is published with: [`Ahead::bit`], but
    /// none where the slot holds a table that did not come ahead (a push),
    /// which an answer sends again (a policy assigning two slots ahead
    /// pushed it the slot before).
    fn ahead_bit(&self, slot: i64, ahead: Ahead) -> u64 {
        if self.0.has_pushed_quota(slot) {
            0
        } else {
            ahead.bit(slot)
        }
    }

    /// The next version of `slot`'s table: its index in the ring, the
    /// value to publish there once its rows are in, and the rows' version.
    /// `None` (counted and logged) past the rows' 16-bit versions. For a
    /// caller holding `register`.
    pub(super) fn next_version(&self, slot: i64) -> Option<(usize, u64, u16)> {
        let idx = slot.rem_euclid(QUOTA_RING as i64) as usize;
        let old = self.0.ring[idx].load(Ordering::Acquire);
        let tag = (slot as u64 & SLOT_MASK) << (64 - SLOT_BITS);
        let version = if old >> (64 - SLOT_BITS) == tag >> (64 - SLOT_BITS) {
            old & u64::from(u16::MAX)
        } else {
            0
        } + 1;
        let Ok(row_version) = u16::try_from(version) else {
            // Rows keep 16-bit versions; no central sends 65,535 tables for
            // one slot, and counting on would make older rows read as newer.
            counter!("throttle_quota_ignored_total").increment(1);
            tracing::warn!(service = %self.0.name, slot, "too many quota tables for one slot; ignored");
            return None;
        };
        Some((idx, tag | version, row_version))
    }

    /// Installs as `slot`'s table the one installed for `from` (a
    /// [`v1::QuotaRef`]): every user with a row of `from`'s table gets the
    /// same quotas for `slot`, as if that table had come again for `slot`.
    /// Returns whether a table for `from` is installed; without one
    /// nothing is.
    pub(super) fn copy_table(&self, slot: i64, from: i64, ahead: Ahead) -> bool {
        let _g = self.0.register.lock();
        let now_slot = ahead.now;
        let Some(from_version) = self.0.quota_version(from) else {
            return false;
        };
        if slot == from {
            // Unchanged since: a push confirms a table that came ahead.
            if self.ahead_bit(slot, ahead) == 0 {
                let idx = slot.rem_euclid(QUOTA_RING as i64) as usize;
                self.0.ring[idx].fetch_and(!AHEAD_BIT, Ordering::AcqRel);
            }
            return true;
        }
        let Some((idx, published, row_version)) = self.next_version(slot) else {
            return true;
        };
        let published = published | self.ahead_bit(slot, ahead);
        if let Some(users) = self.0.users.get() {
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
        self.0.ring[idx].store(published, Ordering::Release);
        self.0.newest.fetch_max(slot, Ordering::Release);
        true
    }
}
