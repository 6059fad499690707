//! The last refusal's head, kept for the next refusal with the same
//! figures (see `refusal`).

use std::hash::{BuildHasher, Hash};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arc_swap::ArcSwapOption;
use http::response::Parts;

use crate::store::ResourceId;

/// Everything a refusal's headers are made of, but the gRPC pushback (in
/// milliseconds, so it changes too often to be worth keeping): equal
/// figures give equal headers. The status, the service's and resources'
/// names and the slot length are the layer's and never change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Figures {
    pub(crate) grpc: bool,
    /// The exhausted resource the headers name, if any.
    pub(crate) resource: Option<ResourceId>,
    pub(crate) limit: u64,
    pub(crate) remaining: u64,
    pub(crate) reset_secs: u64,
    /// The window, in seconds, of the user's configured limit that
    /// `limit` is, when the central's limits give one (else `limit` is
    /// this node's share of the slot).
    pub(crate) window: Option<u32>,
}

/// The last refusal's head and its figures; see the [`refusal`](super::refusal) module docs.
///
/// An `ArcSwapOption` rather than a lock: reading it takes no lock, and two
/// threads refusing at once do not wait for each other. A refusal with other
/// figures builds its own head, and it replaces the kept one when the
/// refusal before it had the same figures.
#[derive(Debug, Default)]
pub(crate) struct RefusalCache {
    last: ArcSwapOption<(Figures, Parts)>,
    /// A digest of the figures of the last refusal that built its head.
    built: AtomicU64,
}

impl RefusalCache {
    pub(crate) fn get(&self, figures: &Figures) -> Option<Parts> {
        let last = self.last.load();
        let (kept, head) = last.as_deref()?;
        (kept == figures).then(|| head.clone())
    }

    /// Notes that a refusal built `head`, and keeps it if the last refusal
    /// to build a head had the same figures. Two threads may race here; the
    /// worst outcome is a head kept once more or once less.
    pub(crate) fn built(&self, figures: Figures, head: &Parts) {
        let digest = foldhash::fast::FixedState::default().hash_one(figures);
        if self.built.swap(digest, Ordering::Relaxed) == digest {
            self.last.store(Some(Arc::new((figures, head.clone()))));
        }
    }
}
