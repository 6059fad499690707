//! A zone: every key's [`Excess`], bounded in memory, keys not used for
//! longest evicted first.

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

/// One key's state, and when it was last moved to the front of its
/// shard's order.
#[derive(Debug, Clone, Copy)]
struct Entry {
    excess: Excess,
    moved: u64,
}

/// One shard: its keys in order of use (the `lru` crate: a hash map
/// threaded on a list, O(1) to find, move and evict), and a count of the
/// moves to the front.
#[derive(Debug)]
struct Shard {
    keys: LruCache<CompactString, Entry, Hasher>,
    moves: u64,
}

/// The states of one limit's keys.
///
/// Each shard holds at most its part of the zone's size; a new key in a
/// full shard takes the place of the one least recently moved to the
/// front, as nginx's `limit_req` frees its oldest state when its zone is
/// full. A key is moved to the front when used, unless it was moved there
/// within the last half shard's worth of moves: it is then in the front
/// half still, and a use costs one lookup and no list surgery (moving a
/// node touches its neighbours' memory, three cache misses at 10,000
/// keys). A key used at least once per half shard of moves is never
/// evicted; one idle longer goes first.
#[derive(Debug)]
pub(crate) struct Zone {
    shards: Box<[Mutex<Shard>]>,
    hasher: Hasher,
    /// Moves a key may lag behind before a use moves it again.
    recent: u64,
    pub(crate) shape: Shape,
    /// Keys evicted while their excess had not drained.
    pub(crate) evicted_busy: metrics::Counter,
}

impl Zone {
    /// A zone of `shape` holding at most about `size` keys (at least one
    /// per shard).
    pub(crate) fn new(shape: Shape, size: usize, evicted_busy: metrics::Counter) -> Self {
        let per_shard = size.div_ceil(SHARDS).max(1);
        let cap = NonZeroUsize::new(per_shard).unwrap_or(NonZeroUsize::MIN);
        let shards = (0..SHARDS)
            .map(|_| {
                Mutex::new(Shard {
                    keys: LruCache::with_hasher(cap, Hasher::default()),
                    moves: 0,
                })
            })
            .collect();
        Self {
            shards,
            hasher: Hasher::default(),
            recent: (per_shard / 2) as u64,
            shape,
            evicted_busy,
        }
    }

    fn shard(&self, key: &str) -> &Mutex<Shard> {
        let at = self.hasher.hash_one(key) as usize % self.shards.len();
        &self.shards[at]
    }

    /// Accounts one request of `key` at `now_ms`. A known key allocates
    /// nothing; a new one passes, as in nginx.
    #[inline]
    pub(crate) fn account(&self, key: &str, now_ms: u64) -> Verdict {
        let mut shard = self.shard(key).lock();
        let moves = shard.moves;
        match shard.keys.peek_mut(key) {
            Some(entry) if moves - entry.moved <= self.recent => {
                entry.excess.account(self.shape, now_ms)
            }
            Some(entry) => {
                entry.moved = moves;
                let verdict = entry.excess.account(self.shape, now_ms);
                shard.moves += 1;
                shard.keys.promote(key);
                verdict
            }
            None => {
                self.insert(&mut shard, key, now_ms);
                Verdict::Pass
            }
        }
    }

    #[cold]
    fn insert(&self, shard: &mut Shard, key: &str, now_ms: u64) {
        let entry = Entry {
            excess: Excess::first(now_ms),
            moved: shard.moves,
        };
        shard.moves += 1;
        let evicted = shard.keys.push(CompactString::from(key), entry);
        if evicted.is_some_and(|(_, e)| !e.excess.is_idle(self.shape, now_ms)) {
            self.evicted_busy.increment(1);
        }
    }

    /// Takes back one request of `key` (a later limit refused it).
    pub(crate) fn refund(&self, key: &str) {
        if let Some(entry) = self.shard(key).lock().keys.peek_mut(key) {
            entry.excess.refund();
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
        let held: usize = z.shards.iter().map(|s| s.lock().keys.len()).sum();
        assert!(held <= 64 * 8, "{held}");
    }
}
