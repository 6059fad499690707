//! The ground floor the policies read: a service's keys, their buckets
//! and distribution, in one dense arena.

use std::collections::VecDeque;
use std::sync::Arc;

use smallvec::SmallVec;
use throttle_clock::SlotLength;

use super::cuts::Cuts;
use super::first_shares::FirstShares;
use super::ids::{KeyId, Map, Name, NodeId};
use super::key::Key;
use super::recent::NodeUsers;
use super::rules::ServiceRules;
use super::sums::{Column, SlotSums};
use crate::limits::Hierarchy;

/// A user's keys. Their resources' names are read from the keys: a name
/// beside each id would make a user's entry in the name index 120 bytes
/// instead of 40, for lookups that filing mostly does without
/// ([`NodeUsers`]).
type UserKeys = SmallVec<[KeyId; 4]>;

/// Slots after it is freed before a key's id may be given again (once the
/// quota history no longer names it either, `nr_slot` slots later): the
/// book holds assignments up to a policy's lead (at most 2) ahead of the
/// current slot. A key at the arena's end is cut at once instead, with
/// its grants in the book (see [`Cuts`]).
const REUSE_AFTER: i64 = 4;

/// All (user, resource) state of one service; what a [`Policy`](crate::policy::Policy) reads.
///
/// Keys live in one dense arena, so a policy's pass over every key reads
/// memory in order (an assign at 400,000 keys is bound by memory, not by
/// arithmetic), and grants name a key by a 4-byte id instead of sharing its
/// names.
#[derive(Debug, Default)]
pub struct ServiceState {
    /// user -> its keys.
    pub(crate) users: Map<Arc<str>, UserKeys>,
    pub(crate) keys: Vec<Key>,
    /// Freed ids, with the cutoff from which each may be reused.
    pub(crate) freed: VecDeque<(KeyId, i64)>,
    pub(crate) live: usize,
    /// The oldest slot kept, as of the last [`Ledger::forget`].
    pub(crate) cutoff: i64,
    /// Per node, the newest data slot it reported for this service: its
    /// consumption up to there is charged.
    pub last_report: Map<NodeId, i64>,
    /// Per node that reports less often than every slot (an Envoy proxy),
    /// how many slots its newest reported one may lag behind the current
    /// slot between two of its reports.
    pub lags: Map<NodeId, i64>,
    /// What proxies' new buckets were told before their first reports.
    pub(crate) first_shares: FirstShares,
    /// The slot length.
    pub slot: SlotLength,
    /// Resource names, interned: every key of a resource shares one `Arc`.
    pub(crate) names: std::collections::HashSet<Name, foldhash::fast::RandomState>,
    /// Per data slot, the sums of every key, oldest first.
    pub(crate) sums: VecDeque<SlotSums>,
    /// The `u32`s of the last dense column packed, for the next slot's:
    /// at a million keys a column is megabytes, and allocating one afresh
    /// each slot beside the smaller packed ones fragments the heap (40
    /// bytes per entry of resident memory in `ledger-slot`).
    pub(crate) spare_sums: Option<Vec<u32>>,
    /// Per node, the users of its last report and their keys.
    pub(crate) recent: Map<NodeId, NodeUsers>,
    /// A list of `recent` let go, for the next report to fill.
    pub(crate) recent_spare: Option<NodeUsers>,
    /// How many ids have been given to a new key: a list in `recent` made
    /// before the count changed may name keys that are no longer its.
    pub(crate) reused: u64,
    /// Where the arena was cut, for the readers of the quota history.
    pub(crate) cuts: Cuts,
    /// The generation a key pushed at the end of the arena starts at:
    /// above every generation its id had before the arena was cut.
    pub(crate) generation_floor: u32,
    /// The rules that limit the service's keys, new ones included.
    pub(crate) rules: ServiceRules,
    /// Keys limited over a period longer than a second, alone or beside
    /// others: the binding bucket of those of several periods is chosen
    /// again before each assign, and each is given a budget for an
    /// outage (`ledger/bound.rs`). Some may no longer be.
    pub(crate) longer: Vec<KeyId>,
    /// The capacity all users share and its applications, if the
    /// limits declare one.
    pub(crate) hierarchy: Option<Arc<Hierarchy>>,
}

impl ServiceState {
    /// The capacity all users share and its applications, if any.
    pub fn hierarchy(&self) -> Option<&Arc<Hierarchy>> {
        self.hierarchy.as_ref()
    }

