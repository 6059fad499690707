//! The last refusal's head and body, kept for the next refusal with the
//! same figures (see `refusal`).

use std::hash::{BuildHasher, Hash};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arc_swap::ArcSwapOption;

use super::future::Refusal;
use super::headers::Stated;
use crate::store::ResourceId;

/// Everything a refusal's head and body are made of, but the gRPC
/// pushback (in milliseconds, so it changes too often to be worth
/// keeping): equal figures give equal refusals. The status, the service's
/// and resources' names and the slot length are the layer's and never
/// change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Figures {
    pub(crate) grpc: bool,
    /// Whether the body is JSON.
    pub(crate) json: bool,
    /// The exhausted resource, if the quota named one.
    pub(crate) resource: Option<ResourceId>,
    /// The limit, what is left and the reset the headers and body state.
    pub(crate) stated: Stated,
}

/// The last refusal's head and body and its figures; see the [`refusal`](super::refusal) module docs.
///
/// An `ArcSwapOption` rather than a lock: reading it takes no lock, and two
/// threads refusing at once do not wait for each other. A refusal with other
/// figures builds its own head, and it replaces the kept one when the
/// refusal before it had the same figures.
#[derive(Debug, Default)]
pub(crate) struct RefusalCache {
    last: ArcSwapOption<(Figures, Refusal)>,
    /// A digest of the figures of the last refusal that built its head.
    built: AtomicU64,
}

impl RefusalCache {
    pub(crate) fn get(&self, figures: &Figures) -> Option<Refusal> {
        let last = self.last.load();
        let (kept, refusal) = last.as_deref()?;
        (kept == figures).then(|| refusal.clone())
    }

    /// Notes that a refusal built `refusal`, and keeps it if the last
    /// refusal to build one had the same figures. Two threads may race
    /// here; the worst outcome is a refusal kept once more or once less.
    pub(crate) fn built(&self, figures: Figures, refusal: &Refusal) {
        let digest = foldhash::fast::FixedState::default().hash_one(figures);
        if self.built.swap(digest, Ordering::Relaxed) == digest {
            self.last.store(Some(Arc::new((figures, refusal.clone()))));
        }
    }
}
