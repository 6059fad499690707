//! Per-slot sums of consumption and rejection, a column per slot.

use super::ids::{KeyId, Map};

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
pub(crate) struct SlotSums {
    pub(crate) slot: i64,
    /// Consumption (0) and rejection (1).
    pub(crate) columns: [Column; 2],
    /// Packed once no report files into it ([`Column::pack`]): tried once,
    /// not at every retention pass.
    pub(crate) settled: bool,
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
pub(crate) enum Column {
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
pub(crate) struct Packed {
    pub(crate) bytes: Box<[u8]>,
    /// The offset in `bytes` of the sums of ids `k * BLOCK`.
    pub(crate) blocks: Box<[u32]>,
    pub(crate) len: usize,
}

impl Packed {
    const BLOCK: usize = 32;

    /// Packs `sums` (each at least 0), or `None` past 4 GiB of bytes.
    pub(crate) fn new(sums: impl ExactSizeIterator<Item = i64>) -> Option<Self> {
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
    pub(crate) fn from(&self, from: usize) -> impl Iterator<Item = i64> + '_ {
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
    pub(crate) fn new(dense: bool, id_bound: usize, spare: &mut Option<Vec<u32>>) -> Self {
        if dense {
            let mut v = spare.take().unwrap_or_default();
            v.clear();
            v.resize(id_bound, 0);
            Column::Narrow(v)
        } else {
            Column::Sparse(Map::default())
        }
    }

    pub(crate) fn is_dense(&self) -> bool {
        !matches!(self, Column::Sparse(_))
    }

    /// Adds `amount` (at least 0) to the sum of `id`, in a service of
    /// `id_bound` ids.
    pub(crate) fn add(&mut self, id: KeyId, amount: i64, id_bound: usize) {
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

    pub(crate) fn get(&self, id: KeyId) -> i64 {
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
    pub(crate) fn pack(&mut self) -> Option<Vec<u32>> {
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
    pub(crate) fn iter(&self) -> Box<dyn Iterator<Item = (KeyId, i64)> + '_> {
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
    pub(crate) fn new(
        slot: i64,
        dense: [bool; 2],
        id_bound: usize,
        spare: &mut Option<Vec<u32>>,
    ) -> Self {
        Self {
            slot,
            columns: dense.map(|d| Column::new(d, id_bound, spare)),
            settled: false,
        }
    }

    /// Adds `amount` (at least 0) to the consumption (`which` 0) or
    /// rejection (1) of `id`, in a service of `id_bound` ids.
    pub(crate) fn add(&mut self, id: KeyId, which: usize, amount: i64, id_bound: usize) {
        if let Some(column) = self.columns.get_mut(which) {
            column.add(id, amount, id_bound);
        }
    }

    /// The consumption (`which` 0) or rejection (1) of `id`.
    pub(crate) fn get(&self, id: KeyId, which: usize) -> i64 {
        self.columns.get(which).map_or(0, |c| c.get(id))
    }

    /// Every key with a consumption (`which` 0) or rejection (1) other
    /// than zero, in no particular order.
    pub(crate) fn entries(&self, which: usize) -> impl Iterator<Item = (KeyId, i64)> + '_ {
        self.columns.get(which).into_iter().flat_map(|c| c.iter())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