    /// What each key consumed in data slot `slot`, as far as reports of
    /// it have come in: a reader by key id (0 for a slot no longer kept).
    pub fn consumption_in(&self, slot: i64) -> impl Fn(KeyId) -> i64 + '_ {
        let column = self.sums.iter().find(|c| c.slot == slot);
        move |id| column.map_or(0, |c| c.get(id, 0))
    }

    /// How many slots `node`'s newest reported slot may lag behind the
    /// one before the current between two of its reports: 0 for a node
    /// that reports every slot.
    pub fn lag(&self, node: NodeId) -> i64 {
        self.lags.get(&node).copied().unwrap_or(0)
    }

    /// Every key, with its id.
    pub fn keys(&self) -> impl Iterator<Item = (KeyId, &Key)> {
        self.keys
            .iter()
            .enumerate()
            .filter(|(_, k)| k.live)
            .map(|(i, k)| (KeyId(i as u32), k))
    }

    /// Every live key's buckets as full at `taken_ms`, refilled since
    /// ([`Key::fill_as_of`]).
    pub(crate) fn fill_as_of(&mut self, taken_ms: i64, now_ms: i64) {
        for key in self.keys.iter_mut().filter(|k| k.live) {
            key.fill_as_of(taken_ms, now_ms);
        }
    }

    /// The keys from id `start` on (of `user` only, if given), by id.
    pub fn keys_from<'a>(
        &'a self,
        start: usize,
        user: Option<&str>,
    ) -> Box<dyn Iterator<Item = (KeyId, &'a Key)> + 'a> {
        let Some(user) = user else {
            let keys = self.keys.iter().enumerate().skip(start);
            return Box::new(
                keys.filter(|(_, k)| k.live)
                    .map(|(i, k)| (KeyId(i as u32), k)),
            );
        };
        let mut ids: Vec<KeyId> = self.users.get(user).map_or_else(Vec::new, |keys| {
            keys.iter()
                .copied()
                .filter(|id| id.index() >= start)
                .collect()
        });
        ids.sort_unstable_by_key(|id| id.index());
        Box::new(ids.into_iter().map(|id| (id, &self.keys[id.index()])))
    }

    /// The key a grant of `slot` names by `id`: `None` when the arena
    /// was cut below `id` since (see [`Cuts`]): that key is forgotten.
    pub fn granted_key(&self, id: KeyId, slot: i64) -> Option<&Key> {
        if self.cuts.stale(slot, id) {
            return None;
        }
        self.keys.get(id.index())
    }

    /// Where the arena was cut, for readers of the quota history.
    pub fn cuts(&self) -> &Cuts {
        &self.cuts
    }

    /// The key of `id`. A freed id still names its former key until it is
    /// reused, so grants of the book always resolve.
    ///
    /// # Panics
    ///
    /// If `id` was never given out by this service.
    pub fn key(&self, id: KeyId) -> &Key {
        &self.keys[id.index()]
    }

    /// How many ids have been given out: the length a per-key table needs.
    pub fn id_bound(&self) -> usize {
        self.keys.len()
    }

    /// How many times an id was given to a new key: a key's names change
    /// only when its id is reused, so anything that copied them is still
    /// right while this stays the same.
    pub fn reused(&self) -> u64 {
        self.reused
    }

    /// How many keys are held.
    pub fn key_count(&self) -> usize {
        self.live
    }

    /// The key of (`user`, `resource`), if held.
    pub fn find(&self, user: &str, resource: &str) -> Option<KeyId> {
        self.key_of(self.users.get(user)?, resource)
    }

    /// Which of a user's `keys` is of `resource`.
    pub(crate) fn key_of(&self, keys: &UserKeys, resource: &str) -> Option<KeyId> {
        keys.iter()
            .copied()
            .find(|id| *self.keys[id.index()].resource == *resource)
    }

    pub(crate) fn key_mut(&mut self, id: KeyId) -> &mut Key {
        &mut self.keys[id.index()]
    }

    /// Whether `ids`, listed for a user in [`NodeUsers`], are still the
    /// user's keys of the resources of `entries`, in order: listed before
    /// any id was reused (checked by the caller), and neither freed since
    /// nor of other resources. Reads the keys, which filing reads next.
    pub(crate) fn still_keys_of(&self, ids: &[KeyId], entries: &[(&str, i64)]) -> bool {
        ids.len() == entries.len()
            && ids.iter().zip(entries).all(|(id, (resource, _))| {
                let key = &self.keys[id.index()];
                key.live && *key.resource == **resource
            })
    }

    /// The index of data slot `slot`'s column of sums, made if new.
    pub(crate) fn sums_column(&mut self, slot: i64) -> usize {
        // Reports are of the newest slot or the one before: search backwards.
        let at = self.sums.iter().rposition(|c| c.slot <= slot);
        match at {
            Some(i) if self.sums[i].slot == slot => i,
            _ => {
                // As dense as the newest column: the same keys mostly report
                // again, and filling a map only to turn it into a vector
                // part way costs more than the filing.
                let dense = self
                    .sums
                    .back()
                    .map_or([false; 2], |c| c.columns.each_ref().map(Column::is_dense));
                let i = at.map_or(0, |i| i + 1);
                let column = SlotSums::new(slot, dense, self.keys.len(), &mut self.spare_sums);
                self.sums.insert(i, column);
                i
            }
        }
    }

    /// The keys, and the column of sums at `column` (from
    /// [`ServiceState::sums_column`]), to update both.
    pub(crate) fn keys_and_sums(&mut self, column: usize) -> (&mut [Key], &mut SlotSums) {
        (&mut self.keys, &mut self.sums[column])
    }

    /// The keys of `user` for each of `entries`' resources, in order: one
    /// lookup of the user for all its entries of a report. A new key is
    /// created while `room` lasts (each takes one); an entry whose key
    /// would be past it is taken out of `entries`, and its resource
    /// returned.
    pub(crate) fn keys_for<'r>(
        &mut self,
        user: &str,
        entries: &mut SmallVec<[(&'r str, i64); 8]>,
        out: &mut SmallVec<[KeyId; 8]>,
        room: &mut usize,
        now_ms: i64,
    ) -> SmallVec<[&'r str; 2]> {
        out.clear();
        if let Some(keys) = self.users.get(user) {
            let found = entries.iter().all(|(r, _)| {
                let id = self.key_of(keys, r);
                out.extend(id);
                id.is_some()
            });
            if found {
                return SmallVec::new();
            }
        }
        // Some key is new: the general path.
        out.clear();
        let mut refused = SmallVec::new();
        entries.retain(|(r, _)| {
            let id = match self.find(user, r) {
                Some(id) => id,
                None if *room > 0 => {
                    *room -= 1;
                    self.find_or_insert(user, r, now_ms)
                }
                None => {
                    refused.push(*r);
                    return false;
                }
            };
            out.push(id);
            true
        });
        refused
    }

    /// The key of (`user`, `resource`), created if new.
    pub(crate) fn find_or_insert(&mut self, user: &str, resource: &str, now_ms: i64) -> KeyId {
        // Look up before inserting: the common case allocates nothing.
        if let Some(id) = self.find(user, resource) {
            return id;
        }
        let resource = match self.names.get(resource) {
            Some(n) => n.clone(),
            None => {
                let n = Name(Arc::new(resource.into()));
                self.names.insert(n.clone());
                n
            }
        };
        let user = match self.users.get_key_value(user) {
            Some((u, _)) => u.clone(),
            None => {
                let u: Arc<str> = user.into();
                self.users.insert(u.clone(), UserKeys::new());
                u
            }
        };
        let id = self.alloc(user.clone(), resource);
        if let Some(keys) = self.users.get_mut(&user) {
            keys.push(id);
        }
        self.limit(id, now_ms);
        id
    }

    /// Limits key `id` as the rules say, from `now_ms`.
    pub(crate) fn limit(&mut self, id: KeyId, now_ms: i64) {
        let key = &self.keys[id.index()];
        if self.rules.is_empty() && !key.limited {
            return;
        }
        let resolved = self.rules.resolve(key.user(), key.resource());
        let longer_before = key.has_longer();
        if self.keys[id.index()].set_allowances(&resolved, now_ms) && !longer_before {
            self.longer.push(id);
        }
    }

    /// Limits every key as the rules say, from `now_ms`.
    pub(crate) fn limit_all(&mut self, now_ms: i64) {
        for i in 0..self.keys.len() {
            if self.keys[i].live {
                self.limit(KeyId(i as u32), now_ms);
            }
        }
        self.longer.sort_unstable_by_key(|id| id.index());
        self.longer.dedup();
    }

    /// Makes each key's bucket with the least room its own, before an
    /// assign reads them; forgets the keys no longer of a longer period.
    pub(crate) fn bind(&mut self, now_ms: i64) {
        let keys = &mut self.keys;
        self.longer.retain(|id| {
            let key = &mut keys[id.index()];
            key.bind(now_ms);
            key.live && key.has_longer()
        });
    }

    pub(crate) fn alloc(&mut self, user: Arc<str>, resource: Name) -> KeyId {
        self.live += 1;
        if let Some(&(id, from)) = self.freed.front()
            && from <= self.cutoff
        {
            self.freed.pop_front();
            self.reused += 1;
            let key = self.key_mut(id);
            let generation = key.generation.wrapping_add(1);
            *key = Key::new(user, resource, generation);
            return id;
        }
        // Each key is over 100 bytes: memory runs out long before 2^32 keys.
        let id = KeyId(u32::try_from(self.keys.len()).expect("fewer than 2^32 keys"));
        self.keys
            .push(Key::new(user, resource, self.generation_floor));
        id
    }

    /// Drops what is older than `cutoff` and the keys left empty; `current`
    /// is the current slot. Returns the arena's new length if it was cut:
    /// the book's grants of ids from there on must go.
    pub(crate) fn forget(&mut self, cutoff: i64, current: i64, now_ms: i64) -> Option<usize> {
        self.cutoff = cutoff;
        self.last_report.retain(|_, s| *s >= cutoff);
        let reporting = &self.last_report;
        self.recent.retain(|n, _| reporting.contains_key(n));
        self.lags.retain(|n, _| reporting.contains_key(n));
        // Counted until the proxy reports its slots: at most a minute on.
        self.first_shares.forget_before(current - 64);
        // A sum a node filed is never of a later slot than that node's
        // entry in the key, so a key freed below (no entry at or after the
        // cutoff) has no sum in a column kept: when its id is reused, no
        // column holds a sum of its former key.
        while self.sums.front().is_some_and(|c| c.slot < cutoff) {
            self.sums.pop_front();
        }
        // Reports file into the data slot before theirs (and a late one
        // into the slot before that): older columns are only read.
        for sums in self
            .sums
            .iter_mut()
            .filter(|c| !c.settled && c.slot < current - 2)
        {
            for c in &mut sums.columns {
                if let Some(v) = c.pack() {
                    self.spare_sums.get_or_insert(v);
                }
            }
            sums.settled = true;
        }
        for (i, key) in self.keys.iter_mut().enumerate() {
            if !key.live {
                continue;
            }
            key.nodes.retain(|n| n.slot >= cutoff);
            // An idle key goes unless a rule of its user's own keeps it,
            // or its buckets still remember something (a debt, a day's
            // quota partly spent): a key of the `*` rule comes back as
            // it went.
            let remembers =
                key.limited && (self.rules.names(&key.user) || !key.buckets_full(now_ms));
            if remembers || !key.nodes.is_empty() {
                continue;
            }
            // Freed: its names stay until the id is reused, so assignments
            // still in the book resolve.
            key.live = false;
            key.limited = false;
            key.periods = None;
            self.live -= 1;
            let id = KeyId(i as u32);
            self.freed.push_back((id, current + REUSE_AFTER));
            if let Some(keys) = self.users.get_mut(&*key.user) {
                keys.retain(|k| *k != id);
                if keys.is_empty() {
                    self.users.remove(&*key.user);
                }
            }
        }
        self.names.retain(|n| Arc::strong_count(&n.0) > 1);
        self.cuts.forget_before(cutoff);
        let cut = self.release(current);
        // The bound keys and budgets are read before the next bind.
        let keys = &self.keys;
        self.longer
            .retain(|id| keys.get(id.index()).is_some_and(|k| k.live));
        cut
    }

    /// Gives back what keys that left took: the arena is cut after its
    /// last live key (the caller drops the book's grants of the keys cut;
    /// see [`Cuts`] for the history's), and the arena and the user map
    /// give back their spare room once they are at most a quarter full. A
    /// churn of users otherwise leaves the arena and the map at their
    /// largest for good. Returns the arena's new length if it was cut.
    fn release(&mut self, current: i64) -> Option<usize> {
        let len = self.keys.iter().rposition(|k| k.live).map_or(0, |i| i + 1);
        let cut = len < self.keys.len();
        if cut {
            let cut = self.keys[len..].iter().map(|k| k.generation).max();
            let floor = cut.map_or(0, |g| g.wrapping_add(1));
            self.generation_floor = self.generation_floor.max(floor);
            self.keys.truncate(len);
            self.freed.retain(|(id, _)| id.index() < len);
            self.cuts.record(current - 1, len);
            // Lists of ids made before the cut may name ids given again.
            self.reused += 1;
        }
        if self.keys.capacity() > 4 * self.keys.len().max(1024) {
            self.keys.shrink_to(2 * self.keys.len());
            self.freed.shrink_to_fit();
        }
        if self.users.capacity() > 4 * self.users.len().max(1024) {
            self.users.shrink_to(2 * self.users.len());
        }
        cut.then_some(len)
    }
}
