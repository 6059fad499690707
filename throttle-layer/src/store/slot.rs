//! [`SlotStore`]: the node's services, and how to build one.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use arc_swap::ArcSwap;
use bytes::Bytes;
use metrics::counter;
use parking_lot::Mutex;
use prost::Message;
use throttle_clock::{Clock, CoarseClock, SlotLength};
use throttle_proto::wire::{RawQuota, ReportEncoder};
use throttle_proto::{MAX_NAME_LEN, v1};

use super::blocked::Blocked;
use super::collect::Drain;
use super::quota::{Ahead, Install};
use super::service::{QUOTA_RING, ServiceStore};
use super::user::Overflow;

pub(super) struct Shared {
    pub(super) clock: Arc<dyn Clock>,
    pub(super) slot: SlotLength,
    pub(super) keys: Arc<AtomicUsize>,
    pub(super) max_keys: usize,
    pub(super) services: Mutex<Vec<Arc<ServiceStore>>>,
    /// The number of services, sent at each registration: a reporter
    /// learns of a service registered after its Hello without polling.
    pub(super) registered: tokio::sync::watch::Sender<usize>,
}

/// The node's store: one [`ServiceStore`] per service. Clones share it.
#[derive(Clone)]
pub struct SlotStore {
    pub(super) shared: Arc<Shared>,
}

impl fmt::Debug for SlotStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SlotStore")
            .field("slot_ms", &self.shared.slot.as_ms())
            .field("keys", &self.shared.keys.load(Ordering::Relaxed))
            .field("max_keys", &self.shared.max_keys)
            .field("services", &self.shared.services.lock())
            .finish()
    }
}

/// Builds a [`SlotStore`].
#[derive(Debug)]
pub struct SlotStoreBuilder {
    pub(super) clock: Arc<dyn Clock>,
    pub(super) slot: SlotLength,
    pub(super) max_keys: usize,
}

impl Default for SlotStore {
    fn default() -> Self {
        Self::builder().build()
    }
}

impl SlotStore {
    /// A builder: the system clock (read through [`CoarseClock`]), 1 s
    /// slots, 1,000,000 keys.
    pub fn builder() -> SlotStoreBuilder {
        SlotStoreBuilder {
            clock: Arc::new(CoarseClock),
            slot: SlotLength::SECOND,
            max_keys: 1_000_000,
        }
    }

    /// The store's clock.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.shared.clock
    }

    /// The slot length.
    pub fn slot_length(&self) -> SlotLength {
        self.shared.slot
    }

    /// The current slot by the store's clock.
    pub fn current_slot(&self) -> i64 {
        self.shared.slot.slot_at(self.shared.clock.now_ms())
    }

    /// The store of `name`, created on first use.
    pub fn service(&self, name: &str) -> Arc<ServiceStore> {
        let mut services = self.shared.services.lock();
        if let Some(s) = named(&services, name) {
            return s.clone();
        }
        let s = Arc::new(ServiceStore {
            name: name.into(),
            clock: self.shared.clock.clone(),
            coarse_clock: self.shared.clock.is_coarse(),
            slot: self.shared.slot,
            keys: self.shared.keys.clone(),
            max_keys: self.shared.max_keys,
            users: OnceLock::new(),
            resources: ArcSwap::from_pointee(Vec::new()),
            register: Mutex::new(()),
            ring: std::array::from_fn(|_| AtomicU64::new(0)),
            newest: AtomicI64::new(i64::MIN),
            overflow: Mutex::new(Overflow::default()),
            at_cap: counter!("throttle_keys_at_cap_total", "service" => name.to_string()),
            blocked: Blocked::default(),
            limits: ArcSwap::default(),
            has_default: AtomicBool::new(false),
            has_newcomers: AtomicBool::new(false),
            bound: ArcSwap::default(),
            budgets: ArcSwap::default(),
            has_budgets: AtomicBool::new(false),
        });
        services.push(s.clone());
        self.shared.registered.send_replace(services.len());
        s
    }

    /// A receiver that changes whenever a service is registered; its value
    /// is the number of services.
    pub(crate) fn watch_services(&self) -> tokio::sync::watch::Receiver<usize> {
        self.shared.registered.subscribe()
    }

    /// How many services are registered (they are never removed).
    pub fn service_count(&self) -> usize {
        self.shared.services.lock().len()
    }

    /// Names of the services in the store.
    pub fn service_names(&self) -> Vec<String> {
        self.shared
            .services
            .lock()
            .iter()
            .map(|s| s.name.to_string())
            .collect()
    }

    /// The store of service `name`, if one is registered (a message the
    /// central sends for a service this process does not serve is
    /// dropped). The list's lock is let go before the caller uses it.
    pub(super) fn served(&self, name: &str) -> Option<Arc<ServiceStore>> {
        named(&self.shared.services.lock(), name).cloned()
    }

    /// Blocks `users` of `service`, if the store serves it.
    #[cfg_attr(feature = "sim", visibility::make(pub))]
    pub(crate) fn set_blocked(&self, service: &str, users: Vec<String>) {
        if let Some(s) = self.served(service) {
            s.set_blocked(users);
        }
    }

    /// Makes `limits` its service's limits, if the store serves it.
    #[cfg_attr(feature = "sim", visibility::make(pub))]
    pub(crate) fn set_limits(&self, limits: v1::Limits) {
        if let Some(s) = self.served(&limits.service) {
            s.set_limits(limits);
        }
    }

    /// Makes `bound` its service's keys bound by a longer period, if the
    /// store serves it.
    #[cfg_attr(feature = "sim", visibility::make(pub))]
    pub(crate) fn set_bound(&self, bound: v1::Bound) {
        if let Some(s) = self.served(&bound.service) {
            s.set_bound(bound);
        }
    }

    /// Users tracked over all services.
    pub fn keys(&self) -> usize {
        self.shared.keys.load(Ordering::Relaxed)
    }
}

