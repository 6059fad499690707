//! The quotas of past slots, kept for the monitor ([`QuotaHistory`]).

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::ops::Bound::{Excluded, Unbounded};
use std::sync::Arc;

use prost::encoding::{decode_varint, encode_varint};

use super::assignment::{Assignment, NodeGrants, same_keys};
use crate::arena::{KeyId, NodeId};

/// The quotas of the slots the book let go, for the monitor.
///
/// The retention keeps 60 slots of quotas, one per (user, resource, node)
/// and slot: at 1,000 nodes x 1,000 users, 240 M amounts, 0.96 GB as
/// `f32`s. Most of a node's quotas are the same from one slot to the next
/// (a user whose use is steady, or idle, keeps its share of a full
/// bucket), so only the newest slot is kept whole: each older one keeps,
/// per node, which of its amounts differ from the node's in the slot after
/// it, and how far. Reading a slot back means reading every newer one
/// first, which the monitor, the only reader, does anyway when it lists a
/// range; dropping the oldest slots needs nothing else.
#[derive(Debug, Default)]
pub struct QuotaHistory {
    /// slot -> its nodes in index order, as an [`Assignment`] lists them.
    slots: BTreeMap<i64, Vec<(NodeId, KeptGrants)>>,
}

/// One node's quotas in one slot.
#[derive(Debug)]
struct KeptGrants {
    /// The grants' keys: shared with the node's previous slot when it names
    /// the same keys, as it does while the node's users stay.
    keys: Arc<[KeyId]>,
    amounts: Amounts,
}

impl KeptGrants {
    /// The amounts, given `newer()`: the node's amounts in the next slot
    /// kept, which changes are read against.
    fn amounts<'a>(&'a self, newer: impl FnOnce() -> Option<Cow<'a, [f32]>>) -> Cow<'a, [f32]> {
        match &self.amounts {
            Amounts::Whole(a) => Cow::Borrowed(a),
            Amounts::Changes(c) => {
                // A slot is re-kept as changes only against a newer slot
                // naming the same keys for the node, and slots are dropped
                // oldest first: it is always there.
                let mut amounts = newer().unwrap_or_default();
                debug_assert_eq!(amounts.len(), self.keys.len());
                apply(c, amounts.to_mut());
                amounts
            }
        }
    }
}

#[derive(Debug)]
enum Amounts {
    /// Every amount, in the keys' order.
    Whole(Box<[f32]>),
    /// What differs from the node's amounts in the next slot kept, which
    /// names the same keys (see [`changes`]).
    Changes(Box<[u8]>),
}

impl QuotaHistory {
    /// Keeps the quotas of `slot`.
    ///
    /// The slot kept before it is re-kept as its changes against this one,
    /// node by node, where that is smaller. A slot older than the newest
    /// kept (only a clock gone back gives one) is kept whole, after every
    /// slot is made whole again, since replacing a slot would change what
    /// the slot before it is read against.
    ///
    /// A node's keys are shared with its previous slot when it names the
    /// same ones, else with the assignment when it shares them
    /// ([`Assignment::share_keys`]), else copied.
    pub fn keep(&mut self, slot: i64, assignment: &Assignment) {
        let in_order = self.slots.last_key_value().is_none_or(|(&s, _)| s < slot);
        if !in_order {
            self.make_whole();
        }
        let previous = self.slots.range(..slot).next_back().map(|(_, p)| p);
        let fresh: Vec<(NodeId, KeptGrants)> = assignment
            .iter()
            .map(|(node, grants)| {
                let keys = match previous.and_then(|p| of_node(p, node)) {
                    Some(k) if same_keys(&k.keys, grants) => k.keys.clone(),
                    _ => grants.shared_keys().unwrap_or_else(|| grants.keys().into()),
                };
                let amounts = Amounts::Whole(grants.amounts().into());
                (node, KeptGrants { keys, amounts })
            })
            .collect();
        if in_order && let Some(previous) = self.slots.values_mut().next_back() {
            for (node, kept) in previous.iter_mut() {
                if let Amounts::Whole(old) = &kept.amounts
                    && let Some(now) =
                        of_node(&fresh, *node).filter(|n| Arc::ptr_eq(&n.keys, &kept.keys))
                    && let Amounts::Whole(new) = &now.amounts
                    && let Some(c) = changes(old, new)
                {
                    kept.amounts = Amounts::Changes(c);
                }
            }
        }
        self.slots.insert(slot, fresh);
    }

