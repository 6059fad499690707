//! A zone: every key's [`Excess`], bounded in memory, least recently used
//! keys evicted first.

use std::hash::BuildHasher;
use std::num::NonZeroUsize;

use compact_str::CompactString;
use lru::LruCache;
use parking_lot::Mutex;

use super::excess::{Excess, Shape, Verdict};

/// Shards of a zone: each key's state is behind its shard's lock only, so
/// requests of different keys seldom wait for one another, and no lock is
/// global.
const SHARDS: usize = 64;

type Hasher = foldhash::fast::RandomState;

type Keys = LruCache<CompactString, Excess, Hasher>;

/// The states of one limit's keys.
///
/// An `LruCache` per shard (the `lru` crate: a hash map threaded on a
/// list, O(1) to find, touch and evict) holds at most its part of the
/// zone's size; a new key in a full shard takes the place of its least
/// recently used one, as nginx's `limit_req` frees its oldest state when
/// its zone is full.
#[derive(Debug)]
pub(crate) struct Zone {
    shards: Box<[Mutex<Keys>]>,
    hasher: Hasher,
    pub(crate) shape: Shape,
    /// Keys evicted while their excess had not drained.
    pub(crate) evicted_busy: metrics::Counter,
}

impl Zone {
    /// A zone of `shape` holding at most about `size` keys (at least one
    /// per shard).
    pub(crate) fn new(shape: Shape, size: usize, evicted_busy: metrics::Counter) -> Self {
        let per_shard = NonZeroUsize::new(size.div_ceil(SHARDS)).unwrap_or(NonZeroUsize::MIN);
        let shards = (0..SHARDS)
            .map(|_| Mutex::new(LruCache::with_hasher(per_shard, Hasher::default())))
            .collect();
        Self {
            shards,
            hasher: Hasher::default(),
            shape,
            evicted_busy,
        }
    }

    fn shard(&self, key: &str) -> &Mutex<Keys> {
        let at = self.hasher.hash_one(key) as usize % self.shards.len();
        &self.shards[at]
    }

    /// Accounts one request of `key` at `now_ms`. A known key allocates
    /// nothing; a new one passes, as in nginx.
    #[inline]
    pub(crate) fn account(&self, key: &str, now_ms: u64) -> Verdict {
        let mut keys = self.shard(key).lock();
        if let Some(state) = keys.get_mut(key) {
            return state.account(self.shape, now_ms);
        }
        self.insert(&mut keys, key, now_ms);
        Verdict::Pass
    }

    #[cold]
    fn insert(&self, keys: &mut Keys, key: &str, now_ms: u64) {
        let evicted = keys.push(CompactString::from(key), Excess::first(now_ms));
        if evicted.is_some_and(|(_, e)| !e.is_idle(self.shape, now_ms)) {
            self.evicted_busy.increment(1);
        }
    }

    /// Takes back one request of `key` (a later limit refused it).
    pub(crate) fn refund(&self, key: &str) {
        if let Some(state) = self.shard(key).lock().peek_mut(key) {
            state.refund();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn zone(size: usize) -> Zone {
        let shape = Shape {
            rate: 1000,
            burst: 0,
            delay: 0,
        };
        Zone::new(shape, size, metrics::Counter::noop())
    }

    #[test]
    fn a_key_in_use_outlives_a_flood_of_new_ones() {
        let z = zone(64 * 8);
        assert_eq!(z.account("kept", 0), Verdict::Pass);
        for k in 0..100_000u64 {
            z.account(&format!("flood-{k}"), 0);
            if k % 2 == 0 {
                // Refused: its state is kept, used every other request.
                assert_eq!(z.account("kept", 0), Verdict::Reject, "at {k}");
            }
        }
        let held: usize = z.shards.iter().map(|s| s.lock().len()).sum();
        assert!(held <= 64 * 8, "{held}");
    }
}
