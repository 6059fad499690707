//! A zone: every key's [`Excess`], bounded in memory, least recently used
//! keys evicted first, and the clock they are accounted by.

use std::hash::BuildHasher;
use std::sync::Arc;

use parking_lot::Mutex;
use throttle_clock::{Clock, CoarseClock};

use super::excess::{Excess, Pace, Verdict};
use super::keys::Keys;

/// Shards of a zone: each key's state is behind its shard's lock only, so
/// requests of different keys seldom wait for one another, and no lock is
/// global.
const SHARDS: usize = 64;

/// foldhash: the fastest of the well-kept hashers on short keys, and
/// seeded per process, so keys a client picks cannot be made to collide.
type Hasher = foldhash::fast::RandomState;

/// The milliseconds a zone accounts requests by.
#[derive(Debug, Clone, Default)]
pub(crate) enum ZoneClock {
    /// The kernel's coarse monotonic clock ([`CoarseClock::monotonic_ms`]),
    /// read from the vDSO without a system call: the precise clock costs a
    /// local limit's decision more than the decision itself on a virtual
    /// machine (`docs/performance.md`). nginx, too, reads a time cached once
    /// per event loop turn.
    #[default]
    Coarse,
    /// A clock given to the limit (a test's).
    Given(Arc<dyn Clock>),
}

impl ZoneClock {
    #[inline]
    fn now_ms(&self) -> u64 {
        match self {
            Self::Coarse => CoarseClock::monotonic_ms(),
            Self::Given(clock) => u64::try_from(clock.now_ms()).unwrap_or(0),
        }
    }
}

/// The states of one limit's keys.
///
/// Each of [`SHARDS`] shards holds at most its part of the zone's size; a
/// new key in a full shard takes the place of one unused for longest
/// (approximately: [`Keys`]), as nginx's `limit_req` frees its oldest
/// state when its zone is full.
#[derive(Debug)]
pub(crate) struct Zone {
    shards: Box<[Mutex<Keys>]>,
    hasher: Hasher,
    clock: ZoneClock,
    pub(crate) shape: Pace,
    /// Keys evicted while their excess had not drained.
    pub(crate) evicted_busy: metrics::Counter,
}

impl Zone {
    /// A zone of `shape` holding at most about `size` keys (at least one
    /// per shard), accounting by `clock`.
    pub(crate) fn new(
        shape: Pace,
        size: usize,
        clock: ZoneClock,
        evicted_busy: metrics::Counter,
    ) -> Self {
        let per_shard = size.div_ceil(SHARDS);
        let shards = (0..SHARDS)
            .map(|_| Mutex::new(Keys::new(per_shard)))
            .collect();
        Self {
            shards,
            hasher: Hasher::default(),
            clock,
            shape,
            evicted_busy,
        }
    }

    /// The key's hash and its shard. The shard is chosen by bits of the
    /// hash that the shard's table uses for neither its bucket (the low
    /// bits) nor its tag (the top seven).
    #[inline]
    fn shard(&self, key: &str) -> (u64, &Mutex<Keys>) {
        let hash = self.hasher.hash_one(key);
        (hash, &self.shards[(hash >> 32) as usize % SHARDS])
    }

    /// Accounts one request of `key` now. A known key allocates nothing;
    /// a new one passes, as in nginx.
    #[inline]
    pub(crate) fn account(&self, key: &str) -> Verdict {
        let now_ms = self.clock.now_ms();
        let (hash, shard) = self.shard(key);
        let mut keys = shard.lock();
        if let Some(state) = keys.get_mut(hash, key) {
            return state.account(self.shape, now_ms);
        }
        self.insert(&mut keys, hash, key, now_ms);
        Verdict::Pass
    }

    #[cold]
    fn insert(&self, keys: &mut Keys, hash: u64, key: &str, now_ms: u64) {
        let evicted = keys.insert(hash, key, Excess::first(now_ms));
        if evicted.is_some_and(|e| !e.is_idle(self.shape, now_ms)) {
            self.evicted_busy.increment(1);
        }
    }

    /// Takes back one request of `key` (a later limit refused it).
    pub(crate) fn refund(&self, key: &str) {
        let (hash, shard) = self.shard(key);
        if let Some(state) = shard.lock().peek_mut(hash, key) {
            state.refund();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn zone(size: usize) -> Zone {
        let shape = Pace {
            rate: 1000,
            burst: 0,
            delay: 0,
        };
        // Time stands still: "kept" never drains.
        let clock = ZoneClock::Given(Arc::new(throttle_clock::ManualClock::new(0)));
        Zone::new(shape, size, clock, metrics::Counter::noop())
    }

    #[test]
    fn a_key_in_use_outlives_a_flood_of_new_ones() {
        let z = zone(64 * 8);
        assert_eq!(z.account("kept"), Verdict::Pass);
        for k in 0..100_000u64 {
            z.account(&format!("flood-{k}"));
            if k % 2 == 0 {
                // Refused: its state is kept, used every other request.
                assert_eq!(z.account("kept"), Verdict::Reject, "at {k}");
            }
        }
        let held: usize = z.shards.iter().map(|s| s.lock().len()).sum();
        assert!(held <= 64 * 8, "{held}");
    }
}
