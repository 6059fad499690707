//! The node's slot store: per-slot counters and the quotas the central node
//! sent, with the original node's decision rules.
//!
//! The store is plain synchronous code reading an injected
//! [`Clock`]; the layer calls it on the request path and the
//! reporter drains it once per slot.
//!
//! - [`ServiceStore::admit`] applies the original `throttle` rules: with no
//!   quota for the current slot the [`Fallback`] decides (by default: allow,
//!   as the original); with a quota table for the slot but no row for the user,
//!   the user is not limited; otherwise, for every resource of the user's
//!   quota, a quota below 1 or this slot's consumption above the quota counts
//!   one rejection for that resource and refuses the request. An admitted
//!   request's fixed costs are added in the same step.
//! - [`UserHandle::consume`] adds amounts known later (body bytes, handler
//!   amounts) to the slot in which they happen.
//! - [`SlotStore::collect`] drains a finished slot into a protocol
//!   [`Report`](v1::Report), and [`SlotStore::apply_quota`] installs a quota.
//!
//! # Concurrency and memory
//!
//! Each service keeps a lock-free map (`papaya`) of its users. A user is one
//! node of the map holding its name (inline up to 24 bytes) and a small spin
//! lock over its state: two requests contend only when they are for the same
//! user, and a known user costs one hash lookup and one uncontended lock,
//! with no allocation. The state holds, per resource the service counts,
//! this slot's and the last slot's counts and the quota of each of three
//! rows (the current slot, or without it the newest past one, and the next
//! two; in whole units, as `f32`), inline in the map's node: the map is made
//! at the service's first user with room for the resources registered by
//! then, and a user of a resource registered later moves its cells to a
//! separate allocation. A per-service ring of `(slot, version)` says which
//! rows are current, so replacing a slot's table never blocks a reader.
//!
//! The number of tracked users is capped ([`StoreBuilder::max_keys`], default
//! 1,000,000 over all services). At the cap a *new* user is neither tracked nor
//! counted: the layer's [`Fallback`] decides for it, and the metric
//! `throttle_keys_at_cap_total` counts such decisions. Users idle for two slots
//! are forgotten at the next [`SlotStore::collect`], which frees room.
//!
//! # Examples
//!
//! ```
//! use std::sync::Arc;
//! use throttle_layer::store::{Fallback, SlotStore};
//! use throttle_proto::legacy;
//! use throttle_proto::slot::ManualClock;
//!
//! let clock = Arc::new(ManualClock::new(100_000)); // slot 100
//! let store = SlotStore::builder().clock(clock.clone()).build();
//! let front = store.service("front");
//! let requests = front.resource("requests").unwrap();
//!
//! // No quota yet: the fallback (allow) decides.
//! assert!(front.admit("alice", &[(requests, 1)], Fallback::Allow).decision.is_allowed());
//!
//! store.apply_quota(&legacy::quota_from_json(r#"{"front": {"100": {"alice": {"requests": 2.0}}}}"#)?);
//! assert!(front.admit("alice", &[(requests, 1)], Fallback::Allow).decision.is_allowed());
//! assert!(front.admit("alice", &[(requests, 1)], Fallback::Allow).decision.is_allowed());
//! // consumption 3 > quota 2: refused, one rejection counted.
//! assert!(!front.admit("alice", &[(requests, 1)], Fallback::Allow).decision.is_allowed());
//!
//! clock.set(101_050);
//! let report = store.collect(100);
//! assert_eq!(report.slot_number, 101);
//! assert_eq!(report.consumption["front"].users["alice"].resources["requests"], 3);
//! assert_eq!(report.rejection["front"].users["alice"].resources["requests"], 1);
//! # Ok::<(), legacy::LegacyError>(())
//! ```

use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use arc_swap::ArcSwap;
use bytes::Bytes;
use compact_str::CompactString;
use metrics::counter;
use parking_lot::Mutex;
use prost::Message;
use throttle_proto::slot::{Clock, CoarseClock, SlotLength};
use throttle_proto::wire::{RawQuota, ReportEncoder, UsageEncoder};
use throttle_proto::{MAX_NAME_LEN, v1};

/// Most resources one service can count.
pub const MAX_RESOURCES: usize = 16;
/// Slots of quota history a user keeps besides the current and coming ones.
const QUOTA_RING: usize = 16;
/// Quota rows kept per user: the current one (or without it the newest
/// past one, for [`Fallback::LastKnownThenAllow`]) and the next two.
const ROWS_PER_USER: usize = 3;
const SLOT_BITS: u32 = 40;
const SLOT_MASK: u64 = (1 << SLOT_BITS) - 1;
const VERSION_MASK: u64 = (1 << (64 - SLOT_BITS)) - 1;

/// A resource of one service, interned; see [`ServiceStore::resource`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ResourceId(u8);

impl ResourceId {
    fn index(self) -> usize {
        usize::from(self.0)
    }
}

/// What to do while there is no quota for the current slot, e.g. while the
/// central node is unreachable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Fallback {
    /// Let everything through (fail-open, the original behaviour).
    #[default]
    Allow,
    /// Refuse everything (fail-closed).
    Deny,
    /// Apply the newest quota of the last `slots` slots, then allow.
    LastKnownThenAllow(u32),
    /// Apply the newest quota of the last `slots` slots, then deny.
    LastKnownThenDeny(u32),
}

/// Why a request was allowed or refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Basis {
    /// The user's quota for the slot decided.
    Quota,
    /// A quota table exists for the slot but has no row for this user: the
    /// user is not limited.
    Unlimited,
    /// No quota for the slot: the [`Fallback`] decided.
    Fallback,
    /// The store is full and the user is new: the [`Fallback`] decided.
    AtCap,
}

/// The resource whose quota is the tightest, for rate-limit headers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tightest {
    /// The resource.
    pub resource: ResourceId,
    /// This node's quota for it in the slot.
    pub quota: f64,
    /// What this node admitted of it in the slot so far.
    pub used: i64,
}

/// The outcome of [`ServiceStore::admit`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Decision {
    allowed: bool,
    /// Why.
    pub basis: Basis,
    /// For a refusal by quota: the exhausted resource. For an allowed request
    /// with a quota: the resource with the least left.
    pub tightest: Option<Tightest>,
}

impl Decision {
    /// True when the request may proceed.
    pub fn is_allowed(&self) -> bool {
        self.allowed
    }

    fn fallback(fallback: Fallback, basis: Basis) -> Self {
        Self {
            allowed: matches!(fallback, Fallback::Allow | Fallback::LastKnownThenAllow(_)),
            basis,
            tightest: None,
        }
    }
}

/// The result of [`ServiceStore::admit`]: the decision and, when asked for,
/// a handle to add amounts known later.
#[derive(Debug)]
pub struct Admission {
    /// Allowed or refused, and why.
    pub decision: Decision,
    /// Set by [`ServiceStore::admit_with_handle`] for a tracked user.
    pub handle: Option<UserHandle>,
}

/// Counts of one user handed from a slot to the report: a transfer value on
/// the stack (or in the rare overflow list), never kept per user.
#[derive(Debug, Clone, Copy)]
struct Counters {
    consumption: [i64; MAX_RESOURCES],
    rejection: [u32; MAX_RESOURCES],
}

impl Default for Counters {
    fn default() -> Self {
        Self {
            consumption: [0; MAX_RESOURCES],
            rejection: [0; MAX_RESOURCES],
        }
    }
}

impl Counters {
    fn is_zero(&self) -> bool {
        self.consumption.iter().all(|&c| c == 0) && self.rejection.iter().all(|&r| r == 0)
    }

    fn merge(&mut self, other: &Self) {
        for i in 0..MAX_RESOURCES {
            self.consumption[i] = self.consumption[i].saturating_add(other.consumption[i]);
            self.rejection[i] = self.rejection[i].saturating_add(other.rejection[i]);
        }
    }
}

/// One resource of one user: this slot's and the last slot's counts, and
/// the quota of each of the user's rows.
///
/// Packed to 4-byte alignment (36 bytes, where natural alignment pads it to
/// 40): a user's cells sit inline in its map node, and the unaligned `i64`
/// loads cost nothing measurable on x86-64. Fields are only read and written
/// by value.
#[derive(Debug, Clone, Copy)]
#[repr(C, packed(4))]
struct Cell {
    used: i64,
    prev_used: i64,
    rejected: u32,
    prev_rejected: u32,
    /// Quota in row `k`, in whole units (see [`whole_units`]); NaN where
    /// row `k` has no quota for this resource.
    quota: [f32; ROWS_PER_USER],
}

/// A quota as a cell keeps it: `floor(q)` as an `f32`, rounded down where
/// it has no exact `f32` (above 2^24), and 0 for a NaN (no quota left).
///
/// Counts are whole, so `used > q` exactly when `used > floor(q)`, and
/// `q < 1` exactly when `floor(q) < 1`: the decision is the one the full
/// `f64` gives up to 2^24 units per slot, and above that it errs by at
/// most 1 part in 16 million, towards refusing. Half the bytes of an `f64`
/// for the rows every (user, resource) holds.
fn whole_units(q: f64) -> f32 {
    if q.is_nan() {
        return 0.0;
    }
    throttle_proto::f32_at_most(q.floor())
}

const EMPTY_CELL: Cell = Cell {
    used: 0,
    prev_used: 0,
    rejected: 0,
    prev_rejected: 0,
    quota: [f32::NAN; ROWS_PER_USER],
};

/// A user's state. Stored as `UserState<[Cell; N]>`, with `N` the cell
/// class of its service's map (see [`Users`]), and used through the
/// unsized `UserState<[Cell]>` it coerces to, so the logic is written once
/// for every class.
#[derive(Debug)]
struct UserState<C: ?Sized = [Cell]> {
    /// Slot of the `used` counts, which is also the last slot the user was
    /// seen in: every admit and consume rolls the counts on to its slot.
    slot: i64,
    /// Slot of each quota row, as a [`RowTag`].
    row_slot: [RowTag; ROWS_PER_USER],
    /// Version of each quota row; 0: the row is empty.
    row_version: [u16; ROWS_PER_USER],
    /// The `prev_used` counts are slot `slot - 1`'s, not yet collected.
    has_prev: bool,
    evicted: bool,
    /// The user's cells once its service counts more resources than the
    /// inline ones hold (resources registered after the map was made); the
    /// inline cells are then unused.
    spill: Option<Box<Spill>>,
    /// One cell per resource, inline in the map's node.
    cells: C,
}

/// Cells that outgrew a user's inline ones; boxed once more so the pointer
/// in every user's state is a thin one (8 bytes).
#[derive(Debug)]
struct Spill {
    cells: Box<[Cell]>,
}

/// Counts set aside by users' rolls until the next collection, one entry
/// per user: a user whose counts roll over slot after slot with nothing
/// collecting them (a store without a reporter, or one stalled) adds to
/// its entry, so the overflow holds no more users than the map does.
type Overflow = std::collections::HashMap<CompactString, Counters, foldhash::fast::RandomState>;

