//! Collecting a finished slot of one service into a report, and
//! forgetting idle users ([`Drain`]).

use std::sync::atomic::Ordering;

use throttle_proto::wire::{ReportEncoder, UsageEncoder};

use super::service::ServiceStore;
use super::totals::Totals;
use super::user::{Counters, ROWS_PER_USER, UserState};
use super::users::{UserLock, Users, with_users};

/// Drains a service's finished slots into reports.
#[derive(Clone, Copy)]
pub(super) struct Drain<'a>(pub(super) &'a ServiceStore);

impl Drain<'_> {
    /// Drains `slot` (and older) into `report`, as prost writes a
    /// [`v1::Usage`]: users and their resources in name order, each user
    /// once.
    pub(super) fn collect_into(&self, slot: i64, report: &mut ReportEncoder, packed: bool) {
        // Each user's name, copied out of the map, and counts; sorted by
        // name through a list of small keys rather than moving the counts.
        let mut users = String::new();
        let mut counts: Vec<Counters> = Vec::new();
        let mut order: Vec<(usize, usize, usize)> = Vec::new();
        self.drain(slot, |user, c| {
            order.push((users.len(), user.len(), counts.len()));
            users.push_str(user);
            counts.push(*c);
        });
        // Loaded after the counts are taken: any resource they count is
        // registered by then.
        let names = self.0.resources.load();
        let mut by_name: Vec<usize> = (0..names.len()).collect();
        by_name.sort_by(|&a, &b| names[a].cmp(&names[b]));
        let name = |&(start, len, _): &(usize, usize, usize)| {
            users.get(start..start + len).unwrap_or_default()
        };
        order.sort_unstable_by(|a, b| name(a).cmp(name(b)));
        let (mut consumption, mut rejection) = if packed {
            let sorted = || by_name.iter().map(|&r| &*names[r]);
            (
                UsageEncoder::packed(sorted()),
                UsageEncoder::packed(sorted()),
            )
        } else {
            (UsageEncoder::new(), UsageEncoder::new())
        };
        let mut totals = Totals::default();
        let mut order = order.iter().peekable();
        while let Some(first) = order.next() {
            // A user's counts set aside by a roll come apart from the rest.
            let mut c = counts[first.2];
            while let Some(more) = order.next_if(|next| name(next) == name(first)) {
                c.merge(&counts[more.2]);
            }
            totals.add(&c, 0..names.len());
            let user = name(first);
            let used = by_name.iter().filter(|&&r| c.consumption[r] != 0);
            if used.clone().next().is_some() {
                consumption.user(user, used.map(|&r| (&*names[r], c.consumption[r])));
            }
            let refused = by_name.iter().filter(|&&r| c.rejection[r] != 0);
            if refused.clone().next().is_some() {
                rejection.user(
                    user,
                    refused.map(|&r| (&*names[r], i64::from(c.rejection[r]))),
                );
            }
        }
        report.service(&self.0.name, &consumption, &rejection);
        totals.count(&self.0.name, &names);
    }

    /// Takes every user's counts of `slot` and before, and the overflow's,
    /// giving each to `add` (a user may come twice: from its cells and
    /// from the overflow); forgets users idle since `slot - 1`.
    pub(super) fn drain(&self, slot: i64, mut add: impl FnMut(&str, &Counters)) {
        with_users!(self.0.user_map(), map => {
            let users = map.pin();
            let mut evict = Vec::new();
            for (user, entry) in users.iter() {
                let state: &UserLock<UserState> = entry;
                let mut st = state.lock();
                let mut taken = Counters::default();
                if st.slot <= slot {
                    taken = st.take(false);
                }
                if !st.has_prev || st.slot - 1 <= slot {
                    taken.merge(&st.take(true));
                    st.has_prev = false;
                }
                if !taken.is_zero() {
                    add(user, &taken);
                }
                let idle = st.slot < slot - 1
                    && st.is_idle()
                    && (0..ROWS_PER_USER)
                        .all(|k| st.row_version[k] == 0 || st.row_slot[k].near(slot) <= slot);
                if idle {
                    st.evicted = true;
                    // The address names this entry, not a later one: the map
                    // frees no node while `users` is pinned.
                    evict.push((user, std::ptr::from_ref(entry)));
                }
            }
            for (user, c) in std::mem::take(&mut *self.0.overflow.lock()) {
                add(&user, &c);
            }
            for (user, entry) in evict {
                if users
                    .remove_if(user.as_str(), |_, e| std::ptr::eq(e, entry))
                    .ok()
                    .flatten()
                    .is_some()
                {
                    self.0.keys.fetch_sub(1, Ordering::Relaxed);
                }
            }
        });
    }
}
