//! [`MemoryStore`]: keyed buckets in this process, in 64 shards.

use std::collections::HashMap;
use std::future::{Future, ready};
use std::hash::BuildHasher;
use std::sync::Arc;

use parking_lot::Mutex;
use smallvec::SmallVec;
use throttle_clock::{Clock, SystemClock};

use super::level::{Level, Wait};
use super::shape::Shape;
use super::store::{Store, StoreError};

const SHARDS: usize = 64;
/// A shard forgets its full buckets once it holds twice as many keys as
/// after its last sweep, and at least this many.
const SWEEP_FLOOR: usize = 1024;

/// One key's bucket and block mark.
#[derive(Debug, Clone, Copy)]
struct Entry {
    /// `None`: blocked before it was ever used.
    level: Option<Level>,
    /// When the bucket is full again if left alone (µs).
    full_at_us: u64,
    blocked: bool,
}

#[derive(Debug, Default)]
struct Shard {
    /// Keys are the service's bytes, 0xFF (never in UTF-8), the key's.
    entries: HashMap<Box<[u8]>, Entry, foldhash::fast::RandomState>,
    swept_len: usize,
}

impl Shard {
    /// Forgets the buckets that are full by `now_us` and not blocked.
    fn sweep(&mut self, now_us: u64) {
        self.entries
            .retain(|_, e| e.blocked || e.full_at_us > now_us);
        self.swept_len = self.entries.len();
    }

    fn sweep_if_grown(&mut self, now_us: u64) {
        let len = self.entries.len();
        if len >= SWEEP_FLOOR && len >= self.swept_len.saturating_mul(2) {
            self.sweep(now_us);
        }
    }
}