/// Adds `counts` to `user`'s entry in the overflow.
#[cold]
fn set_aside(overflow: &Mutex<Overflow>, user: &str, counts: &Counters) {
    let mut overflow = overflow.lock();
    match overflow.get_mut(user) {
        Some(kept) => kept.merge(counts),
        None => {
            overflow.insert(user.into(), *counts);
        }
    }
}

/// A quota row's slot, kept as its low 32 bits: half the bytes of an `i64`
/// for each of a user's rows. Read back relative to a nearby slot
/// ([`RowTag::near`]): quotas are installed only within 16 slots of now, and
/// rows older than [`RowTag::MAX_AGE`] are dropped as users roll on, so the
/// nearest slot with these bits is the row's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct RowTag(u32);

impl RowTag {
    /// Rows older than this many slots are dropped (2^30: 34 years of 1 s
    /// slots, 12 days of 1 ms ones).
    const MAX_AGE: i64 = 1 << 30;

    fn of(slot: i64) -> Self {
        Self(slot as u32)
    }

    /// The slot within 2^31 of `now` whose low bits these are.
    fn near(self, now: i64) -> i64 {
        now.wrapping_add(i64::from(self.0.wrapping_sub(now as u32) as i32))
    }
}

/// The per-user lock. A spin lock rather than `parking_lot`'s: its unlock is
/// a plain release store where a parking mutex needs a compare-and-swap, one
/// atomic read-modify-write less on every decision. Critical sections are a
/// few dozen instructions and two requests contend only for the same user;
/// a waiter yields its time slice rather than burn it, so a preempted holder
/// is not starved.
type UserLock<T> = spin::mutex::SpinMutex<T, spin::relax::Yield>;
type UserGuard<'g> = spin::mutex::SpinMutexGuard<'g, UserState>;

/// A tracked user: the map's value, stored with the user's name (the key,
/// inline up to 24 bytes) in the map's own node. One allocation per user:
/// the lookup, the key compare, the lock and the cells read adjacent lines.
type Entry<const N: usize> = UserLock<UserState<[Cell; N]>>;
type UserMap<const N: usize> =
    papaya::HashMap<CompactString, Entry<N>, foldhash::fast::RandomState>;
/// A user's name as the maps' query: hashed as its key is (as a `str`), and
/// compared inline, 8 bytes at a time. Comparing as `str` calls `memcmp`,
/// which for a name of a few dozen bytes is most of the comparison's cost
/// (about 5 ns of a decision).
#[derive(Debug, Clone, Copy)]
struct Name<'a>(&'a str);

impl std::hash::Hash for Name<'_> {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.hash(state);
    }
}

impl papaya::Equivalent<CompactString> for Name<'_> {
    #[inline]
    fn equivalent(&self, key: &CompactString) -> bool {
        same_bytes(self.0.as_bytes(), key.as_bytes())
    }
}

#[inline]
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let ((a8, a_rest), (b8, b_rest)) = (a.as_chunks::<8>(), b.as_chunks::<8>());
    a8.iter()
        .zip(b8)
        .all(|(x, y)| u64::from_ne_bytes(*x) == u64::from_ne_bytes(*y))
        && a_rest.iter().zip(b_rest).all(|(x, y)| x == y)
}

/// A guard of any class's map: the type does not depend on the class.
type Guard<'m> = papaya::LocalGuard<'m>;

/// A service's users, in a map whose nodes hold `N` cells each: the
/// smallest class that holds the resources registered when the map is
/// made, at the service's first user. A user of a service that later
/// counts more resources moves its cells to a [`Spill`].
enum Users {
    C1(UserMap<1>),
    C2(UserMap<2>),
    C3(UserMap<3>),
    C4(UserMap<4>),
    C6(UserMap<6>),
    C8(UserMap<8>),
    C12(UserMap<12>),
    C16(UserMap<MAX_RESOURCES>),
}

/// Runs `$body` with `$map` bound to the map of whichever class `$users` is.
macro_rules! with_users {
    ($users:expr, $map:ident => $body:expr) => {
        match $users {
            Users::C1($map) => $body,
            Users::C2($map) => $body,
            Users::C3($map) => $body,
            Users::C4($map) => $body,
            Users::C6($map) => $body,
            Users::C8($map) => $body,
            Users::C12($map) => $body,
            Users::C16($map) => $body,
        }
    };
}

impl Users {
    fn for_resources(n: usize) -> Self {
        fn map<const N: usize>() -> UserMap<N> {
            UserMap::with_hasher(foldhash::fast::RandomState::default())
        }
        match n {
            0..=1 => Self::C1(map()),
            2 => Self::C2(map()),
            3 => Self::C3(map()),
            4 => Self::C4(map()),
            5..=6 => Self::C6(map()),
            7..=8 => Self::C8(map()),
            9..=12 => Self::C12(map()),
            _ => Self::C16(map()),
        }
    }

    fn len(&self) -> usize {
        with_users!(self, m => m.len())
    }

    /// Cells inline in each user's node.
    fn class(&self) -> usize {
        fn of<const N: usize>(_: &UserMap<N>) -> usize {
            N
        }
        with_users!(self, m => of(m))
    }
}

/// Counters and quotas of one service; get it from [`SlotStore::service`].
pub struct ServiceStore {
    name: Arc<str>,
    clock: Arc<dyn Clock>,
    /// The clock is [`CoarseClock`], read directly ([`Clock::is_coarse`]):
    /// every decision reads the clock, and the call through `dyn Clock`
    /// reads its vtable, a line no other part of the request touches, so
    /// mostly an L1 miss between requests.
    coarse_clock: bool,
    slot: SlotLength,
    keys: Arc<AtomicUsize>,
    max_keys: usize,
    /// Made at the first use, when the resources the layer counts are known.
    users: OnceLock<Users>,
    resources: ArcSwap<Vec<Arc<str>>>,
    register: Mutex<()>,
    /// `slot & SLOT_MASK << 24 | version` of the quota tables received.
    ring: [AtomicU64; QUOTA_RING],
    /// Counts a user's roll could not keep in its cells: slots that rolled
    /// over before they were collected, and charges that came after.
    overflow: Mutex<Overflow>,
    /// Registered once: a flood of new users at the cap must not build a
    /// labelled metric key per request.
    at_cap: metrics::Counter,
}

impl fmt::Debug for ServiceStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServiceStore")
            .field("name", &self.name)
            .field("users", &self.users())
            .field("resources", &self.resources.load())
            .finish_non_exhaustive()
    }
}

/// A tracked user of one service, to add amounts after the decision.
///
/// It names the user rather than pointing at its entry: entries live in the
/// map's nodes, and a user forgotten while a handle is held is counted under
/// a fresh entry.
#[derive(Clone)]
pub struct UserHandle {
    service: Arc<ServiceStore>,
    user: CompactString,
}

impl fmt::Debug for UserHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UserHandle")
            .field("service", &self.service.name)
            .field("user", &self.user)
            .finish()
    }
}

impl UserHandle {
    /// Adds `amount` of `resource` to the current slot.
    pub fn consume(&self, resource: ResourceId, amount: i64) {
        self.service.consume(&self.user, resource, amount);
    }

    /// The service this user belongs to.
    pub fn service(&self) -> &Arc<ServiceStore> {
        &self.service
    }

    /// The user's name.
    pub fn user(&self) -> &str {
        &self.user
    }
}

impl<const N: usize> UserState<[Cell; N]> {
    fn new(slot: i64) -> Self {
        Self {
            slot,
            row_slot: [RowTag(0); ROWS_PER_USER],
            row_version: [0; ROWS_PER_USER],
            has_prev: false,
            evicted: false,
            spill: None,
            cells: [EMPTY_CELL; N],
        }
    }
}

impl UserState {
    /// The user's cells: the inline ones, or the spill once they outgrew
    /// them.
    fn cells(&self) -> &[Cell] {
        match &self.spill {
            Some(spill) => &spill.cells,
            None => &self.cells,
        }
    }

    fn cells_mut(&mut self) -> &mut [Cell] {
        match &mut self.spill {
            Some(spill) => &mut spill.cells,
            None => &mut self.cells,
        }
    }

    /// The cell of resource `i`, moving the cells to a larger spill if the
    /// service gained resources since this user's map was made.
    #[inline]
    fn cell(&mut self, i: usize) -> &mut Cell {
        if i >= self.cells().len() {
            self.spill_to(i + 1);
        }
        &mut self.cells_mut()[i]
    }

    /// Moves the cells to a spill of `len` cells.
    #[cold]
    fn spill_to(&mut self, len: usize) {
        let mut cells = self.cells().to_vec();
        cells.resize(len, EMPTY_CELL);
        self.spill = Some(Box::new(Spill {
            cells: cells.into_boxed_slice(),
        }));
    }

    /// This slot's counts (`previous` false) or the last slot's, zeroed.
    fn take(&mut self, previous: bool) -> Counters {
        let mut c = Counters::default();
        for (i, cell) in self.cells_mut().iter_mut().enumerate() {
            if previous {
                c.consumption[i] = cell.prev_used;
                c.rejection[i] = cell.prev_rejected;
                (cell.prev_used, cell.prev_rejected) = (0, 0);
            } else {
                c.consumption[i] = cell.used;
                c.rejection[i] = cell.rejected;
                (cell.used, cell.rejected) = (0, 0);
            }
        }
        c
    }

    fn is_idle(&self) -> bool {
        self.cells()
            .iter()
            .all(|c| c.used == 0 && c.rejected == 0 && c.prev_used == 0 && c.prev_rejected == 0)
    }

    /// Moves the counters on to `slot`, keeping the last slot's counts for
    /// the reporter.
    #[inline]
    fn roll(&mut self, slot: i64, user: &str, overflow: &Mutex<Overflow>) {
        if self.slot < slot {
            self.roll_on(slot, user, overflow);
        }
    }

    /// [`UserState::roll`] for a user first seen in this slot.
    ///
    /// A collection zeroes the counts it takes, so any count still here is
    /// unreported: either its slot is not collected yet, or it was charged
    /// after its slot was (a request that read the clock before the
    /// boundary and took the lock after the report). Counts the roll cannot
    /// keep in place go to the overflow, which the next collection drains:
    /// none is dropped, and none is reported twice.
    #[inline(never)]
    fn roll_on(&mut self, slot: i64, user: &str, overflow: &Mutex<Overflow>) {
        // Forget rows too old to be read back from their tags.
        for k in 0..ROWS_PER_USER {
            if self.row_version[k] != 0
                && slot - self.row_slot[k].near(self.slot) >= RowTag::MAX_AGE
            {
                self.row_version[k] = 0;
            }
        }
        if self.has_prev {
            // The reporter is more than a slot behind, or the counts came
            // late: keep them aside rather than lose them.
            let previous = self.take(true);
            if !previous.is_zero() {
                set_aside(overflow, user, &previous);
            }
        }
        if self.slot == slot - 1 {
            for c in self.cells_mut() {
                (c.prev_used, c.prev_rejected) = (c.used, c.rejected);
                (c.used, c.rejected) = (0, 0);
            }
            self.has_prev = true;
        } else {
            // A gap of a slot or more: nothing is kept in place (the
            // previous counts are zero, taken above or by a collection).
            let current = self.take(false);
            if !current.is_zero() {
                set_aside(overflow, user, &current);
            }
            self.has_prev = false;
        }
        self.slot = slot;
    }

