//! What the central node knows: buckets, distribution, per-slot sums, quotas.
//!
//! The [`Ledger`] is plain synchronous code driven by the caller's clock: the
//! gRPC server feeds it reports and timer ticks, the simulator feeds it the
//! same from virtual time. Per (service, user, resource) it keeps
//!
//! - the [`Bucket`], when the user has a limit for that resource;
//! - the *distribution*: per node, the latest `{slot, consumption, rejection}`;
//! - the per-slot sums of consumption and rejection (`nr_slot` slots).
//!
//! Slots in the ledger are *data* slots: a report sent at the start of slot
//! `S` carries slot `S - 1`, and that is the slot its amounts are filed under.
//!
//! # Examples
//!
//! ```
//! use throttle_central::ledger::{Ledger, LedgerConfig};
//! use throttle_central::limits::Limit;
//! use throttle_proto::legacy;
//!
//! let mut ledger = Ledger::new(LedgerConfig::default());
//! let limit = Limit { user: "alice".into(), per_second: [("requests".into(), 100.0)].into(), burst_seconds: 10.0 };
//! ledger.apply_limits("front", &[limit], 10_000);
//! let report = legacy::report_from_json(
//!     r#"{"node_id": "n1", "slot_number": 10, "consumption": {"front": {"alice": {"requests": 40}}}, "rejection": {"front": {}}}"#,
//! )?;
//! ledger.ingest(&report, 10_050).unwrap();
//! assert_eq!(ledger.bucket_level("front", "alice", "requests", 10_050), Some(60.0 + 5.0));
//! # Ok::<(), throttle_proto::legacy::LegacyError>(())
//! ```

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use serde_json::{Value, json};
use throttle_proto::slot::SlotLength;
use throttle_proto::wire::{QuotaEncoder, RawAmounts, RawReport, RawUsers};
use throttle_proto::{MAX_NAME_LEN, v1};

use smallvec::SmallVec;

use crate::bucket::Bucket;
use crate::limits::Limit;
use crate::policy::{
    Assignment, Granted, NodeGrants, Policy, Projected, QuotaHistory, encode_grants, same_keys,
    to_user_quotas,
};

/// Hash map with a fast, seeded hasher: names come from the network, so the
/// seed matters, and ingest hashes several names per entry, so speed does too.
pub type Map<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// A node, interned: cheap to copy and compare.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(u32);

impl NodeId {
    /// The index of the node among all nodes seen (dense, from 0).
    pub fn index(self) -> usize {
        self.0 as usize
    }

    pub(crate) fn from_index(i: usize) -> Self {
        Self(i as u32)
    }

    #[cfg(test)]
    pub(crate) fn test(i: u32) -> Self {
        Self(i)
    }
}

/// Settings of a [`Ledger`].
#[derive(Debug, Clone)]
pub struct LedgerConfig {
    /// Slot length shared with the nodes.
    pub slot: SlotLength,
    /// How many slots of history to keep (the original's `nr_slot`).
    pub nr_slot: u32,
    /// Most users one report may carry, over all its services.
    pub max_users_per_report: usize,
}

impl LedgerConfig {
    /// Whether a report may be filed at `now_ms`, on its own: its node id,
    /// how far its slot is from now, its number of users. The ledger's own
    /// check, which the gRPC server also runs before it answers a report
    /// ahead of filing it.
    ///
    /// # Errors
    ///
    /// The [`ReportError`] the ledger would refuse the report with.
    pub fn check<R: ReportSource>(&self, report: &R, now_ms: i64) -> Result<(), ReportError> {
        if !valid_name(report.node_id()) {
            return Err(ReportError::BadNodeId);
        }
        let current = self.slot.slot_at(now_ms);
        if report.slot_number().abs_diff(current) > u64::from(self.nr_slot) {
            return Err(ReportError::SlotOutOfRange {
                slot: report.slot_number(),
                current,
                nr_slot: self.nr_slot,
            });
        }
        let users = report.user_count();
        if users > self.max_users_per_report {
            return Err(ReportError::TooManyUsers {
                users,
                max: self.max_users_per_report,
            });
        }
        Ok(())
    }
}

impl Default for LedgerConfig {
    fn default() -> Self {
        Self {
            slot: SlotLength::SECOND,
            nr_slot: 60,
            max_users_per_report: 1_000_000,
        }
    }
}

/// One node's latest report for one (service, user, resource).
///
/// 24 bytes: a rejection count is a number of requests refused in one
/// slot, and the ledger drops one above `u32::MAX` as absurd
/// ([`DropReason::TooManyRejections`]), so it fits beside the node's id,
/// and a key's three inline entries take 72 bytes instead of 96.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NodeUsage {
    /// The node.
    pub node: NodeId,
    /// How many requests it refused for this resource in that slot.
    pub rejection: u32,
    /// The data slot of that report.
    pub slot: i64,
    /// What it consumed in that slot.
    pub consumption: i64,
}

/// One data slot's sums of a service, per key: a column of consumption
/// and one of rejection.
///
/// A column per slot rather than a list per key: filing a report writes
/// the keys of one slot, which a column holds side by side, and dropping a
/// slot past the retention is dropping one column instead of visiting every
/// key.
///
/// The two kinds have a column each, because they are not alike: most keys
/// consume in every slot, while rejections are rare (a user over its
/// limit). The central keeps `nr_slot` = 60 slots, so a rejection column
/// as dense as consumption's would be 240 bytes per key, nearly all zeros;
/// sparse, it is nothing until someone is refused.
#[derive(Debug)]
struct SlotSums {
    slot: i64,
    /// Consumption (0) and rejection (1).
    columns: [Column; 2],
    /// Packed once no report files into it ([`Column::pack`]): tried once,
    /// not at every retention pass.
    settled: bool,
}

/// One slot's sums of one kind, per key.
///
/// A column starts sparse and becomes a dense vector indexed by key id
/// once it holds sums for a quarter of the keys, where the vector (4 bytes
/// a key) is about as small as the map (some 20 bytes an entry, with its
/// spare room). A dense column holds its sums as `u32`s while they fit
/// and widens to `i64`s at the first that does not: 4 bytes a key instead
/// of 8 for sums of up to 4 G per slot, which covers request counts and
/// most byte counts.
#[derive(Debug)]
enum Column {
    /// By key id.
    Sparse(Map<KeyId, i64>),
    /// Indexed by key id, while every sum fits; zero for a key without sums.
    Narrow(Vec<u32>),
    /// Indexed by key id; zero for a key without sums.
    Dense(Vec<i64>),
    /// A dense column of a slot no report files into any more, kept for
    /// the monitor ([`Column::pack`]).
    Packed(Packed),
}

/// A dense column's sums as LEB128 varints, in key order: most sums of a
/// slot are small (a user's requests in one second take one byte, its
/// bytes two or three), against 4 bytes each as `u32`s, and 57 of the 60
/// slots kept are only ever read again. Every [`Packed::BLOCK`]th sum's
/// offset is kept, so reading one key decodes at most a block.
#[derive(Debug)]
struct Packed {
    bytes: Box<[u8]>,
    /// The offset in `bytes` of the sums of ids `k * BLOCK`.
    blocks: Box<[u32]>,
    len: usize,
}

impl Packed {
    const BLOCK: usize = 32;

    /// Packs `sums` (each at least 0), or `None` past 4 GiB of bytes.
    fn new(sums: impl ExactSizeIterator<Item = i64>) -> Option<Self> {
        let len = sums.len();
        let mut bytes = Vec::with_capacity(len + len / 2);
        let mut blocks = Vec::with_capacity(len.div_ceil(Self::BLOCK));
        for (i, sum) in sums.enumerate() {
            if i % Self::BLOCK == 0 {
                blocks.push(u32::try_from(bytes.len()).ok()?);
            }
            prost::encoding::encode_varint(sum.max(0) as u64, &mut bytes);
        }
        Some(Self {
            bytes: bytes.into_boxed_slice(),
            blocks: blocks.into_boxed_slice(),
            len,
        })
    }

    /// The sums from id `from` on, in order.
    fn from(&self, from: usize) -> impl Iterator<Item = i64> + '_ {
        let block = from / Self::BLOCK;
        let start = self
            .blocks
            .get(block)
            .map_or(self.bytes.len(), |&b| b as usize);
        let mut rest = &self.bytes[start.min(self.bytes.len())..];
        let count = self.len.saturating_sub(block * Self::BLOCK);
        std::iter::from_fn(move || {
            // Written by `new`: a decoding error cannot happen, and would
            // read as the end.
            (!rest.is_empty())
                .then(|| prost::encoding::decode_varint(&mut rest).ok())
                .flatten()
                .map(|v| i64::try_from(v).unwrap_or(i64::MAX))
        })
        .take(count)
        .skip(from % Self::BLOCK)
    }
}

impl Column {
    /// An empty column, dense if `dense` (sized for `id_bound` ids), in
    /// the memory of a dense column packed before, if `spare` holds one.
    fn new(dense: bool, id_bound: usize, spare: &mut Option<Vec<u32>>) -> Self {
        if dense {
            let mut v = spare.take().unwrap_or_default();
            v.clear();
            v.resize(id_bound, 0);
            Column::Narrow(v)
        } else {
            Column::Sparse(Map::default())
        }
    }

    fn is_dense(&self) -> bool {
        !matches!(self, Column::Sparse(_))
    }

    /// Adds `amount` (at least 0) to the sum of `id`, in a service of
    /// `id_bound` ids.
    fn add(&mut self, id: KeyId, amount: i64, id_bound: usize) {
        let len = id_bound.max(id.index() + 1);
        match self {
            Column::Narrow(v) => {
                if v.len() <= id.index() {
                    v.resize(len, 0);
                }
                let sum = &mut v[id.index()];
                match u32::try_from(i64::from(*sum).saturating_add(amount)) {
                    Ok(n) => *sum = n,
                    Err(_) => {
                        *self = Column::Dense(v.iter().map(|&s| i64::from(s)).collect());
                        self.add(id, amount, id_bound);
                    }
                }
            }
            Column::Dense(v) => {
                if v.len() <= id.index() {
                    v.resize(len, 0);
                }
                let sum = &mut v[id.index()];
                *sum = sum.saturating_add(amount);
            }
            Column::Packed(p) => {
                // A report far later than reports come: unpacked again.
                *self = Column::Dense(p.from(0).collect());
                self.add(id, amount, id_bound);
            }
            Column::Sparse(m) if (m.len() + 1) * 4 > id_bound => {
                let mut v = vec![0; len];
                for (k, sum) in m.drain() {
                    if let Some(slot) = v.get_mut(k.index()) {
                        *slot = sum;
                    }
                }
                // Narrow when every sum so far fits.
                *self = match v.iter().map(|&s| u32::try_from(s)).collect() {
                    Ok(narrow) => Column::Narrow(narrow),
                    Err(_) => Column::Dense(v),
                };
                self.add(id, amount, id_bound);
            }
            Column::Sparse(m) => {
                let sum = m.entry(id).or_default();
                *sum = sum.saturating_add(amount);
            }
        }
    }

    fn get(&self, id: KeyId) -> i64 {
        match self {
            Column::Narrow(v) => v.get(id.index()).map(|&s| i64::from(s)),
            Column::Dense(v) => v.get(id.index()).copied(),
            Column::Packed(p) => p.from(id.index()).next(),
            Column::Sparse(m) => m.get(&id).copied(),
        }
        .unwrap_or_default()
    }