/// Keyed buckets in memory: 64 shards, each a map behind its own mutex
/// (held for one lookup and a few additions; no global lock), found by
/// the key's hash. Full buckets are forgotten (a new one would be the
/// same): a shard sweeps them when it has doubled since its last sweep,
/// and [`MemoryStore::purge`] sweeps all. Blocked keys are kept.
///
/// ```
/// use throttle_layer::bucket::{MemoryStore, Shape, Wait};
///
/// let store = MemoryStore::new();
/// let shape = Shape::per_second(2);
/// assert!(store.take("front", "alice", &shape, 2).is_ok());
/// assert!(matches!(store.take("front", "alice", &shape, 1), Err(Wait::For(_))));
/// store.set_blocked("front", "bob", true);
/// assert_eq!(store.take("front", "bob", &shape, 1), Err(Wait::Blocked));
/// ```
#[derive(Debug, Clone)]
pub struct MemoryStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    shards: Box<[Mutex<Shard>]>,
    hasher: foldhash::fast::RandomState,
    clock: Arc<dyn Clock>,
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryStore {
    /// An empty store on the system clock.
    pub fn new() -> Self {
        Self::with_clock(Arc::new(SystemClock))
    }

    /// An empty store on `clock` (a `ManualClock` in tests).
    pub fn with_clock(clock: Arc<dyn Clock>) -> Self {
        let shards = (0..SHARDS).map(|_| Mutex::default()).collect();
        Self {
            inner: Arc::new(Inner {
                shards,
                hasher: foldhash::fast::RandomState::default(),
                clock,
            }),
        }
    }

    fn now_us(&self) -> u64 {
        u64::try_from(self.inner.clock.now_ms())
            .unwrap_or(0)
            .saturating_mul(1000)
    }

    /// Runs `f` on the shard of `key` in `service` with the map's key.
    fn with_shard<R>(&self, service: &str, key: &str, f: impl FnOnce(&mut Shard, &[u8]) -> R) -> R {
        // On the stack for the names of up to 120 bytes together.
        let mut name: SmallVec<[u8; 128]> = SmallVec::new();
        name.extend_from_slice(service.as_bytes());
        name.push(0xFF);
        name.extend_from_slice(key.as_bytes());
        let i = self.inner.hasher.hash_one(&name[..]) as usize % SHARDS;
        f(&mut self.inner.shards[i].lock(), &name)
    }

    /// [`Store::try_acquire`], at once.
    pub fn take(&self, service: &str, key: &str, shape: &Shape, n: u64) -> Result<(), Wait> {
        let now = self.now_us();
        self.with_shard(service, key, |shard, name| {
            if let Some(e) = shard.entries.get_mut(name) {
                return take_from(e, shape, now, n);
            }
            let mut e = Entry {
                level: None,
                full_at_us: 0,
                blocked: false,
            };
            let taken = take_from(&mut e, shape, now, n);
            shard.sweep_if_grown(now);
            shard.entries.insert(name.into(), e);
            taken
        })
    }

    /// Puts back `n` tokens of the bucket of `key` in `service`, up to its
    /// capacity (a take whose request a later limit refused).
    pub fn give_back(&self, service: &str, key: &str, shape: &Shape, n: u64) {
        self.with_shard(service, key, |shard, name| {
            if let Some(e) = shard.entries.get_mut(name)
                && let Some(level) = &mut e.level
            {
                level.give_back(shape, n);
                e.full_at_us = level.full_at_us(shape);
            }
        });
    }

    /// [`Store::available`], at once.
    pub fn level(&self, service: &str, key: &str, shape: &Shape) -> u64 {
        let now = self.now_us();
        self.with_shard(service, key, |shard, name| {
            match shard.entries.get(name).and_then(|e| e.level) {
                Some(level) => level.available(shape, now),
                None => shape.capacity_tokens(),
            }
        })
    }

    /// Puts `key` on (or takes it off) `service`'s block list, at once.
    pub fn set_blocked(&self, service: &str, key: &str, blocked: bool) {
        self.with_shard(service, key, |shard, name| {
            match shard.entries.get_mut(name) {
                Some(e) => e.blocked = blocked,
                None if blocked => {
                    let e = Entry {
                        level: None,
                        full_at_us: 0,
                        blocked,
                    };
                    shard.entries.insert(name.into(), e);
                }
                None => {}
            }
        });
    }

    /// Whether `key` is on `service`'s block list, at once.
    pub fn blocked(&self, service: &str, key: &str) -> bool {
        self.with_shard(service, key, |shard, name| {
            shard.entries.get(name).is_some_and(|e| e.blocked)
        })
    }

    /// Forgets every bucket that is full and not blocked.
    pub fn purge(&self) {
        let now = self.now_us();
        for shard in &self.inner.shards {
            shard.lock().sweep(now);
        }
    }

    /// Keys held (buckets and block marks).
    pub fn len(&self) -> usize {
        self.inner
            .shards
            .iter()
            .map(|s| s.lock().entries.len())
            .sum()
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn take_from(e: &mut Entry, shape: &Shape, now_us: u64, n: u64) -> Result<(), Wait> {
    if e.blocked {
        return Err(Wait::Blocked);
    }
    let mut level = e.level.unwrap_or_else(|| Level::full(shape, now_us));
    let taken = level.take(shape, now_us, n);
    e.level = Some(level);
    e.full_at_us = level.full_at_us(shape);
    taken
}

impl Store for MemoryStore {
    fn try_acquire(
        &self,
        service: &str,
        key: &str,
        shape: &Shape,
        n: u64,
    ) -> impl Future<Output = Result<(), Wait>> + Send {
        ready(self.take(service, key, shape, n))
    }

    fn available(
        &self,
        service: &str,
        key: &str,
        shape: &Shape,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send {
        ready(Ok(self.level(service, key, shape)))
    }

    fn block(
        &self,
        service: &str,
        key: &str,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.set_blocked(service, key, true);
        ready(Ok(()))
    }

    fn unblock(
        &self,
        service: &str,
        key: &str,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.set_blocked(service, key, false);
        ready(Ok(()))
    }

    fn is_blocked(
        &self,
        service: &str,
        key: &str,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        ready(Ok(self.blocked(service, key)))
    }
}
