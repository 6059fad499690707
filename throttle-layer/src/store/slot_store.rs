//! [`SlotStore`]: the node's services, and how to build one.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use arc_swap::ArcSwap;
use metrics::counter;
use parking_lot::Mutex;
use throttle_clock::{Clock, CoarseClock, SlotLength};
use throttle_proto::v1;

use super::blocked::Blocked;
use super::service_store::ServiceStore;
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
pub struct StoreBuilder {
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
    pub fn builder() -> StoreBuilder {
        StoreBuilder {
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
    #[doc(hidden)]
    pub fn set_blocked(&self, service: &str, users: Vec<String>) {
        if let Some(s) = self.served(service) {
            s.set_blocked(users);
        }
    }

    /// Makes `limits` its service's limits, if the store serves it.
    #[doc(hidden)]
    pub fn set_limits(&self, limits: v1::Limits) {
        if let Some(s) = self.served(&limits.service) {
            s.set_limits(limits);
        }
    }

    /// Makes `bound` its service's keys bound by a longer period, if the
    /// store serves it.
    #[doc(hidden)]
    pub fn set_bound(&self, bound: v1::Bound) {
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

impl StoreBuilder {
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
