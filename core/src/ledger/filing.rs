//! Filing a report's usages into a service's state ([`Filer`]): keys
//! charged, distribution and sums updated.

use std::sync::Arc;

use smallvec::SmallVec;

use super::dropped::DropReason;
use super::ingested::Ingested;
use crate::arena::filing_at::Filing;
use crate::arena::ids::{KeyId, Name, valid_name};
use crate::arena::key::Key;
use crate::arena::recent::NodeUsers;
use crate::arena::state::ServiceState;

/// Files a report's usages into one service's state.
pub(super) struct Filer<'s> {
    pub(super) state: &'s mut ServiceState,
}

impl Filer<'_> {
    /// Files one usage of a report (`service`'s consumption or rejection)
    /// into the keys and the slot's sums.
    pub(super) fn file_usage<'r, U, A>(
        &mut self,
        service: &str,
        at: Filing,
        users: U,
        room: &mut usize,
        out: &mut Ingested,
    ) where
        U: Iterator<Item = (&'r str, A)>,
        A: Iterator<Item = (&'r str, i64)>,
    {
        let column_at = self.state.sums_column(at.slot);
        let mut entries: SmallVec<[(&str, i64); 8]> = SmallVec::new();
        let mut ids: SmallVec<[KeyId; 8]> = SmallVec::new();
        let (last, mut next) = self.take_recent(at);
        let mut place = 0;
        let mut sums: SmallVec<[(Name, i64); 4]> = SmallVec::new();
        for (user, amounts) in users {
            checked_entries(service, user, amounts, at, &mut entries, out);
            let listed = last.as_ref().and_then(|l| l.find(&mut place, user));
            match listed.filter(|listed| self.state.still_keys_of(listed, &entries)) {
                Some(listed) => {
                    ids.clear();
                    ids.extend_from_slice(listed);
                }
                None => {
                    let refused =
                        self.state
                            .keys_for(user, &mut entries, &mut ids, room, at.met_ms);
                    for resource in refused {
                        let name = || format!("{service}/{user}/{resource}");
                        out.dropped.push(DropReason::TooManyKeys, name);
                    }
                }
            }
            if let Some(next) = &mut next {
                next.push(user, &ids);
            }
            let (keys, column) = self.state.keys_and_sums(column_at);
            let id_bound = keys.len();
            for (nth, (&id, &(_, amount))) in ids.iter().zip(&entries).enumerate() {
                let key = &mut keys[id.index()];
                key.file(at, amount);
                add_sum(&mut sums, nth, key, amount);
                column.add(id, usize::from(at.is_rejection), amount, id_bound);
                out.entries += 1;
            }
        }
        out.add_totals(service, at.is_rejection, &sums);
        if let Some(next) = next {
            self.state.recent.insert(at.node, next);
            self.state.recent_spare = last;
        }
    }

    /// For filing consumption, the node's list of users from its last
    /// report (if no id was reused since) and an empty one to fill; for
    /// rejections, neither: a node's rejections are few, and change.
    fn take_recent(&mut self, at: Filing) -> (Option<NodeUsers>, Option<NodeUsers>) {
        if at.is_rejection {
            return (None, None);
        }
        let reused = self.state.reused;
        let last = self
            .state
            .recent
            .remove(&at.node)
            .filter(|l| l.reused == reused);
        let mut next = self.state.recent_spare.take().unwrap_or_default();
        next.clear(reused);
        (last, Some(next))
    }
}

/// Puts `user`'s valid (resource, amount) entries in `entries`, and lists
/// the others in `out.dropped` with why.
fn checked_entries<'r>(
    service: &str,
    user: &str,
    amounts: impl Iterator<Item = (&'r str, i64)>,
    at: Filing,
    entries: &mut SmallVec<[(&'r str, i64); 8]>,
    out: &mut Ingested,
) {
    entries.clear();
    for (resource, amount) in amounts {
        let reason = if !valid_name(user) || !valid_name(resource) {
            DropReason::BadName
        } else if amount < 0 {
            DropReason::NegativeAmount
        } else if at.is_rejection && amount > i64::from(u32::MAX) {
            DropReason::TooManyRejections
        } else if amount > at.max_amount {
            DropReason::AmountTooLarge
        } else {
            entries.push((resource, amount));
            continue;
        };
        out.dropped
            .push(reason, || format!("{service}/{user}/{resource}"));
    }
}

/// Adds `amount` of `key`'s resource, a user's `nth` entry, to `sums`.
/// Resource names are interned per service, so the few a usage has are
/// told apart by pointer (the key was just charged: this reads nothing
/// new), and users list them in the same order, so the `nth` sum is tried
/// first.
fn add_sum(sums: &mut SmallVec<[(Name, i64); 4]>, nth: usize, key: &Key, amount: i64) {
    let same = |r: &(Name, i64)| Arc::ptr_eq(&r.0.0, &key.resource.0);
    let at = match sums.get(nth) {
        Some(r) if same(r) => Some(nth),
        _ => sums.iter().position(same),
    };
    match at {
        Some(i) => sums[i].1 = sums[i].1.saturating_add(amount),
        None => sums.push((key.resource.clone(), amount)),
    }
}
