//! [`Monitor`]: the monitor's questions to the ledger, a page at a time.

use super::ledger::Ledger;
use super::page::{Filler, Page, Paged};
use super::views::{KeyView, NodeEntry, QuotaRow, QuotaSlot, SlotRange, SumRow, bucket_view};
use crate::arena::ids::NodeId;
use crate::arena::state::ServiceState;
use crate::policy::{AppsStatus, NodeGrants};

/// The monitor's questions to a [`Ledger`], each answered with owned rows:
/// `Monitor::of(&ledger).sums(range, false, &page)`.
#[derive(Debug, Clone, Copy)]
pub struct Monitor<'a> {
    ledger: &'a Ledger,
}

impl<'a> Monitor<'a> {
    /// The questions to `ledger`.
    pub fn of(ledger: &'a Ledger) -> Self {
        Self { ledger }
    }

    /// Data slot -> the nodes that reported it, oldest first. Not paged:
    /// at most `nr_slot` slots of the connected nodes.
    pub fn reported(self, range: SlotRange) -> Vec<(i64, Vec<String>)> {
        self.ledger
            .reported
            .iter()
            .filter(|(slot, _)| range.contains(**slot))
            .map(|(slot, nodes)| {
                let names = nodes.iter().map(|n| self.ledger.node_name(*n).to_owned());
                (*slot, names.collect())
            })
            .collect()
    }

    /// Per service that shares a capacity, how its policy split it in its
    /// latest assign (`service` only, if given).
    pub fn apps(self, service: Option<&str>) -> Vec<(String, AppsStatus)> {
        self.ledger
            .services
            .iter()
            .filter(|(name, _)| service.is_none_or(|s| s == &***name))
            .filter_map(|(name, svc)| Some((name.to_string(), svc.policy.apps()?.clone())))
            .collect()
    }

    /// Per service, a page of every key's summed consumption (or
    /// rejection) per data slot, where it is not zero.
    pub fn sums(self, range: SlotRange, rejection: bool, page: &Page) -> Paged<SumRow> {
        let which = usize::from(rejection);
        let mut fill = Filler::new(page);
        for (name, svc, start) in self.services_from(page) {
            if !fill.open(name) {
                break;
            }
            let state = &svc.state;
            let columns = state.sums.iter().filter(|c| range.contains(c.slot));
            let rows = columns.flat_map(|c| c.columns[which].iter().map(|(id, n)| (c.slot, id, n)));
            for (position, (slot, id, amount)) in rows.enumerate().skip(start) {
                let key = state.key(id);
                if !page.wants(key.user()) {
                    continue;
                }
                let row = || SumRow {
                    slot,
                    user: key.user().to_owned(),
                    resource: key.resource().to_owned(),
                    amount,
                };
                if !fill.push(position, |rows| rows.push(row())) {
                    break;
                }
            }
        }
        fill.finish()
    }

    /// Per service, a page of keys: each key's latest entry per node
    /// (within `range`) and its bucket as of `now_ms`.
    pub fn distribution(self, range: SlotRange, now_ms: i64, page: &Page) -> Paged<KeyView> {
        let view = |key: &super::Key| KeyView {
            user: key.user().to_owned(),
            resource: key.resource().to_owned(),
            nodes: key
                .nodes()
                .iter()
                .filter(|n| range.contains(n.slot))
                .map(|n| NodeEntry {
                    node: self.ledger.node_name(n.node).to_owned(),
                    usage: *n,
                })
                .collect(),
            bucket: key.buckets().next().map(|(p, b)| bucket_view(p, b, now_ms)),
            others: key
                .buckets()
                .skip(1)
                .map(|(p, b)| bucket_view(p, b, now_ms))
                .collect(),
        };
        let mut fill = Filler::new(page);
        for (name, svc, start) in self.services_from(page) {
            if !fill.open(name) {
                break;
            }
            // A key's position is its id: a page starts at its cursor's
            // key without reading the ones before.
            for (id, key) in svc.state.keys_from(start, page.user.as_deref()) {
                if !fill.push(id.index(), |rows| rows.push(view(key))) {
                    break;
                }
            }
        }
        fill.finish()
    }

    /// Per service, a page of the quotas of every slot held (the older
    /// ones compact), oldest first; a slot the book holds is listed after
    /// the same slot kept compact, and stands for it.
    pub fn quota(self, range: SlotRange, page: &Page) -> Paged<QuotaSlot> {
        let mut fill = Filler::new(page);
        for (name, svc, start) in self.services_from(page) {
            if !fill.open(name) {
                break;
            }
            let mut quota = QuotaPager {
                ledger: self.ledger,
                state: &svc.state,
                page,
                start,
                position: 0,
                fill: &mut fill,
            };
            svc.kept.read(range.start, |slot, quotas| {
                if range.contains(slot) {
                    quota.slot(slot, quotas.iter());
                }
            });
            for (slot, assignment) in svc.book.iter().filter(|(s, _)| range.contains(**s)) {
                quota.slot(*slot, assignment.iter());
            }
        }
        fill.finish()
    }

    /// The services a page reads, in name order, each with the position
    /// its rows start from.
    fn services_from<'p>(
        self,
        page: &'p Page,
    ) -> impl Iterator<Item = (&'a str, &'a super::service::Service, usize)> + 'p
    where
        'a: 'p,
    {
        let services = self.ledger.services.iter();
        services.filter_map(|(name, svc)| Some((&**name, svc, page.start_of(name)?)))
    }
}

/// Fills a page with one service's quotas, slot by slot.
struct QuotaPager<'a, 'f> {
    ledger: &'a Ledger,
    state: &'a ServiceState,
    page: &'a Page,
    start: usize,
    /// The position of the next grant read.
    position: usize,
    fill: &'f mut Filler<QuotaSlot>,
}

impl QuotaPager<'_, '_> {
    fn slot<'g>(&mut self, slot: i64, grants: impl Iterator<Item = (NodeId, NodeGrants<'g>)>) {
        let mut opened = false;
        for (node, grants) in grants {
            for g in grants.iter() {
                let position = self.position;
                self.position += 1;
                let Some(key) = self.state.granted_key(g.key, slot) else {
                    continue;
                };
                if position < self.start || !self.page.wants(key.user()) {
                    continue;
                }
                let row = QuotaRow {
                    node: self.ledger.node_name(node).to_owned(),
                    user: key.user().to_owned(),
                    resource: key.resource().to_owned(),
                    amount: g.amount(),
                };
                let added = self.fill.push(position, |slots| {
                    if !opened {
                        slots.push(QuotaSlot {
                            slot,
                            grants: Vec::new(),
                        });
                        opened = true;
                    }
                    if let Some(last) = slots.last_mut() {
                        last.grants.push(row);
                    }
                });
                if !added {
                    return;
                }
            }
        }
    }
}
