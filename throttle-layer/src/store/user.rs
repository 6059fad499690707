//! One user's state: its counts per resource, its quota rows, and how
//! they roll from slot to slot.

use compact_str::CompactString;
use parking_lot::Mutex;

use super::decision::Tightest;
use super::resource::{MAX_RESOURCES, ResourceId};

/// Quota rows kept per user: the current one (or without it the newest
/// past one, for [`Fallback::LastKnownThenAllow`]) and the next two.
pub(super) const ROWS_PER_USER: usize = 3;

/// Counts of one user handed from a slot to the report: a transfer value on
/// the stack (or in the rare overflow list), never kept per user.
#[derive(Debug, Clone, Copy)]
pub(super) struct Counters {
    pub(super) consumption: [i64; MAX_RESOURCES],
    pub(super) rejection: [u32; MAX_RESOURCES],
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
    pub(super) fn is_zero(&self) -> bool {
        self.consumption.iter().all(|&c| c == 0) && self.rejection.iter().all(|&r| r == 0)
    }

    pub(super) fn merge(&mut self, other: &Self) {
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
pub(super) struct Cell {
    pub(super) used: i64,
    pub(super) prev_used: i64,
    pub(super) rejected: u32,
    pub(super) prev_rejected: u32,
    /// Quota in row `k`, in whole units (see [`whole_units`]); NaN where
    /// row `k` has no quota for this resource.
    pub(super) quota: [f32; ROWS_PER_USER],
}

/// A quota as a cell keeps it: `floor(q)` as an `f32`, rounded down where
/// it has no exact `f32` (above 2^24), and 0 for a NaN (no quota left).
///
/// Counts are whole, so `used > q` exactly when `used > floor(q)`, and
/// `q < 1` exactly when `floor(q) < 1`: the decision is the one the full
/// `f64` gives up to 2^24 units per slot, and above that it errs by at
/// most 1 part in 16 million, towards refusing. Half the bytes of an `f64`
/// for the rows every (user, resource) holds.
pub(super) fn whole_units(q: f64) -> f32 {
    if q.is_nan() {
        return 0.0;
    }
    throttle_proto::f32_at_most(q.floor())
}

pub(super) const EMPTY_CELL: Cell = Cell {
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
pub(super) struct UserState<C: ?Sized = [Cell]> {
    /// Slot of the `used` counts, which is also the last slot the user was
    /// seen in: every admit and consume rolls the counts on to its slot.
    pub(super) slot: i64,
    /// Slot of each quota row, as a [`RowTag`].
    pub(super) row_slot: [RowTag; ROWS_PER_USER],
    /// Version of each quota row; 0: the row is empty.
    pub(super) row_version: [u16; ROWS_PER_USER],
    /// The `prev_used` counts are slot `slot - 1`'s, not yet collected.
    pub(super) has_prev: bool,
    pub(super) evicted: bool,
    /// The user's cells once its service counts more resources than the
    /// inline ones hold (resources registered after the map was made); the
    /// inline cells are then unused.
    pub(super) spill: Option<Box<Spill>>,
    /// One cell per resource, inline in the map's node.
    pub(super) cells: C,
}

/// Cells that outgrew a user's inline ones; boxed once more so the pointer
/// in every user's state is a thin one (8 bytes).
#[derive(Debug)]
pub(super) struct Spill {
    pub(super) cells: Box<[Cell]>,
}

/// Counts set aside by users' rolls until the next collection, one entry
/// per user: a user whose counts roll over slot after slot with nothing
/// collecting them (a store without a reporter, or one stalled) adds to
/// its entry, so the overflow holds no more users than the map does.
pub(super) type Overflow =
    std::collections::HashMap<CompactString, Counters, foldhash::fast::RandomState>;

/// Adds `counts` to `user`'s entry in the overflow.
#[cold]
pub(super) fn set_aside(overflow: &Mutex<Overflow>, user: &str, counts: &Counters) {
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
pub(super) struct RowTag(pub(super) u32);

impl RowTag {
    /// Rows older than this many slots are dropped (2^30: 34 years of 1 s
    /// slots, 12 days of 1 ms ones).
    pub(super) const MAX_AGE: i64 = 1 << 30;

    #[inline]
    pub(super) fn of(slot: i64) -> Self {
        Self(slot as u32)
    }

    /// The slot within 2^31 of `now` whose low bits these are.
    pub(super) fn near(self, now: i64) -> i64 {
        now.wrapping_add(i64::from(self.0.wrapping_sub(now as u32) as i32))
    }
}

impl<const N: usize> UserState<[Cell; N]> {
    pub(super) fn new(slot: i64) -> Self {
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
    #[inline]
    pub(super) fn cells(&self) -> &[Cell] {
        match &self.spill {
            Some(spill) => &spill.cells,
            None => &self.cells,
        }
    }

    #[inline]
    pub(super) fn cells_mut(&mut self) -> &mut [Cell] {
        match &mut self.spill {
            Some(spill) => &mut spill.cells,
            None => &mut self.cells,
        }
    }

    /// The cell of resource `i`, moving the cells to a larger spill if the
    /// service gained resources since this user's map was made.
    #[inline]
    pub(super) fn cell(&mut self, i: usize) -> &mut Cell {
        if i >= self.cells().len() {
            self.spill_to(i + 1);
        }
        &mut self.cells_mut()[i]
    }

    /// Moves the cells to a spill of `len` cells.
    #[cold]
    pub(super) fn spill_to(&mut self, len: usize) {
        let mut cells = self.cells().to_vec();
        cells.resize(len, EMPTY_CELL);
        self.spill = Some(Box::new(Spill {
            cells: cells.into_boxed_slice(),
        }));
    }

    /// This slot's counts (`previous` false) or the last slot's, zeroed.
    pub(super) fn take(&mut self, previous: bool) -> Counters {
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

    pub(super) fn is_idle(&self) -> bool {
        self.cells()
            .iter()
            .all(|c| c.used == 0 && c.rejected == 0 && c.prev_used == 0 && c.prev_rejected == 0)
    }

    /// Moves the counters on to `slot`, keeping the last slot's counts for
    /// the reporter (the store rolls with [`ServiceStore::roll_with_default`](super::ServiceStore),
    /// which also gives the user their default row).
    #[cfg(test)]
    pub(super) fn roll(&mut self, slot: i64, user: &str, overflow: &Mutex<Overflow>) {
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
    pub(super) fn roll_on(&mut self, slot: i64, user: &str, overflow: &Mutex<Overflow>) {
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

    #[inline]
    pub(super) fn add(&mut self, resource: ResourceId, amount: i64) {
        let c = self.cell(resource.index());
        c.used = c.used.saturating_add(amount);
    }

    /// Adds an admitted request's fixed costs.
    #[inline]
    pub(super) fn charge(&mut self, costs: &[(ResourceId, i64)]) {
        for &(r, amount) in costs {
            self.add(r, amount);
        }
    }

    /// Installs the row for `slot` with `quotas` (by resource index; NaN:
    /// none), replacing any row for that slot. Keeps the current row, or
    /// without one the newest past row (for [`Fallback::LastKnownThenAllow`]),
    /// and the coming rows nearest to now: the current one is never pushed
    /// out by quotas for slots further ahead, and three rows hold what the
    /// central sends (the quotas of the next slot and the one after).
    pub(super) fn insert_row(&mut self, slot: i64, version: u16, quotas: &[f32], now_slot: i64) {
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
}

// The decision on the request path: a user's entry found and locked,
// its quota row read, the request admitted or refused.
impl UserState {
    #[inline]
    pub(super) fn row(&self, slot: i64, version: u16) -> Option<usize> {
        // A row at least as new as the published version is current: rows
        // are written before their version is published.
        (0..ROWS_PER_USER).find(|&k| {
            self.row_slot[k] == RowTag::of(slot)
                && self.row_version[k] != 0
                && self.row_version[k] >= version
        })
    }

    /// Whether row `row` was installed with `version`.
    #[inline(always)]
    pub(super) fn row_has_version(&self, row: usize, version: u16) -> bool {
        self.row_version[row] == version
    }

    /// Applies row `row`: counts rejections (if `record`) and refuses, or
    /// admits and adds `costs`.
    #[inline(always)]
    pub(super) fn apply_row(
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
