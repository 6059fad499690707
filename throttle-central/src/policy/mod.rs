//! How a service's stored tokens are split between nodes.
//!
//! Each service has one [`Policy`], as each service of the original central
//! node was a module with `consume`, `get_quota` and `assign`. The ledger
//! calls [`Policy::consume`] after filing each report, [`Policy::assign`]
//! once per slot, and [`Policy::grants_for`] to answer a report.
//!
//! - [`Projected`]: the default; see its docs.
//! - [`Classic`]: the original algorithm, kept exactly.
//! - [`StaticSplit`]: each node gets the rate divided by the number of
//!   active nodes; a baseline for comparisons.

mod classic;
mod history;
mod projected;
mod split;

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

pub use classic::Classic;
pub use history::{QuotaHistory, SlotQuotas};
pub use projected::Projected;
pub use split::StaticSplit;
use throttle_proto::v1;
use throttle_proto::wire::QuotaEncoder;

use crate::ledger::{KeyId, NodeId, ServiceState};

/// One node's quota for one (user, resource) in one slot.
///
/// 8 bytes and `Copy`: the key is named by its id in the service's arena,
/// so building a slot's million grants touches no reference count, and the
/// amount is kept as an `f32`, which is also what the retention keeps of
/// older slots ([`QuotaHistory`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Grant {
    /// The (user, resource) key.
    pub key: KeyId,
    amount: f32,
}

impl Grant {
    /// A grant of `amount` (at least 0), kept as the largest `f32` not
    /// above it.
    ///
    /// Rounding down never grants more than the policy computed, so the
    /// grants of a key still sum to at most what its bucket holds. A node
    /// decides on whole units (`used > floor(quota)`), and below 2^24 the
    /// floor of the kept amount is the floor of the computed one: the
    /// rounding changes no decision there, and above it errs by at most 1
    /// part in 16 million, towards refusing, as the node's own `f32`
    /// quotas do.
    pub fn new(key: KeyId, amount: f64) -> Self {
        Self {
            key,
            amount: throttle_proto::f32_at_most(amount.max(0.0)),
        }
    }

    /// How much the node may admit.
    pub fn amount(&self) -> f64 {
        f64::from(self.amount)
    }
}

/// Quotas of one slot, per node. Compact: the protobuf message for a node is
/// encoded only when it is sent ([`encode_grants`], or [`to_user_quotas`]
/// for a message).
///
/// A node's grants name the same keys in the same order from one assign
/// to the next while its users stay, so each node's keys are one list
/// shared with the assignments before it (and the [`QuotaHistory`], and
/// the skeleton its quotas are encoded from): an assignment begun with
/// [`Assignment::clear_like`] follows the keys of the one given, and keeps
/// keys of its own only for a node whose grants stop following them. Each
/// grant then takes 4 bytes (its amount) in each of the assignments the
/// book holds, rather than 8.
#[derive(Debug, Default)]
pub struct Assignment {
    /// Indexed by node id; a node without grants has no amounts.
    nodes: Vec<NodeColumn>,
}

/// One node's grants in an [`Assignment`].
#[derive(Debug, Default)]
struct NodeColumn {
    /// While `own` is `None`, the grants' keys are the first
    /// `amounts.len()` of these.
    shared: Arc<[KeyId]>,
    /// The grants' keys, once they stopped following `shared`'s.
    own: Option<Vec<KeyId>>,
    amounts: Vec<f32>,
}

impl NodeColumn {
    /// Goes on in a list of its own, whose next key is `key`: the grants
    /// no longer name the shared list's keys.
    #[cold]
    #[inline(never)]
    fn stop_following(&mut self, key: KeyId) {
        let at = self.amounts.len();
        let mut own = Vec::with_capacity(self.shared.len().max(at + 1));
        own.extend_from_slice(&self.shared[..at]);
        own.push(key);
        self.own = Some(own);
    }

    fn keys(&self) -> &[KeyId] {
        match &self.own {
            Some(own) => own,
            None => &self.shared[..self.amounts.len()],
        }
    }