    /// Packs a dense column that no report will add to any more
    /// ([`Packed`]) where that is smaller (sums from 2^28 up take 5 bytes
    /// as varints); a sparse one is left as it is. Returns the `u32`s a
    /// narrow column let go, for the next slot's column to fill.
    fn pack(&mut self) -> Option<Vec<u32>> {
        let (packed, size) = match self {
            Column::Narrow(v) => (Packed::new(v.iter().map(|&s| i64::from(s))), v.len() * 4),
            Column::Dense(v) => (Packed::new(v.iter().copied()), v.len() * 8),
            Column::Packed(_) | Column::Sparse(_) => (None, 0),
        };
        let p = packed.filter(|p| p.bytes.len() + p.blocks.len() * 4 < size)?;
        match std::mem::replace(self, Column::Packed(p)) {
            Column::Narrow(v) => Some(v),
            _ => None,
        }
    }

    /// Every key with a sum other than zero, in no particular order.
    fn iter(&self) -> Box<dyn Iterator<Item = (KeyId, i64)> + '_> {
        let nonzero = |(i, s): (usize, i64)| (s != 0).then_some((KeyId(i as u32), s));
        match self {
            Column::Narrow(v) => Box::new(
                v.iter()
                    .enumerate()
                    .filter_map(move |(i, &s)| nonzero((i, i64::from(s)))),
            ),
            Column::Dense(v) => Box::new(
                v.iter()
                    .enumerate()
                    .filter_map(move |(i, &s)| nonzero((i, s))),
            ),
            Column::Packed(p) => Box::new(p.from(0).enumerate().filter_map(nonzero)),
            Column::Sparse(m) => {
                Box::new(m.iter().filter(|(_, s)| **s != 0).map(|(k, s)| (*k, *s)))
            }
        }
    }
}

impl SlotSums {
    /// An empty slot, each column dense where `dense` says (sized for
    /// `id_bound` ids; see [`Column::new`] for `spare`).
    fn new(slot: i64, dense: [bool; 2], id_bound: usize, spare: &mut Option<Vec<u32>>) -> Self {
        Self {
            slot,
            columns: dense.map(|d| Column::new(d, id_bound, spare)),
            settled: false,
        }
    }

    /// Adds `amount` (at least 0) to the consumption (`which` 0) or
    /// rejection (1) of `id`, in a service of `id_bound` ids.
    fn add(&mut self, id: KeyId, which: usize, amount: i64, id_bound: usize) {
        if let Some(column) = self.columns.get_mut(which) {
            column.add(id, amount, id_bound);
        }
    }

    /// The consumption (`which` 0) or rejection (1) of `id`.
    fn get(&self, id: KeyId, which: usize) -> i64 {
        self.columns.get(which).map_or(0, |c| c.get(id))
    }
}

/// The place of one (user, resource) key in its service's arena.
///
/// Ids are dense, so per-key tables (grants, a policy's history) are plain
/// vectors. A freed id is reused only once no assignment in the book can
/// still name it; [`Key::generation`] tells a reused id from its former key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KeyId(u32);

impl KeyId {
    #[cfg(test)]
    pub(crate) fn test(i: u32) -> Self {
        Self(i)
    }

    /// The index in the arena (and in any per-key table).
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// Node entries kept inline in a key: with sticky load balancing a user is
/// on a few nodes, and then reading a key's distribution reads no other
/// allocation.
type NodeList = SmallVec<[NodeUsage; 3]>;

const _: () = assert!(std::mem::size_of::<NodeUsage>() == 24);

/// A resource's name, interned per service: every key of the resource
/// holds the one copy, through a pointer of 8 bytes (an `Arc<str>` is 16),
/// and reads it through a second pointer, to one of a few names that stay
/// in cache.
#[derive(Debug, Clone)]
struct Name(Arc<Box<str>>);

impl std::ops::Deref for Name {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl std::borrow::Borrow<str> for Name {
    fn borrow(&self) -> &str {
        self
    }
}

impl PartialEq for Name {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl Eq for Name {}

impl std::hash::Hash for Name {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        (**self).hash(state);
    }
}

/// Everything the ledger keeps for one (service, user, resource).
///
/// 144 bytes (was 160), a third of them per (user, resource, node) entry
/// where a user is on 3 nodes: the resource's name is a thin pointer
/// (`Name`), and whether the key has a bucket is a flag beside the
/// generation rather than an `Option`'s tag padded to 8 bytes.
#[derive(Debug)]
pub struct Key {
    user: Arc<str>,
    resource: Name,
    nodes: NodeList,
    /// Meaningful while `limited`.
    bucket: Bucket,
    generation: u32,
    live: bool,
    limited: bool,
}

const _: () = assert!(std::mem::size_of::<Key>() == 144);

impl Key {
    fn new(user: Arc<str>, resource: Name, generation: u32) -> Self {
        Self {
            user,
            resource,
            nodes: NodeList::new(),
            bucket: Bucket::new(0.0, 0.0, 0),
            generation,
            live: true,
            limited: false,
        }
    }

    /// The bucket, when the user has a limit on this resource.
    fn bucket_mut(&mut self) -> Option<&mut Bucket> {
        self.limited.then_some(&mut self.bucket)
    }

    /// The user's name.
    pub fn user(&self) -> &str {
        &self.user
    }

    /// The resource's name.
    pub fn resource(&self) -> &str {
        &self.resource
    }

    /// Changes each time the key's id is given to a new key.
    pub fn generation(&self) -> u32 {
        self.generation
    }

    /// The bucket, when the user has a limit on this resource.
    pub fn bucket(&self) -> Option<&Bucket> {
        self.limited.then_some(&self.bucket)
    }

    /// Latest report per node.
    pub fn nodes(&self) -> &[NodeUsage] {
        &self.nodes
    }
}

/// A user's keys. Their resources' names are read from the keys: a name
/// beside each id would make a user's entry in the name index 120 bytes
/// instead of 40, for lookups that filing mostly does without
/// ([`NodeUsers`]).
type UserKeys = SmallVec<[KeyId; 4]>;

/// Slots after it is freed before a key's id may be reused: the book holds
/// assignments up to a policy's lead (at most 2) ahead of the current slot,
/// and those must go before the id can name another key.
const REUSE_AFTER: i64 = 4;

/// All (user, resource) state of one service; what a [`Policy`] reads.
///
/// Keys live in one dense arena, so a policy's pass over every key reads
/// memory in order (an assign at 400,000 keys is bound by memory, not by
/// arithmetic), and grants name a key by a 4-byte id instead of sharing its
/// names.
#[derive(Debug, Default)]
pub struct ServiceState {
    /// user -> its keys.
    users: Map<Arc<str>, UserKeys>,
    keys: Vec<Key>,
    /// Freed ids, with the cutoff from which each may be reused.
    freed: VecDeque<(KeyId, i64)>,
    live: usize,
    /// The oldest slot kept, as of the last [`Ledger::forget`].
    cutoff: i64,
    /// Per node, the newest data slot it reported for this service: its
    /// consumption up to there is charged.
    pub last_report: Map<NodeId, i64>,
    /// The slot length.
    pub slot: SlotLength,
    /// Resource names, interned: every key of a resource shares one `Arc`.
    names: std::collections::HashSet<Name, foldhash::fast::RandomState>,
    /// Per data slot, the sums of every key, oldest first.
    sums: VecDeque<SlotSums>,
    /// The `u32`s of the last dense column packed, for the next slot's:
    /// at a million keys a column is megabytes, and allocating one afresh
    /// each slot beside the smaller packed ones fragments the heap (40
    /// bytes per entry of resident memory in `ledger-slot`).
    spare_sums: Option<Vec<u32>>,
    /// Per node, the users of its last report and their keys.
    recent: Map<NodeId, NodeUsers>,
    /// A list of `recent` let go, for the next report to fill.
    recent_spare: Option<NodeUsers>,
    /// How many ids have been given to a new key: a list in `recent` made
    /// before the count changed may name keys that are no longer its.
    reused: u64,
}

/// The users a node reported last for a service, in its report's order,
/// with their keys.
///
/// A node's next report mostly names the same users in the same order, so
/// filing it walks this list beside the report instead of looking each
/// user up in the service's map: at a million keys that lookup is three
/// cache misses per user (the map's control bytes, its bucket, the name),
/// and this list is read in order.
#[derive(Debug, Default)]
struct NodeUsers {
    /// Per user, where its name ends in `names` and its keys in `ids`: 8
    /// bytes a user, 2 per entry.
    ends: Vec<(u32, u32)>,
    names: Vec<u8>,
    ids: Vec<KeyId>,
    /// [`ServiceState::reused`] when the list was made.
    reused: u64,
}

impl NodeUsers {
    fn clear(&mut self, reused: u64) {
        self.ends.clear();
        self.names.clear();
        self.ids.clear();
        self.reused = reused;
    }

    /// Lists `user` with its keys, unless the list would pass 4 GiB of
    /// names or 2^32 keys (a report cannot: its size is bounded far below),
    /// when the user is left to the service's map.
    fn push(&mut self, user: &str, ids: &[KeyId]) {
        let ends = (
            u32::try_from(self.names.len() + user.len()),
            u32::try_from(self.ids.len() + ids.len()),
        );
        if let (Ok(name_end), Ok(ids_end)) = ends {
            self.names.extend_from_slice(user.as_bytes());
            self.ids.extend_from_slice(ids);
            self.ends.push((name_end, ids_end));
        }
    }

    /// The keys listed for `user`, looking from `*at` on (both lists are in
    /// the order of the names' bytes, as reports are); moves `*at` past it.
    fn find(&self, at: &mut usize, user: &str) -> Option<&[KeyId]> {
        while let Some(&(name_end, ids_end)) = self.ends.get(*at) {
            let (name_start, ids_start) = match at.checked_sub(1) {
                Some(i) => self.ends[i],
                None => (0, 0),
            };
            let name = &self.names[name_start as usize..name_end as usize];
            match name.cmp(user.as_bytes()) {
                std::cmp::Ordering::Less => *at += 1,
                std::cmp::Ordering::Equal => {
                    *at += 1;
                    return Some(&self.ids[ids_start as usize..ids_end as usize]);
                }
                std::cmp::Ordering::Greater => return None,
            }
        }
        None
    }
}

struct Service {
    state: ServiceState,
    policy: Box<dyn Policy>,
    /// slot -> node -> quota, for the slots reports and pushes still read
    /// (the previous one on).
    book: BTreeMap<i64, Assignment>,
    /// The older slots of the retention, compact, for the monitor.
    kept: QuotaHistory,
    /// An assignment the book let go, for the next assign to fill: at
    /// 1,000 nodes x 1,000 users an assignment is 4 M grants, and
    /// allocating them afresh twice a slot was page faults and copies.
    spare: Option<Assignment>,
    /// Per node, its users as last encoded ([`Skeleton`]). Encoding takes
    /// `&self` (answers are rendered from a shared ledger), and the ledger
    /// is used from one thread at a time: a `RefCell`.
    skeletons: RefCell<Map<NodeId, Skeleton>>,
}

/// One node's users of a service as last encoded, with the keys they were
/// encoded from and where each grant's amount is.
///
/// A node's grants name the same keys in the same order from one assign
/// to the next while its users stay, so its next quota's users are this
/// block with other amounts: copied and patched, rather than encoded
/// again, which reads every key's names (a cache miss per grant at a
/// million keys), sorts the grants by user and writes every name.
#[derive(Debug, Default)]
struct Skeleton {
    /// The grants' keys, in the grants' order: one list with the book's
    /// assignments and the [`QuotaHistory`]'s slots of the node while its
    /// keys stay ([`Assignment`]).
    keys: Arc<[KeyId]>,
    /// [`ServiceState::reused`] then: a key's names change only when its
    /// id is reused.
    reused: u64,
    /// The encoded users: a slice of the last message they were encoded
    /// into, which is held anyway while it waits to be sent, and after
    /// the mid-slot assign until the node's next report (the answer
    /// rendered ahead), rather than a copy of its own.
    block: Bytes,
    /// Whether `block` is of a packed table.
    packed: bool,
    /// Per grant, where its amount is in `block` (classic) or among the
    /// table's amounts (packed): see [`QuotaEncoder::user_noting`].
    amounts_at: Vec<u32>,
}

impl Service {
    /// Encodes `grants` of `node` as the users of the (service, slot) `out`
    /// has just begun (`packed` or not): from the node's [`Skeleton`] when
    /// it has the same keys in the same form, else anew, making the
    /// skeleton. Returns whether the node has a
    /// skeleton of these users, whose block the caller then points at the
    /// users in the finished message ([`Ledger::encode_quota_for`]).
    fn encode_users(
        &self,
        out: &mut QuotaEncoder,
        node: NodeId,
        grants: NodeGrants<'_>,
        packed: bool,
        order: &mut Vec<(usize, u32)>,
    ) -> bool {
        let mut skeletons = self.skeletons.borrow_mut();
        let skeleton = skeletons.entry(node).or_default();
        if skeleton.reused == self.state.reused
            && skeleton.packed == packed
            && same_keys(&skeleton.keys, grants)
        {
            let amounts = skeleton.amounts_at.iter().zip(grants.iter());
            if out.append_users(
                &skeleton.block,
                amounts.map(|(&at, g)| (at as usize, g.amount())),
            ) {
                return true;
            }
        }
        encode_grants(out, &self.state, grants, order, &mut skeleton.amounts_at);
        skeleton.block = Bytes::new();
        skeleton.keys = Arc::default();
        skeleton.packed = packed;
        if u32::try_from(out.table_len()).is_err() {
            // Offsets past 4 GiB were not noted: copy nothing from it.
            return false;
        }
        skeleton.keys = grants.shared_keys().unwrap_or_else(|| grants.keys().into());
        skeleton.reused = self.state.reused;
        true
    }

