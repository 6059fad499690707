//! [`Keys`]: one shard of a zone, a map from key to [`Excess`] bounded in
//! size, its least recently used keys evicted first (approximately, by
//! the CLOCK algorithm).

use compact_str::CompactString;
use hashbrown::HashTable;

use super::excess::Excess;

/// One key's state where it lives: in the shard's array, not behind a
/// pointer.
#[derive(Debug)]
struct Entry {
    key: CompactString,
    /// The key's hash, kept to find its index when it is evicted.
    hash: u64,
    state: Excess,
    /// Used since the clock hand last passed it.
    used: bool,
}

/// At most `cap` keys. The states sit in one array, found through a hash
/// table of indices; a lookup reads the table and then the entry, and
/// touching a key only sets its `used` flag. A linked LRU list (the `lru`
/// crate's) moves the entry to the list's head on each touch, reading
/// and writing its neighbours' nodes: on a zone of 10,000 keys that was
/// the largest part of a decision's time.
///
/// When full, a new key takes the place of the first entry the clock hand
/// finds unused since it last passed (clearing `used` as it goes): the
/// classic CLOCK approximation of LRU. A new key starts unused, so a
/// flood of keys seen once evicts its own kind before any key in use.
#[derive(Debug)]
pub(crate) struct Keys {
    entries: Vec<Entry>,
    index: HashTable<u32>,
    hand: usize,
    cap: usize,
}

impl Keys {
    /// An empty shard of at most `cap` keys (at least 1, at most
    /// `u32::MAX`); it allocates as keys arrive.
    pub(crate) fn new(cap: usize) -> Self {
        Self {
            entries: Vec::new(),
            index: HashTable::new(),
            hand: 0,
            cap: cap.clamp(1, u32::MAX as usize),
        }
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// The entry of `key` (of hash `hash`).
    #[inline]
    fn entry(&mut self, hash: u64, key: &str) -> Option<&mut Entry> {
        let entries = &self.entries;
        let at = *self.index.find(hash, |&i| entries[i as usize].key == key)?;
        self.entries.get_mut(at as usize)
    }

    /// The state of `key` (of hash `hash`), marked used.
    #[inline]
    pub(crate) fn get_mut(&mut self, hash: u64, key: &str) -> Option<&mut Excess> {
        let entry = self.entry(hash, key)?;
        entry.used = true;
        Some(&mut entry.state)
    }

    /// The state of `key`, not marked used.
    pub(crate) fn peek_mut(&mut self, hash: u64, key: &str) -> Option<&mut Excess> {
        self.entry(hash, key).map(|e| &mut e.state)
    }

    /// Adds `key` (not present) with `state`; when full, it takes the
    /// place of an entry unused since the hand last passed, whose state
    /// is returned.
    pub(crate) fn insert(&mut self, hash: u64, key: &str, state: Excess) -> Option<Excess> {
        let entry = Entry {
            key: CompactString::from(key),
            hash,
            state,
            used: false,
        };
        let entries = &self.entries;
        if entries.len() < self.cap {
            let at = entries.len() as u32;
            self.index
                .insert_unique(hash, at, |&i| entries[i as usize].hash);
            self.grow();
            self.entries.push(entry);
            return None;
        }
        let at = self.victim();
        let old_hash = self.entries[at].hash;
        if let Ok(found) = self.index.find_entry(old_hash, |&i| i as usize == at) {
            found.remove();
        }
        let entries = &self.entries;
        self.index
            .insert_unique(hash, at as u32, |&i| entries[i as usize].hash);
        let old = std::mem::replace(&mut self.entries[at], entry);
        Some(old.state)
    }

    /// Room for one more entry: doubling, as a `Vec` does, but never past
    /// the cap, so a full shard holds no unused room.
    fn grow(&mut self) {
        let len = self.entries.len();
        if len == self.entries.capacity() {
            let want = (len * 2).max(4).min(self.cap);
            self.entries.reserve_exact(want.saturating_sub(len).max(1));
        }
    }

    /// Moves the hand to the first entry unused since it last passed,
    /// clearing `used` on the way; the hand then stands after it. Ends
    /// within two turns.
    fn victim(&mut self) -> usize {
        let n = self.entries.len();
        loop {
            let at = self.hand;
            self.hand = (at + 1) % n;
            let entry = &mut self.entries[at];
            if !std::mem::take(&mut entry.used) {
                return at;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::hash::BuildHasher;

    use proptest::prelude::*;

    use super::*;

    fn hash(key: &str) -> u64 {
        foldhash::fast::FixedState::with_seed(7).hash_one(key)
    }

    fn state(ms: u64) -> Excess {
        Excess::first(ms)
    }

    #[test]
    fn a_full_shard_replaces_an_unused_key_and_keeps_the_used_ones() {
        let mut keys = Keys::new(3);
        for (i, k) in ["a", "b", "c"].iter().enumerate() {
            assert_eq!(keys.insert(hash(k), k, state(i as u64)), None);
        }
        assert!(keys.get_mut(hash("a"), "a").is_some());
        assert!(keys.get_mut(hash("c"), "c").is_some());
        // "b" is the one unused: it goes, its state returned.
        assert_eq!(keys.insert(hash("d"), "d", state(9)), Some(state(1)));
        assert!(keys.peek_mut(hash("b"), "b").is_none());
        for k in ["a", "c", "d"] {
            assert!(keys.peek_mut(hash(k), k).is_some(), "{k}");
        }
        assert_eq!(keys.len(), 3);
    }

    proptest! {
        /// Against a plain map: every key present answers with its own
        /// state, the size never passes the cap, and a key is evicted
        /// only when the shard is full.
        #[test]
        fn keys_hold_their_own_states_within_the_cap(
            cap in 1usize..20,
            ops in prop::collection::vec((0u64..40, any::<bool>()), 1..400),
        ) {
            let mut keys = Keys::new(cap);
            let mut model = std::collections::HashMap::new();
            for (n, (k, touch)) in ops.into_iter().enumerate() {
                let key = format!("k{k}");
                let h = hash(&key);
                match keys.get_mut(h, &key) {
                    Some(s) => {
                        prop_assert_eq!(Some(&*s), model.get(&key));
                        if touch {
                            *s = state(n as u64);
                            model.insert(key, *s);
                        }
                    }
                    None => {
                        let before = keys.len();
                        let evicted = keys.insert(h, &key, state(n as u64));
                        prop_assert_eq!(evicted.is_some(), before == cap);
                        if let Some(old) = evicted {
                            let gone: Vec<_> = model
                                .iter()
                                .filter(|(_, s)| **s == old)
                                .map(|(k, _)| k.clone())
                                .collect();
                            prop_assert_eq!(gone.len(), 1);
                            model.remove(&gone[0]);
                        }
                        model.insert(key, state(n as u64));
                    }
                }
                prop_assert!(keys.len() <= cap);
                prop_assert_eq!(keys.len(), model.len());
            }
            for (k, s) in &model {
                prop_assert_eq!(keys.peek_mut(hash(k), k).copied(), Some(*s));
            }
        }
    }
}
