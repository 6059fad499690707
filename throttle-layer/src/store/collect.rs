//! Collecting a finished slot into a report, and forgetting idle users.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use metrics::counter;
use prost::Message;
use throttle_proto::v1;
use throttle_proto::wire::{ReportEncoder, UsageEncoder};

use super::resource::MAX_RESOURCES;
use super::service_store::ServiceStore;
use super::slot_store::SlotStore;
use super::user::{Counters, ROWS_PER_USER, UserState};
use super::users::{UserLock, Users, with_users};

impl ServiceStore {
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
        let names = self.resources.load();
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
        report.service(&self.name, &consumption, &rejection);
        totals.count(&self.name, &names);
    }

    /// Takes every user's counts of `slot` and before, and the overflow's,
    /// giving each to `add` (a user may come twice: from its cells and
    /// from the overflow); forgets users idle since `slot - 1`.
    pub(super) fn drain(&self, slot: i64, mut add: impl FnMut(&str, &Counters)) {
        with_users!(self.user_map(), map => {
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
            for (user, c) in std::mem::take(&mut *self.overflow.lock()) {
                add(&user, &c);
            }
            for (user, entry) in evict {
                if users
                    .remove_if(user.as_str(), |_, e| std::ptr::eq(e, entry))
                    .ok()
                    .flatten()
                    .is_some()
                {
                    self.keys.fetch_sub(1, Ordering::Relaxed);
                }
            }
        });
    }
}

/// What a collection took per resource, for the `throttle_consumed_total`
/// and `throttle_rejected_total` metrics.
#[derive(Default)]
pub(super) struct Totals {
    pub(super) consumed: [i64; MAX_RESOURCES],
    pub(super) rejected: [i64; MAX_RESOURCES],
}

impl Totals {
    pub(super) fn add(&mut self, c: &Counters, resources: std::ops::Range<usize>) {
        for i in resources.take(MAX_RESOURCES) {
            self.consumed[i] = self.consumed[i].saturating_add(c.consumption[i]);
            self.rejected[i] = self.rejected[i].saturating_add(i64::from(c.rejection[i]));
        }
    }

    pub(super) fn count(&self, service: &str, names: &[Arc<str>]) {
        for (totals, metric) in [
            (&self.consumed, "throttle_consumed_total"),
            (&self.rejected, "throttle_rejected_total"),
        ] {
            for (name, &total) in names.iter().zip(totals).filter(|(_, t)| **t > 0) {
                counter!(metric, "service" => service.to_string(), "resource" => name.to_string())
                    .increment(total as u64);
            }
        }
    }
}

impl SlotStore {
    /// Drains `slot` (and any older slot not yet collected) into the report
    /// sent at the start of `slot + 1`, and forgets users idle since
    /// `slot - 1`. Every service appears in both maps, possibly empty.
    ///
    /// The report [`SlotStore::collect_encoded`] writes, decoded: the
    /// reporter sends those bytes, and this reads them back as a message
    /// for tests, simulations and tools.
    pub fn collect(&self, slot: i64) -> v1::Report {
        let bytes = self.collect_encoded(slot, "");
        v1::Report::decode(bytes).unwrap_or_else(|e| {
            // The encoders write what prost reads (proptests in `wire` and
            // here): this would be a bug, not input.
            counter!("throttle_reports_dropped_total").increment(1);
            tracing::error!(error = %e, slot, "collected report does not decode; dropped");
            v1::Report {
                slot_number: slot + 1,
                ..v1::Report::default()
            }
        })
    }

    /// The encoded [`v1::Report`] of `node_id` (the bytes prost writes for
    /// it, with no message built): what the reporter sends. See
    /// [`SlotStore::collect`].
    pub fn collect_encoded(&self, slot: i64, node_id: &str) -> Bytes {
        self.collect_encoded_as(slot, node_id, false)
    }

    /// [`SlotStore::collect_encoded`], with each service's usage written as
    /// [`v1::PackedUsage`]s if `packed` (for a central node whose Welcome
    /// accepts [`PACKED_REPORTS`](throttle_proto::PACKED_REPORTS)).
    pub fn collect_encoded_as(&self, slot: i64, node_id: &str, packed: bool) -> Bytes {
        let mut services: Vec<Arc<ServiceStore>> = self.shared.services.lock().clone();
        // A report's maps are in key order, as prost writes them.
        services.sort_by(|a, b| a.name.cmp(&b.name));
        let mut report = ReportEncoder::new();
        for s in services {
            s.collect_into(slot, &mut report, packed);
        }
        report.finish(node_id, slot + 1)
    }
}