    /// Runs the policy for `slot` and keeps the result, replacing any
    /// earlier assignment of that slot.
    fn assign(&mut self, slot: i64, now_ms: i64) {
        let mut out = self.spare.take().unwrap_or_default();
        out.clear_like(self.book.values().next_back());
        let granted = Granted::new(&self.book, &self.kept);
        let mut assignment = self.policy.assign(&self.state, granted, slot, now_ms, out);
        assignment.share_keys();
        if let Some(replaced) = self.book.insert(slot, assignment) {
            self.keep_spare(replaced);
        }
    }

    /// Keeps `assignment` for the next assign to fill, cleared (its key
    /// lists would otherwise outlive the keys they name), unless one is
    /// kept already.
    fn keep_spare(&mut self, mut assignment: Assignment) {
        if self.spare.is_none() {
            assignment.clear();
            self.spare = Some(assignment);
        }
    }

    /// Moves the assignments of slots before `open_from` to the compact
    /// [`QuotaHistory`], keeping one for the next assign to fill, and
    /// drops everything before `cutoff`.
    fn forget_book(&mut self, cutoff: i64, open_from: i64) {
        let open = self.book.split_off(&open_from);
        let closed = std::mem::replace(&mut self.book, open);
        for (slot, assignment) in closed {
            if slot >= cutoff {
                self.kept.keep(slot, &assignment);
            }
            self.keep_spare(assignment);
        }
        self.kept.forget_before(cutoff);
    }
}

impl fmt::Debug for Service {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Service")
            .field("keys", &self.state.key_count())
            .field("policy", &self.policy.name())
            .field("book_slots", &self.book.len())
            .field("kept_slots", &self.kept.slots().count())
            .finish()
    }
}

/// A report the ledger can file: a decoded [`v1::Report`], or a
/// [`RawReport`] whose names and amounts are read in place.
pub trait ReportSource {
    /// One usage's users, each with its amounts.
    type Users<'a>: Iterator<Item = (&'a str, Self::Amounts<'a>)>
    where
        Self: 'a;
    /// One user's amount per resource.
    type Amounts<'a>: Iterator<Item = (&'a str, i64)>
    where
        Self: 'a;

    /// The reporting node.
    fn node_id(&self) -> &str;
    /// The slot the report was sent in (its data is of the slot before).
    fn slot_number(&self) -> i64;
    /// Users over every usage.
    fn user_count(&self) -> usize;
    /// Every (service, rejection or consumption, users).
    fn usages(&self) -> impl Iterator<Item = (&str, bool, Self::Users<'_>)>;
}

type ReportUsers<'a> = std::iter::Map<
    std::collections::btree_map::Iter<'a, String, v1::Amounts>,
    fn((&'a String, &'a v1::Amounts)) -> (&'a str, ReportAmounts<'a>),
>;
type ReportAmounts<'a> = std::iter::Map<
    std::collections::btree_map::Iter<'a, String, i64>,
    fn((&'a String, &'a i64)) -> (&'a str, i64),
>;

fn report_users(usage: &v1::Usage) -> ReportUsers<'_> {
    usage.users.iter().map(|(user, amounts)| {
        let amounts: ReportAmounts<'_> = amounts.resources.iter().map(|(r, a)| (r.as_str(), *a));
        (user.as_str(), amounts)
    })
}

impl ReportSource for v1::Report {
    type Users<'a> = ReportUsers<'a>;
    type Amounts<'a> = ReportAmounts<'a>;

    fn node_id(&self) -> &str {
        &self.node_id
    }

    fn slot_number(&self) -> i64 {
        self.slot_number
    }

    fn user_count(&self) -> usize {
        let usages = self.consumption.values().chain(self.rejection.values());
        usages.map(|u| u.users.len()).sum()
    }

    fn usages(&self) -> impl Iterator<Item = (&str, bool, ReportUsers<'_>)> {
        let consumption = self
            .consumption
            .iter()
            .map(|(s, u)| (s.as_str(), false, report_users(u)));
        let rejection = self
            .rejection
            .iter()
            .map(|(s, u)| (s.as_str(), true, report_users(u)));
        consumption.chain(rejection)
    }
}

impl ReportSource for RawReport {
    type Users<'a> = RawUsers<'a>;
    type Amounts<'a> = RawAmounts<'a>;

    fn node_id(&self) -> &str {
        RawReport::node_id(self)
    }

    fn slot_number(&self) -> i64 {
        RawReport::slot_number(self)
    }

    fn user_count(&self) -> usize {
        RawReport::user_count(self)
    }

    fn usages(&self) -> impl Iterator<Item = (&str, bool, RawUsers<'_>)> {
        RawReport::usages(self)
    }
}

/// A report filed under the name of the stream it came on, whatever node id
/// it carries (the server checks that the two agree, or that it has none).
#[derive(Debug)]
pub struct FromNode<'a, R>(pub &'a str, pub &'a R);

impl<R: ReportSource> ReportSource for FromNode<'_, R> {
    type Users<'a>
        = R::Users<'a>
    where
        Self: 'a;
    type Amounts<'a>
        = R::Amounts<'a>
    where
        Self: 'a;

    fn node_id(&self) -> &str {
        self.0
    }

    fn slot_number(&self) -> i64 {
        self.1.slot_number()
    }

    fn user_count(&self) -> usize {
        self.1.user_count()
    }

    fn usages(&self) -> impl Iterator<Item = (&str, bool, R::Users<'_>)> {
        self.1.usages()
    }
}

/// Why a report was refused as a whole.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReportError {
    /// `node_id` is empty or too long.
    #[error("node_id must be 1 to {MAX_NAME_LEN} bytes")]
    BadNodeId,
    /// The slot is further than `nr_slot` slots from the central's clock.
    #[error("slot {slot} is more than {nr_slot} slots away from the current slot {current}")]
    SlotOutOfRange {
        /// The report's slot.
        slot: i64,
        /// The central's current slot.
        current: i64,
        /// The retention.
        nr_slot: u32,
    },
    /// The report names more users than allowed.
    #[error("report carries {users} users, more than the limit of {max}")]
    TooManyUsers {
        /// Users in the report.
        users: usize,
        /// The configured maximum.
        max: usize,
    },
    /// A packed usage whose bits and amounts do not match.
    #[error("packed usage: {0}")]
    Packed(#[from] throttle_proto::PackedError),
}

/// Why one entry of a report was left out (the rest is kept).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DropReason {
    /// An empty or overlong service, user or resource name.
    BadName,
    /// An amount below zero.
    NegativeAmount,
    /// A rejection count above `u32::MAX` (4.3 G requests refused in one
    /// slot, by one node, for one user): no node refuses that many.
    TooManyRejections,
}

impl DropReason {
    /// Label for logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::BadName => "bad_name",
            Self::NegativeAmount => "negative_amount",
            Self::TooManyRejections => "too_many_rejections",
        }
    }
}

/// What [`Ledger::ingest`] did with a report.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Ingested {
    /// The same node already reported this slot; nothing was charged again.
    pub duplicate: bool,
    /// Entries applied.
    pub entries: usize,
    /// Entries left out, with why.
    pub dropped: Vec<(DropReason, String)>,
}

/// An inclusive slot range for monitor queries; open ends are unbounded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SlotRange {
    /// First slot, inclusive.
    pub start: Option<i64>,
    /// Last slot, inclusive.
    pub end: Option<i64>,
}

impl SlotRange {
    fn contains(&self, slot: i64) -> bool {
        self.start.is_none_or(|s| slot >= s) && self.end.is_none_or(|e| slot <= e)
    }
}

/// Builds the policy of a service when it first appears.
pub type PolicyFactory = Box<dyn Fn(&str) -> Box<dyn Policy> + Send>;

/// The central node's state; see the [module docs](self).
pub struct Ledger {
    config: LedgerConfig,
    node_names: Vec<Box<str>>,
    node_ids: Map<Box<str>, NodeId>,
    /// By node index: whether its quotas are written packed
    /// ([`Ledger::set_packed`]).
    packed: Vec<bool>,
    services: BTreeMap<Box<str>, Service>,
    /// data slot -> nodes that reported it.
    reported: BTreeMap<i64, BTreeSet<NodeId>>,
    policy_factory: PolicyFactory,
}

impl fmt::Debug for Ledger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ledger")
            .field("config", &self.config)
            .field("nodes", &self.node_names.len())
            .field("services", &self.services)
            .finish()
    }
}

fn valid_name(name: &str) -> bool {
    !name.is_empty() && name.len() <= MAX_NAME_LEN
}

impl Ledger {
    /// An empty ledger whose services use the default [`Projected`] policy.
    pub fn new(config: LedgerConfig) -> Self {
        Self::with_policies(config, Box::new(|_| Box::new(Projected::new())))
    }

    /// An empty ledger whose services get their policy from `factory`.
    pub fn with_policies(config: LedgerConfig, factory: PolicyFactory) -> Self {
        Self {
            config,
            node_names: Vec::new(),
            node_ids: Map::default(),
            packed: Vec::new(),
            services: BTreeMap::new(),
            reported: BTreeMap::new(),
            policy_factory: factory,
        }
    }

    /// The settings.
    pub fn config(&self) -> &LedgerConfig {
        &self.config
    }

    /// The interned id of `node`, interning it if new.
    pub fn node_id(&mut self, node: &str) -> NodeId {
        if let Some(&id) = self.node_ids.get(node) {
            return id;
        }
        let id = NodeId(u32::try_from(self.node_names.len()).unwrap_or(u32::MAX));
        self.node_names.push(node.into());
        self.node_ids.insert(node.into(), id);
        id
    }

    /// The id of `node`, if interned.
    pub fn find_node(&self, node: &str) -> Option<NodeId> {
        self.node_ids.get(node).copied()
    }

    /// The name of an interned node.
    pub fn node_name(&self, id: NodeId) -> &str {
        self.node_names.get(id.0 as usize).map_or("", |s| s)
    }

