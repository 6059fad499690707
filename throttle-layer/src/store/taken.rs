//! Amounts counted outside a request's decision: taken by a handler
//! before the work they pay for, or added after it; see the comments on
//! the `impl` blocks.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::decision::Tightest;
use super::resource::ResourceId;
use super::service::ServiceStore;

// An amount taken by a handler before the work it pays for
// ([`ServiceStore::try_take`]): allowed or refused by the user's quota
// of that one resource, as a request costing the amount would be; and
// what is left of it ([`ServiceStore::standing`]).
impl ServiceStore {
    /// Takes `amount` of `resource` for `user` now if their quota of that
    /// resource for the slot has room, as the layer admits a request (the
    /// quota at least 1 and not yet exceeded); refused, one rejection of
    /// the resource is counted and nothing is charged. Without a quota
    /// row for the slot (no table, or none for the user) the amount is
    /// taken: the layer's fallback decided the request itself. `Err`
    /// names the resource's quota and use.
    ///
    /// # Errors
    ///
    /// The quota of `resource` has no room.
    pub fn try_take(
        self: &Arc<Self>,
        user: &str,
        resource: ResourceId,
        amount: u64,
    ) -> Result<(), Tightest> {
        let amount = super::counted(amount);
        let slot = self.current_slot();
        let version = self.quota_version(slot);
        let taken = self.with_entry(user, slot, |st| {
            let row = version.and_then(|v| st.row(slot, v));
            let cell = st.cell(resource.index());
            let quota = row.map_or(f32::NAN, |k| cell.quota[k]);
            if !quota.is_nan() && (quota < 1.0 || cell.used as f64 > f64::from(quota)) {
                cell.rejected = cell.rejected.saturating_add(1);
                return Err(Tightest {
                    resource,
                    quota: f64::from(quota),
                    used: cell.used,
                });
            }
            cell.used = cell.used.saturating_add(amount);
            Ok(())
        });
        // At the key cap the user is not tracked: nothing to decide by.
        taken.unwrap_or(Ok(()))
    }

    /// `user`'s quota of `resource` for the slot and what they used of
    /// it on this node; `None` without a quota row for the slot (no
    /// table, none for the user, or no figure for the resource), or at
    /// the key cap.
    pub fn standing(self: &Arc<Self>, user: &str, resource: ResourceId) -> Option<Tightest> {
        let slot = self.current_slot();
        let version = self.quota_version(slot)?;
        self.with_entry(user, slot, |st| {
            let row = st.row(slot, version)?;
            let cell = st.cell(resource.index());
            let quota = cell.quota[row];
            (!quota.is_nan()).then(|| Tightest {
                resource,
                quota: f64::from(quota),
                used: cell.used,
            })
        })
        .flatten()
    }
}

// Amounts added without a decision: what a handler or a body counts after
// the request was admitted ([`ServiceStore::consume`]), and a refused
// request's refund.
impl ServiceStore {
    /// Adds `amount` of `resource` for `user` to the current slot, without a
    /// decision. At the key cap the amount is not counted.
    pub fn consume(self: &Arc<Self>, user: &str, resource: ResourceId, amount: u64) {
        self.count(user, resource, super::counted(amount));
    }

    /// Adds `amount` of `resource` for `user`, as [`consume`](Self::consume)
    /// does; below zero, gives it back (a refused request's refund).
    pub(crate) fn count(self: &Arc<Self>, user: &str, resource: ResourceId, amount: i64) {
        let slot = self.current_slot();
        self.with_entry(user, slot, |st| st.add(resource, amount));
        // What a budget's resource costs after the response is spent from
        // it too, or a node would admit it through a whole outage.
        if self.has_budgets.load(Ordering::Relaxed) {
            self.budgets.load().spend(user, &[(resource, amount)]);
        }
    }
}