    /// The shared list when the grants' keys are all of it, else an
    /// empty one: what an assignment begun like this one follows.
    fn shared_list(&self) -> Arc<[KeyId]> {
        self.grants().shared.cloned().unwrap_or_default()
    }

    fn grants(&self) -> NodeGrants<'_> {
        let shared =
            (self.own.is_none() && self.shared.len() == self.amounts.len()).then_some(&self.shared);
        NodeGrants {
            keys: self.keys(),
            shared,
            amounts: &self.amounts,
        }
    }
}

impl Assignment {
    /// Gives `node` a grant. Inlined into a policy's pass over the keys,
    /// where it runs once per grant: a million times an assign.
    #[inline]
    pub fn push(&mut self, node: NodeId, grant: Grant) {
        let i = node.index();
        if i >= self.nodes.len() {
            self.add_nodes(i + 1);
        }
        let column = &mut self.nodes[i];
        let at = column.amounts.len();
        match &mut column.own {
            None if column.shared.get(at) == Some(&grant.key) => {}
            Some(own) => own.push(grant.key),
            None => column.stop_following(grant.key),
        }
        column.amounts.push(grant.amount);
    }

    #[cold]
    #[inline(never)]
    fn add_nodes(&mut self, len: usize) {
        self.nodes.resize_with(len, NodeColumn::default);
    }

    /// Removes every grant, keeping the memory of the amounts for the next
    /// assign.
    pub fn clear(&mut self) {
        self.clear_like(None);
    }

    /// Removes every grant, as [`Assignment::clear`], and has each node's
    /// next grants follow its keys in `like` (a recent assignment): while
    /// they name the same keys in the same order, they share its list.
    pub fn clear_like(&mut self, like: Option<&Assignment>) {
        for (i, column) in self.nodes.iter_mut().enumerate() {
            column.amounts.clear();
            column.own = None;
            column.shared = like
                .and_then(|l| l.nodes.get(i))
                .map(NodeColumn::shared_list)
                .unwrap_or_default();
        }
        if let Some(like) = like {
            for column in like.nodes.iter().skip(self.nodes.len()) {
                self.nodes.push(NodeColumn {
                    shared: column.shared_list(),
                    ..NodeColumn::default()
                });
            }
        }
    }

    /// Makes each node's keys one shared list, so that whatever keeps them
    /// beside this assignment (the history, a skeleton, the next assign)
    /// shares them rather than copying: the keys of a node whose grants
    /// stopped following the shared list, or ended before its end, become
    /// a new shared list.
    pub fn share_keys(&mut self) {
        for column in &mut self.nodes {
            if column.amounts.is_empty() {
                column.own = None;
                column.shared = Arc::default();
            } else if column.own.is_some() || column.shared.len() != column.amounts.len() {
                column.shared = Arc::from(column.keys());
                column.own = None;
            }
        }
    }

    /// The grants of `node`, if it has any.
    pub fn get(&self, node: NodeId) -> Option<NodeGrants<'_>> {
        self.nodes
            .get(node.index())
            .filter(|c| !c.amounts.is_empty())
            .map(NodeColumn::grants)
    }

    /// Every node with grants, and its grants.
    pub fn iter(&self) -> impl Iterator<Item = (NodeId, NodeGrants<'_>)> {
        self.nodes
            .iter()
            .enumerate()
            .filter(|(_, c)| !c.amounts.is_empty())
            .map(|(i, c)| (NodeId::from_index(i), c.grants()))
    }
}

/// One node's grants in an [`Assignment`]: its keys and, in the same
/// order, its amounts.
#[derive(Debug, Clone, Copy)]
pub struct NodeGrants<'a> {
    keys: &'a [KeyId],
    /// The list `keys` is, when it is one shared list.
    shared: Option<&'a Arc<[KeyId]>>,
    amounts: &'a [f32],
}

impl<'a> NodeGrants<'a> {
    /// How many grants.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Whether these are the very grants `other` are (the same lists, not
    /// equal ones).
    pub fn is(&self, other: &NodeGrants<'_>) -> bool {
        std::ptr::eq(self.keys, other.keys) && std::ptr::eq(self.amounts, other.amounts)
    }

