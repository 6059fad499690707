//! [`Key`]: everything the ledger keeps for one (service, user, resource),
//! and [`NodeUsage`], one node's part of it.

use std::sync::Arc;

use smallvec::SmallVec;

use super::charge::Charge;
use super::filing_at::Filing;
use super::ids::{Name, NodeId};
use super::periods::{Periods, bucket_for, room};
use crate::bucket::Bucket;
use crate::limits::{Period, Resolved};

/// One node's latest report for one (service, user, resource).
///
/// 24 bytes: a rejection count is a number of requests refused in one
/// slot, and the ledger drops one above `u32::MAX` as absurd
/// ([`DropReason::TooManyRejections`](crate::ledger::DropReason::TooManyRejections)), so it fits beside the node's id,
/// and a key's three inline entries take 72 bytes instead of 96.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NodeUsage {
    /// The node.
    pub node: NodeId,
    /// How many requests it refused for this resource in that slot.
    pub rejection: u32,
    /// The data slot of that report.
    pub slot: i64,
    /// What it consumed in that slot.
    pub consumption: i64,
}

/// Node entries kept inline in a key: with sticky load balancing a user is
/// on a few nodes, and then reading a key's distribution reads no other
/// allocation.
type NodeList = SmallVec<[NodeUsage; 3]>;

const _: () = assert!(std::mem::size_of::<NodeUsage>() == 24);

/// Everything the ledger keeps for one (service, user, resource).
///
/// 160 bytes, a third of them per (user, resource, node) entry
/// where a user is on 3 nodes: the resource's name is a thin pointer
/// (`Name`), whether the key has a bucket is a flag beside the
/// generation rather than an `Option`'s tag padded to 8 bytes, and the
/// buckets of a key limited over several periods are behind one pointer.
#[derive(Debug)]
pub struct Key {
    pub(crate) user: Arc<str>,
    pub(crate) resource: Name,
    pub(crate) nodes: NodeList,
    /// Meaningful while `limited`.
    pub(crate) bucket: Bucket,
    pub(crate) generation: u32,
    pub(crate) live: bool,
    pub(crate) limited: bool,
    /// How deep in debt the bucket may go; in what was padding.
    pub(crate) max_debt: MaxDebt,
    /// The buckets of other periods, for a key limited over several.
    pub(crate) periods: Option<Box<Periods>>,
}

/// How far below zero a bucket may go, in whole seconds of its rate, in
/// two bytes: 0 for as far as its capacity (the default), `u16::MAX` for
/// no bound, otherwise one more than the seconds (rounded up, at most
/// 65,533: 18 hours), so that no debt at all is a bound too.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct MaxDebt(u16);

impl MaxDebt {
    /// The bound of a limit's `max_debt_seconds`.
    pub(crate) fn of(seconds: Option<f64>) -> Self {
        match seconds {
            None => Self(0),
            Some(s) if s.is_infinite() => Self(u16::MAX),
            Some(s) => Self(s.max(0.0).ceil().min(f64::from(u16::MAX - 2)) as u16 + 1),
        }
    }

    /// The lowest level of `bucket` under this bound.
    pub(crate) fn floor(self, bucket: &Bucket) -> f64 {
        match self.0 {
            0 => -bucket.capacity(),
            u16::MAX => f64::NEG_INFINITY,
            s => bucket.floor(f64::from(s - 1)),
        }
    }
}

const _: () = assert!(std::mem::size_of::<Key>() == 160);

impl Key {
    pub(crate) fn new(user: Arc<str>, resource: Name, generation: u32) -> Self {
        Self {
            user,
            resource,
            nodes: NodeList::new(),
            bucket: Bucket::new(0.0, 0.0, 0),
            generation,
            live: true,
            limited: false,
            max_debt: MaxDebt::default(),
            periods: None,
        }
    }

    /// The bucket, when the user has a limit on this resource.
    pub(crate) fn bucket_mut(&mut self) -> Option<&mut Bucket> {
        self.limited.then_some(&mut self.bucket)
    }

    /// The user's name.
    pub fn user(&self) -> &str {
        &self.user
    }