    fn add(&mut self, resource: ResourceId, amount: i64) {
        let c = self.cell(resource.index());
        c.used = c.used.saturating_add(amount);
    }

    /// Adds an admitted request's fixed costs.
    fn charge(&mut self, costs: &[(ResourceId, i64)]) {
        for &(r, amount) in costs {
            self.add(r, amount);
        }
    }

    fn row(&self, slot: i64, version: u16) -> Option<usize> {
        // A row at least as new as the published version is current: rows
        // are written before their version is published.
        (0..ROWS_PER_USER).find(|&k| {
            self.row_slot[k] == RowTag::of(slot)
                && self.row_version[k] != 0
                && self.row_version[k] >= version
        })
    }

    /// Installs the row for `slot` with `quotas` (by resource index; NaN:
    /// none), replacing any row for that slot. Keeps the current row, or
    /// without one the newest past row (for [`Fallback::LastKnownThenAllow`]),
    /// and the coming rows nearest to now: the current one is never pushed
    /// out by quotas for slots further ahead, and three rows hold what the
    /// central sends (the quotas of the next slot and the one after).
    fn insert_row(&mut self, slot: i64, version: u16, quotas: &[f32], now_slot: i64) {
        // Sources of the new rows, in slot order: an old row or the new one.
        let mut order: [(i64, Option<usize>); ROWS_PER_USER + 1] =
            [(i64::MAX, None); ROWS_PER_USER + 1];
        let mut n = 0;
        for k in 0..ROWS_PER_USER {
            let row = self.row_slot[k].near(now_slot);
            if self.row_version[k] != 0 && row != slot {
                order[n] = (row, Some(k));
                n += 1;
            }
        }
        order[n] = (slot, None);
        n += 1;
        order[..n].sort_unstable_by_key(|&(s, _)| s);
        // The current row, or the newest past one when there is no current
        // one, then the coming ones.
        let due = order[..n].iter().filter(|(s, _)| *s <= now_slot).count();
        let first = due.saturating_sub(1);
        let kept = &order[first..n.min(first + ROWS_PER_USER)];
        if quotas.len() > self.cells().len() {
            self.cell(quotas.len() - 1);
        }
        for (i, cell) in self.cells_mut().iter_mut().enumerate() {
            let old = cell.quota;
            let mut quota = [f32::NAN; ROWS_PER_USER];
            for (k, &(_, src)) in kept.iter().enumerate() {
                quota[k] = match src {
                    Some(j) => old[j],
                    None => quotas.get(i).copied().unwrap_or(f32::NAN),
                };
            }
            cell.quota = quota;
        }
        let old_version = self.row_version;
        self.row_slot = [RowTag(0); ROWS_PER_USER];
        self.row_version = [0; ROWS_PER_USER];
        for (k, &(s, src)) in kept.iter().enumerate() {
            self.row_slot[k] = RowTag::of(s);
            self.row_version[k] = src.map_or(version, |j| old_version[j]);
        }
    }

    /// Applies row `row`: counts rejections (if `record`) and refuses, or
    /// admits and adds `costs`.
    fn decide(
        &mut self,
        row: usize,
        costs: &[(ResourceId, i64)],
        record: bool,
    ) -> (bool, Option<Tightest>) {
        let mut refused: Option<Tightest> = None;
        let mut tightest: Option<Tightest> = None;
        for (i, cell) in self.cells_mut().iter_mut().enumerate() {
            let quota = f64::from(cell.quota[row]);
            if quota.is_nan() {
                continue;
            }
            let used = cell.used;
            let t = Tightest {
                resource: ResourceId(i as u8),
                quota,
                used,
            };
            if quota < 1.0 || used as f64 > quota {
                if record {
                    cell.rejected = cell.rejected.saturating_add(1);
                }
                refused.get_or_insert(t);
            } else if tightest.is_none_or(|b| quota - (used as f64) < b.quota - (b.used as f64)) {
                tightest = Some(t);
            }
        }
        // Shadow mode lets a refused request through, so it consumes.
        let allowed = refused.is_none();
        if allowed || !record {
            self.charge(costs);
        }
        if allowed {
            (true, tightest)
        } else {
            (false, refused)
        }
    }
}

