//! What an assign produces: per node, its grants of one slot.

use std::sync::Arc;

use crate::arena::{KeyId, NodeId};

/// One node's quota for one (user, resource) in one slot.
///
/// 8 bytes and `Copy`: the key is named by its id in the service's arena,
/// so building a slot's million grants touches no reference count, and the
/// amount is kept as an `f32`, which is also what the retention keeps of
/// older slots ([`QuotaHistory`](super::QuotaHistory)).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Grant {
    /// The (user, resource) key.
    pub key: KeyId,
    pub(super) amount: f32,
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
/// encoded only when it is sent ([`encode_grants`](crate::assigner::render::encode_grants), or
/// [`to_user_quotas`](crate::assigner::render::to_user_quotas) for a message).
///
/// A node's grants name the same keys in the same order from one assign
/// to the next while its users stay, so each node's keys are one list
/// shared with the assignments before it (and the [`QuotaHistory`](super::QuotaHistory), and
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

    /// Drops the grants of keys whose ids are `bound` or above: keys cut
    /// from the arena, whose ids new keys may hold next.
    pub fn forget_keys_from(&mut self, bound: usize) {
        for column in &mut self.nodes {
            if column.keys().iter().all(|k| k.index() < bound) {
                continue;
            }
            let kept = column.keys().iter().zip(&column.amounts);
            let (keys, amounts): (Vec<KeyId>, Vec<f32>) =
                kept.filter(|(k, _)| k.index() < bound).unzip();
            column.shared = Arc::from(keys);
            column.own = None;
            column.amounts = amounts;
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
    pub(super) keys: &'a [KeyId],
    /// The list `keys` is, when it is one shared list.
    pub(super) shared: Option<&'a Arc<[KeyId]>>,
    pub(super) amounts: &'a [f32],
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

    /// The grants' amounts, in the order of their keys.
    pub fn amounts(&self) -> &'a [f32] {
        self.amounts
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

/// Whether `grants` name the keys of `keys`, in that order: a node's grants
/// do from one assign to the next while its users stay.
pub fn same_keys(keys: &[KeyId], grants: NodeGrants<'_>) -> bool {
    std::ptr::eq(keys, grants.keys) || keys == grants.keys
}