    /// The resource's name.
    pub fn resource(&self) -> &str {
        &self.resource
    }

    /// Changes each time the key's id is given to a new key.
    pub fn generation(&self) -> u32 {
        self.generation
    }

    /// The bucket, when the user has a limit on this resource.
    pub fn bucket(&self) -> Option<&Bucket> {
        self.limited.then_some(&self.bucket)
    }

    /// Latest report per node.
    pub fn nodes(&self) -> &[NodeUsage] {
        &self.nodes
    }
}

impl Key {
    /// The period of the key's bucket (a second for keys no rule limits).
    pub fn period(&self) -> Period {
        self.periods.as_ref().map_or(Period::Second, |p| p.own)
    }

    /// The buckets of every period limiting the key, its own first.
    pub fn buckets(&self) -> impl Iterator<Item = (Period, &Bucket)> {
        let own = self.bucket().map(|b| (self.period(), b));
        let others = self.periods.iter().flat_map(|p| p.others.iter());
        own.into_iter().chain(others.map(|(p, b)| (*p, b)))
    }

    /// The bucket of `period`, if the key is limited over it.
    pub(crate) fn bucket_of_mut(&mut self, period: Period) -> Option<&mut Bucket> {
        if !self.limited {
            return None;
        }
        if self.period() == period {
            return Some(&mut self.bucket);
        }
        let mut others = self.periods.as_deref_mut()?.others.iter_mut();
        others.find(|(p, _)| *p == period).map(|(_, b)| b)
    }

    /// Whether the key is limited over a period longer than a second
    /// (alone or beside others).
    pub(crate) fn has_longer(&self) -> bool {
        self.limited && self.periods.is_some()
    }

    /// Limits the key as `resolved` says from `now_ms`: a bucket per
    /// period, each keeping its level if it had one. Returns whether the
    /// key has a bucket of a period longer than a second.
    pub(crate) fn set_allowances(&mut self, resolved: &Resolved, now_ms: i64) -> bool {
        let mut old: SmallVec<[(Period, Bucket); 4]> = SmallVec::new();
        if self.limited {
            old.push((self.period(), self.bucket.clone()));
        }
        if let Some(p) = self.periods.take() {
            old.extend(p.others);
        }
        let mut take = |period| {
            let i = old.iter().position(|(p, _)| *p == period)?;
            Some(old.swap_remove(i).1)
        };
        let mut buckets = resolved
            .allowances
            .iter()
            .map(|a| (a.period, bucket_for(a, take(a.period), now_ms)));
        let Some((own, bucket)) = buckets.next() else {
            self.limited = false;
            return false;
        };
        let others: SmallVec<[(Period, Bucket); 3]> = buckets.collect();
        let several = !others.is_empty();
        let longer = several || own != Period::Second;
        self.bucket = bucket;
        self.limited = true;
        self.max_debt = MaxDebt::of(resolved.max_debt_seconds);
        if longer {
            self.periods = Some(Box::new(Periods { own, others }));
        }
        self.bind(now_ms);
        longer
    }

    /// Makes the bucket with the least room the key's own.
    pub(crate) fn bind(&mut self, now_ms: i64) {
        let Some(p) = self.periods.as_deref_mut() else {
            return;
        };
        let mut least = room(&self.bucket, now_ms);
        let mut binding = None;
        for (i, (_, b)) in p.others.iter().enumerate() {
            let r = room(b, now_ms);
            if r < least {
                (least, binding) = (r, Some(i));
            }
        }
        if let Some(i) = binding {
            let (period, bucket) = &mut p.others[i];
            std::mem::swap(&mut self.bucket, bucket);
            std::mem::swap(&mut p.own, period);
        }
    }

