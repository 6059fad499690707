//! What nodes were granted before, as a policy reads it.

use std::borrow::Cow;
use std::collections::BTreeMap;

use super::assignment::Assignment;
use super::history::QuotaHistory;
use crate::arena::{Cuts, KeyId, NodeId};

/// The grants nodes got for slots before the one being assigned, as the
/// ledger holds them: the book's slots (the previous one on) and the
/// older ones the [`QuotaHistory`] keeps. A policy that weighs what was
/// granted but not yet reported ([`Projected`](super::Projected)) reads them here rather
/// than keeping a copy of its own.
#[derive(Debug, Clone, Copy)]
pub struct Granted<'a> {
    book: &'a BTreeMap<i64, Assignment>,
    kept: &'a QuotaHistory,
    cuts: &'a Cuts,
}

impl<'a> Granted<'a> {
    /// The grants of the slots in `book`, and of the older slots in `kept`
    /// but those of keys cut from the arena since (`cuts`).
    pub fn new(
        book: &'a BTreeMap<i64, Assignment>,
        kept: &'a QuotaHistory,
        cuts: &'a Cuts,
    ) -> Self {
        Self { book, kept, cuts }
    }

    /// A reader of `slot`'s grants.
    pub fn slot(&self, slot: i64) -> SlotGrants<'a> {
        let source = match self.book.get(&slot) {
            Some(assignment) => Source::Book(assignment),
            None => Source::Kept(self.kept, slot),
        };
        SlotGrants {
            source,
            bound: self.cuts.bound(slot),
            nodes: Vec::new(),
        }
    }
}

/// One slot's grants, looked up for keys in increasing id order, as a pass
/// over a service's keys asks for them.
///
/// Each node's grants are listed in key order (an assign pushes them as it
/// walks the keys), so each node's lookups resume where its last one
/// stopped: a pass over every key reads each node's list once, in order.
/// Asked out of order, a lookup finds nothing rather than a wrong grant.
///
/// A node's grants are found on its first lookup: the history reads back
/// a slot kept as changes for that node alone, so a pass that only asks
/// about the few nodes whose reports are late reads little of it.
#[derive(Debug)]
pub struct SlotGrants<'a> {
    source: Source<'a>,
    /// The first key id the slot's grants no longer name (see [`Cuts`]).
    bound: usize,
    /// By node index, once looked up: the node's grants and how far its
    /// lookups have read.
    nodes: Vec<Option<(Column<'a>, usize)>>,
}

#[derive(Debug, Clone, Copy)]
enum Source<'a> {
    Book(&'a Assignment),
    Kept(&'a QuotaHistory, i64),
}

/// A node's grants in one slot, as the book or the history holds them:
/// its keys and, in the same order, its amounts.
#[derive(Debug)]
struct Column<'a> {
    keys: &'a [KeyId],
    amounts: Cow<'a, [f32]>,
}

impl SlotGrants<'_> {
    /// What `node` was granted of `key` in this slot, if anything. `key`
    /// must not come before the key of the node's previous lookup.
    pub fn get(&mut self, node: NodeId, key: KeyId) -> Option<f32> {
        if key.index() >= self.bound {
            return None;
        }
        let i = node.index();
        if self.nodes.len() <= i {
            self.nodes.resize_with(i + 1, || None);
        }
        let (column, at) = match &mut self.nodes[i] {
            Some(found) => found,
            empty => {
                let (keys, amounts) = match self.source {
                    Source::Book(assignment) => match assignment.get(node) {
                        Some(g) => (g.keys(), Cow::Borrowed(g.amounts())),
                        None => (&[][..], Cow::Borrowed(&[][..])),
                    },
                    Source::Kept(kept, slot) => kept
                        .node_quotas(slot, node)
                        .unwrap_or((&[], Cow::Borrowed(&[]))),
                };
                let column = Column { keys, amounts };
                empty.insert((column, 0))
            }
        };
        while column.keys.get(*at).is_some_and(|&k| k < key) {
            *at += 1;
        }
        (column.keys.get(*at) == Some(&key))
            .then(|| column.amounts.get(*at).copied())
            .flatten()
    }
}