impl ServiceStore {
    /// The service's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    fn current_slot(&self) -> i64 {
        let ms = if self.coarse_clock {
            CoarseClock::now()
        } else {
            self.clock.now_ms()
        };
        self.slot.slot_at(ms)
    }

    /// The id of `resource`, registering it if new.
    ///
    /// Returns `None` when the service already counts [`MAX_RESOURCES`]
    /// resources or the name is empty or longer than 256 bytes.
    pub fn resource(&self, name: &str) -> Option<ResourceId> {
        if let Some(id) = self.find_resource(name) {
            return Some(id);
        }
        let _g = self.register.lock();
        self.resource_locked(name)
    }

    fn find_resource(&self, name: &str) -> Option<ResourceId> {
        let list = self.resources.load();
        list.iter()
            .position(|r| &**r == name)
            .map(|i| ResourceId(i as u8))
    }

    /// The name of a resource id.
    pub fn resource_name(&self, id: ResourceId) -> Option<Arc<str>> {
        self.resources.load().get(id.index()).cloned()
    }

    /// The version of the quota table for `slot`, if one was received.
    fn quota_version(&self, slot: i64) -> Option<u16> {
        let v = self.ring[slot.rem_euclid(QUOTA_RING as i64) as usize].load(Ordering::Acquire);
        // `apply` publishes versions up to `u16::MAX` only.
        (v != 0 && v >> (64 - SLOT_BITS) == slot as u64 & SLOT_MASK)
            .then_some((v & VERSION_MASK) as u16)
    }

    /// The service's users, in a map made at the first use of the store.
    fn user_map(&self) -> &Users {
        self.users
            .get_or_init(|| Users::for_resources(self.resources.load().len()))
    }

    /// `user`'s entry, added if new; `None` when the store is at its key
    /// cap and the user is new.
    #[inline]
    fn lookup<'g, const N: usize>(
        &self,
        users: &'g UserMap<N>,
        guard: &'g Guard<'_>,
        user: &str,
        slot: i64,
    ) -> Option<&'g Entry<N>> {
        match users.get(&Name(user), guard) {
            Some(entry) => Some(entry),
            None => self.add_user(users, guard, user, slot),
        }
    }

    #[cold]
    #[inline(never)]
    fn add_user<'g, const N: usize>(
        &self,
        users: &'g UserMap<N>,
        guard: &'g Guard<'_>,
        user: &str,
        slot: i64,
    ) -> Option<&'g Entry<N>> {
        if self.keys.fetch_add(1, Ordering::Relaxed) >= self.max_keys {
            self.keys.fetch_sub(1, Ordering::Relaxed);
            self.at_cap.increment(1);
            return None;
        }
        let entry = UserLock::new(UserState::new(slot));
        match users.try_insert(user.into(), entry, guard) {
            Ok(entry) => Some(entry),
            Err(e) => {
                // Another thread added it first.
                self.keys.fetch_sub(1, Ordering::Relaxed);
                Some(e.current)
            }
        }
    }

    /// Decides whether `user` may make a request now, with the original
    /// rules (see the [module docs](self)); if so, adds `costs`.
    pub fn admit(
        self: &Arc<Self>,
        user: &str,
        costs: &[(ResourceId, i64)],
        fallback: Fallback,
    ) -> Admission {
        self.admit_inner(user, costs, fallback, true, false)
    }

    /// As [`ServiceStore::admit`], and returns a [`UserHandle`] for amounts
    /// known later. With `record_rejection` false (shadow mode) a refusal is
    /// decided but not counted as a rejection, and the costs are charged
    /// since the request goes through anyway.
    pub fn admit_with_handle(
        self: &Arc<Self>,
        user: &str,
        costs: &[(ResourceId, i64)],
        fallback: Fallback,
        record_rejection: bool,
    ) -> Admission {
        self.admit_inner(user, costs, fallback, record_rejection, true)
    }

    fn admit_inner(
        self: &Arc<Self>,
        user: &str,
        costs: &[(ResourceId, i64)],
        fallback: Fallback,
        record: bool,
        want_handle: bool,
    ) -> Admission {
        let slot = self.current_slot();
        let admission = self.with_entry(user, slot, |st| {
            let decision = self.decide(st, slot, costs, fallback, record);
            let handle = want_handle.then(|| UserHandle {
                service: self.clone(),
                user: user.into(),
            });
            Admission { decision, handle }
        });
        admission.unwrap_or(Admission {
            decision: Decision::fallback(fallback, Basis::AtCap),
            handle: None,
        })
    }

    /// Runs `f` on `user`'s entry (created if new), locked and rolled on to
    /// `slot`; `None` when the store is at its key cap and the user is new.
    fn with_entry<T>(
        &self,
        user: &str,
        slot: i64,
        f: impl FnOnce(&mut UserState) -> T,
    ) -> Option<T> {
        // Only the lookup depends on the map's class: the rest is one copy.
        let users = self.user_map();
        let guard = with_users!(users, map => map.guard());
        let mut st = with_users!(users, map => self.locked(map, &guard, user, slot))?;
        st.roll(slot, user, &self.overflow);
        Some(f(&mut st))
    }

    /// `user`'s state (created if new), locked; `None` when the store is at
    /// its key cap and the user is new.
    #[inline]
    fn locked<'g, const N: usize>(
        &self,
        users: &'g UserMap<N>,
        guard: &'g Guard<'_>,
        user: &str,
        slot: i64,
    ) -> Option<UserGuard<'g>> {
        loop {
            let entry = self.lookup(users, guard, user, slot)?;
            let state: &UserLock<UserState> = entry;
            let st = state.lock();
            if !st.evicted {
                return Some(st);
            }
            // Forgotten by a collect after we found it: drop it from the map
            // if it is still there, and start over with a fresh one.
            drop(st);
            let _ = users.remove_if(user, |_, e| std::ptr::eq(e, entry), guard);
        }
    }

    fn decide(
        &self,
        st: &mut UserState,
        slot: i64,
        costs: &[(ResourceId, i64)],
        fallback: Fallback,
        record: bool,
    ) -> Decision {
        let found = match self.quota_version(slot) {
            Some(v) => Some((slot, v)),
            None => match fallback {
                Fallback::Allow | Fallback::Deny => None,
                Fallback::LastKnownThenAllow(n) | Fallback::LastKnownThenDeny(n) => (1
                    ..=i64::from(n))
                    .map(|back| slot - back)
                    .find_map(|s| self.quota_version(s).map(|v| (s, v))),
            },
        };
        let Some((quota_slot, version)) = found else {
            let d = Decision::fallback(fallback, Basis::Fallback);
            if d.allowed {
                st.charge(costs);
            }
            return d;
        };
        let basis = if quota_slot == slot {
            Basis::Quota
        } else {
            Basis::Fallback
        };
        match st.row(quota_slot, version) {
            Some(row) => {
                let (allowed, tightest) = st.decide(row, costs, record);
                Decision {
                    allowed,
                    basis,
                    tightest,
                }
            }
            None => {
                st.charge(costs);
                Decision {
                    allowed: true,
                    basis: Basis::Unlimited,
                    tightest: None,
                }
            }
        }
    }

    /// Adds `amount` of `resource` for `user` to the current slot, without a
    /// decision. At the key cap the amount is not counted.
    pub fn consume(self: &Arc<Self>, user: &str, resource: ResourceId, amount: i64) {
        let slot = self.current_slot();
        self.with_entry(user, slot, |st| st.add(resource, amount));
    }

    /// Installs one (service, slot) table: `users`, each with its
    /// (resource, quota) pairs, as prost decoded them or read in place.
    fn apply<'a, U, R>(&self, slot: i64, users: U, now_slot: i64)
    where
        U: Iterator<Item = (&'a str, R)> + Clone,
        R: Iterator<Item = (&'a str, f64)>,
    {
        let _g = self.register.lock();
        let Some((idx, published, row_version)) = self.next_version(slot) else {
            return;
        };
        if self.users.get().is_none() {
            // The map's cell class is fixed when it is made: count this
            // table's resources first.
            for (_, resources) in users.clone() {
                for (resource, _) in resources {
                    self.resource_locked(resource);
                }
            }
        }
        let mut quotas = [f32::NAN; MAX_RESOURCES];
        with_users!(self.user_map(), map => {
            let guard = map.guard();
            for (user, resources) in users {
                if user.is_empty() || user.len() > MAX_NAME_LEN {
                    continue;
                }
                quotas.fill(f32::NAN);
                let mut len = 0;
                for (resource, q) in resources {
                    let Some(id) = self.resource_locked(resource) else {
                        continue;
                    };
                    quotas[id.index()] = whole_units(q);
                    len = len.max(id.index() + 1);
                }
                if let Some(mut st) = self.locked(map, &guard, user, now_slot) {
                    st.insert_row(slot, row_version, &quotas[..len], now_slot);
                }
            }
        });
        // Rows first, then the version: readers never see a version whose
        // rows are missing.
        self.ring[idx].store(published, Ordering::Release);
    }

    /// The next version of `slot`'s table: its index in the ring, the
    /// value to publish there once its rows are in, and the rows' version.
    /// `None` (counted and logged) past the rows' 16-bit versions. For a
    /// caller holding `register`.
    fn next_version(&self, slot: i64) -> Option<(usize, u64, u16)> {
        let idx = slot.rem_euclid(QUOTA_RING as i64) as usize;
        let old = self.ring[idx].load(Ordering::Acquire);
        let tag = (slot as u64 & SLOT_MASK) << (64 - SLOT_BITS);
        let version = if old >> (64 - SLOT_BITS) == tag >> (64 - SLOT_BITS) {
            old & VERSION_MASK
        } else {
            0
        } + 1;
        let Ok(row_version) = u16::try_from(version) else {
            // Rows keep 16-bit versions; no central sends 65,535 tables for
            // one slot, and counting on would make older rows read as newer.
            counter!("throttle_quota_ignored_total").increment(1);
            tracing::warn!(service = %self.name, slot, "too many quota tables for one slot; ignored");
            return None;
        };
        Some((idx, tag | version, row_version))
    }

    /// Installs as `slot`'s table the one installed for `from` (a
    /// [`v1::QuotaRef`]): every user with a row of `from`'s table gets the
    /// same quotas for `slot`, as if that table had come again for `slot`.
    /// Returns whether a table for `from` is installed; without one
    /// nothing is.
    fn copy_table(&self, slot: i64, from: i64, now_slot: i64) -> bool {
        let _g = self.register.lock();
        let Some(from_version) = self.quota_version(from) else {
            return false;
        };
        if slot == from {
            return true;
        }
        let Some((idx, published, row_version)) = self.next_version(slot) else {
            return true;
        };
        if let Some(users) = self.users.get() {
            with_users!(users, map => {
                let users = map.pin();
                let mut quotas = [f32::NAN; MAX_RESOURCES];
                for (_, entry) in users.iter() {
                    let state: &UserLock<UserState> = entry;
                    let mut st = state.lock();
                    let Some(k) = st.row(from, from_version).filter(|_| !st.evicted) else {
                        continue;
                    };
                    let cells = st.cells();
                    let len = cells.len().min(MAX_RESOURCES);
                    for (q, cell) in quotas.iter_mut().zip(cells) {
                        let rows = cell.quota;
                        *q = rows[k];
                    }
                    st.insert_row(slot, row_version, &quotas[..len], now_slot);
                }
            });
        }
        self.ring[idx].store(published, Ordering::Release);
        true
    }

    /// [`ServiceStore::resource`] for a caller already holding `register`.
    fn resource_locked(&self, name: &str) -> Option<ResourceId> {
        if let Some(id) = self.find_resource(name) {
            return Some(id);
        }
        if name.is_empty() || name.len() > MAX_NAME_LEN {
            return None;
        }
        let mut list = Vec::clone(&self.resources.load());
        if list.len() >= MAX_RESOURCES {
            counter!("throttle_resources_over_limit_total", "service" => self.name.to_string())
                .increment(1);
            tracing::warn!(service = %self.name, resource = name, max = MAX_RESOURCES, "too many resources; not counted");
            return None;
        }
        list.push(name.into());
        let id = ResourceId((list.len() - 1) as u8);
        self.resources.store(Arc::new(list));
        Some(id)
    }

    /// Whether a quota table for `slot` has been received.
    pub fn has_quota(&self, slot: i64) -> bool {
        self.quota_version(slot).is_some()
    }

    /// The resources a user's counters have room for in its map node, fixed
    /// at the service's first user (`None` before it); a user counting more
    /// moves its counters to a separate allocation.
    pub fn cells_per_user(&self) -> Option<usize> {
        self.users.get().map(Users::class)
    }

    /// Number of users tracked.
    pub fn users(&self) -> usize {
        self.users.get().map_or(0, Users::len)
    }

    /// Drains `slot` (and older) into `report`, as prost writes a
    /// [`v1::Usage`]: users and their resources in name order, each user
    /// once.
    fn collect_into(&self, slot: i64, report: &mut ReportEncoder, packed: bool) {
        // Each user's name, copied out of the map, and counts; sorted by
        // name through a list of small keys rather than moving the counts.
        let mut users = String::new();
        let mut counts: Vec<Counters> = Vec::new();
        let mut order: Vec<(usize, usize, usize)> = Vec::new();
        self.drain(slot, |user, c| {
            order.push((users.len(), user.len(), counts.len()));
            users.push_str(user);
            counts.push(*c);
        });
        // Loaded after the counts are taken: any resource they count is
        // registered by then.
        let names = self.resources.load();
        let mut by_name: Vec<usize> = (0..names.len()).collect();
        by_name.sort_by(|&a, &b| names[a].cmp(&names[b]));
        let name = |&(start, len, _): &(usize, usize, usize)| {
            users.get(start..start + len).unwrap_or_default()
        };
        order.sort_unstable_by(|a, b| name(a).cmp(name(b)));
        let (mut consumption, mut rejection) = if packed {
            let sorted = || by_name.iter().map(|&r| &*names[r]);
            (
                UsageEncoder::packed(sorted()),
                UsageEncoder::packed(sorted()),
            )
        } else {
            (UsageEncoder::new(), UsageEncoder::new())
        };
        let mut totals = Totals::default();
        let mut order = order.iter().peekable();
        while let Some(first) = order.next() {
            // A user's counts set aside by a roll come apart from the rest.
            let mut c = counts[first.2];
            while let Some(more) = order.next_if(|next| name(next) == name(first)) {
                c.merge(&counts[more.2]);
            }
            totals.add(&c, 0..names.len());
            let user = name(first);
            let used = by_name.iter().filter(|&&r| c.consumption[r] != 0);
            if used.clone().next().is_some() {
                consumption.user(user, used.map(|&r| (&*names[r], c.consumption[r])));
            }
            let refused = by_name.iter().filter(|&&r| c.rejection[r] != 0);
            if refused.clone().next().is_some() {
                rejection.user(
                    user,
                    refused.map(|&r| (&*names[r], i64::from(c.rejection[r]))),
                );
            }
        }
        report.service(&self.name, &consumption, &rejection);
        totals.count(&self.name, &names);
    }

    /// Takes every user's counts of `slot` and before, and the overflow's,
    /// giving each to `add` (a user may come twice: from its cells and
    /// from the overflow); forgets users idle since `slot - 1`.
    fn drain(&self, slot: i64, mut add: impl FnMut(&str, &Counters)) {
        with_users!(self.user_map(), map => {
            let users = map.pin();
            let mut evict = Vec::new();
            for (user, entry) in users.iter() {
                let state: &UserLock<UserState> = entry;
                let mut st = state.lock();
                let mut taken = Counters::default();
                if st.slot <= slot {
                    taken = st.take(false);
                }
                if !st.has_prev || st.slot - 1 <= slot {
                    taken.merge(&st.take(true));
                    st.has_prev = false;
                }
                if !taken.is_zero() {
                    add(user, &taken);
                }
                let idle = st.slot < slot - 1
                    && st.is_idle()
                    && (0..ROWS_PER_USER)
                        .all(|k| st.row_version[k] == 0 || st.row_slot[k].near(slot) <= slot);
                if idle {
                    st.evicted = true;
                    // The address names this entry, not a later one: the map
                    // frees no node while `users` is pinned.
                    evict.push((user, std::ptr::from_ref(entry)));
                }
            }
            for (user, c) in std::mem::take(&mut *self.overflow.lock()) {
                add(&user, &c);
            }
            for (user, entry) in evict {
                if users
                    .remove_if(user.as_str(), |_, e| std::ptr::eq(e, entry))
                    .ok()
                    .flatten()
                    .is_some()
                {
                    self.keys.fetch_sub(1, Ordering::Relaxed);
                }
            }
        });
    }
}

/// What a collection took per resource, for the `throttle_consumed_total`
/// and `throttle_rejected_total` metrics.
#[derive(Default)]
struct Totals {
    consumed: [i64; MAX_RESOURCES],
    rejected: [i64; MAX_RESOURCES],
}

impl Totals {
    fn add(&mut self, c: &Counters, resources: std::ops::Range<usize>) {
        for i in resources.take(MAX_RESOURCES) {
            self.consumed[i] = self.consumed[i].saturating_add(c.consumption[i]);
            self.rejected[i] = self.rejected[i].saturating_add(i64::from(c.rejection[i]));
        }
    }

    fn count(&self, service: &str, names: &[Arc<str>]) {
        for (totals, metric) in [
            (&self.consumed, "throttle_consumed_total"),
            (&self.rejected, "throttle_rejected_total"),
        ] {
            for (name, &total) in names.iter().zip(totals).filter(|(_, t)| **t > 0) {
                counter!(metric, "service" => service.to_string(), "resource" => name.to_string())
                    .increment(total as u64);
            }
        }
    }
}

struct Shared {
    clock: Arc<dyn Clock>,
    slot: SlotLength,
    keys: Arc<AtomicUsize>,
    max_keys: usize,
    services: Mutex<Vec<Arc<ServiceStore>>>,
    /// The number of services, sent at each registration: a reporter
    /// learns of a service registered after its Hello without polling.
    registered: tokio::sync::watch::Sender<usize>,
}

/// The node's store: one [`ServiceStore`] per service. Clones share it.
#[derive(Clone)]
pub struct SlotStore {
    shared: Arc<Shared>,
}

impl fmt::Debug for SlotStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SlotStore")
            .field("slot_ms", &self.shared.slot.as_ms())
            .field("keys", &self.shared.keys.load(Ordering::Relaxed))
            .field("max_keys", &self.shared.max_keys)
            .field("services", &self.shared.services.lock())
            .finish()
    }
}