    /// Drops the slots before `cutoff`. Nothing else changes: a slot is
    /// read against the slots after it, never before.
    pub fn forget_before(&mut self, cutoff: i64) {
        self.slots = self.slots.split_off(&cutoff);
    }

    /// The slots kept, oldest first.
    pub fn slots(&self) -> impl Iterator<Item = i64> + '_ {
        self.slots.keys().copied()
    }

    /// The keys of `node`'s quotas in the newest slot kept.
    #[cfg(test)]
    pub(crate) fn newest_keys(&self, node: NodeId) -> Option<Arc<[KeyId]>> {
        let (_, nodes) = self.slots.last_key_value()?;
        of_node(nodes, node).map(|k| k.keys.clone())
    }

    /// The quotas of `node` in `slot`, if kept: its grants' keys and
    /// amounts. Reads the node's amounts back through the newer slots
    /// alone (borrowed where `slot` keeps them whole), for a reader that
    /// wants a few nodes of a recent slot rather than all of them.
    pub(crate) fn node_quotas(
        &self,
        slot: i64,
        node: NodeId,
    ) -> Option<(&[KeyId], Cow<'_, [f32]>)> {
        let kept = of_node(self.slots.get(&slot)?, node)?;
        let amounts = kept.amounts(|| {
            let newer = self.slots.range((Excluded(slot), Unbounded)).next()?.0;
            self.node_quotas(*newer, node).map(|(_, a)| a)
        });
        Some((&kept.keys[..], amounts))
    }

    /// Calls `f` with the quotas of every slot kept from `from` on, newest
    /// first (each is read against the one after it).
    pub fn read(&self, from: Option<i64>, mut f: impl FnMut(i64, &SlotQuotas)) {
        let (mut newer, mut this) = (SlotQuotas::default(), SlotQuotas::default());
        for (&slot, nodes) in self.slots.iter().rev() {
            if from.is_some_and(|s| slot < s) {
                break;
            }
            this.read(nodes, &newer);
            f(slot, &this);
            std::mem::swap(&mut newer, &mut this);
        }
    }

    /// Keeps every slot whole.
    fn make_whole(&mut self) {
        let mut newer = SlotQuotas::default();
        for nodes in self.slots.values_mut().rev() {
            let mut this = SlotQuotas::default();
            this.read(nodes, &newer);
            for ((_, kept), (_, q)) in nodes.iter_mut().zip(&this.nodes) {
                kept.amounts = Amounts::Whole(q.amounts.clone());
            }
            newer = this;
        }
    }
}

/// One kept slot's quotas, read back: per node, its keys and amounts.
#[derive(Debug, Default)]
pub struct SlotQuotas {
    nodes: Vec<(NodeId, NodeQuotas)>,
}

/// One node's quotas in one slot, whole: as kept newest, or read back.
#[derive(Debug)]
struct NodeQuotas {
    keys: Arc<[KeyId]>,
    amounts: Box<[f32]>,
}

impl SlotQuotas {
    /// Reads `nodes`, whose changes are against `newer` (the slot after).
    fn read(&mut self, nodes: &[(NodeId, KeptGrants)], newer: &SlotQuotas) {
        self.nodes.clear();
        for (node, kept) in nodes {
            let after = || of_node(&newer.nodes, *node).map(|q| Cow::Borrowed(&q.amounts[..]));
            let amounts = kept.amounts(after).into_owned().into_boxed_slice();
            let keys = kept.keys.clone();
            self.nodes.push((*node, NodeQuotas { keys, amounts }));
        }
    }