    /// Whether [`Ledger::encode_quota_for`] writes `node`'s quotas as
    /// [`v1::PackedQuota`]s (the node accepts them: [`PACKED_QUOTAS`]) or
    /// in the original `services` map (the default).
    ///
    /// [`PACKED_QUOTAS`]: throttle_proto::PACKED_QUOTAS
    pub fn set_packed(&mut self, node: NodeId, packed: bool) {
        let i = node.index();
        if i >= self.packed.len() {
            if !packed {
                return;
            }
            self.packed.resize(i + 1, false);
        }
        self.packed[i] = packed;
    }

    /// See [`Ledger::set_packed`].
    pub fn is_packed(&self, node: NodeId) -> bool {
        self.packed.get(node.index()).copied().unwrap_or(false)
    }

    fn service_mut(&mut self, name: &str) -> &mut Service {
        if !self.services.contains_key(name) {
            let policy = (self.policy_factory)(name);
            self.services.insert(
                name.into(),
                Service {
                    state: ServiceState {
                        slot: self.config.slot,
                        ..ServiceState::default()
                    },
                    policy,
                    book: BTreeMap::new(),
                    kept: QuotaHistory::default(),
                    spare: None,
                    skeletons: RefCell::default(),
                },
            );
        }
        self.services.get_mut(name).expect("inserted above")
    }

    /// Names of the services seen so far.
    pub fn services(&self) -> impl Iterator<Item = &str> {
        self.services.keys().map(|s| &**s)
    }

    /// Makes `limits` the limits of `service`: buckets are created, changed
    /// (a new rate applies from `now_ms`), or dropped for users and resources
    /// no longer listed.
    pub fn apply_limits(&mut self, service: &str, limits: &[Limit], now_ms: i64) {
        let by_user: Map<&str, &Limit> = limits.iter().map(|l| (l.user.as_str(), l)).collect();
        let svc = self.service_mut(service);
        for key in svc.state.keys.iter_mut().filter(|k| k.live) {
            let limited = by_user
                .get(&*key.user)
                .is_some_and(|l| l.per_second.contains_key(&*key.resource));
            key.limited &= limited;
        }
        for limit in limits {
            for (resource, &rate) in &limit.per_second {
                let id = svc.state.find_or_insert(&limit.user, resource);
                let key = svc.state.key_mut(id);
                match key.bucket_mut() {
                    Some(b) if b.rate() == rate && b.capacity() == rate * limit.burst_seconds => {}
                    Some(b) => b.set_limit(rate, limit.burst_seconds, now_ms),
                    None => {
                        key.bucket = Bucket::new(rate, limit.burst_seconds, now_ms);
                        key.limited = true;
                    }
                }
            }
        }
    }

    /// Records that `node` opened a stream for `services` at `now_ms`: it
    /// counts as active from now on, with nothing unreported before the
    /// current slot (a node that reported before keeps its history).
    pub fn connect<'a>(
        &mut self,
        node: NodeId,
        services: impl IntoIterator<Item = &'a str>,
        now_ms: i64,
    ) {
        let before = self.config.slot.slot_at(now_ms) - 1;
        for name in services {
            if valid_name(name) {
                self.service_mut(name)
                    .state
                    .last_report
                    .entry(node)
                    .or_insert(before);
            }
        }
    }

    /// Files a report: charges the buckets, updates the distribution and the
    /// sums, and lets each service's policy see it. Its
    /// [`packed`](v1::Report::packed) usages are read as the map entries they
    /// stand for ([`v1::Report::unpack`]).
    ///
    /// # Errors
    ///
    /// [`ReportError`] when the report as a whole is unusable; bad entries
    /// are only left out and listed in [`Ingested::dropped`].
    pub fn ingest(&mut self, report: &v1::Report, now_ms: i64) -> Result<Ingested, ReportError> {
        if report.packed.is_empty() {
            return self.ingest_from(report, now_ms);
        }
        let mut unpacked = report.clone();
        unpacked.unpack()?;
        self.ingest_from(&unpacked, now_ms)
    }

    /// [`Ledger::ingest`] for any [`ReportSource`], such as a
    /// [`RawReport`] read in place.
    ///
    /// # Errors
    ///
    /// As [`Ledger::ingest`].
    pub fn ingest_from<R: ReportSource>(
        &mut self,
        report: &R,
        now_ms: i64,
    ) -> Result<Ingested, ReportError> {
        self.config.check(report, now_ms)?;
        let node = self.node_id(report.node_id());
        let slot = report.slot_number() - 1;
        if !self.reported.entry(slot).or_default().insert(node) {
            return Ok(Ingested {
                duplicate: true,
                ..Ingested::default()
            });
        }
        let mut out = Ingested::default();
        // Services filed (or refused), each once, in the order first seen.
        let mut seen: Vec<(&str, bool)> = Vec::new();
        for (name, is_rejection, users) in report.usages() {
            let valid = valid_name(name);
            if !seen.iter().any(|(s, _)| *s == name) {
                seen.push((name, valid));
                if !valid {
                    out.dropped.push((DropReason::BadName, name.to_owned()));
                }
            }
            if !valid {
                continue;
            }
            let svc = self.service_mut(name);
            let column_at = svc.state.sums_column(slot);
            let mut entries: SmallVec<[(&str, i64); 8]> = SmallVec::new();
            let mut ids: SmallVec<[KeyId; 8]> = SmallVec::new();
            // Consumption only: a node's rejections are few, and change.
            let (last, mut next) = if is_rejection {
                (None, None)
            } else {
                let reused = svc.state.reused;
                let last = svc
                    .state
                    .recent
                    .remove(&node)
                    .filter(|l| l.reused == reused);
                let mut next = svc.state.recent_spare.take().unwrap_or_default();
                next.clear(reused);
                (last, Some(next))
            };
            let mut at = 0;
            for (user, amounts) in users {
                entries.clear();
                for (resource, amount) in amounts {
                    if !valid_name(user) || !valid_name(resource) {
                        out.dropped
                            .push((DropReason::BadName, format!("{name}/{user}/{resource}")));
                    } else if amount < 0 {
                        out.dropped.push((
                            DropReason::NegativeAmount,
                            format!("{name}/{user}/{resource}"),
                        ));
                    } else if is_rejection && amount > i64::from(u32::MAX) {
                        out.dropped.push((
                            DropReason::TooManyRejections,
                            format!("{name}/{user}/{resource}"),
                        ));
                    } else {
                        entries.push((resource, amount));
                    }
                }
                let listed = last.as_ref().and_then(|l| l.find(&mut at, user));
                match listed.filter(|listed| svc.state.still_keys_of(listed, &entries)) {
                    Some(listed) => {
                        ids.clear();
                        ids.extend_from_slice(listed);
                    }
                    None => {
                        svc.state
                            .keys_for(user, entries.iter().map(|(r, _)| *r), &mut ids);
                    }
                }
                if let Some(next) = &mut next {
                    next.push(user, &ids);
                }
                let (keys, column) = svc.state.keys_and_sums(column_at);
                let id_bound = keys.len();
                for (&id, &(_, amount)) in ids.iter().zip(&entries) {
                    keys[id.index()].file(node, slot, amount, is_rejection, now_ms);
                    column.add(id, usize::from(is_rejection), amount, id_bound);
                    out.entries += 1;
                }
            }
            if let Some(next) = next {
                svc.state.recent.insert(node, next);
                svc.state.recent_spare = last;
            }
        }
        for (name, _) in seen.into_iter().filter(|(_, valid)| *valid) {
            let svc = self.service_mut(name);
            let last = svc.state.last_report.entry(node).or_insert(slot);
            *last = (*last).max(slot);
            svc.policy.consume(&svc.state, node, slot, now_ms);
        }
        Ok(out)
    }

    /// Runs every service's policy, normally at mid-slot, to compute the
    /// quotas of the slot [`Policy::lead`] slots ahead; returns that slot per
    /// service.
    pub fn assign(&mut self, now_ms: i64) -> BTreeMap<String, i64> {
        let current = self.config.slot.slot_at(now_ms);
        let mut assigned = BTreeMap::new();
        for (name, svc) in &mut self.services {
            let slot = current + svc.policy.lead();
            svc.assign(slot, now_ms);
            assigned.insert(name.to_string(), slot);
        }
        assigned
    }

    /// Re-assigns the current slot of `service` now, if its policy
    /// re-assigns as reports arrive and the service holds at most
    /// `max_keys` keys (a new node then gets a quota at once instead of
    /// failing open until the next assign). Returns whether it did.
    pub fn reassign_for_new_node(&mut self, service: &str, max_keys: usize, now_ms: i64) -> bool {
        let Some(svc) = self.services.get(service) else {
            return false;
        };
        let keys = svc.state.key_count();
        svc.policy.reassign_when_reported()
            && keys <= max_keys
            && self.reassign(service, self.config.slot.slot_at(now_ms), now_ms)
    }

    /// Whether `service`'s policy re-assigns as reports arrive and every
    /// node active in it has reported data slot `slot - 1`.
    pub fn all_reported(&self, service: &str, slot: i64) -> bool {
        let Some(svc) = self.services.get(service) else {
            return false;
        };
        let recent = slot - 1 - 5;
        svc.policy.reassign_when_reported()
            && svc
                .state
                .last_report
                .values()
                .filter(|s| **s > recent)
                .all(|s| *s >= slot - 1)
    }

    /// Re-assigns `slot` of `service` now; false for an unknown service.
    pub fn reassign(&mut self, service: &str, slot: i64, now_ms: i64) -> bool {
        let Some(svc) = self.services.get_mut(service) else {
            return false;
        };
        svc.assign(slot, now_ms);
        true
    }

    /// The grants of `node` in (`service`, `slot`), with the service's keys.
    fn grants(
        &self,
        node: NodeId,
        service: &str,
        slot: i64,
    ) -> Option<(&ServiceState, NodeGrants<'_>)> {
        let svc = self.services.get(service)?;
        let grants = svc.policy.grants_for(&svc.book, node, slot)?;
        Some((&svc.state, grants))
    }

    /// Whether `node`'s grants of `service` for `slot` are the very ones
    /// of `other` (a lead-1 policy answers for a slot not yet assigned
    /// with the grants of the slot before): false where either has none.
    pub fn same_grants(&self, node: NodeId, service: &str, slot: i64, other: i64) -> bool {
        let Some(svc) = self.services.get(service) else {
            return false;
        };
        let grants = |slot| svc.policy.grants_for(&svc.book, node, slot);
        match (grants(slot), grants(other)) {
            (Some(a), Some(b)) => a.is(&b),
            _ => false,
        }
    }

    /// The quota of `node` for each `(service, slot)`: `{slot: {}}` for a
    /// service with nothing for this node.
    pub fn quota_for<'a>(
        &self,
        node: NodeId,
        services: impl IntoIterator<Item = (&'a str, i64)>,
    ) -> v1::Quota {
        let mut quota = v1::Quota::default();
        for (name, slot) in services {
            let users = self
                .grants(node, name, slot)
                .map(|(state, grants)| to_user_quotas(state, grants));
            let slots = [(slot, users.unwrap_or_default())].into();
            quota
                .services
                .insert(name.to_owned(), v1::ServiceQuota { slots });
        }
        quota
    }

    /// The same quota as [`Ledger::quota_for`], answering the report of
    /// `report_slot` if given, as the encoded [`v1::CentralMessage`]: written
    /// straight from the grants, with no message built, and packed for a
    /// node that accepts it ([`Ledger::set_packed`]).
    pub fn encode_quota_for<'a>(
        &self,
        node: NodeId,
        services: impl IntoIterator<Item = (&'a str, i64)>,
        refs: &[crate::assigner::QuotaRef<'_>],
        report_slot: Option<i64>,
    ) -> Bytes {
        let mut out = QuotaEncoder::new();
        let mut order = Vec::new();
        // Per service begun, in order: the service whose skeleton of this
        // node takes its users block from the message.
        let mut skeletons: SmallVec<[Option<&Service>; 4]> = SmallVec::new();
        let packed = self.is_packed(node);
        for (name, slot) in services {
            if packed {
                out.begin_packed(name, slot);
            } else {
                out.begin(name, slot);
            }
            let svc = self.services.get(name);
            let grants = svc.and_then(|svc| svc.policy.grants_for(&svc.book, node, slot));
            let kept = match (svc, grants) {
                (Some(svc), Some(grants)) => {
                    svc.encode_users(&mut out, node, grants, packed, &mut order)
                }
                _ => false,
            };
            skeletons.push(svc.filter(|_| kept));
        }
        for &(service, slot, from) in refs {
            out.refer(service, slot, from);
        }
        let (message, blocks) = out.finish_with_users(report_slot);
        for (svc, block) in skeletons.into_iter().zip(blocks) {
            if let Some(svc) = svc
                && let Some(skeleton) = svc.skeletons.borrow_mut().get_mut(&node)
            {
                skeleton.block = message.slice(block);
            }
        }
        message
    }

    /// Forgets everything older than `nr_slot` slots before `now_ms`.
    pub fn forget(&mut self, now_ms: i64) {
        let current = self.config.slot.slot_at(now_ms);
        let cutoff = current - i64::from(self.config.nr_slot);
        self.reported = self.reported.split_off(&cutoff);
        for svc in self.services.values_mut() {
            // Reports are answered, and pushes sent, for the current slot
            // and the next (for a lead-1 policy, the current one standing
            // in until the next is assigned): older slots are only read by
            // the monitor, and a report older than the previous slot is
            // answered for a slot already past, which its node never reads.
            svc.forget_book(cutoff, current);
            svc.policy.forget_before(cutoff);
            svc.state
                .forget(cutoff, cutoff + i64::from(self.config.nr_slot));
            // A node that no longer reports gets no grants to encode.
            let reporting = &svc.state.last_report;
            svc.skeletons
                .get_mut()
                .retain(|n, _| reporting.contains_key(n));
        }
    }

    /// Level of one bucket at `now_ms`, if it exists.
    pub fn bucket_level(
        &mut self,
        service: &str,
        user: &str,
        resource: &str,
        now_ms: i64,
    ) -> Option<f64> {
        let state = &mut self.services.get_mut(service)?.state;
        let id = state.find(user, resource)?;
        state.key_mut(id).bucket_mut().map(|b| b.level(now_ms))
    }

    /// Sum of consumption (or rejection) of one key in data slot `slot`.
    pub fn slot_sum(
        &self,
        service: &str,
        user: &str,
        resource: &str,
        slot: i64,
        rejection: bool,
    ) -> i64 {
        let Some(state) = self.services.get(service).map(|s| &s.state) else {
            return 0;
        };
        let Some(id) = state.find(user, resource) else {
            return 0;
        };
        state
            .sums
            .iter()
            .find(|c| c.slot == slot)
            .map_or(0, |c| c.get(id, usize::from(rejection)))
    }

    /// Number of (service, user, resource) keys held.
    pub fn key_count(&self) -> usize {
        self.services.values().map(|s| s.state.key_count()).sum()
    }

    /// Monitor: data slot -> nodes that reported it.
    pub fn monitor_reported(&self, range: SlotRange) -> Value {
        let map: BTreeMap<String, Vec<&str>> = self
            .reported
            .iter()
            .filter(|(slot, _)| range.contains(**slot))
            .map(|(slot, nodes)| {
                (
                    slot.to_string(),
                    nodes.iter().map(|n| self.node_name(*n)).collect(),
                )
            })
            .collect();
        json!(map)
    }

    /// Monitor: service -> slot -> user -> resource -> summed consumption
    /// (or rejection).
    pub fn monitor_sums(&self, range: SlotRange, rejection: bool) -> Value {
        type Users<'a> = BTreeMap<&'a str, BTreeMap<&'a str, i64>>;
        let mut out: BTreeMap<&str, BTreeMap<String, Users<'_>>> = BTreeMap::new();
        for (service, svc) in &self.services {
            let slots = out.entry(service).or_default();
            for column in svc.state.sums.iter().filter(|c| range.contains(c.slot)) {
                for (id, amount) in column.columns[usize::from(rejection)].iter() {
                    let key = svc.state.key(id);
                    *slots
                        .entry(column.slot.to_string())
                        .or_default()
                        .entry(key.user())
                        .or_default()
                        .entry(key.resource())
                        .or_default() += amount;
                }
            }
        }
        json!(out)
    }

    /// Monitor: service -> user -> resource -> node -> latest entry, and the
    /// bucket level.
    pub fn monitor_distribution(&mut self, range: SlotRange, now_ms: i64) -> Value {
        let mut out = serde_json::Map::new();
        for (service, svc) in &mut self.services {
            let mut users: BTreeMap<&str, serde_json::Map<String, Value>> = BTreeMap::new();
            for key in svc.state.keys.iter_mut().filter(|k| k.live) {
                let nodes: serde_json::Map<String, Value> = key
                    .nodes
                    .iter()
                    .filter(|n| range.contains(n.slot))
                    .map(|n| {
                        let name = self.node_names.get(n.node.0 as usize).map_or("", |s| s);
                        let entry =
                            json!({"slot": n.slot, "consumption": n.consumption, "rejection": n.rejection});
                        (name.to_owned(), entry)
                    })
                    .collect();
                let bucket = key.bucket_mut().map(|b| {
                    json!({"level": b.level(now_ms), "rate": b.rate(), "capacity": b.capacity()})
                });
                users.entry(&key.user).or_default().insert(
                    key.resource.to_string(),
                    json!({"nodes": nodes, "bucket": bucket}),
                );
            }
            out.insert(service.to_string(), json!(users));
        }
        Value::Object(out)
    }

    /// One slot of the monitor's quotas: node -> user -> resource -> quota.
    fn quota_json<'a>(
        &self,
        state: &ServiceState,
        grants: impl Iterator<Item = (NodeId, NodeGrants<'a>)>,
    ) -> Value {
        let mut nodes: BTreeMap<&str, BTreeMap<&str, BTreeMap<&str, f64>>> = BTreeMap::new();
        for (n, grants) in grants {
            let users = nodes.entry(self.node_name(n)).or_default();
            for g in grants.iter() {
                let key = state.key(g.key);
                users
                    .entry(key.user())
                    .or_default()
                    .insert(key.resource(), g.amount());
            }
        }
        json!(nodes)
    }

    /// Monitor: service -> slot -> node -> user -> resource -> quota.
    pub fn monitor_quota(&self, range: SlotRange) -> Value {
        let mut out = serde_json::Map::new();
        for (service, svc) in &self.services {
            let mut slots = serde_json::Map::new();
            svc.kept.read(range.start, |slot, quotas| {
                if range.contains(slot) {
                    slots.insert(slot.to_string(), self.quota_json(&svc.state, quotas.iter()));
                }
            });
            for (slot, assignment) in svc.book.iter().filter(|(s, _)| range.contains(**s)) {
                slots.insert(
                    slot.to_string(),
                    self.quota_json(&svc.state, assignment.iter()),
                );
            }
            out.insert(service.to_string(), Value::Object(slots));
        }
        Value::Object(out)
    }
}

