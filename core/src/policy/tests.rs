use proptest::prelude::*;

use std::collections::BTreeMap;
use std::sync::Arc;

use super::*;
use crate::arena::{Cuts, KeyId, NodeId};

fn amount(q: f64) -> f64 {
    Grant::new(KeyId::test(0), q).amount()
}

#[test]
fn every_policy_name_of_the_limits_makes_a_policy() {
    for name in crate::limits::POLICY_NAMES {
        assert!(by_name(name).is_some(), "{name}");
    }
    assert!(by_name("fair").is_none());
}

#[test]
fn a_grant_keeps_exact_amounts_and_nothing_below_zero() {
    for q in [0.0, 1.0, 0.5, 1000.0, 16_777_216.0, 2f64.powi(100)] {
        assert_eq!(amount(q), q);
    }
    assert_eq!(amount(-3.0), 0.0);
    assert_eq!(amount(f64::NAN), 0.0, "no quota left");
    assert_eq!(amount(f64::INFINITY), f64::INFINITY);
    assert_eq!(std::mem::size_of::<Grant>(), 8);
}

proptest! {
    /// A slot's grants, looked up node by node for keys in increasing
    /// order, are the grants it gave, whether the book holds the slot
    /// or the history does (whole or as changes); asked out of order,
    /// a lookup finds the grant or nothing.
    #[test]
    fn slot_grants_find_each_grant_asked_in_key_order(
        keys in prop::collection::btree_set((0u32..4, 0u32..12), 0..30),
        // Per slot: the same keys with these amounts, or other grants.
        slots in prop::collection::vec(
            prop::option::weighted(
                0.3,
                prop::collection::btree_map((0u32..4, 0u32..12), 0u32..4, 0..30),
            ),
            5,
        ),
        amounts in prop::collection::vec(prop::collection::vec(0u32..4, 30), 5),
        mut asks in prop::collection::vec((0u32..5, 0u32..13), 0..60),
    ) {
        let slots: Vec<BTreeMap<(u32, u32), u32>> = slots
            .into_iter()
            .zip(&amounts)
            .map(|(other, amounts)| {
                other.unwrap_or_else(|| keys.iter().copied().zip(amounts.iter().copied()).collect())
            })
            .collect();
        let assignment = |grants: &BTreeMap<(u32, u32), u32>| {
            let mut a = Assignment::default();
            // By node, then key: each node's grants in key order.
            for (&(node, key), &q) in grants {
                a.push(NodeId::test(node), Grant::new(KeyId::test(key), f64::from(q)));
            }
            a
        };
        let (mut book, mut kept) = (BTreeMap::new(), QuotaHistory::default());
        for (slot, grants) in (10..).zip(&slots) {
            if slot < 13 {
                kept.keep(slot, &assignment(grants));
            } else {
                book.insert(slot, assignment(grants));
            }
        }
        let cuts = Cuts::default();
        let granted = Granted::new(&book, &kept, &cuts);
        let mut unordered = asks.clone();
        unordered.reverse();
        asks.sort_by_key(|&(_, key)| key);
        for (slot, grants) in (10..).zip(&slots) {
            let want = |node: u32, key: u32| grants.get(&(node, key)).map(|&q| q as f32);
            let mut found = granted.slot(slot);
            for &(node, key) in &asks {
                let got = found.get(NodeId::test(node), KeyId::test(key));
                prop_assert_eq!(got, want(node, key), "slot {} ({}, {})", slot, node, key);
            }
            let mut found = granted.slot(slot);
            for &(node, key) in &unordered {
                let got = found.get(NodeId::test(node), KeyId::test(key));
                prop_assert!(got.is_none() || got == want(node, key));
            }
        }
        prop_assert_eq!(granted.slot(9).get(NodeId::test(0), KeyId::test(0)), None);
    }

    /// An assignment begun like another reads back exactly the grants
    /// pushed into it, before and after its keys are made shared, and
    /// a node whose keys are the other's shares that one's list.
    #[test]
    fn an_assignment_begun_like_another_holds_what_was_pushed(
        like in prop::collection::btree_map(0u32..4, prop::collection::btree_set(0u32..12, 0..8), 0..4),
        pushed in prop::collection::btree_map(0u32..5, prop::collection::btree_map(0u32..12, 0u32..9, 0..8), 0..5),
        used_before in prop::collection::btree_map((0u32..6, 0u32..12), 0u32..9, 0..20),
    ) {
        let mut before = Assignment::default();
        for (&node, keys) in &like {
            for &key in keys {
                before.push(NodeId::test(node), Grant::new(KeyId::test(key), 1.0));
            }
        }
        before.share_keys();
        // Recycled: it held other grants before.
        let mut a = Assignment::default();
        for (&(node, key), &q) in &used_before {
            a.push(NodeId::test(node), Grant::new(KeyId::test(key), f64::from(q)));
        }
        a.clear_like(Some(&before));
        for (&node, grants) in &pushed {
            for (&key, &q) in grants {
                a.push(NodeId::test(node), Grant::new(KeyId::test(key), f64::from(q)));
            }
        }
        let want: Vec<(NodeId, Vec<Grant>)> = pushed
            .iter()
            .filter(|(_, g)| !g.is_empty())
            .map(|(&n, g)| {
                let g = g.iter().map(|(&k, &q)| Grant::new(KeyId::test(k), f64::from(q)));
                (NodeId::test(n), g.collect())
            })
            .collect();
        let read = |a: &Assignment| -> Vec<(NodeId, Vec<Grant>)> {
            a.iter().map(|(n, g)| (n, g.iter().collect())).collect()
        };
        prop_assert_eq!(read(&a), want.clone());
        a.share_keys();
        prop_assert_eq!(read(&a), want);
        for (node, grants) in a.iter() {
            let shared = grants.shared_keys().expect("shared once made so");
            let like = before.get(node).and_then(|g| g.shared_keys());
            if let Some(like) = like.filter(|l| l[..] == shared[..]) {
                prop_assert!(Arc::ptr_eq(&like, &shared), "{:?}", node);
            }
        }
    }

    /// Forgetting the keys from an id on leaves every other grant, in
    /// order, whether the node's keys were shared or its own.
    #[test]
    fn forgetting_keys_from_an_id_keeps_the_grants_below_it(
        pushed in prop::collection::btree_map(0u32..4, prop::collection::btree_map(0u32..12, 0u32..9, 0..8), 0..4),
        bound in 0usize..14,
        shared in any::<bool>(),
    ) {
        let mut a = Assignment::default();
        for (&node, grants) in &pushed {
            for (&key, &q) in grants {
                a.push(NodeId::test(node), Grant::new(KeyId::test(key), f64::from(q)));
            }
        }
        if shared {
            a.share_keys();
        }
        a.forget_keys_from(bound);
        let want: Vec<(NodeId, Vec<Grant>)> = pushed
            .iter()
            .map(|(&n, g)| {
                let g = g.iter().filter(|(k, _)| (**k as usize) < bound);
                let g = g.map(|(&k, &q)| Grant::new(KeyId::test(k), f64::from(q)));
                (NodeId::test(n), g.collect::<Vec<_>>())
            })
            .filter(|(_, g)| !g.is_empty())
            .collect();
        let read: Vec<(NodeId, Vec<Grant>)> =
            a.iter().map(|(n, g)| (n, g.iter().collect())).collect();
        prop_assert_eq!(read, want);
    }

    /// The kept amount is the largest `f32` not above the computed one,
    /// and a node's whole-unit decision is the same with either below
    /// 2^24 units.
    #[test]
    fn a_grant_rounds_down_to_the_nearest_f32(q in 0.0f64..1e12) {
        let kept = amount(q);
        prop_assert!(kept <= q);
        prop_assert!(f64::from((kept as f32).next_up()) > q);
        if q < 16_777_216.0 {
            prop_assert_eq!(kept.floor(), q.floor());
        }
    }
}