    /// Every node with grants, and its grants.
    pub fn iter(&self) -> impl Iterator<Item = (NodeId, NodeGrants<'_>)> {
        self.nodes.iter().map(|(node, q)| {
            let grants = NodeGrants {
                keys: &q.keys,
                shared: Some(&q.keys),
                amounts: &q.amounts,
            };
            (*node, grants)
        })
    }
}

/// What `nodes`, in index order as an [`Assignment`] lists them, hold for
/// `node`.
fn of_node<T>(nodes: &[(NodeId, T)], node: NodeId) -> Option<&T> {
    let i = nodes
        .binary_search_by_key(&node.index(), |(n, _)| n.index())
        .ok()?;
    Some(&nodes[i].1)
}

/// `old` as its changes against `new` (as long, same keys), if that is
/// smaller than `old`: a bitmap with one bit per amount, set where the two
/// differ, then for each amount that does, in order, how far apart the two
/// amounts' bits are ([`step`]) as a LEB128 varint.
///
/// Where quotas move every slot by as much as they do in `ledger-slot
/// --vary`, most steps take 4 bytes and the changes would be no smaller:
/// once the varints so far pass the pace at which they would end up as
/// large as `old` (by more than [`GIVE_UP_SLACK`] bytes), the rest are not
/// encoded.
fn changes(old: &[f32], new: &[f32]) -> Option<Box<[u8]>> {
    let bitmap = old.len().div_ceil(8);
    // Smaller than `old` means varints under 31/8 bytes per amount.
    let at_most = |amounts: usize| (amounts * 31).div_ceil(8);
    let mut out = vec![0u8; bitmap];
    for (i, (a, b)) in old.iter().zip(new).enumerate() {
        let x = step(*b, *a);
        if x != 0 {
            out[i / 8] |= 1 << (i % 8);
            encode_varint(u64::from(x), &mut out);
            let varints = out.len() - bitmap;
            if varints >= at_most(old.len()) || varints > at_most(i + 1) + GIVE_UP_SLACK {
                return None;
            }
        }
    }
    Some(out.into_boxed_slice())
}

/// How far `to`'s bits are from `from`'s, as integers, zigzag-encoded
/// (0, -1, 1, -2... as 0, 1, 2, 3...). The bits of positive floats order
/// as their values do, 2^23 apart per doubling: an amount 1% off the one
/// after is about 2^16 away (3 varint bytes), 10% off about 2^19 (3), and
/// one crossing a power of two stays as near, where the XOR of the bits
/// would take 4 bytes.
fn step(from: f32, to: f32) -> u32 {
    let d = to.to_bits().wrapping_sub(from.to_bits()) as i32;
    ((d << 1) ^ (d >> 31)) as u32
}

/// The amount [`step`] `z` away from `from`.
fn step_from(from: f32, z: u32) -> f32 {
    let d = ((z >> 1) as i32) ^ -((z & 1) as i32);
    f32::from_bits(from.to_bits().wrapping_add(d as u32))
}

/// How far ahead of the break-even pace a node's changes may run before
/// they are given up ([`changes`]): a run of changed amounts among steady
/// ones is no reason to.
const GIVE_UP_SLACK: usize = 256;