impl ServiceState {
    /// Every key, with its id.
    pub fn keys(&self) -> impl Iterator<Item = (KeyId, &Key)> {
        self.keys
            .iter()
            .enumerate()
            .filter(|(_, k)| k.live)
            .map(|(i, k)| (KeyId(i as u32), k))
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

    /// How many keys are held.
    pub fn key_count(&self) -> usize {
        self.live
    }

    /// The key of (`user`, `resource`), if held.
    pub fn find(&self, user: &str, resource: &str) -> Option<KeyId> {
        self.key_of(self.users.get(user)?, resource)
    }

    /// Which of a user's `keys` is of `resource`.
    fn key_of(&self, keys: &UserKeys, resource: &str) -> Option<KeyId> {
        keys.iter()
            .copied()
            .find(|id| *self.keys[id.index()].resource == *resource)
    }

    fn key_mut(&mut self, id: KeyId) -> &mut Key {
        &mut self.keys[id.index()]
    }

    /// Whether `ids`, listed for a user in [`NodeUsers`], are still the
    /// user's keys of the resources of `entries`, in order: listed before
    /// any id was reused (checked by the caller), and neither freed since
    /// nor of other resources. Reads the keys, which filing reads next.
    fn still_keys_of(&self, ids: &[KeyId], entries: &[(&str, i64)]) -> bool {
        ids.len() == entries.len()
            && ids.iter().zip(entries).all(|(id, (resource, _))| {
                let key = &self.keys[id.index()];
                key.live && *key.resource == **resource
            })
    }

    /// The index of data slot `slot`'s column of sums, made if new.
    fn sums_column(&mut self, slot: i64) -> usize {
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
    fn keys_and_sums(&mut self, column: usize) -> (&mut [Key], &mut SlotSums) {
        (&mut self.keys, &mut self.sums[column])
    }

    /// The keys of `user` for each of `resources` (created where new), in
    /// order: one lookup of the user for all its entries of a report.
    fn keys_for<'r>(
        &mut self,
        user: &str,
        resources: impl Iterator<Item = &'r str> + Clone,
        out: &mut SmallVec<[KeyId; 8]>,
    ) {
        out.clear();
        if let Some(keys) = self.users.get(user) {
            let found = resources.clone().all(|r| {
                let id = self.key_of(keys, r);
                out.extend(id);
                id.is_some()
            });
            if found {
                return;
            }
        }
        // Some key is new: the general path.
        out.clear();
        for r in resources {
            let id = self.find_or_insert(user, r);
            out.push(id);
        }
    }

    /// The key of (`user`, `resource`), created if new.
    fn find_or_insert(&mut self, user: &str, resource: &str) -> KeyId {
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
        id
    }

    fn alloc(&mut self, user: Arc<str>, resource: Name) -> KeyId {
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
        self.keys.push(Key::new(user, resource, 0));
        id
    }

    /// Drops what is older than `cutoff` and the keys left empty; `current`
    /// is the current slot.
    fn forget(&mut self, cutoff: i64, current: i64) {
        self.cutoff = cutoff;
        self.last_report.retain(|_, s| *s >= cutoff);
        let reporting = &self.last_report;
        self.recent.retain(|n, _| reporting.contains_key(n));
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
            if key.limited || !key.nodes.is_empty() {
                continue;
            }
            // Freed: its names stay until the id is reused, so assignments
            // still in the book resolve.
            key.live = false;
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
    }
}

/// A rejection count as kept: the ledger drops counts above `u32::MAX`
/// before filing, so this saturates only in theory.
fn rejections(amount: i64) -> u32 {
    u32::try_from(amount.max(0)).unwrap_or(u32::MAX)
}

impl Key {
    fn file(&mut self, node: NodeId, slot: i64, amount: i64, is_rejection: bool, now_ms: i64) {
        if !is_rejection && let Some(b) = self.bucket_mut() {
            b.consume(amount, now_ms);
        }
        // Distribution: one entry per node, the latest report wins; both the
        // consumption and the rejection pass of one report land in it.
        match self.nodes.iter_mut().find(|n| n.node == node) {
            Some(n) if n.slot > slot => {}
            Some(n) => {
                if n.slot < slot {
                    *n = NodeUsage {
                        node,
                        slot,
                        consumption: 0,
                        rejection: 0,
                    };
                }
                if is_rejection {
                    n.rejection = rejections(amount);
                } else {
                    n.consumption = amount;
                }
            }
            None => self.nodes.push(NodeUsage {
                node,
                slot,
                consumption: if is_rejection { 0 } else { amount },
                rejection: if is_rejection { rejections(amount) } else { 0 },
            }),
        }
        // Its sum is added to the slot's column by the caller.
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::policy::Grant;
    use throttle_proto::legacy::report_from_json;

    #[test]
    fn a_dense_column_is_narrow_until_a_sum_outgrows_u32() {
        let ids = 8;
        let mut column = Column::new(false, ids, &mut None);
        column.add(KeyId::test(0), 7, ids);
        column.add(KeyId::test(1), 7, ids);
        assert!(matches!(column, Column::Sparse(_)), "a quarter: sparse");
        column.add(KeyId::test(2), 7, ids);
        assert!(
            matches!(column, Column::Narrow(_)),
            "dense from a quarter of the keys, narrow"
        );
        column.add(KeyId::test(1), i64::from(u32::MAX) - 8, ids);
        assert!(
            matches!(column, Column::Narrow(_)),
            "u32::MAX - 1 still fits"
        );
        column.add(KeyId::test(1), 2, ids);
        assert!(matches!(column, Column::Dense(_)));
        assert_eq!(column.get(KeyId::test(1)), i64::from(u32::MAX) + 1);
        assert_eq!(column.get(KeyId::test(2)), 7);
        assert_eq!(column.get(KeyId::test(3)), 0);
        let mut big = Column::new(false, 2, &mut None);
        big.add(KeyId::test(0), 1 << 40, 2);
        big.add(KeyId::test(1), 1, 2);
        assert!(matches!(big, Column::Dense(_)), "a sum too big to narrow");
        assert_eq!(big.iter().count(), 2);
    }

    #[test]
    fn a_packed_column_reads_back_every_sum() {
        let ids = 100;
        let sum = |i: u32| match i % 7 {
            0 => 0,
            1 => 1 << 40,
            n => i64::from(n * i * 31),
        };
        let mut column = Column::new(true, ids, &mut None);
        for i in 0..ids as u32 {
            column.add(KeyId::test(i), sum(i), ids);
        }
        let before: Vec<_> = column.iter().collect();
        column.pack();
        assert!(matches!(column, Column::Packed(_)));
        for i in 0..ids as u32 + 40 {
            let want = if i < ids as u32 { sum(i) } else { 0 };
            assert_eq!(column.get(KeyId::test(i)), want, "id {i}");
        }
        assert_eq!(column.iter().collect::<Vec<_>>(), before);
        // A report filed into it after all: unpacked, nothing lost.
        column.add(KeyId::test(5), 2, ids);
        assert_eq!(column.get(KeyId::test(5)), sum(5) + 2);
        assert_eq!(column.get(KeyId::test(99)), sum(99));
        // Sums past 2^28 take 5 bytes as varints: kept as u32s.
        let mut big = Column::new(true, ids, &mut None);
        for i in 0..ids as u32 {
            big.add(KeyId::test(i), 1 << 30, ids);
        }
        big.pack();
        assert!(matches!(big, Column::Narrow(_)));
        // A sparse column stays sparse.
        let mut sparse = Column::new(false, ids, &mut None);
        sparse.add(KeyId::test(3), 4, ids);
        sparse.pack();
        assert!(matches!(sparse, Column::Sparse(_)));
        assert_eq!(sparse.get(KeyId::test(3)), 4);
    }

    #[test]
    fn a_packed_column_lets_the_next_dense_one_have_its_memory() {
        let ids = 1000;
        let mut column = Column::new(true, ids, &mut None);
        for i in 0..ids as u32 {
            column.add(KeyId::test(i), 3, ids);
        }
        let spare = column.pack().expect("packed smaller: its u32s let go");
        assert_eq!(column.get(KeyId::test(7)), 3);
        let at = spare.as_ptr();
        let mut spare = Some(spare);
        let next = Column::new(true, ids - 5, &mut spare);
        assert!(spare.is_none(), "taken");
        let Column::Narrow(v) = &next else {
            panic!("{next:?}")
        };
        assert_eq!(v.as_ptr(), at, "the same memory");
        assert_eq!(v.len(), ids - 5);
        assert!(v.iter().all(|&s| s == 0), "every sum zero again");
        // A sparse column has none to give.
        let mut sparse = Column::new(false, ids, &mut spare);
        sparse.add(KeyId::test(1), 1, ids);
        assert!(sparse.pack().is_none());
    }

    #[test]
    fn rejections_stay_sparse_while_consumption_is_dense() {
        let ids = 100;
        let mut sums = SlotSums::new(5, [false; 2], ids, &mut None);
        for i in 0..ids as u32 {
            sums.add(KeyId::test(i), 0, 3, ids);
        }
        sums.add(KeyId::test(7), 1, 2, ids);
        sums.add(KeyId::test(7), 1, 1, ids);
        assert!(sums.columns[0].is_dense());
        assert!(!sums.columns[1].is_dense(), "one key refused of 100");
        assert_eq!(
            (sums.get(KeyId::test(7), 0), sums.get(KeyId::test(7), 1)),
            (3, 3)
        );
        assert_eq!(sums.get(KeyId::test(8), 1), 0);
        let refused: Vec<_> = sums.columns[1].iter().collect();
        assert_eq!(refused, [(KeyId::test(7), 3)]);
        assert_eq!(sums.columns[0].iter().count(), ids);
    }

    fn limit(user: &str, resource: &str, rate: f64) -> Limit {
        Limit {
            user: user.into(),
            per_second: [(resource.into(), rate)].into(),
            burst_seconds: 10.0,
        }
    }

    /// A report of service `front` from its legacy JSON maps of users.
    pub(crate) fn report(node: &str, slot: i64, consumption: &str, rejection: &str) -> v1::Report {
        report_from_json(&format!(
            r#"{{"node_id": "{node}", "slot_number": {slot}, "consumption": {{"front": {consumption}}}, "rejection": {{"front": {rejection}}}}}"#
        ))
        .unwrap()
    }

    const T: i64 = 100_000; // slot 100 at 1 s slots

    /// A ledger keeping `nr_slot` slots of history.
    fn keeping(nr_slot: u32) -> Ledger {
        Ledger::new(LedgerConfig {
            nr_slot,
            ..LedgerConfig::default()
        })
    }

    /// A report's packed usages are filed as the map entries they stand
    /// for; one whose bits and amounts disagree is refused whole.
    #[test]
    fn packed_usages_are_ingested_as_the_maps_they_stand_for() {
        let mut l = keeping(3);
        let table = |rejection, amounts: Vec<i64>| v1::PackedUsage {
            service: "front".into(),
            rejection,
            resources: vec!["requests".into()],
            users: vec![v1::PackedUser {
                user: "alice".into(),
                resources: vec![1],
            }],
            amounts,
        };
        let packed = |amounts: Vec<i64>| v1::Report {
            node_id: "n1".into(),
            slot_number: 100,
            packed: vec![table(false, amounts), table(true, vec![2])],
            ..v1::Report::default()
        };
        assert!(matches!(
            l.ingest(&packed(vec![]), T),
            Err(ReportError::Packed(_))
        ));
        l.ingest(&packed(vec![5]), T).unwrap();
        assert_eq!(l.slot_sum("front", "alice", "requests", 99, false), 5);
        assert_eq!(l.slot_sum("front", "alice", "requests", 99, true), 2);
    }

    #[test]
    fn an_assign_into_a_recycled_assignment_keeps_none_of_its_grants() {
        let mut l = keeping(3);
        l.apply_limits("front", &[limit("alice", "requests", 100.0)], T);
        let alice = r#"{"alice": {"requests": 5}}"#;
        for node in ["n1", "n2"] {
            l.ingest(&report(node, 100, alice, "{}"), T).unwrap();
        }
        let (n1, n2) = (l.node_id("n1"), l.node_id("n2"));
        let users = |l: &Ledger, node, slot| {
            let quota = l.quota_for(node, [("front", slot)]);
            quota.services["front"].slots[&slot].users.len()
        };
        let first = l.assign(T + 500)["front"];
        assert_eq!((users(&l, n1, first), users(&l, n2, first)), (1, 1));
        // n2 stops reporting; its grants in the book's assignments, later
        // recycled, must not come back.
        let mut n2_granted = Vec::new();
        for slot in 101..112 {
            let now = slot * 1_000;
            l.ingest(&report("n1", slot, alice, "{}"), now).unwrap();
            let assigned = l.assign(now + 500)["front"];
            assert_eq!(users(&l, n1, assigned), 1);
            n2_granted.push(users(&l, n2, assigned));
            l.forget(now + 500);
        }
        assert!(
            l.services["front"].spare.is_some(),
            "an assignment is recycled"
        );
        // Granted while in the window, then never again.
        let granted = n2_granted.iter().take_while(|n| **n == 1).count();
        assert!(granted < 6, "{n2_granted:?}");
        assert!(
            n2_granted[granted..].iter().all(|n| *n == 0),
            "{n2_granted:?}"
        );
    }

    /// The default policy's grants for slot 101 of `alice`'s requests on
    /// n1, n2 and n3, when n1 reported `used` of them in slot 99 and the
    /// others only `bob`'s.
    fn grants_after(used: i64) -> [f64; 3] {
        let mut l = Ledger::new(LedgerConfig::default());
        l.apply_limits("front", &[limit("alice", "requests", 100.0)], T);
        let alice = format!(r#"{{"alice": {{"requests": {used}}}}}"#);
        l.ingest(&report("n1", 100, &alice, "{}"), T).unwrap();
        for node in ["n2", "n3"] {
            l.ingest(&report(node, 100, r#"{"bob": {"requests": 1}}"#, "{}"), T)
                .unwrap();
        }
        let slot = l.assign(T + 500)["front"];
        assert_eq!(slot, 101);
        ["n1", "n2", "n3"].map(|n| {
            let node = l.node_id(n);
            let quota = l.quota_for(node, [("front", slot)]);
            quota.services["front"].slots[&slot].users["alice"].resources["requests"]
        })
    }

    #[test]
    fn idle_nodes_share_a_tenth_of_what_the_busy_ones_leave() {
        // Under the limit: n1's 5 requests leave most of the budget.
        let [busy, idle2, idle3] = grants_after(5);
        let budget = busy + idle2 + idle3;
        assert_eq!(idle2, idle3);
        let each = 0.1 * (budget - 5.0) / 3.0;
        assert!((idle2 - each).abs() < 1e-3, "{idle2} vs {each}");
        assert!(idle2 >= 9.0, "room for a user arriving there: {idle2}");
        assert!(busy >= 5.0);
        // At the limit: no slack, so the idle nodes get only the floor (1%
        // of a slot's rate, at least 1) and n1 keeps the whole budget.
        // (The bucket's 150 by then, less the 120 expected in slot 100 too,
        // plus 100 per second up to the end of slot 101: 60 < 120.)
        let [busy, idle2, idle3] = grants_after(120);
        assert_eq!((idle2, idle3), (1.0, 1.0));
        assert_eq!(busy, 60.0);
    }

    #[test]
    fn the_monitor_reads_the_same_quotas_once_a_slot_is_kept_compact() {
        let mut l = keeping(10);
        l.apply_limits("front", &[limit("alice", "requests", 100.0)], T);
        let range = SlotRange::default();
        let mut seen = BTreeMap::new();
        for slot in 100..120 {
            let now = slot * 1_000;
            for (node, used) in [("n1", 5 + slot % 7), ("n2", 3)] {
                let r = format!(r#"{{"alice": {{"requests": {used}}}, "bob": {{"requests": 1}}}}"#);
                l.ingest(&report(node, slot, &r, "{}"), now).unwrap();
            }
            let assigned = l.assign(now + 500)["front"];
            // As assigned, before any forget.
            seen.insert(
                assigned,
                l.monitor_quota(range)["front"][assigned.to_string()].clone(),
            );
            l.forget(now + 500);
            let svc = &l.services["front"];
            assert!(svc.book.len() <= 3, "only the slots still answered");
        }
        let quotas = l.monitor_quota(range)["front"].clone();
        let kept: Vec<i64> = l.services["front"].kept.slots().collect();
        assert!(kept.len() >= 8, "{kept:?}");
        for (slot, q) in seen.iter().filter(|(s, _)| **s >= 110) {
            assert_eq!(&quotas[slot.to_string()], q, "slot {slot}");
            assert!(q["n1"]["alice"]["requests"].as_f64().is_some(), "{q}");
        }
        assert!(quotas.get("108").is_none(), "past the retention");
    }

    /// A ledger keeping 10 slots, where alice may make 100 requests a
    /// second and carol 40.
    fn alice_and_carol_limited() -> Ledger {
        let mut l = keeping(10);
        let limits = [
            limit("alice", "requests", 100.0),
            limit("carol", "requests", 40.0),
        ];
        l.apply_limits("front", &limits, T);
        l
    }

    /// Between assigns, as at every mid-slot, the book and the history
    /// still hold the grants of the slots the next assign weighs (the
    /// default policy's four slots before it), and give them back node by
    /// node, key by key.
    #[test]
    fn the_slots_an_assign_weighs_are_still_held_when_it_runs() {
        let mut l = alice_and_carol_limited();
        let mut seen: BTreeMap<i64, Vec<(NodeId, Vec<Grant>)>> = BTreeMap::new();
        for slot in 100..116 {
            let now = slot * 1_000;
            for (node, used) in [("n1", 5 + slot % 7), ("n2", 30 + slot % 3)] {
                let r =
                    format!(r#"{{"alice": {{"requests": {used}}}, "carol": {{"requests": 9}}}}"#);
                l.ingest(&report(node, slot, &r, "{}"), now).unwrap();
            }
            let assigned = l.assign(now + 500)["front"];
            let svc = &l.services["front"];
            let grants = svc.book[&assigned].iter();
            seen.insert(
                assigned,
                grants
                    .map(|(n, g)| (n, g.iter().collect::<Vec<_>>()))
                    .collect(),
            );
            l.forget(now + 500);
            let svc = &l.services["front"];
            let granted = Granted::new(&svc.book, &svc.kept);
            let next = assigned + 1;
            for y in (next - 4..next).filter(|y| seen.contains_key(y)) {
                let mut found = granted.slot(y);
                for (node, grants) in &seen[&y] {
                    assert_eq!(grants.len(), 2, "alice and carol");
                    for g in grants {
                        let got = found.get(*node, g.key).map(f64::from);
                        assert_eq!(got, Some(g.amount()), "slot {y} for {next}");
                    }
                }
            }
        }
        assert!(seen.len() >= 15);
    }

    /// While a node's users stay, the book's assignments, the skeleton its
    /// quotas are encoded from and every slot of its quota history hold
    /// one list of its keys.
    #[test]
    fn a_nodes_assignments_skeleton_and_quota_history_share_one_key_list() {
        let mut l = alice_and_carol_limited();
        let r = r#"{"alice": {"requests": 5}, "carol": {"requests": 9}}"#;
        for slot in 100..110 {
            let now = slot * 1_000;
            l.ingest(&report("n1", slot, r, "{}"), now).unwrap();
            let assigned = l.assign(now + 500)["front"];
            let n1 = l.node_id("n1");
            l.encode_quota_for(n1, [("front", assigned)], &[], Some(slot));
            l.forget(now + 500);
        }
        let n1 = l.node_id("n1");
        let svc = l.services.get_mut("front").unwrap();
        let skeleton = svc.skeletons.get_mut()[&n1].keys.clone();
        assert_eq!(skeleton.len(), 2, "alice's and carol's requests");
        let newest = svc.kept.newest_keys(n1).expect("kept");
        assert!(Arc::ptr_eq(&skeleton, &newest));
        let booked = svc
            .book
            .values()
            .map(|a| a.get(n1).and_then(|g| g.shared_keys()));
        let booked: Vec<Arc<[KeyId]>> = booked.map(|k| k.expect("shared")).collect();
        assert!(booked.len() >= 2, "the current slot and the next");
        assert!(booked.iter().all(|k| Arc::ptr_eq(k, &skeleton)));
        // The clones here, the skeleton, every assignment and slot kept.
        let kept = svc.kept.slots().count();
        assert!(kept >= 8, "{kept}");
        let clones = 2 + booked.len();
        assert_eq!(
            Arc::strong_count(&skeleton),
            clones + 1 + booked.len() + kept
        );
    }

    #[test]
    fn ingest_charges_buckets_and_sums_by_data_slot() {
        let mut l = Ledger::new(LedgerConfig::default());
        l.apply_limits("front", &[limit("alice", "requests", 10.0)], T);
        l.ingest(
            &report(
                "n1",
                100,
                r#"{"alice": {"requests": 4}, "bob": {"requests": 7}}"#,
                "{}",
            ),
            T,
        )
        .unwrap();
        l.ingest(
            &report(
                "n2",
                100,
                r#"{"alice": {"requests": 3}}"#,
                r#"{"alice": {"requests": 2}}"#,
            ),
            T,
        )
        .unwrap();
        assert_eq!(l.bucket_level("front", "alice", "requests", T), Some(3.0));
        assert_eq!(
            l.bucket_level("front", "bob", "requests", T),
            None,
            "no limit, no bucket"
        );
        assert_eq!(l.slot_sum("front", "alice", "requests", 99, false), 7);
        assert_eq!(l.slot_sum("front", "alice", "requests", 99, true), 2);
        assert_eq!(
            l.slot_sum("front", "bob", "requests", 99, false),
            7,
            "accounting without limit"
        );
    }

    #[test]
    fn duplicate_report_is_not_charged_twice() {
        let mut l = Ledger::new(LedgerConfig::default());
        l.apply_limits("front", &[limit("alice", "requests", 10.0)], T);
        let r = report("n1", 100, r#"{"alice": {"requests": 4}}"#, "{}");
        assert!(!l.ingest(&r, T).unwrap().duplicate);
        assert!(l.ingest(&r, T).unwrap().duplicate);
        assert_eq!(l.bucket_level("front", "alice", "requests", T), Some(6.0));
        assert_eq!(l.slot_sum("front", "alice", "requests", 99, false), 4);
    }

    #[test]
    fn late_report_is_charged_under_its_own_slot() {
        let mut l = Ledger::new(LedgerConfig::default());
        l.apply_limits("front", &[limit("alice", "requests", 10.0)], T);
        l.ingest(&report("n1", 100, r#"{"alice": {"requests": 4}}"#, "{}"), T)
            .unwrap();
        l.ingest(&report("n1", 98, r#"{"alice": {"requests": 5}}"#, "{}"), T)
            .unwrap();
        assert_eq!(l.slot_sum("front", "alice", "requests", 97, false), 5);
        assert_eq!(l.slot_sum("front", "alice", "requests", 99, false), 4);
        assert_eq!(l.bucket_level("front", "alice", "requests", T), Some(1.0));
        let dist = l.monitor_distribution(SlotRange::default(), T);
        assert_eq!(
            dist["front"]["alice"]["requests"]["nodes"]["n1"]["slot"], 99,
            "latest stays"
        );
    }

    #[test]
    fn whole_report_errors() {
        let mut l = Ledger::new(LedgerConfig {
            max_users_per_report: 1,
            ..LedgerConfig::default()
        });
        let far = report("n1", 100 + 61, "{}", "{}");
        assert!(matches!(
            l.ingest(&far, T),
            Err(ReportError::SlotOutOfRange { .. })
        ));
        let old = report("n1", 100 - 61, "{}", "{}");
        assert!(matches!(
            l.ingest(&old, T),
            Err(ReportError::SlotOutOfRange { .. })
        ));
        let anon = report("", 100, "{}", "{}");
        assert_eq!(l.ingest(&anon, T), Err(ReportError::BadNodeId));
        let long = report(&"n".repeat(MAX_NAME_LEN + 1), 100, "{}", "{}");
        assert_eq!(l.ingest(&long, T), Err(ReportError::BadNodeId));
        let many = report("n1", 100, r#"{"a": {"r": 1}, "b": {"r": 1}}"#, "{}");
        assert_eq!(
            l.ingest(&many, T),
            Err(ReportError::TooManyUsers { users: 2, max: 1 })
        );
    }

    #[test]
    fn bad_entries_are_dropped_and_the_rest_kept() {
        let mut l = Ledger::new(LedgerConfig::default());
        let long = "u".repeat(MAX_NAME_LEN + 1);
        let r = report(
            "n1",
            100,
            &format!(
                r#"{{"ok": {{"requests": 2}}, "neg": {{"requests": -5}}, "{long}": {{"r": 1}}, "e": {{"": 1}}}}"#
            ),
            r#"{"ok": {"requests": 4294967295}, "absurd": {"requests": 4294967296}}"#,
        );
        let out = l.ingest(&r, T).unwrap();
        assert_eq!(out.entries, 2);
        let reasons: Vec<_> = out.dropped.iter().map(|d| d.0).collect();
        assert_eq!(
            reasons
                .iter()
                .filter(|r| **r == DropReason::BadName)
                .count(),
            2
        );
        assert_eq!(
            reasons
                .iter()
                .filter(|r| **r == DropReason::NegativeAmount)
                .count(),
            1
        );
        assert_eq!(
            out.dropped
                .iter()
                .filter(|r| r.0 == DropReason::TooManyRejections)
                .map(|r| r.1.as_str())
                .collect::<Vec<_>>(),
            ["front/absurd/requests"]
        );
        assert_eq!(l.slot_sum("front", "ok", "requests", 99, false), 2);
        assert_eq!(
            l.slot_sum("front", "ok", "requests", 99, true),
            i64::from(u32::MAX),
            "the largest count kept"
        );
        assert_eq!(l.slot_sum("front", "absurd", "requests", 99, true), 0);
    }

    #[test]
    fn limits_change_and_disappear() {
        let mut l = Ledger::new(LedgerConfig::default());
        l.apply_limits("front", &[limit("alice", "requests", 10.0)], T);
        l.apply_limits("front", &[limit("alice", "requests", 1.0)], T);
        assert_eq!(
            l.bucket_level("front", "alice", "requests", T),
            Some(10.0),
            "clamped to 10 x 1"
        );
        l.apply_limits("front", &[], T);
        assert_eq!(l.bucket_level("front", "alice", "requests", T), None);
    }

    #[test]
    fn forget_drops_old_slots_and_idle_keys() {
        let mut l = keeping(5);
        l.ingest(&report("n1", 100, r#"{"bob": {"requests": 1}}"#, "{}"), T)
            .unwrap();
        assert_eq!(l.key_count(), 1);
        l.forget(T + 4_000);
        assert_eq!(
            l.key_count(),
            1,
            "slot 99 is one of the 5 slots kept at slot 104"
        );
        l.forget(T + 5_000);
        assert_eq!(l.key_count(), 0);
        assert_eq!(l.monitor_reported(SlotRange::default()), json!({}));
    }

    #[test]
    fn freed_key_ids_are_reused_only_once_the_book_lets_go() {
        let mut l = keeping(5);
        let one = |user: &str| format!(r#"{{"{user}": {{"requests": 1}}}}"#);
        l.ingest(&report("n1", 100, &one("bob"), "{}"), T).unwrap();
        l.forget(T + 5_000);
        fn state(l: &Ledger) -> &ServiceState {
            &l.services["front"].state
        }
        assert_eq!(state(&l).key_count(), 0);
        assert_eq!(
            state(&l).key(KeyId(0)).user(),
            "bob",
            "a freed key keeps its names for the assignments still naming it"
        );
        // Too soon to reuse id 0: the book may hold slots up to 107.
        l.ingest(&report("n1", 106, &one("carol"), "{}"), T + 6_000)
            .unwrap();
        assert_eq!(state(&l).find("carol", "requests"), Some(KeyId(1)));
        // Carol's data slot 105 is forgotten too; id 0 may now be reused.
        l.forget(T + 14_000);
        l.ingest(&report("n1", 115, &one("dave"), "{}"), T + 15_000)
            .unwrap();
        let dave = state(&l).find("dave", "requests");
        assert_eq!(dave, Some(KeyId(0)));
        let key = state(&l).key(KeyId(0));
        assert_eq!((key.user(), key.resource()), ("dave", "requests"));
        assert_eq!(key.generation(), 1, "a reused id is a new generation");
        assert_eq!(state(&l).id_bound(), 2);
        assert_eq!(l.slot_sum("front", "dave", "requests", 114, false), 1);
        assert_eq!(l.slot_sum("front", "bob", "requests", 99, false), 0);
    }

    proptest::proptest! {
        /// Whatever the order of reports and forgetting, the arena holds
        /// exactly the keys reported within the last `nr_slot` slots, each
        /// found under its own names.
        #[test]
        fn the_arena_holds_exactly_the_recent_keys(
            ops in proptest::collection::vec((0..6usize, 0..3usize, 0..4i64), 1..120)
        ) {
            const RESOURCES: [&str; 3] = ["requests", "traffic_up", "db"];
            let nr_slot = 5;
            let mut l = keeping(nr_slot);
            let mut model: BTreeMap<(usize, usize), i64> = BTreeMap::new();
            let mut now = T;
            for (i, (user, resource, advance)) in ops.into_iter().enumerate() {
                now += advance * 1_000;
                let slot = l.config().slot.slot_at(now);
                let usage = format!(r#"{{"u{user}": {{"{}": 1}}}}"#, RESOURCES[resource]);
                l.ingest(&report(&format!("n{i}"), slot, &usage, "{}"), now).unwrap();
                model.insert((user, resource), slot - 1);
                l.forget(now);
                let cutoff = slot - i64::from(nr_slot);
                model.retain(|_, s| *s >= cutoff);
                let state = &l.services["front"].state;
                proptest::prop_assert_eq!(state.key_count(), model.len());
                proptest::prop_assert_eq!(state.keys().count(), model.len());
                for &(u, r) in model.keys() {
                    let id = state.find(&format!("u{u}"), RESOURCES[r]);
                    proptest::prop_assert!(id.is_some());
                    let key = state.key(id.unwrap_or(KeyId(u32::MAX)));
                    proptest::prop_assert_eq!(key.user(), format!("u{u}"));
                    proptest::prop_assert_eq!(key.resource(), RESOURCES[r]);
                }
            }
        }
    }

    proptest::proptest! {
        /// Whatever the same few nodes report from slot to slot (users
        /// coming and going, resources changing, keys freed and their ids
        /// reused), each amount is filed under its own user and resource,
        /// whether its keys were found by name or from the node's last
        /// report.
        #[test]
        fn amounts_land_on_their_own_keys(
            reports in proptest::collection::vec(
                (
                    0..3usize,
                    0..3i64,
                    proptest::collection::btree_map(
                        (0..8usize, 0..4usize),
                        1..100i64,
                        1..20,
                    ),
                ),
                1..40,
            ),
        ) {
            const RESOURCES: [&str; 4] = ["requests", "up", "down", "db"];
            let mut l = keeping(2);
            let mut now = T;
            for (node, advance, entries) in reports {
                now += advance * 1_000;
                let slot = l.config().slot.slot_at(now);
                let mut users: BTreeMap<String, BTreeMap<&str, i64>> = BTreeMap::new();
                for (&(u, r), &amount) in &entries {
                    users.entry(format!("u{u}")).or_default().insert(RESOURCES[r], amount);
                }
                let name = format!("n{node}");
                let filed = l.ingest(&report(&name, slot, &json!(users).to_string(), "{}"), now);
                l.forget(now);
                if filed.as_ref().is_ok_and(|f| f.duplicate) {
                    continue;
                }
                proptest::prop_assert!(filed.is_ok());
                let n = l.node_id(&name);
                let state = &l.services["front"].state;
                for (&(u, r), &amount) in &entries {
                    let id = state.find(&format!("u{u}"), RESOURCES[r]);
                    proptest::prop_assert!(id.is_some(), "u{} {} not found", u, RESOURCES[r]);
                    let key = state.key(id.unwrap_or(KeyId(u32::MAX)));
                    proptest::prop_assert_eq!(key.user(), format!("u{u}"));
                    proptest::prop_assert_eq!(key.resource(), RESOURCES[r]);
                    let mine = key.nodes().iter().find(|e| e.node == n).copied();
                    proptest::prop_assert_eq!(mine.map(|e| (e.slot, e.consumption)), Some((slot - 1, amount)));
                    proptest::prop_assert_eq!(
                        l.slot_sum("front", &format!("u{u}"), RESOURCES[r], slot - 1, false) >= amount,
                        true
                    );
                }
                proptest::prop_assert_eq!(state.keys().count(), state.key_count());
            }
        }
    }

    proptest::proptest! {
        /// The per-slot sums read back as a plain model's, as columns turn
        /// dense, widen past `u32`, slots pass the retention and key ids
        /// are reused.
        #[test]
        fn sums_read_back_as_the_model_says(
            reports in proptest::collection::vec(
                (
                    0..3usize,
                    0..3i64,
                    proptest::bool::ANY,
                    proptest::collection::vec(
                        (
                            0..10usize,
                            0..4usize,
                            proptest::prop_oneof![
                                8 => 0..50i64,
                                1 => (1i64 << 31)..(1i64 << 33),
                            ],
                        ),
                        1..30,
                    ),
                ),
                1..25,
            ),
        ) {
            const RESOURCES: [&str; 4] = ["requests", "up", "down", "db"];
            let nr_slot = 3;
            let mut l = keeping(nr_slot);
            // (data slot, user, resource) -> [consumption, rejection]
            let mut model: BTreeMap<(i64, usize, usize), [i64; 2]> = BTreeMap::new();
            let mut now = T;
            for (i, (node, advance, late, entries)) in reports.into_iter().enumerate() {
                now += advance * 1_000;
                // A late report carries the slot before the current one.
                let slot = l.config().slot.slot_at(now) - i64::from(late);
                let mut users: [BTreeMap<String, BTreeMap<&str, i64>>; 2] = Default::default();
                for (j, &(u, r, amount)) in entries.iter().enumerate() {
                    users[j % 2].entry(format!("u{u}")).or_default().insert(RESOURCES[r], amount);
                }
                let [consumption, rejection] = [&users[0], &users[1]].map(|u| json!(u).to_string());
                let node = format!("n{node}-{i}");
                l.ingest(&report(&node, slot, &consumption, &rejection), now).unwrap();
                for (which, usage) in users.iter().enumerate() {
                    for (user, amounts) in usage {
                        let u: usize = user[1..].parse().unwrap_or_default();
                        // A rejection count above u32::MAX is dropped; the
                        // sums of several still outgrow it.
                        for (resource, amount) in amounts.iter().filter(|(_, a)| which == 0 || **a <= i64::from(u32::MAX)) {
                            let r = RESOURCES.iter().position(|x| x == resource).unwrap_or(0);
                            model.entry((slot - 1, u, r)).or_default()[which] += amount;
                        }
                    }
                }
                l.forget(now);
                let cutoff = l.config().slot.slot_at(now) - i64::from(nr_slot);
                model.retain(|(s, ..), _| *s >= cutoff);
                for (&(s, u, r), sums) in &model {
                    for (which, want) in sums.iter().enumerate() {
                        let got = l.slot_sum("front", &format!("u{u}"), RESOURCES[r], s, which == 1);
                        proptest::prop_assert_eq!(got, *want);
                    }
                }
                let monitored = l.monitor_sums(SlotRange::default(), false);
                let total: i64 = model.values().map(|s| s[0]).sum();
                let monitored_total: i64 = monitored["front"]
                    .as_object()
                    .into_iter()
                    .flat_map(|slots| slots.values())
                    .flat_map(|users| users.as_object().into_iter().flat_map(|u| u.values()))
                    .flat_map(|res| res.as_object().into_iter().flat_map(|r| r.values()))
                    .filter_map(Value::as_i64)
                    .sum();
                proptest::prop_assert_eq!(monitored_total, total);
            }
        }
    }

    proptest::proptest! {
        /// The encoded answer says exactly what the built one says, also
        /// when a user's keys are far apart in the arena (a resource that
        /// first appears in a later report).
        #[test]
        fn encoded_quotas_decode_as_the_built_ones(
            reports in proptest::collection::vec(
                (0..3usize, proptest::collection::vec((0..8usize, 0..4usize, 0..50i64), 1..12)),
                2..8,
            ),
            limited in proptest::collection::btree_set((0..8usize, 0..4usize), 0..20),
            policy in 0..3usize,
        ) {
            use prost::Message;
            const RESOURCES: [&str; 4] = ["requests", "up", "down", "db"];
            let factory: PolicyFactory = match policy {
                0 => Box::new(|_| Box::new(Projected::new())),
                1 => Box::new(|_| Box::new(crate::policy::Classic::new())),
                _ => Box::new(|_| Box::new(crate::policy::StaticSplit::new())),
            };
            // Short retention: keys are freed and their ids reused.
            let config = LedgerConfig { nr_slot: 3, ..LedgerConfig::default() };
            let mut l = Ledger::with_policies(config, factory);
            let limits: Vec<Limit> = limited
                .iter()
                .map(|&(u, r)| limit(&format!("user-{u}"), RESOURCES[r], 10.0 + r as f64))
                .collect();
            // Every node's quotas around `slot`, encoded (from a node's
            // last encoding when its keys are the same) and built.
            let check = |l: &Ledger, slot: i64| -> Result<(), proptest::test_runner::TestCaseError> {
                for node in 0..3 {
                    let n = l.node_ids.get(format!("n{node}").as_str()).copied();
                    let Some(n) = n else { continue };
                    for s in [slot, slot + 1, slot + 2] {
                        let built = l.quota_for(n, [("front", s), ("other", s)]);
                        let encoded = l.encode_quota_for(n, [("front", s), ("other", s)], &[], Some(s - 1));
                        let decoded = v1::CentralMessage::decode(&encoded[..]);
                        let want = v1::CentralMessage {
                            kind: Some(v1::central_message::Kind::Quota(v1::Quota {
                                report_slot: Some(s - 1),
                                ..built
                            })),
                        };
                        proptest::prop_assert_eq!(decoded, Ok(want));
                    }
                }
                Ok(())
            };
            for (i, (node, entries)) in reports.iter().enumerate() {
                if i == 1 {
                    // Keys the first report created come before the
                    // limited ones in the arena.
                    l.apply_limits("front", &limits, T);
                }
                let mut users: BTreeMap<String, BTreeMap<&str, i64>> = BTreeMap::new();
                for &(u, r, amount) in entries {
                    users.entry(format!("user-{u}")).or_default().insert(RESOURCES[r], amount);
                }
                let now = T + i as i64 * 1_000;
                let slot = l.config().slot.slot_at(now);
                l.ingest(&report(&format!("n{node}"), slot, &json!(users).to_string(), "{}"), now)
                    .unwrap();
                l.assign(now + 500);
                check(&l, slot)?;
                l.forget(now + 500);
            }
            let now = T + reports.len() as i64 * 1_000;
            check(&l, l.config().slot.slot_at(now))?;
        }
    }

    #[test]
    fn quota_for_unknown_service_is_an_empty_slot() {
        let mut l = Ledger::new(LedgerConfig::default());
        let n = l.node_id("n1");
        let q = l.quota_for(n, [("front", 101)]);
        assert_eq!(
            throttle_proto::legacy::quota_to_json(&q).unwrap(),
            r#"{"front":{"101":{}}}"#
        );
    }
}