/// Builds a [`SlotStore`].
#[derive(Debug)]
pub struct StoreBuilder {
    clock: Arc<dyn Clock>,
    slot: SlotLength,
    max_keys: usize,
}

impl Default for SlotStore {
    fn default() -> Self {
        Self::builder().build()
    }
}

impl SlotStore {
    /// A builder: the system clock (read through [`CoarseClock`]), 1 s
    /// slots, 1,000,000 keys.
    pub fn builder() -> StoreBuilder {
        StoreBuilder {
            clock: Arc::new(CoarseClock),
            slot: SlotLength::SECOND,
            max_keys: 1_000_000,
        }
    }

    /// The store's clock.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.shared.clock
    }

    /// The slot length.
    pub fn slot_length(&self) -> SlotLength {
        self.shared.slot
    }

    /// The current slot by the store's clock.
    pub fn current_slot(&self) -> i64 {
        self.shared.slot.slot_at(self.shared.clock.now_ms())
    }

    /// The store of `name`, created on first use.
    pub fn service(&self, name: &str) -> Arc<ServiceStore> {
        let mut services = self.shared.services.lock();
        if let Some(s) = named(&services, name) {
            return s.clone();
        }
        let s = Arc::new(ServiceStore {
            name: name.into(),
            clock: self.shared.clock.clone(),
            coarse_clock: self.shared.clock.is_coarse(),
            slot: self.shared.slot,
            keys: self.shared.keys.clone(),
            max_keys: self.shared.max_keys,
            users: OnceLock::new(),
            resources: ArcSwap::from_pointee(Vec::new()),
            register: Mutex::new(()),
            ring: std::array::from_fn(|_| AtomicU64::new(0)),
            overflow: Mutex::new(Overflow::default()),
            at_cap: counter!("throttle_keys_at_cap_total", "service" => name.to_string()),
        });
        services.push(s.clone());
        self.shared.registered.send_replace(services.len());
        s
    }

    /// A receiver that changes whenever a service is registered; its value
    /// is the number of services.
    pub(crate) fn watch_services(&self) -> tokio::sync::watch::Receiver<usize> {
        self.shared.registered.subscribe()
    }

    /// How many services are registered (they are never removed).
    pub fn service_count(&self) -> usize {
        self.shared.services.lock().len()
    }

    /// Names of the services in the store.
    pub fn service_names(&self) -> Vec<String> {
        self.shared
            .services
            .lock()
            .iter()
            .map(|s| s.name.to_string())
            .collect()
    }

    /// Users tracked over all services.
    pub fn keys(&self) -> usize {
        self.shared.keys.load(Ordering::Relaxed)
    }

    /// Drains `slot` (and any older slot not yet collected) into the report
    /// sent at the start of `slot + 1`, and forgets users idle since
    /// `slot - 1`. Every service appears in both maps, possibly empty.
    ///
    /// The report [`SlotStore::collect_encoded`] writes, decoded: the
    /// reporter sends those bytes, and this reads them back as a message
    /// for tests, simulations and tools.
    pub fn collect(&self, slot: i64) -> v1::Report {
        let bytes = self.collect_encoded(slot, "");
        v1::Report::decode(bytes).unwrap_or_else(|e| {
            // The encoders write what prost reads (proptests in `wire` and
            // here): this would be a bug, not input.
            counter!("throttle_reports_dropped_total").increment(1);
            tracing::error!(error = %e, slot, "collected report does not decode; dropped");
            v1::Report {
                slot_number: slot + 1,
                ..v1::Report::default()
            }
        })
    }

    /// The encoded [`v1::Report`] of `node_id` (the bytes prost writes for
    /// it, with no message built): what the reporter sends. See
    /// [`SlotStore::collect`].
    pub fn collect_encoded(&self, slot: i64, node_id: &str) -> Bytes {
        self.collect_encoded_as(slot, node_id, false)
    }

    /// [`SlotStore::collect_encoded`], with each service's usage written as
    /// [`v1::PackedUsage`]s if `packed` (for a central node whose Welcome
    /// accepts [`PACKED_REPORTS`](throttle_proto::PACKED_REPORTS)).
    pub fn collect_encoded_as(&self, slot: i64, node_id: &str, packed: bool) -> Bytes {
        let mut services: Vec<Arc<ServiceStore>> = self.shared.services.lock().clone();
        // A report's maps are in key order, as prost writes them.
        services.sort_by(|a, b| a.name.cmp(&b.name));
        let mut report = ReportEncoder::new();
        for s in services {
            s.collect_into(slot, &mut report, packed);
        }
        report.finish(node_id, slot + 1)
    }

    /// Installs a quota from the central node: each (service, slot) table
    /// replaces any earlier one for that slot, then each of its
    /// [`refs`](v1::Quota::refs) installs a copy of a table already
    /// installed. Slots more than 16 slots in the past or future are
    /// ignored.
    pub fn apply_quota(&self, quota: &v1::Quota) {
        let now = self.current_slot();
        for (name, sq) in &quota.services {
            for (&slot, users) in &sq.slots {
                let users = users.users.iter().map(|(user, rq)| {
                    let resources = rq.resources.iter().map(|(r, &q)| (r.as_str(), q));
                    (user.as_str(), resources)
                });
                self.apply_table(name, slot, users, now);
            }
        }
        for r in &quota.refs {
            self.apply_ref(&r.service, r.slot, r.from_slot, now);
        }
    }

    /// [`SlotStore::apply_quota`] for a quota read in place, as the
    /// reporter receives it: the same tables installed, without decoding
    /// them into maps first.
    pub fn apply_raw_quota(&self, quota: &RawQuota) {
        let now = self.current_slot();
        for (name, slot, users) in quota.tables() {
            self.apply_table(name, slot, users, now);
        }
        for (name, slot, from) in quota.refs() {
            self.apply_ref(name, slot, from, now);
        }
    }

    fn apply_table<'a, U, R>(&self, name: &str, slot: i64, users: U, now: i64)
    where
        U: Iterator<Item = (&'a str, R)> + Clone,
        R: Iterator<Item = (&'a str, f64)>,
    {
        if self.installable(name, slot, now) {
            self.service(name).apply(slot, users, now);
        }
    }

    /// Installs (`name`, `slot`) as a copy of (`name`, `from`), a
    /// [`v1::QuotaRef`]. A ref to a table this store does not hold (the
    /// central node sends one only after the table, on the same stream)
    /// installs nothing, so the slot goes to the [`Fallback`]: counted and
    /// logged.
    fn apply_ref(&self, name: &str, slot: i64, from: i64, now: i64) {
        if !self.installable(name, slot, now) {
            return;
        }
        let service = named(&self.shared.services.lock(), name).cloned();
        if !service.is_some_and(|s| s.copy_table(slot, from, now)) {
            counter!("throttle_quota_refs_missing_total").increment(1);
            tracing::warn!(service = %name, slot, from, "quota refers to a table this node does not hold; ignored");
        }
    }

    /// Whether a table of (`name`, `slot`) may be installed at slot `now`:
    /// a valid name, a slot within the store's reach (else counted).
    fn installable(&self, name: &str, slot: i64, now: i64) -> bool {
        if name.is_empty() || name.len() > MAX_NAME_LEN {
            return false;
        }
        if slot.abs_diff(now) >= QUOTA_RING as u64 {
            counter!("throttle_quota_ignored_total").increment(1);
            tracing::debug!(service = %name, slot, now, "quota for a distant slot ignored");
            return false;
        }
        true
    }
}

/// The store of `name` among `services`.
fn named<'s>(services: &'s [Arc<ServiceStore>], name: &str) -> Option<&'s Arc<ServiceStore>> {
    services.iter().find(|s| &*s.name == name)
}

impl StoreBuilder {
    /// The clock slots are read from (default: [`CoarseClock`], the system
    /// clock at the kernel's last tick).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// The slot length; must match the central node's (default 1 s).
    pub fn slot(mut self, slot: SlotLength) -> Self {
        self.slot = slot;
        self
    }

    /// Most users tracked over all services (default 1,000,000).
    pub fn max_keys(mut self, max: usize) -> Self {
        self.max_keys = max;
        self
    }