/// Turns `amounts`, the amounts of the slot after, into the ones whose
/// [`changes`] against them `c` are.
fn apply(c: &[u8], amounts: &mut [f32]) {
    let (bitmap, mut steps) = c.split_at(amounts.len().div_ceil(8).min(c.len()));
    for (byte, chunk) in bitmap.iter().zip(amounts.chunks_mut(8)) {
        for (bit, amount) in chunk.iter_mut().enumerate() {
            if byte & (1 << bit) != 0 {
                let z = decode_varint(&mut steps).unwrap_or(0) as u32;
                *amount = step_from(*amount, z);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::policy::Grant;

    fn assignment(grants: &[(NodeId, u32, f64)]) -> Assignment {
        let mut a = Assignment::default();
        for &(node, key, q) in grants {
            a.push(node, Grant::new(KeyId::test(key), q));
        }
        a
    }

    fn read_all(h: &QuotaHistory) -> BTreeMap<i64, Vec<(NodeId, Vec<Grant>)>> {
        let mut out = BTreeMap::new();
        h.read(None, |slot, q| {
            out.insert(
                slot,
                q.iter().map(|(n, g)| (n, g.iter().collect())).collect(),
            );
        });
        out
    }

    fn as_kept(a: &Assignment) -> Vec<(NodeId, Vec<Grant>)> {
        a.iter().map(|(n, g)| (n, g.iter().collect())).collect()
    }

    #[test]
    fn slots_read_back_their_grants_and_share_key_lists() {
        let (n0, n1) = (NodeId::test(0), NodeId::test(2));
        let first = assignment(&[(n0, 1, 5.0), (n0, 4, 7.5), (n1, 1, 2.0)]);
        // Same keys on n0, one amount changed; other keys on n1.
        let second = assignment(&[(n0, 1, 6.0), (n0, 4, 7.5), (n1, 3, 2.0)]);
        let mut h = QuotaHistory::default();
        h.keep(10, &first);
        h.keep(11, &second);
        let read = read_all(&h);
        assert_eq!(read[&10], as_kept(&first));
        assert_eq!(read[&11], as_kept(&second));
        let (old, new) = (&h.slots[&10], &h.slots[&11]);
        assert!(Arc::ptr_eq(&old[0].1.keys, &new[0].1.keys));
        assert!(!Arc::ptr_eq(&old[1].1.keys, &new[1].1.keys));
        assert!(matches!(old[0].1.amounts, Amounts::Changes(_)), "{old:?}");
        assert!(matches!(old[1].1.amounts, Amounts::Whole(_)), "other keys");
        assert!(matches!(new[0].1.amounts, Amounts::Whole(_)), "the newest");
    }

    #[test]
    fn a_steady_slot_takes_a_bit_per_amount() {
        let n = NodeId::test(0);
        let grants: Vec<_> = (0..1000).map(|k| (n, k, f64::from(k) * 1.5)).collect();
        let mut h = QuotaHistory::default();
        h.keep(1, &assignment(&grants));
        h.keep(2, &assignment(&grants));
        let Amounts::Changes(c) = &h.slots[&1][0].1.amounts else {
            panic!("kept whole");
        };
        assert_eq!(c.len(), 125, "1,000 bits, nothing changed");
        assert_eq!(read_all(&h)[&1], as_kept(&assignment(&grants)));
    }

    #[test]
    fn amounts_that_all_change_stay_whole() {
        let n = NodeId::test(0);
        let at = |t: f64| {
            assignment(
                &(0..64)
                    .map(|k| (n, k, t * 1e6 + f64::from(k)))
                    .collect::<Vec<_>>(),
            )
        };
        let mut h = QuotaHistory::default();
        h.keep(1, &at(1.0));
        h.keep(2, &at(7.0));
        assert!(matches!(h.slots[&1][0].1.amounts, Amounts::Whole(_)));
        assert_eq!(read_all(&h)[&1], as_kept(&at(1.0)));
    }

    #[test]
    fn changes_are_kept_where_smaller_and_a_run_of_them_is_not_given_up() {
        let steady: Vec<f32> = (0..4096).map(|k| k as f32 * 2.5).collect();
        let moved = |from: usize, to: usize| -> Vec<f32> {
            let mut v = steady.clone();
            for (k, q) in v.iter_mut().enumerate().take(to).skip(from) {
                *q = (k as f32 + 1e6).sqrt() * 977.3;
            }
            v
        };
        // Every amount changed: given up, and kept whole.
        assert!(changes(&steady, &moved(0, 4096)).is_none());
        // A run of changes at the start, then steady: kept as changes.
        let c = changes(&steady, &moved(0, 64)).expect("smaller");
        assert!(c.len() < 512 + 64 * 5, "{}", c.len());
        let mut back = moved(0, 64);
        apply(&c, &mut back);
        assert_eq!(back, steady);
    }

    #[test]
    fn a_slot_kept_out_of_order_leaves_the_others_readable() {
        let n = NodeId::test(1);
        let at = |q: f64| assignment(&[(n, 1, q), (n, 2, 3.0)]);
        let mut h = QuotaHistory::default();
        for (slot, q) in [(1, 1.0), (2, 2.0), (3, 3.0)] {
            h.keep(slot, &at(q));
        }
        // Slot 2 again, with other quotas: slot 1 was kept as its changes
        // against the slot 2 it replaces.
        h.keep(2, &at(9.0));
        h.keep(4, &at(4.0));
        let read = read_all(&h);
        for (slot, q) in [(1, 1.0), (2, 9.0), (3, 3.0), (4, 4.0)] {
            assert_eq!(read[&slot], as_kept(&at(q)), "slot {slot}");
        }
        h.forget_before(3);
        assert_eq!(h.slots().collect::<Vec<_>>(), [3, 4]);
        assert_eq!(read_all(&h)[&3], as_kept(&at(3.0)));
    }

    /// A slot's grants: per node, amounts for some keys.
    fn slot_strategy() -> impl Strategy<Value = Vec<(NodeId, u32, f64)>> {
        // Few nodes, keys and amounts, so that slots often repeat a node's
        // keys and amounts.
        let amount = prop_oneof![
            Just(0.0),
            Just(1.0),
            Just(250.5),
            0.0f64..1e9,
            Just(f64::INFINITY)
        ];
        prop::collection::btree_map((0u32..4, 0u32..6), amount, 0..16).prop_map(|m| {
            m.into_iter()
                .map(|((node, key), q)| (NodeId::test(node), key, q))
                .collect()
        })
    }

    #[test]
    fn a_small_move_is_a_small_step() {
        let bytes =
            |from: f32, to: f32| prost::encoding::encoded_len_varint(u64::from(step(from, to)));
        assert_eq!(step(3.0, 3.0), 0);
        assert_eq!(bytes(1000.0, 1010.0), 3, "1% up");
        assert_eq!(bytes(1010.0, 1000.0), 3, "1% down");
        assert_eq!(bytes(1000.0, 1000.25), 2);
        // Across a power of two: the XOR of the bits would take 4 bytes.
        assert_eq!(bytes(1020.0, 1030.0), 3);
    }

    proptest! {
        /// A step leads back to the amount it was taken to, for any bits.
        #[test]
        fn a_step_leads_back(from in any::<u32>(), to in any::<u32>()) {
            let (from, to) = (f32::from_bits(from), f32::from_bits(to));
            prop_assert_eq!(step_from(from, step(from, to)).to_bits(), to.to_bits());
        }

        /// Whatever is kept, forgotten or kept again out of order, every
        /// slot kept reads back as it was kept.
        #[test]
        fn every_slot_reads_back_as_kept(
            steps in prop::collection::vec((0i64..3, slot_strategy(), prop::bool::weighted(0.1)), 1..40),
        ) {
            let mut h = QuotaHistory::default();
            let mut model: BTreeMap<i64, Vec<(NodeId, Vec<Grant>)>> = BTreeMap::new();
            let mut slot = 100;
            for (gap, grants, forget) in steps {
                // Mostly the next slots; sometimes one already kept.
                slot = if gap == 0 { slot - 2 } else { slot + gap };
                let a = assignment(&grants);
                h.keep(slot, &a);
                let kept = as_kept(&a);
                model.insert(slot, kept.into_iter().filter(|(_, g)| !g.is_empty()).collect());
                if forget {
                    h.forget_before(slot - 3);
                    model = model.split_off(&(slot - 3));
                }
                prop_assert_eq!(&read_all(&h), &model);
                // A node's quotas read alone are the same.
                for (slot, nodes) in &model {
                    for n in (0..4).map(NodeId::test) {
                        let alone = h.node_quotas(*slot, n).map(|(keys, amounts)| {
                            keys.iter().zip(amounts.iter())
                                .map(|(&key, &amount)| Grant { key, amount })
                                .collect::<Vec<_>>()
                        });
                        let want = nodes.iter().find(|(m, _)| *m == n).map(|(_, g)| g.clone());
                        prop_assert_eq!(alone, want, "slot {} node {:?}", slot, n);
                    }
                }
            }
        }
    }
}