    /// Charges `amount` to every bucket as `how` says, each no deeper
    /// than its floor.
    pub(crate) fn charge(&mut self, amount: i64, now_ms: i64, how: Charge) {
        let max_debt = self.max_debt;
        let charge = |b: &mut Bucket| match how {
            Charge::No => {}
            Charge::OnTime => b.consume_down_to(amount, now_ms, max_debt.floor(b)),
            Charge::Steady => b.consume_steady(amount, now_ms, max_debt.floor(b)),
            Charge::Late => b.consume_late(amount, now_ms, max_debt.floor(b)),
            Charge::Batched { since_ms } => {
                b.consume_batched(amount, now_ms, max_debt.floor(b), since_ms)
            }
            Charge::Emptying { .. } => b.consume_late(amount, now_ms, 0.0),
        };
        charge(&mut self.bucket);
        if let Some(p) = self.periods.as_deref_mut() {
            p.others.iter_mut().for_each(|(_, b)| charge(b));
        }
    }

    /// Every bucket as full when a checkpoint was taken (`taken_ms`) and
    /// refilled since, what its capacity turned away kept for late
    /// reports: a checkpoint lists only the buckets below their capacity.
    pub(crate) fn fill_as_of(&mut self, taken_ms: i64, now_ms: i64) {
        if !self.limited {
            return;
        }
        let fill = |b: &mut Bucket| b.restore(b.capacity(), taken_ms, now_ms);
        fill(&mut self.bucket);
        if let Some(p) = self.periods.as_deref_mut() {
            p.others.iter_mut().for_each(|(_, b)| fill(b));
        }
    }

    /// Every bucket keeps for late reports the refill since `since_ms`
    /// (at most what a bucket keeps): a key new to a ledger without a
    /// checkpoint, whose first consumption filed is of a slot before that
    /// ledger began (refusals may come first), so the refill its nodes
    /// admitted on then pays for it, and the level is the new buckets'
    /// start.
    fn keep_refill_since(&mut self, since_ms: i64, now_ms: i64) {
        self.bucket.keep_refill_since(since_ms, now_ms);
        if let Some(p) = self.periods.as_deref_mut() {
            (p.others.iter_mut()).for_each(|(_, b)| b.keep_refill_since(since_ms, now_ms));
        }
    }

    /// Whether every bucket holds at least what a new one would start
    /// with at `now_ms`: forgetting the key then gives its user nothing
    /// back.
    pub(crate) fn buckets_full(&self, now_ms: i64) -> bool {
        self.buckets().all(|(period, b)| {
            let start = match period {
                Period::Second => b.capacity().min(b.rate()),
                _ => b.capacity(),
            };
            b.level_at(now_ms) >= start
        })
    }
}

/// A rejection count as kept: the ledger drops counts above `u32::MAX`
/// before filing, so this saturates only in theory.
fn rejections(amount: i64) -> u32 {
    u32::try_from(amount.max(0)).unwrap_or(u32::MAX)
}

impl Key {
    pub(crate) fn file(&mut self, at: Filing, amount: i64) {
        let (node, slot, is_rejection) = (at.node, at.slot, at.is_rejection);
        if !is_rejection && self.limited {
            if let Charge::Emptying { since_ms } = at.charge
                && self.nodes.iter().all(|n| n.consumption == 0)
            {
                self.keep_refill_since(since_ms, at.now_ms);
            }
            self.charge(amount, at.now_ms, at.charge);
            if at.gap > 0 && at.charge != Charge::No {
                self.charge(amount.saturating_mul(at.gap), at.now_ms, Charge::Late);
            }
        }
        // Distribution: one entry per node, the latest report wins; both the
        // consumption and the rejection pass of one report land in it.
        match self.nodes.iter_mut().find(|n| n.node == node) {
            Some(n) if n.slot > slot => {}
            Some(n) => {
                if n.slot < slot {
                    *n = NodeUsage {
                        node,
                        slot,
                        consumption: 0,
                        rejection: 0,
                    };
                }
                if is_rejection {
                    n.rejection = rejections(amount);
                } else {
                    n.consumption = amount;
                }
            }
            None => self.nodes.push(NodeUsage {
                node,
                slot,
                consumption: if is_rejection { 0 } else { amount },
                rejection: if is_rejection { rejections(amount) } else { 0 },
            }),
        }
        // Its sum is added to the slot's column by the caller.
    }
}