/// The store of `name` among `services`.
pub(super) fn named<'s>(
    services: &'s [Arc<ServiceStore>],
    name: &str,
) -> Option<&'s Arc<ServiceStore>> {
    services.iter().find(|s| &*s.name == name)
}

impl SlotStoreBuilder {
    /// The clock slots are read from (default: [`CoarseClock`], the system
    /// clock at the kernel's last tick).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// The slot length; must match the central node's (default 1 s).
    pub fn slot(mut self, slot: SlotLength) -> Self {
        self.slot = slot;
        self
    }

    /// Most users tracked over all services (default 1,000,000).
    pub fn max_keys(mut self, max: usize) -> Self {
        self.max_keys = max;
        self
    }

    /// The store.
    pub fn build(self) -> SlotStore {
        SlotStore {
            shared: Arc::new(Shared {
                clock: self.clock,
                slot: self.slot,
                keys: Arc::new(AtomicUsize::new(0)),
                max_keys: self.max_keys,
                services: Mutex::new(Vec::new()),
                registered: tokio::sync::watch::Sender::new(0),
            }),
        }
    }
}

// Installing quotas: a (service, slot) table into the users' rows, or a
// ref copying a table already installed.
impl SlotStore {
    /// Installs a quota from the central node: each (service, slot) table
    /// replaces any earlier one for that slot, then each of its
    /// [`refs`](v1::Quota::refs) installs a copy of a table already
    /// installed. Slots more than 16 slots in the past or future are
    /// ignored. The tables of an answer to a report for slots to come are
    /// marked ahead: while the node applies one, the budgets the central
    /// told it hold as without a table.
    pub fn apply_quota(&self, quota: &v1::Quota) {
        let now = self.current_slot();
        let ahead = Ahead::of(quota.report_slot, now);
        for (name, sq) in &quota.services {
            for (&slot, users) in &sq.slots {
                let users = users.users.iter().map(|(user, rq)| {
                    let resources = rq.resources.iter().map(|(r, &q)| (r.as_str(), q));
                    (user.as_str(), resources)
                });
                self.apply_table(name, slot, users, ahead);
            }
        }
        for r in &quota.refs {
            self.apply_ref(&r.service, r.slot, r.from_slot, ahead);
        }
    }

    /// [`SlotStore::apply_quota`] for a quota read in place, as the
    /// reporter receives it: the same tables installed, without decoding
    /// them into maps first.
    pub fn apply_raw_quota(&self, quota: &RawQuota) {
        let now = self.current_slot();
        let ahead = Ahead::of(quota.report_slot(), now);
        for (name, slot, users) in quota.tables() {
            self.apply_table(name, slot, users, ahead);
        }
        for (name, slot, from) in quota.refs() {
            self.apply_ref(name, slot, from, ahead);
        }
    }

    pub(super) fn apply_table<'a, U, R>(&self, name: &str, slot: i64, users: U, ahead: Ahead)
    where
        U: Iterator<Item = (&'a str, R)> + Clone,
        R: Iterator<Item = (&'a str, f64)>,
    {
        let now = ahead.now;
        if self.installable(name, slot, now) {
            Install(&self.service(name)).apply(slot, users, ahead);
            counter!("throttle_quota_tables_installed_total", "service" => name.to_owned())
                .increment(1);
        }
    }

    /// Installs (`name`, `slot`) as a copy of (`name`, `from`), a
    /// [`v1::QuotaRef`]. A ref to a table this store does not hold (the
    /// central node sends one only after the table, on the same stream)
    /// installs nothing, so the slot goes to the [`Fallback`]: counted and
    /// logged.
    pub(super) fn apply_ref(&self, name: &str, slot: i64, from: i64, ahead: Ahead) {
        if !self.installable(name, slot, ahead.now) {
            return;
        }
        if self
            .served(name)
            .is_some_and(|s| Install(&s).copy_table(slot, from, ahead))
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

// Collecting a finished slot into a report, and forgetting idle users.
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
            Drain(&s).collect_into(slot, &mut report, packed);
        }
        report.finish(node_id, slot + 1)
    }
}
