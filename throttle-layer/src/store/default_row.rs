//! The default quota: a user the central has not sent this node a quota
//! row for yet (one new to the node) is held, until their row comes, to
//! the share of their rule, or of the `*` rule, that the central's
//! [`Limits`](throttle_proto::v1::Limits) gives this node.
//!
//! The share is installed as the user's row for the slot when the user
//! enters it (first seen, or first seen again in a new slot) and the
//! slot's table is there, with the highest version, so it stands for any
//! table of the slot that has no row for the user; the user's own row,
//! when a table brings one, replaces it. The request path is untouched:
//! it reads a row as always.

use std::sync::atomic::Ordering;

use super::service_store::ServiceStore;
use super::user::{ROWS_PER_USER, RowTag, UserState};

/// The version of a default row: above any table's, so it is current for
/// every table of its slot until a row of the user's own replaces it.
const DEFAULT_VERSION: u16 = u16::MAX;

impl ServiceStore {
    /// Rolls `st` on to `slot` ([`UserState::roll_on`]) and gives it its
    /// default row there.
    #[inline(never)]
    pub(super) fn roll_with_default(&self, st: &mut UserState, slot: i64, user: &str) {
        st.roll_on(slot, user, &self.overflow);
        self.give_default_row(st, user, slot);
    }

    /// Installs `user`'s default row for `slot` in `st`, if the service
    /// has one for them, a table for the slot is installed, and `st` holds
    /// no row for the slot. Without a table the fallback decides, and the
    /// last known row it reads must stay: a row for the slot would push it
    /// out.
    pub(super) fn give_default_row(&self, st: &mut UserState, user: &str, slot: i64) {
        if !self.has_default.load(Ordering::Acquire) || self.quota_version(slot).is_none() {
            return;
        }
        let has_row = (0..ROWS_PER_USER)
            .any(|k| st.row_slot[k] == RowTag::of(slot) && st.row_version[k] != 0);
        if has_row {
            return;
        }
        let limits = self.limits.load();
        let Some(row) = limits.default_row(user) else {
            return;
        };
        // Only as many cells as the row limits: more would move the
        // user's cells out of the map's node.
        let len = row.iter().rposition(|q| !q.is_nan()).map_or(0, |i| i + 1);
        st.insert_row(slot, DEFAULT_VERSION, &row[..len], slot);
    }
}
