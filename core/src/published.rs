//! [`Published`]: the version in force of something read again and again.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arc_swap::ArcSwap;

/// The version in force of something read again and again (a file, an
/// etcd key), a number that changes with it, and why the last read
/// failed: what a reader of the limits or node keys asks.
#[derive(Debug)]
pub struct Published<T> {
    current: ArcSwap<T>,
    /// Bumped after each new version.
    version: AtomicU64,
    error: ArcSwap<Option<String>>,
}

impl<T> Published<T> {
    /// `value` in force, as version 0.
    pub fn new(value: T) -> Self {
        Self {
            current: ArcSwap::from_pointee(value),
            version: AtomicU64::new(0),
            error: ArcSwap::from_pointee(None),
        }
    }

    /// Puts `value` in force, and forgets the last error.
    pub fn publish(&self, value: T) {
        self.current.store(Arc::new(value));
        // After the store: whoever sees the new version sees the value.
        self.version.fetch_add(1, Ordering::Release);
        self.error.store(Arc::new(None));
    }

    /// Records why the last read failed; the version in force stays.
    pub fn fail(&self, error: String) {
        self.error.store(Arc::new(Some(error)));
    }

    /// Forgets the last error: the version in force was read again as it
    /// is (a file put back unchanged).
    pub fn recover(&self) {
        if self.error.load().is_some() {
            self.error.store(Arc::new(None));
        }
    }

    /// The version in force.
    pub fn current(&self) -> Arc<T> {
        self.current.load_full()
    }

    /// A number that changes whenever the version in force does.
    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    /// Why the last read failed, if it did.
    pub fn last_error(&self) -> Option<String> {
        (**self.error.load()).clone()
    }
}
