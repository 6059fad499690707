//! The rows of monitor answers ([`Monitor`](super::Monitor)): what the ledger holds, as
//! owned rows that the HTTP layer renders (and that may leave the ledger's
//! thread).

use crate::arena::key::NodeUsage;
use crate::bucket::Bucket;
use crate::limits::Period;

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
    /// The period of the limit it stands for.
    pub period: Period,
}

/// One (user, resource) key: its distribution and its buckets.
#[derive(Debug, Clone, PartialEq)]
pub struct KeyView {
    /// The user.
    pub user: String,
    /// The resource.
    pub resource: String,
    /// Per node, its latest report within the range asked.
    pub nodes: Vec<NodeEntry>,
    /// The bucket with the least room, when the user has a limit on the
    /// resource: the one quotas are cut from.
    pub bucket: Option<BucketView>,
    /// The other periods' buckets, for a key limited over several.
    pub others: Vec<BucketView>,
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

pub(super) fn bucket_view(period: Period, b: &Bucket, now_ms: i64) -> BucketView {
    BucketView {
        level: b.level_at(now_ms),
        rate: b.rate(),
        capacity: b.capacity(),
        period,
    }
}
