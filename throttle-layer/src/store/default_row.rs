//! The default quota of a user without a row: installed as their row
//! when they enter a slot; see the comment on its `impl` block.

use std::sync::atomic::Ordering;

use super::service::{DEFAULT_VERSION, ServiceStore};
use super::user::UserState;

// The default quota: a user the central has not sent this node a quota
// row for yet (one new to the node) is held, until their row comes, to
// the share of their rule, or of the `*` rule, that the central's
// [`Limits`](throttle_proto::v1::Limits) gives this node.
//
// The share is installed as the user's row for the slot when the user
// enters it (first seen, or first seen again in a new slot) and the
// slot's table is there, with the highest version, so it stands for any
// table of the slot that has no row for the user; the user's own row,
// when a table brings one, replaces it. The request path is untouched:
// it reads a row as always.
impl ServiceStore {
    /// Rolls `st` on to `slot` ([`UserState::roll_on`]) and gives it its
    /// default row there.
    #[inline(never)]
    pub(super) fn roll_with_default(&self, st: &mut UserState, slot: i64, user: &str) {
        st.roll_on(slot, user, &self.overflow);
        self.give_default_row(st, user, slot);
    }

    /// Installs `user`'s default row for `slot` in `st`, if the service
    /// has one for them and `st` holds no row that decides the slot: with
    /// a table for the slot, a row for the slot; without one, a row for
    /// the newest table received, which the last-known fallback reads
    /// (the default row would push it out). So a user new to the node is
    /// held to their share from the node's first request on, before its
    /// first table and through an outage, not let through.
    pub(super) fn give_default_row(&self, st: &mut UserState, user: &str, slot: i64) {
        if !self.has_default.load(Ordering::Acquire) {
            return;
        }
        let decides = match self.quota_version(slot) {
            Some(v) => Some((slot, v)),
            None => {
                let newest = self.newest.load(Ordering::Acquire);
                self.quota_version(newest).map(|v| (newest, v))
            }
        };
        let has_row = decides.is_some_and(|(s, v)| st.row(s, v).is_some());
        if !has_row {
            self.install_default_row(st, user, slot);
        }
    }

    /// Installs `user`'s default row for `slot` in `st`, if the service
    /// has one for them.
    pub(super) fn install_default_row(&self, st: &mut UserState, user: &str, slot: i64) {
        if !self.has_default.load(Ordering::Acquire) {
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