    /// The grants' keys.
    pub fn keys(&self) -> &'a [KeyId] {
        self.keys
    }

    /// The grants, in order.
    pub fn iter(self) -> impl Iterator<Item = Grant> + 'a {
        let (keys, amounts) = (self.keys, self.amounts);
        keys.iter()
            .zip(amounts)
            .map(|(&key, &amount)| Grant { key, amount })
    }

    /// The keys as the one list the assignment shares, if they are (see
    /// [`Assignment::share_keys`]).
    pub fn shared_keys(&self) -> Option<Arc<[KeyId]>> {
        self.shared.cloned()
    }
}

/// The grants nodes got for slots before the one being assigned, as the
/// ledger holds them: the book's slots (the previous one on) and the
/// older ones the [`QuotaHistory`] keeps. A policy that weighs what was
/// granted but not yet reported ([`Projected`]) reads them here rather
/// than keeping a copy of its own.
#[derive(Debug, Clone, Copy)]
pub struct Granted<'a> {
    book: &'a BTreeMap<i64, Assignment>,
    kept: &'a QuotaHistory,
}

impl<'a> Granted<'a> {
    /// The grants of the slots in `book`, and of the older slots in `kept`.
    pub fn new(book: &'a BTreeMap<i64, Assignment>, kept: &'a QuotaHistory) -> Self {
        Self { book, kept }
    }

