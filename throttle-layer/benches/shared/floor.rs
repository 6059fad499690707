//! The least a per-user decision costs: shared by the `store` bench (its
//! `slot-quota` floors, in-process) and `http-bench` (its `floor` variant,
//! over HTTP), so both measure the same floor.
//!
//! It reads the user's header, takes the slot from a store's clock, finds
//! the user in a papaya map (the store's) and, in one compare-and-swap,
//! checks the user's count in that slot against its quota, adds one and
//! rolls the count to a new slot. Lock-free, one resource, nothing kept for
//! a report.

use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use throttle_clock::{Clock, SlotLength};
use tower_service::Service;

/// The user's header, read as `Throttle` reads it.
#[inline]
pub(crate) fn user_of<B>(req: &http::Request<B>) -> Option<&str> {
    const X_USER: http::HeaderName = http::HeaderName::from_static("x-user");
    req.headers()
        .get(&X_USER)
        .and_then(|v| v.to_str().ok())
        .map(str::trim_ascii)
}

/// A user's count in one slot, lock-free: the slot's low 32 bits above
/// the count, so that one compare-and-swap checks, counts and rolls.
pub(crate) struct SlotCount {
    word: AtomicU64,
    quota: u32,
}

impl SlotCount {
    /// A count at 0 allowing `quota` a slot.
    pub(crate) fn new(quota: u32) -> Self {
        Self {
            word: AtomicU64::new(0),
            quota,
        }
    }

    /// Whether one more request fits `slot`'s quota; if so it is counted.
    #[inline]
    pub(crate) fn admit(&self, slot: i64) -> bool {
        let tag = (slot as u64) << 32;
        let mut word = self.word.load(Ordering::Relaxed);
        loop {
            let used = if word & !u64::from(u32::MAX) == tag {
                word as u32
            } else {
                0
            };
            if used >= self.quota {
                return false;
            }
            let next = tag | u64::from(used + 1);
            match self
                .word
                .compare_exchange_weak(word, next, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return true,
                Err(now) => word = now,
            }
        }
    }
}

/// [`SlotCount`]s for a bench's users, read through a store's clock.
#[derive(Clone)]
pub(crate) struct SlotCounts {
    counts: Shared<SlotCount>,
    clock: Arc<dyn Clock>,
}

impl SlotCounts {
    /// A count for each of `names`, each allowing `quota` a slot, in
    /// `clock`'s 1 s slots.
    pub(crate) fn new(names: &[String], quota: u32, clock: Arc<dyn Clock>) -> Self {
        Self {
            counts: shared(names, || SlotCount::new(quota)),
            clock,
        }
    }

    /// The decision for `user`; `None` for a user it does not know.
    #[inline]
    pub(crate) fn admit(&self, user: &str) -> Option<bool> {
        let slot = SlotLength::SECOND.slot_at(self.clock.now_ms());
        Some(self.counts.pin().get(user)?.admit(slot))
    }
}

/// A per-user map threads can share: papaya's, as the store's.
pub(crate) type Shared<V> = Arc<papaya::HashMap<Box<str>, V, foldhash::fast::RandomState>>;

/// A map from each of `names` to a fresh count.
pub(crate) fn per_user<M: FromIterator<(Box<str>, V)>, V>(
    names: &[String],
    count: impl Fn() -> V,
) -> M {
    names.iter().map(|n| (n.as_str().into(), count())).collect()
}

/// [`per_user`] in a map threads can share.
pub(crate) fn shared<V>(names: &[String], count: impl Fn() -> V) -> Shared<V> {
    Arc::new(per_user(names, count))
}

/// A floor's part of a layer's work on a request.
pub(crate) trait Count {
    fn count<B>(&mut self, req: &http::Request<B>);
}

impl Count for SlotCounts {
    /// The decision for the request's user, kept from being optimized away.
    fn count<B>(&mut self, req: &http::Request<B>) {
        black_box(user_of(req).and_then(|u| self.admit(u)));
    }
}

/// A floor in front of a service: its part of the work, then the request
/// passed on, whatever was decided (the benches' users stay under their
/// quotas, or measure the refusal apart).
#[derive(Clone)]
pub(crate) struct Floored<F, S>(pub(crate) F, pub(crate) S);

impl<F: Count, S: Service<http::Request<B>>, B> Service<http::Request<B>> for Floored<F, S> {
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.1.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> S::Future {
        self.0.count(&req);
        self.1.call(req)
    }
}