    /// The store.
    pub fn build(self) -> SlotStore {
        SlotStore {
            shared: Arc::new(Shared {
                clock: self.clock,
                slot: self.slot,
                keys: Arc::new(AtomicUsize::new(0)),
                max_keys: self.max_keys,
                services: Mutex::new(Vec::new()),
                registered: tokio::sync::watch::Sender::new(0),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use throttle_proto::legacy::quota_from_json;
    use throttle_proto::slot::ManualClock;

    const T: i64 = 100_000; // slot 100

    struct Fixture {
        clock: Arc<ManualClock>,
        store: SlotStore,
        front: Arc<ServiceStore>,
        requests: ResourceId,
        down: ResourceId,
    }

    fn fixture() -> Fixture {
        let clock = Arc::new(ManualClock::new(T));
        let store = SlotStore::builder().clock(clock.clone()).build();
        let front = store.service("front");
        let requests = front.resource("requests").unwrap();
        let down = front.resource("traffic_down").unwrap();
        Fixture {
            clock,
            store,
            front,
            requests,
            down,
        }
    }

    impl Fixture {
        fn quota(&self, json: &str) {
            self.store.apply_quota(&quota_from_json(json).unwrap());
        }

        fn admit(&self, user: &str, fallback: Fallback) -> Decision {
            self.front
                .admit(user, &[(self.requests, 1)], fallback)
                .decision
        }
    }

    fn amount(usage: &BTreeMap<String, v1::Usage>, user: &str, resource: &str) -> i64 {
        usage["front"]
            .users
            .get(user)
            .and_then(|a| a.resources.get(resource))
            .copied()
            .unwrap_or(0)
    }

    use std::collections::BTreeMap;

    #[test]
    fn no_quota_for_the_slot_is_fail_open_by_default() {
        let f = fixture();
        let d = f.admit("alice", Fallback::Allow);
        assert!(d.is_allowed());
        assert_eq!(d.basis, Basis::Fallback);
        // A quota for another slot does not count for this one.
        f.quota(r#"{"front": {"101": {"alice": {"requests": 0.0}}}}"#);
        assert!(f.admit("alice", Fallback::Allow).is_allowed());
    }

    /// A ref installs, for its slot, the table the store holds for its
    /// `from_slot`, deciding as that table sent again for the slot would;
    /// read in place or as prost decodes it. A ref to a table the store
    /// does not hold installs nothing.
    #[test]
    fn a_quota_ref_installs_the_table_it_names_for_its_slot() {
        const TABLE: &str =
            r#"{"alice": {"requests": 2.0, "traffic_down": 5.0}, "bob": {"requests": 0.0}}"#;
        let refer = |slot: i64, from_slot: i64| v1::Quota {
            refs: vec![v1::QuotaRef {
                service: "front".into(),
                slot,
                from_slot,
            }],
            ..v1::Quota::default()
        };
        let sent = fixture();
        let by_ref = fixture();
        let in_place = fixture();
        // An older table for slot 101, which the new one replaces.
        for f in [&sent, &by_ref, &in_place] {
            f.quota(&format!(
                r#"{{"front": {{"100": {TABLE}, "101": {{"carol": {{"requests": 0.0}}}}}}}}"#
            ));
        }
        sent.quota(&format!(r#"{{"front": {{"101": {TABLE}}}}}"#));
        by_ref.store.apply_quota(&refer(101, 100));
        let bytes = refer(101, 100).encode_to_vec();
        in_place
            .store
            .apply_raw_quota(&RawQuota::parse(&bytes).unwrap());
        let decisions = |f: &Fixture| {
            f.clock.set(T + 1_000);
            ["alice", "alice", "alice", "alice", "bob", "carol", "dave"]
                .map(|user| {
                    let d = f.admit(user, Fallback::Deny);
                    (d.is_allowed(), d.basis)
                })
                .to_vec()
        };
        let want = decisions(&sent);
        assert_eq!(
            want,
            [
                (true, Basis::Quota),
                (true, Basis::Quota),
                (true, Basis::Quota),
                (false, Basis::Quota),
                (false, Basis::Quota),
                (true, Basis::Unlimited),
                (true, Basis::Unlimited),
            ]
        );
        assert_eq!(decisions(&by_ref), want);
        assert_eq!(decisions(&in_place), want);

        // Slot 99 has no table here: its ref installs nothing for 102.
        by_ref.store.apply_quota(&refer(102, 99));
        assert!(!by_ref.front.has_quota(102));
        // A ref to its own slot keeps the table as it is.
        by_ref.store.apply_quota(&refer(101, 101));
        assert_eq!(by_ref.admit("bob", Fallback::Allow).basis, Basis::Quota);
    }

    #[test]
    fn no_row_for_the_user_means_unlimited() {
        let f = fixture();
        f.quota(r#"{"front": {"100": {"bob": {"requests": 0.0}}}}"#);
        let d = f.admit("alice", Fallback::Deny);
        assert!(d.is_allowed());
        assert_eq!(d.basis, Basis::Unlimited);
        assert!(!f.admit("bob", Fallback::Allow).is_allowed());
    }

    #[test]
    fn quota_below_one_refuses_and_counts_a_rejection() {
        let f = fixture();
        f.quota(r#"{"front": {"100": {"alice": {"requests": 0.9}}}}"#);
        let d = f.admit("alice", Fallback::Allow);
        assert!(!d.is_allowed());
        assert_eq!(d.tightest.unwrap().resource, f.requests);
        f.clock.set(T + 1_000);
        let r = f.store.collect(100);
        assert_eq!(amount(&r.rejection, "alice", "requests"), 1);
        assert_eq!(amount(&r.consumption, "alice", "requests"), 0);
    }

    #[test]
    fn consumption_above_the_quota_refuses() {
        let f = fixture();
        f.quota(r#"{"front": {"100": {"alice": {"requests": 100.0, "traffic_down": 1000.0}}}}"#);
        let h = f
            .front
            .admit_with_handle("alice", &[(f.requests, 1)], Fallback::Allow, true);
        assert!(h.decision.is_allowed());
        let handle = h.handle.unwrap();
        handle.consume(f.down, 1000);
        // 1000 is not above 1000: still allowed.
        assert!(f.admit("alice", Fallback::Allow).is_allowed());
        handle.consume(f.down, 1);
        let d = f.admit("alice", Fallback::Allow);
        assert!(!d.is_allowed());
        assert_eq!(d.basis, Basis::Quota);
        assert_eq!(d.tightest.unwrap().resource, f.down);
        assert_eq!(d.tightest.unwrap().used, 1001);
        f.clock.set(T + 1_050);
        let r = f.store.collect(100);
        assert_eq!(amount(&r.rejection, "alice", "traffic_down"), 1);
        assert_eq!(amount(&r.rejection, "alice", "requests"), 0);
        assert_eq!(amount(&r.consumption, "alice", "requests"), 2);
        assert_eq!(amount(&r.consumption, "alice", "traffic_down"), 1001);
    }

    #[test]
    fn every_exhausted_resource_counts_a_rejection() {
        let f = fixture();
        f.quota(r#"{"front": {"100": {"alice": {"requests": 0.0, "traffic_down": 0.5}}}}"#);
        assert!(!f.admit("alice", Fallback::Allow).is_allowed());
        f.clock.set(T + 1_000);
        let r = f.store.collect(100);
        assert_eq!(amount(&r.rejection, "alice", "requests"), 1);
        assert_eq!(amount(&r.rejection, "alice", "traffic_down"), 1);
    }

    #[test]
    fn a_newer_table_for_a_slot_replaces_the_older() {
        let f = fixture();
        f.quota(r#"{"front": {"100": {"alice": {"requests": 0.0}, "bob": {"requests": 0.0}}}}"#);
        assert!(!f.admit("bob", Fallback::Allow).is_allowed());
        f.quota(r#"{"front": {"100": {"alice": {"requests": 5.0}}}}"#);
        assert!(f.admit("alice", Fallback::Allow).is_allowed());
        let d = f.admit("bob", Fallback::Allow);
        assert!(d.is_allowed(), "bob is absent from the newer table");
        assert_eq!(d.basis, Basis::Unlimited);
    }

    #[test]
    fn fallback_policies() {
        let f = fixture();
        assert!(!f.admit("alice", Fallback::Deny).is_allowed());
        f.quota(r#"{"front": {"100": {"alice": {"requests": 0.0}}}}"#);
        f.clock.set(T + 2_000); // slot 102: no table
        assert!(f.admit("alice", Fallback::Allow).is_allowed());
        let d = f.admit("alice", Fallback::LastKnownThenAllow(3));
        assert!(!d.is_allowed(), "slot 100's quota still applies");
        assert_eq!(d.basis, Basis::Fallback);
        f.clock.set(T + 4_000); // slot 104: 100 is 4 slots back
        assert!(
            f.admit("alice", Fallback::LastKnownThenAllow(3))
                .is_allowed()
        );
        assert!(
            !f.admit("alice", Fallback::LastKnownThenDeny(3))
                .is_allowed()
        );
        assert!(
            !f.admit("alice", Fallback::LastKnownThenDeny(4))
                .is_allowed()
        );
    }

    #[test]
    fn collect_drains_the_slot_and_keeps_the_next() {
        let f = fixture();
        f.admit("alice", Fallback::Allow);
        f.clock.set(T + 1_010); // slot 101 before the reporter runs
        f.admit("alice", Fallback::Allow);
        f.admit("alice", Fallback::Allow);
        let r = f.store.collect(100);
        assert_eq!(r.slot_number, 101);
        assert_eq!(amount(&r.consumption, "alice", "requests"), 1);
        let r = f.store.collect(100);
        assert_eq!(
            amount(&r.consumption, "alice", "requests"),
            0,
            "collected once"
        );
        f.clock.set(T + 2_050);
        let r = f.store.collect(101);
        assert_eq!(amount(&r.consumption, "alice", "requests"), 2);
        assert!(r.rejection["front"].users.is_empty());
    }

    #[test]
    fn counts_of_a_late_collection_are_not_lost() {
        let f = fixture();
        f.admit("alice", Fallback::Allow);
        f.clock.set(T + 1_000);
        f.admit("alice", Fallback::Allow);
        f.clock.set(T + 2_000);
        f.admit("alice", Fallback::Allow);
        // Reporter stalled for two slots: the first slot rolled into the overflow.
        let r = f.store.collect(101);
        assert_eq!(amount(&r.consumption, "alice", "requests"), 2);
        let r = f.store.collect(102);
        assert_eq!(amount(&r.consumption, "alice", "requests"), 1);
    }

    /// With nothing collecting (a store without a reporter), a user's
    /// counts roll into the overflow every slot: they add to one entry per
    /// user there, rather than one per user per slot without end, and the
    /// first collection still reports every one of them.
    #[test]
    fn uncollected_slots_keep_one_overflow_entry_per_user() {
        let f = fixture();
        for slot in 0..1_000 {
            f.clock.set(T + slot * 1_000);
            f.admit("alice", Fallback::Allow);
            f.admit("bob", Fallback::Allow);
        }
        assert_eq!(f.front.overflow.lock().len(), 2);
        // Slot 1,099's counts are still in alice's cells; every earlier
        // slot's is in the overflow, and this collection takes both.
        let r = f.store.collect(100 + 999);
        assert_eq!(amount(&r.consumption, "alice", "requests"), 1_000);
        assert_eq!(amount(&r.consumption, "bob", "requests"), 1_000);
        assert!(f.front.overflow.lock().is_empty());
    }

    /// A request that read the clock in slot 100 and took the user's lock
    /// only after slot 100 was collected (a thread preempted for longer
    /// than the report delay, or a clock stepped back) charges slot 100
    /// late: the next report carries it, and the next roll must not drop it.
    #[test]
    fn a_charge_after_its_slot_was_collected_is_reported_later() {
        let f = fixture();
        // alice's request at `ms` past slot 100's start.
        let admit_at = |ms| {
            f.clock.set(T + ms);
            f.admit("alice", Fallback::Allow);
        };
        // Slot `slot`'s report, collected at `ms`.
        let requests = |ms, slot| {
            f.clock.set(T + ms);
            amount(&f.store.collect(slot).consumption, "alice", "requests")
        };
        admit_at(0);
        assert_eq!(requests(1_050, 100), 1);
        // The late request, still in slot 100, then one in slot 101.
        admit_at(999);
        admit_at(1_100);
        assert_eq!(requests(2_050, 101), 2);
        // Late in the slot before the last one collected, rolled on over a
        // gap: also carried.
        admit_at(1_999);
        admit_at(4_000);
        assert_eq!(requests(5_050, 104), 2);
    }

    #[test]
    fn every_service_is_in_the_report() {
        let f = fixture();
        f.store.service("storage");
        let r = f.store.collect(99);
        assert!(r.consumption.contains_key("storage") && r.rejection.contains_key("storage"));
        assert!(r.consumption.contains_key("front") && r.rejection.contains_key("front"));
    }

    #[test]
    fn idle_users_are_forgotten() {
        let f = fixture();
        f.admit("alice", Fallback::Allow);
        assert_eq!(f.store.keys(), 1);
        f.clock.set(T + 1_000);
        f.store.collect(100);
        assert_eq!(f.store.keys(), 1, "seen in slot 100");
        f.clock.set(T + 2_000);
        f.store.collect(101);
        assert_eq!(f.store.keys(), 1);
        f.clock.set(T + 3_000);
        f.store.collect(102);
        assert_eq!(f.store.keys(), 0);
        assert_eq!(f.front.users(), 0);
        // A forgotten user comes back as new.
        f.admit("alice", Fallback::Allow);
        assert_eq!(f.store.keys(), 1);
    }

    #[test]
    fn a_handle_outliving_eviction_still_counts() {
        let f = fixture();
        let h = f
            .front
            .admit_with_handle("alice", &[], Fallback::Allow, true)
            .handle
            .unwrap();
        f.clock.set(T + 3_000);
        f.store.collect(100);
        f.store.collect(101);
        f.store.collect(102);
        assert_eq!(f.store.keys(), 0);
        h.consume(f.down, 7);
        f.clock.set(T + 4_000);
        let r = f.store.collect(103);
        assert_eq!(amount(&r.consumption, "alice", "traffic_down"), 7);
    }

    #[test]
    fn the_key_cap_hands_new_users_to_the_fallback() {
        let clock = Arc::new(ManualClock::new(T));
        let store = SlotStore::builder().clock(clock).max_keys(2).build();
        let front = store.service("front");
        let r = front.resource("requests").unwrap();
        for u in ["a", "b"] {
            assert_eq!(
                front.admit(u, &[(r, 1)], Fallback::Deny).decision.basis,
                Basis::Fallback
            );
        }
        let d = front.admit("c", &[(r, 1)], Fallback::Deny).decision;
        assert_eq!(d.basis, Basis::AtCap);
        assert!(!d.is_allowed());
        assert!(
            front
                .admit("c", &[(r, 1)], Fallback::Allow)
                .decision
                .is_allowed()
        );
        assert_eq!(store.keys(), 2);
        // Known users are still tracked.
        assert_eq!(
            front.admit("a", &[(r, 1)], Fallback::Deny).decision.basis,
            Basis::Fallback
        );
    }

    #[test]
    fn resources_are_capped_per_service() {
        let f = fixture();
        for i in 2..MAX_RESOURCES {
            assert!(f.front.resource(&format!("r{i}")).is_some());
        }
        assert_eq!(f.front.resource("one_too_many"), None);
        assert_eq!(f.front.resource(""), None);
        assert_eq!(f.front.resource("requests"), Some(f.requests));
        // A quota naming an unknown resource beyond the cap is ignored, the rest applies.
        f.quota(r#"{"front": {"100": {"alice": {"requests": 0.0, "zzz": 0.0}}}}"#);
        assert!(!f.admit("alice", Fallback::Allow).is_allowed());
    }

    #[test]
    fn quotas_for_many_coming_slots_keep_the_current_one() {
        let f = fixture();
        let slots: Vec<String> = (99..112)
            .map(|s| format!(r#""{s}": {{"alice": {{"requests": 0.0}}}}"#))
            .collect();
        f.quota(&format!(r#"{{"front": {{{}}}}}"#, slots.join(",")));
        let d = f.admit("alice", Fallback::Allow);
        assert!(!d.is_allowed() && d.basis == Basis::Quota, "{d:?}");
        f.clock.set(T + 2_000);
        assert!(
            !f.admit("alice", Fallback::Allow).is_allowed(),
            "slot 102 kept too"
        );
    }

    #[test]
    fn distant_or_malformed_quotas_are_ignored() {
        let f = fixture();
        f.quota(r#"{"front": {"200": {"alice": {"requests": 0.0}}}}"#);
        f.quota(r#"{"": {"100": {"alice": {"requests": 0.0}}}}"#);
        assert_eq!(f.admit("alice", Fallback::Allow).basis, Basis::Fallback);
        let mut q = quota_from_json(r#"{"front": {"100": {"alice": {"requests": 5.0}}}}"#).unwrap();
        q.services
            .get_mut("front")
            .unwrap()
            .slots
            .get_mut(&100)
            .unwrap()
            .users
            .get_mut("alice")
            .unwrap()
            .resources
            .insert("requests".into(), f64::NAN);
        f.store.apply_quota(&q);
        assert!(
            !f.admit("alice", Fallback::Allow).is_allowed(),
            "NaN counts as no quota left"
        );
    }

    #[test]
    fn shadow_mode_decides_without_counting_rejections() {
        let f = fixture();
        f.quota(r#"{"front": {"100": {"alice": {"requests": 0.0}}}}"#);
        let a = f
            .front
            .admit_with_handle("alice", &[(f.requests, 1)], Fallback::Allow, false);
        assert!(!a.decision.is_allowed());
        f.clock.set(T + 1_000);
        let r = f.store.collect(100);
        assert_eq!(amount(&r.rejection, "alice", "requests"), 0);
    }

    #[test]
    fn resources_registered_after_the_first_user_spill_and_count() {
        let f = fixture();
        // The map is made at the first user, for the two resources then known.
        assert_eq!(f.front.cells_per_user(), None);
        assert!(f.admit("alice", Fallback::Allow).is_allowed());
        assert_eq!(f.front.cells_per_user(), Some(2));
        let late: Vec<ResourceId> = (0..3)
            .map(|i| f.front.resource(&format!("late{i}")).unwrap())
            .collect();
        let a = f
            .front
            .admit_with_handle("alice", &[(f.requests, 1)], Fallback::Allow, true);
        let handle = a.handle.unwrap();
        handle.consume(f.down, 7);
        handle.consume(late[2], 5);
        // A quota naming a late resource refuses by it.
        f.quota(r#"{"front": {"100": {"alice": {"requests": 10.0, "late1": 0.0}}}}"#);
        let d = f.admit("alice", Fallback::Allow);
        assert_eq!(d.tightest.map(|t| t.resource), Some(late[1]), "{d:?}");
        assert!(!d.is_allowed());
        // A user first seen now starts with inline cells and spills too.
        f.front.consume("bob", late[0], 3);
        f.clock.set(T + 1_000);
        let r = f.store.collect(100);
        assert_eq!(amount(&r.consumption, "alice", "requests"), 2);
        assert_eq!(amount(&r.consumption, "alice", "traffic_down"), 7);
        assert_eq!(amount(&r.consumption, "alice", "late2"), 5);
        assert_eq!(amount(&r.rejection, "alice", "late1"), 1);
        assert_eq!(amount(&r.consumption, "bob", "late0"), 3);
    }

    #[test]
    fn a_quota_table_first_sizes_the_map_to_its_resources() {
        let clock = Arc::new(ManualClock::new(T));
        let store = SlotStore::builder().clock(clock).build();
        store.apply_quota(
            &quota_from_json(r#"{"api": {"100": {"carol": {"a": 1.0, "b": 1.0, "c": 1.0}}}}"#)
                .unwrap(),
        );
        let api = store.service("api");
        assert_eq!(api.cells_per_user(), Some(3));
        assert_eq!(api.users(), 1);
    }

    #[test]
    fn a_slot_takes_at_most_65535_quota_tables() {
        let f = fixture();
        let q = |quota: f64| {
            quota_from_json(&format!(
                r#"{{"front": {{"100": {{"alice": {{"requests": {quota:.1}}}}}}}}}"#
            ))
            .unwrap()
        };
        let open = q(100.0);
        for _ in 1..u16::MAX {
            f.store.apply_quota(&open);
        }
        f.store.apply_quota(&q(0.0));
        assert!(
            !f.admit("alice", Fallback::Allow).is_allowed(),
            "the 65,535th applies"
        );
        f.store.apply_quota(&open);
        assert!(
            !f.admit("alice", Fallback::Allow).is_allowed(),
            "the 65,536th is ignored"
        );
    }

    #[test]
    fn a_user_of_four_resources_is_one_224_byte_allocation() {
        // papaya's node is the key and the value; the allocator adds 8 bytes
        // and rounds up to 16.
        let node = std::mem::size_of::<(CompactString, Entry<4>)>();
        assert!(node + 8 <= 224, "{node} bytes");
        assert_eq!(std::mem::size_of::<Cell>(), 36);
    }

    #[test]
    fn rows_too_old_for_their_tags_are_forgotten() {
        let overflow = Mutex::new(Overflow::default());
        let mut st = UserState::<[Cell; 1]>::new(0);
        let st: &mut UserState = &mut st;
        st.insert_row(0, 1, &[5.0], 0);
        st.roll(RowTag::MAX_AGE - 1, "alice", &overflow);
        assert_eq!(st.row(0, 1), Some(0), "still readable");
        st.roll(RowTag::MAX_AGE, "alice", &overflow);
        assert_eq!(st.row(0, 1), None);
        // Without that, slot 2^32 would read slot 0's row: same low bits.
        st.roll(1 << 32, "alice", &overflow);
        assert_eq!(st.row(1 << 32, 1), None);
    }

    #[test]
    fn a_name_finds_its_key_by_the_same_hash() {
        let map: UserMap<1> = UserMap::with_hasher(foldhash::fast::RandomState::default());
        let guard = map.guard();
        for name in ["u", "user-00042", "a-name-longer-than-twenty-four-bytes"] {
            let entry: Entry<1> = UserLock::new(UserState::new(1));
            map.insert(CompactString::from(name), entry, &guard);
            assert!(map.get(&Name(name), &guard).is_some(), "{name}");
        }
        assert!(map.get(&Name("user-00043"), &guard).is_none());
    }

    proptest::proptest! {
        /// Names compare as their bytes do, at every length around the
        /// 8-byte steps.
        #[test]
        fn names_compare_as_their_bytes(
            a in proptest::collection::vec(0..3u8, 0..40),
            b in proptest::collection::vec(0..3u8, 0..40),
        ) {
            proptest::prop_assert_eq!(same_bytes(&a, &b), a == b);
            proptest::prop_assert!(same_bytes(&a, &a));
            let mut c = a.clone();
            if let Some(last) = c.last_mut() {
                *last ^= 1;
                proptest::prop_assert!(!same_bytes(&a, &c));
            }
        }
    }

    proptest::proptest! {
        /// A row's 32-bit tag reads back as its slot from any slot within
        /// 2^31 of it, across the sign and the 32-bit boundaries.
        #[test]
        fn row_tags_read_back_near_their_slot(
            slot in proptest::prop_oneof![
                -1_000i64..1_000,
                proptest::strategy::Strategy::prop_map(proptest::prelude::any::<i64>(), |s| s / 4),
                (1i64 << 32) - 3..(1i64 << 32) + 3,
            ],
            off in -(1i64 << 31) + 1..(1i64 << 31),
        ) {
            let now = slot - off;
            proptest::prop_assert_eq!(RowTag::of(slot).near(now), slot);
        }

        /// A quota kept in whole `f32` units decides as the `f64` does up to
        /// 2^24 units, and never more permissively above.
        #[test]
        fn whole_units_decide_as_the_full_quota(
            q in proptest::prop_oneof![-4.0f64..20.0, -1e9f64..1e9, 0.0f64..1e18],
            used in proptest::prop_oneof![-4i64..40, 0i64..(1 << 40)],
        ) {
            let w = f64::from(whole_units(q));
            let refuses = |quota: f64| quota < 1.0 || used as f64 > quota;
            if q.abs() <= f64::from(1u32 << 24) {
                proptest::prop_assert_eq!(refuses(w), refuses(q), "q {} kept as {}", q, w);
            } else {
                proptest::prop_assert!(w <= q.floor());
                proptest::prop_assert!(q.floor() - w <= q.abs() / f64::from(1u32 << 23));
                proptest::prop_assert!(refuses(w) || !refuses(q));
            }
        }
    }

    proptest::proptest! {
        /// The fixed rows keep what a sorted list of rows would: the current
        /// row or else the newest past one, then the nearest coming slots,
        /// each with its own quotas and version, for any order of arrival;
        /// the quotas of resources past the inline cell move to the spill.
        #[test]
        fn rows_keep_the_current_or_newest_past_and_the_nearest_slots(
            inserts in proptest::collection::vec((90i64..110, 0usize..3, 0.0f64..1e9), 1..40),
            now in 95i64..105,
        ) {
            let mut st = UserState::<[Cell; 1]>::new(now);
            let st: &mut UserState = &mut st;
            // Model: (slot, version, quota per resource), sorted by slot.
            let mut model: Vec<(i64, u16, Vec<f32>)> = Vec::new();
            for (v, &(slot, resources, q)) in inserts.iter().enumerate() {
                let version = v as u16 + 1;
                let quotas: Vec<f32> = (0..=resources).map(|i| whole_units(q + i as f64)).collect();
                st.insert_row(slot, version, &quotas, now);
                model.retain(|r| r.0 != slot);
                model.push((slot, version, quotas));
                model.sort_by_key(|r| r.0);
                let due = model.iter().filter(|r| r.0 <= now).count();
                if due > 1 {
                    model.drain(..due - 1);
                }
                model.truncate(ROWS_PER_USER);
            }
            for (slot, version, quotas) in &model {
                let k = st.row(*slot, *version);
                proptest::prop_assert!(k.is_some(), "row for slot {} lost", slot);
                let k = k.unwrap_or_default();
                for (i, cell) in st.cells().iter().enumerate() {
                    let quota = cell.quota[k];
                    match quotas.get(i) {
                        Some(q) => proptest::prop_assert_eq!(quota, *q),
                        None => proptest::prop_assert!(quota.is_nan()),
                    }
                }
            }
            let kept = (0..ROWS_PER_USER).filter(|&k| st.row_version[k] != 0).count();
            proptest::prop_assert_eq!(kept, model.len());
        }
    }

    /// One step of [`every_count_is_reported_once`].
    #[derive(Debug, Clone)]
    enum Step {
        /// Time moves on by this many milliseconds.
        Wait(i64),
        /// A request of this user that read the clock this many slots ago
        /// (0: now) and was admitted only now.
        Admit { user: u8, late: i64 },
        /// A byte count for this user, added without a decision.
        Consume { user: u8, amount: i64 },
        /// The reporter collects the slots that ended, as it does at every
        /// slot boundary (or late, after several).
        Collect,
    }

    fn step() -> impl proptest::strategy::Strategy<Value = Step> {
        use proptest::prelude::*;
        prop_oneof![
            (1..2_500i64).prop_map(Step::Wait),
            (0..3u8, prop_oneof![4 => Just(0i64), 1 => 1..3i64])
                .prop_map(|(user, late)| Step::Admit { user, late }),
            (0..3u8, 1..1_000i64).prop_map(|(user, amount)| Step::Consume { user, amount }),
            Just(Step::Collect),
        ]
    }

    proptest::proptest! {
        /// Whatever the order of requests, late requests, byte counts,
        /// collections and evictions, every count is in exactly one report:
        /// none lost, none reported twice.
        #[test]
        fn every_count_is_reported_once(steps in proptest::collection::vec(step(), 1..80)) {
            let f = fixture();
            let mut now = T;
            let mut collected = f.store.current_slot() - 1;
            let (mut want_requests, mut want_bytes) = (0i64, 0i64);
            // Requests and bytes in the reports.
            let mut got = (0i64, 0i64);
            let take = |r: &v1::Report, got: &mut (i64, i64)| {
                for user in ["u0", "u1", "u2"] {
                    got.0 += amount(&r.consumption, user, "requests");
                    got.1 += amount(&r.consumption, user, "traffic_down");
                }
            };
            for s in steps {
                match s {
                    Step::Wait(ms) => now += ms,
                    Step::Admit { user, late } => {
                        f.clock.set(now - late * 1_000);
                        f.admit(&format!("u{user}"), Fallback::Allow);
                        f.clock.set(now);
                        want_requests += 1;
                    }
                    Step::Consume { user, amount } => {
                        f.clock.set(now);
                        f.front.consume(&format!("u{user}"), f.down, amount);
                        want_bytes += amount;
                    }
                    Step::Collect => {
                        f.clock.set(now);
                        let finished = f.store.current_slot() - 1;
                        if finished > collected {
                            collected = finished;
                            let r = f.store.collect(finished);
                            take(&r, &mut got);
                        }
                    }
                }
            }
            // Everything ends: two more reports collect what is left.
            for _ in 0..2 {
                now += 1_000;
                f.clock.set(now);
                let r = f.store.collect(f.store.current_slot() - 1);
                take(&r, &mut got);
            }
            proptest::prop_assert_eq!(got, (want_requests, want_bytes));
        }
    }

    #[test]
    fn a_quota_read_in_place_installs_what_the_decoded_one_does() {
        use prost::Message;
        let json = r#"{"front": {"100": {"alice": {"requests": 2.0}, "bob": {"requests": 0.5}},
                                 "101": {"alice": {"requests": 1.0}}},
                       "back": {"100": {"carol": {"requests": 0, "traffic_down": 9}}}}"#;
        let quota = quota_from_json(json).unwrap();
        let raw = RawQuota::parse(&quota.encode_to_vec()).unwrap();
        let (a, b) = (fixture(), fixture());
        a.store.apply_quota(&quota);
        b.store.apply_raw_quota(&raw);
        let decide = |f: &Fixture, service: &str, user: &str| {
            let svc = f.store.service(service);
            let r = svc.resource("requests").unwrap();
            let d = svc.admit(user, &[(r, 1)], Fallback::Deny).decision;
            (d.allowed, d.basis, d.tightest.map(|t| (t.quota, t.used)))
        };
        for slot in 0..2 {
            for (service, user) in [
                ("front", "alice"),
                ("front", "bob"),
                ("front", "dave"),
                ("back", "carol"),
            ] {
                for _ in 0..3 {
                    assert_eq!(
                        decide(&a, service, user),
                        decide(&b, service, user),
                        "{service}/{user} in slot {slot}"
                    );
                }
            }
            a.clock.advance(Duration::from_secs(1));
            b.clock.advance(Duration::from_secs(1));
        }
        assert!(!decide(&a, "back", "carol").0, "carol has no quota");
    }

    /// One step of [`reports_encoded_as_prost_encodes_the_collected_one`].
    #[derive(Debug, Clone)]
    enum ReportStep {
        /// A user admitted (quota 0 or none) with a cost, in a service.
        Admit(u8, u8, bool),
        /// A user's handle counts an amount of a resource.
        Consume(u8, u8, u8, i64),
        /// The clock moves on this many slots.
        Advance(u8),
        /// The last slot is collected.
        Collect,
    }

    fn report_step() -> impl proptest::strategy::Strategy<Value = ReportStep> {
        use proptest::prelude::*;
        prop_oneof![
            4 => (0..2u8, 0..12u8, any::<bool>()).prop_map(|(s, u, q)| ReportStep::Admit(s, u, q)),
            4 => (0..2u8, 0..12u8, 0..5u8, prop_oneof![1i64..1000, any::<i64>()])
                .prop_map(|(s, u, r, a)| ReportStep::Consume(s, u, r, a)),
            1 => (0..3u8).prop_map(ReportStep::Advance),
            1 => Just(ReportStep::Collect),
        ]
    }

    proptest::proptest! {
        /// The report the reporter sends, written straight from the store,
        /// is byte for byte what prost writes for the same report (that of
        /// a second store fed the same steps, read back by `collect`):
        /// each user once, users and resources in name order, over any mix
        /// of users, services, resources (some registered late, past the
        /// inline cells), refusals, rolls and late counts. What the report
        /// holds is checked by the other tests here, which read it through
        /// `collect`.
        #[test]
        fn reports_encoded_as_prost_encodes_the_collected_one(
            steps in proptest::collection::vec(report_step(), 1..60),
        ) {
            use prost::Message;
            let stores: Vec<(Arc<ManualClock>, SlotStore)> = (0..2)
                .map(|_| {
                    let clock = Arc::new(ManualClock::new(T));
                    let store = SlotStore::builder().clock(clock.clone()).build();
                    (clock, store)
                })
                .collect();
            let service = |s: u8| ["front", "back"][usize::from(s)];
            let resource = |r: u8| ["requests", "zeta", "alpha", "traffic_down", "b"][usize::from(r)];
            for step in steps {
                let mut reports = Vec::new();
                for (clock, store) in &stores {
                    match &step {
                        ReportStep::Admit(s, u, quota) => {
                            let svc = store.service(service(*s));
                            let requests = svc.resource("requests").unwrap();
                            let slot = store.current_slot();
                            if *quota {
                                store.apply_quota(&quota_from_json(&format!(
                                    r#"{{"{}": {{"{slot}": {{"user-{u}": {{"requests": 0}}}}}}}}"#,
                                    service(*s)
                                )).unwrap());
                            }
                            svc.admit(&format!("user-{u}"), &[(requests, 1)], Fallback::Allow);
                        }
                        ReportStep::Consume(s, u, r, amount) => {
                            let svc = store.service(service(*s));
                            let r = svc.resource(resource(*r)).unwrap();
                            svc.consume(&format!("user-{u}"), r, *amount);
                        }
                        ReportStep::Advance(n) => clock.advance(Duration::from_secs(u64::from(*n))),
                        ReportStep::Collect => {}
                    }
                    if matches!(step, ReportStep::Collect) {
                        let slot = store.current_slot() - 1;
                        reports.push((store.clone(), slot));
                    }
                }
                if let [(a, slot), (b, _)] = &reports[..] {
                    let encoded = a.collect_encoded(*slot, "node-1");
                    let mut built = b.collect(*slot);
                    built.node_id = "node-1".into();
                    proptest::prop_assert_eq!(&encoded[..], &built.encode_to_vec()[..]);
                }
            }
        }
    }
}