    /// A reader of `slot`'s grants.
    pub fn slot(&self, slot: i64) -> SlotGrants<'a> {
        let source = match self.book.get(&slot) {
            Some(assignment) => Source::Book(assignment),
            None => Source::Kept(self.kept, slot),
        };
        SlotGrants {
            source,
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
        let i = node.index();
        if self.nodes.len() <= i {
            self.nodes.resize_with(i + 1, || None);
        }
        let (column, at) = match &mut self.nodes[i] {
            Some(found) => found,
            empty => {
                let (keys, amounts) = match self.source {
                    Source::Book(assignment) => match assignment.get(node) {
                        Some(g) => (g.keys, Cow::Borrowed(g.amounts)),
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

/// Whether `grants` name the keys of `keys`, in that order: a node's grants
/// do from one assign to the next while its users stay.
pub(crate) fn same_keys(keys: &[KeyId], grants: NodeGrants<'_>) -> bool {
    std::ptr::eq(keys, grants.keys) || keys == grants.keys
}

/// Sorts `order` so that each user's grants form one run: (the user's name
/// address, index in `grants`). A user's keys share its name's allocation,
/// so this gathers them without comparing names. Protobuf map entries must
/// not repeat a user.
fn gather_by_user(state: &ServiceState, grants: NodeGrants<'_>, order: &mut Vec<(usize, u32)>) {
    order.clear();
    order.extend(
        grants
            .keys
            .iter()
            .enumerate()
            .map(|(i, &k)| (state.key(k).user().as_ptr() as usize, i as u32)),
    );
    order.sort_unstable();
}

/// One user's run of `order`: its name and its (resource, amount) pairs.
fn user_run<'a>(
    state: &'a ServiceState,
    grants: NodeGrants<'a>,
    run: &'a [(usize, u32)],
) -> (&'a str, impl Iterator<Item = (&'a str, f64)> + Clone) {
    let user = state.key(grants.keys[run[0].1 as usize]).user();
    let resources = run.iter().map(move |&(_, i)| {
        let i = i as usize;
        (
            state.key(grants.keys[i]).resource(),
            f64::from(grants.amounts[i]),
        )
    });
    (user, resources)
}

/// Writes one node's grants into `out` as the users of the (service, slot)
/// just begun there, noting in `amounts_at[i]` where the amount of
/// `grants[i]` is in that table (see [`QuotaEncoder::user_noting`]), as a
/// `u32`: the skeleton that keeps them holds one per grant, and a gRPC
/// message cannot pass 4 GiB (an offset that would is noted as
/// `u32::MAX`; the ledger keeps no skeleton of users that long). `order`
/// is scratch space.
pub fn encode_grants(
    out: &mut QuotaEncoder,
    state: &ServiceState,
    grants: NodeGrants<'_>,
    order: &mut Vec<(usize, u32)>,
    amounts_at: &mut Vec<u32>,
) {
    gather_by_user(state, grants, order);
    amounts_at.clear();
    amounts_at.resize(grants.len(), 0);
    let mut noted = Vec::new();
    for run in order.chunk_by(|a, b| a.0 == b.0) {
        let (user, resources) = user_run(state, grants, run);
        noted.clear();
        out.user_noting(user, resources, &mut noted);
        for (&(_, i), &at) in run.iter().zip(&noted) {
            amounts_at[i as usize] = u32::try_from(at).unwrap_or(u32::MAX);
        }
    }
}

/// The protobuf form of one node's grants. The users' map is built from
/// one sorted list rather than one insertion per grant.
pub fn to_user_quotas(state: &ServiceState, grants: NodeGrants<'_>) -> v1::UserQuotas {
    let mut order = Vec::with_capacity(grants.len());
    gather_by_user(state, grants, &mut order);
    let users: Vec<(String, v1::ResourceQuotas)> = order
        .chunk_by(|a, b| a.0 == b.0)
        .map(|run| {
            let (user, resources) = user_run(state, grants, run);
            let resources = resources.map(|(r, a)| (r.to_owned(), a)).collect();
            (user.to_owned(), v1::ResourceQuotas { resources })
        })
        .collect();
    v1::UserQuotas {
        users: users.into_iter().collect(),
    }
}

/// A quota strategy for one service; see the [module docs](self).
pub trait Policy: Send + fmt::Debug {
    /// Short name, for logs and the monitor.
    fn name(&self) -> &'static str;

    /// Called after the ledger filed a report of `node` for data slot `slot`.
    fn consume(&mut self, state: &ServiceState, node: NodeId, slot: i64, now_ms: i64) {
        let _ = (state, node, slot, now_ms);
    }

    /// How many slots ahead of the current one [`Policy::assign`] computes,
    /// when run at mid-slot.
    fn lead(&self) -> i64 {
        2
    }

    /// Whether the central node should re-assign the *current* slot and push
    /// it as soon as every active node has reported the previous one
    /// (default: no, as the original).
    fn reassign_when_reported(&self) -> bool {
        false
    }

    /// Computes every node's quota for `slot` into `out` and returns it.
    ///
    /// `out` is empty: an assignment the book let go, cleared, whose
    /// vectors keep their capacity, and begun like the book's newest
    /// ([`Assignment::clear_like`]), so an assign in the steady state
    /// allocates nothing: push each node's grants in key order.
    ///
    /// `granted` holds what nodes were granted for recent slots before
    /// `slot` (and, when `slot` is re-assigned, what it was assigned).
    fn assign(
        &mut self,
        state: &ServiceState,
        granted: Granted<'_>,
        slot: i64,
        now_ms: i64,
        out: Assignment,
    ) -> Assignment;

    /// The grants of `node` for `slot`, to answer a report or push: what
    /// [`Policy::assign`] computed, found in `book` (slot -> assignment).
    ///
    /// A slot not assigned yet has none (as the original), except for a
    /// policy that assigns one slot ahead ([`Policy::lead`] 1): a report is
    /// answered before its next slot is assigned, so until then the node's
    /// grants of the slot before stand in, a safety net should the coming
    /// push be lost. Answering never runs an assign, so reports arriving
    /// together do not queue behind one.
    fn grants_for<'a>(
        &self,
        book: &'a BTreeMap<i64, Assignment>,
        node: NodeId,
        slot: i64,
    ) -> Option<NodeGrants<'a>> {
        match book.get(&slot) {
            Some(a) => a.get(node),
            None if self.lead() <= 1 => book.get(&(slot - 1))?.get(node),
            None => None,
        }
    }

    /// Drops whatever the policy keeps about slots before `slot`.
    fn forget_before(&mut self, slot: i64) {
        let _ = slot;
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn amount(q: f64) -> f64 {
        Grant::new(KeyId::test(0), q).amount()
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
            let granted = Granted::new(&book, &kept);
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
}
