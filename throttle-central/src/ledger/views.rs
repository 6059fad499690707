//! Typed answers to monitor questions: what the ledger holds, as owned rows
//! that the HTTP layer renders (and that may leave the ledger's thread).

use super::ids::NodeId;
use super::ledger::Ledger;
use super::state::{NodeUsage, ServiceState};
use crate::policy::NodeGrants;

/// An inclusive slot range for monitor queries; open ends are unbounded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SlotRange {
    /// First slot, inclusive.
    pub start: Option<i64>,
    /// Last slot, inclusive.
    pub end: Option<i64>,
}

impl SlotRange {
    /// Whether `slot` is in the range.
    pub fn contains(&self, slot: i64) -> bool {
        self.start.is_none_or(|s| slot >= s) && self.end.is_none_or(|e| slot <= e)
    }
}

/// Rows per service, in the order of the services' names; every known
/// service is listed, with no rows if it has none.
pub type ServiceRows<T> = Vec<(String, Vec<T>)>;

/// One key's sum of consumption (or rejection) in one data slot.
#[derive(Debug, Clone, PartialEq)]
pub struct SumRow {
    /// The data slot.
    pub slot: i64,
    /// The user.
    pub user: String,
    /// The resource.
    pub resource: String,
    /// The sum over every node.
    pub amount: i64,
}

/// One node's latest report of a key.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeEntry {
    /// The node's name.
    pub node: String,
    /// What it reported.
    pub usage: NodeUsage,
}

/// A bucket as the monitor shows it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BucketView {
    /// The level now (may be negative).
    pub level: f64,
    /// Tokens per second.
    pub rate: f64,
    /// Most tokens held.
    pub capacity: f64,
}

/// One (user, resource) key: its distribution and its bucket.
#[derive(Debug, Clone, PartialEq)]
pub struct KeyView {
    /// The user.
    pub user: String,
    /// The resource.
    pub resource: String,
    /// Per node, its latest report within the range asked.
    pub nodes: Vec<NodeEntry>,
    /// The bucket, when the user has a limit on the resource.
    pub bucket: Option<BucketView>,
}

/// One slot's quotas of a service, per node.
#[derive(Debug, Clone, PartialEq)]
pub struct QuotaSlot {
    /// The slot the quotas are for.
    pub slot: i64,
    /// Every grant: (node, user, resource, amount).
    pub grants: Vec<QuotaRow>,
}

/// One node's quota of one key.
#[derive(Debug, Clone, PartialEq)]
pub struct QuotaRow {
    /// The node's name.
    pub node: String,
    /// The user.
    pub user: String,
    /// The resource.
    pub resource: String,
    /// How much the node may admit in the slot.
    pub amount: f64,
}

impl Ledger {
    /// Data slot -> the nodes that reported it, oldest first.
    pub fn reported_view(&self, range: SlotRange) -> Vec<(i64, Vec<String>)> {
        self.reported
            .iter()
            .filter(|(slot, _)| range.contains(**slot))
            .map(|(slot, nodes)| {
                let names = nodes.iter().map(|n| self.node_name(*n).to_owned());
                (*slot, names.collect())
            })
            .collect()
    }

    /// Per service, every key's summed consumption (or rejection) per
    /// data slot, where it is not zero.
    pub fn sums_view(&self, range: SlotRange, rejection: bool) -> ServiceRows<SumRow> {
        let which = usize::from(rejection);
        let rows = |state: &ServiceState| {
            let columns = state.sums.iter().filter(|c| range.contains(c.slot));
            columns
                .flat_map(|column| {
                    column.columns[which].iter().map(|(id, amount)| {
                        let key = state.key(id);
                        SumRow {
                            slot: column.slot,
                            user: key.user().to_owned(),
                            resource: key.resource().to_owned(),
                            amount,
                        }
                    })
                })
                .collect()
        };
        self.services
            .iter()
            .map(|(name, svc)| (name.to_string(), rows(&svc.state)))
            .collect()
    }

    /// Per service, every key's latest entry per node (within `range`)
    /// and its bucket as of `now_ms`.
    pub fn distribution_view(&self, range: SlotRange, now_ms: i64) -> ServiceRows<KeyView> {
        let view = |(_, key): (_, &super::Key)| KeyView {
            user: key.user().to_owned(),
            resource: key.resource().to_owned(),
            nodes: key
                .nodes()
                .iter()
                .filter(|n| range.contains(n.slot))
                .map(|n| NodeEntry {
                    node: self.node_name(n.node).to_owned(),
                    usage: *n,
                })
                .collect(),
            bucket: key.bucket().map(|b| BucketView {
                level: b.level_at(now_ms),
                rate: b.rate(),
                capacity: b.capacity(),
            }),
        };
        self.services
            .iter()
            .map(|(name, svc)| (name.to_string(), svc.state.keys().map(view).collect()))
            .collect()
    }

    /// Per service, the quotas of every slot held (the older ones compact),
    /// oldest first; a slot the book holds is listed after the same slot
    /// kept compact, and stands for it.
    pub fn quota_view(&self, range: SlotRange) -> ServiceRows<QuotaSlot> {
        let mut out = Vec::with_capacity(self.services.len());
        for (name, svc) in &self.services {
            let mut slots = Vec::new();
            svc.kept.read(range.start, |slot, quotas| {
                if range.contains(slot) {
                    slots.push(self.quota_slot(&svc.state, slot, quotas.iter()));
                }
            });
            for (slot, assignment) in svc.book.iter().filter(|(s, _)| range.contains(**s)) {
                slots.push(self.quota_slot(&svc.state, *slot, assignment.iter()));
            }
            out.push((name.to_string(), slots));
        }
        out
    }

    fn quota_slot<'a>(
        &self,
        state: &ServiceState,
        slot: i64,
        grants: impl Iterator<Item = (NodeId, NodeGrants<'a>)>,
    ) -> QuotaSlot {
        let mut rows = Vec::new();
        for (node, grants) in grants {
            for g in grants.iter() {
                let key = state.key(g.key);
                rows.push(QuotaRow {
                    node: self.node_name(node).to_owned(),
                    user: key.user().to_owned(),
                    resource: key.resource().to_owned(),
                    amount: g.amount(),
                });
            }
        }
        QuotaSlot { slot, grants: rows }
    }
}
