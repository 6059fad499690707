//! Filing a report: buckets charged, distribution and sums updated.

use std::sync::Arc;

use smallvec::SmallVec;
use throttle_proto::v1;

use super::config::ReportError;
use super::dropped::{DropReason, Dropped};
use super::filing_at::Filing;
use super::ids::{KeyId, Name, valid_name};
use super::key::Key;
use super::ledger::Ledger;
use super::recent::NodeUsers;
use super::source::ReportSource;
use super::state::ServiceState;

/// What [`Ledger::ingest`] did with a report.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Ingested {
    /// The same node already reported this slot; nothing was charged again.
    pub duplicate: bool,
    /// Entries applied.
    pub entries: usize,
    /// Entries left out, with why.
    pub dropped: Dropped,
    /// What the entries applied add up to, per service and resource:
    /// (service, resource, consumed, rejected), for the
    /// `throttle_central_consumed_total` and `_rejected_total` metrics.
    pub totals: Vec<(String, String, i64, i64)>,
}

impl Ingested {
    /// Adds `sums` (resource, amount) of `service` to [`Ingested::totals`].
    fn add_totals(&mut self, service: &str, is_rejection: bool, sums: &[(Name, i64)]) {
        for (resource, amount) in sums {
            let (resource, amount) = (&**resource, *amount);
            let found = self
                .totals
                .iter()
                .position(|(s, r, ..)| s == service && r == resource);
            let i = found.unwrap_or_else(|| {
                let row = (service.to_owned(), resource.to_owned(), 0, 0);
                self.totals.push(row);
                self.totals.len() - 1
            });
            let row = &mut self.totals[i];
            let sum = if is_rejection { &mut row.3 } else { &mut row.2 };
            *sum = sum.saturating_add(amount);
        }
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

impl Ledger {
    /// Files a report: charges the buckets, updates the distribution and the
    /// sums, and lets each service's policy see it. Its
    /// [`packed`](v1::Report::packed) usages are read as the map entries they
    /// stand for ([`v1::Report::unpack`]).
    ///
    /// # Errors
    ///
    /// [`ReportError`] when the report as a whole is unusable; bad entries
    /// are only left out and listed in [`Ingested::dropped`].
    pub fn ingest(&mut self, report: &v1::Report, now_ms: i64) -> Result<Ingested, ReportError> {
        if report.packed.is_empty() {
            return self.ingest_from(report, now_ms);
        }
        let mut unpacked = report.clone();
        unpacked.unpack()?;
        self.ingest_from(&unpacked, now_ms)
    }

    /// [`Ledger::ingest`] for any [`ReportSource`], such as a
    /// [`RawReport`](throttle_proto::wire::RawReport) read in place.
    ///
    /// # Errors
    ///
    /// As [`Ledger::ingest`].
    pub fn ingest_from<R: ReportSource>(
        &mut self,
        report: &R,
        now_ms: i64,
    ) -> Result<Ingested, ReportError> {
        self.config.check(report, now_ms)?;
        let node = self.node_id(report.node_id());
        let slot = report.slot_number() - 1;
        if report.answered() {
            self.await_unknown_nodes(now_ms);
        }
        self.await_after_silence(now_ms);
        if !self.reported.entry(slot).or_default().insert(node) {
            return Ok(Ingested {
                duplicate: true,
                ..Ingested::default()
            });
        }
        self.caught_up(node, slot, now_ms);
        let charge = self.charge_of(node, slot, report.answered(), now_ms);
        let mut out = Ingested::default();
        // Services filed (or refused), each once, in the order first seen.
        let mut seen: Vec<(&str, bool)> = Vec::new();
        for (name, is_rejection, users) in report.usages() {
            let known = seen.iter().find(|(s, _)| *s == name).map(|&(_, ok)| ok);
            let valid = known.unwrap_or_else(|| {
                let refused = if !valid_name(name) {
                    Some(DropReason::BadName)
                } else if !self.has_room_for(name) {
                    Some(DropReason::TooManyServices)
                } else {
                    None
                };
                if let Some(reason) = refused {
                    out.dropped.push(reason, || name.to_owned());
                }
                seen.push((name, refused.is_none()));
                refused.is_none()
            });
            if valid {
                let at = Filing {
                    node,
                    slot,
                    is_rejection,
                    charge,
                    max_amount: self.config.max_amount,
                    now_ms,
                };
                let mut room = self.config.max_keys.saturating_sub(self.key_total);
                let before = room;
                let state = &mut self.service_mut(name).state;
                state.file_usage(name, at, users, &mut room, &mut out);
                self.key_total += before - room;
            }
        }
        for (name, _) in seen.into_iter().filter(|(_, valid)| *valid) {
            let svc = self.service_mut(name);
            let last = svc.state.last_report.entry(node).or_insert(slot);
            *last = (*last).max(slot);
            svc.policy.consume(&svc.state, node, slot, now_ms);
        }
        Ok(out)
    }
}

impl ServiceState {
    /// Files one usage of a report (`service`'s consumption or rejection)
    /// into the keys and the slot's sums.
    fn file_usage<'r, U, A>(
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
        let column_at = self.sums_column(at.slot);
        let mut entries: SmallVec<[(&str, i64); 8]> = SmallVec::new();
        let mut ids: SmallVec<[KeyId; 8]> = SmallVec::new();
        let (last, mut next) = self.take_recent(at);
        let mut place = 0;
        let mut sums: SmallVec<[(Name, i64); 4]> = SmallVec::new();
        for (user, amounts) in users {
            checked_entries(service, user, amounts, at, &mut entries, out);
            let listed = last.as_ref().and_then(|l| l.find(&mut place, user));
            match listed.filter(|listed| self.still_keys_of(listed, &entries)) {
                Some(listed) => {
                    ids.clear();
                    ids.extend_from_slice(listed);
                }
                None => {
                    let refused = self.keys_for(user, &mut entries, &mut ids, room, at.now_ms);
                    for resource in refused {
                        let name = || format!("{service}/{user}/{resource}");
                        out.dropped.push(DropReason::TooManyKeys, name);
                    }
                }
            }
            if let Some(next) = &mut next {
                next.push(user, &ids);
            }
            let (keys, column) = self.keys_and_sums(column_at);
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
            self.recent.insert(at.node, next);
            self.recent_spare = last;
        }
    }

    /// For filing consumption, the node's list of users from its last
    /// report (if no id was reused since) and an empty one to fill; for
    /// rejections, neither: a node's rejections are few, and change.
    fn take_recent(&mut self, at: Filing) -> (Option<NodeUsers>, Option<NodeUsers>) {
        if at.is_rejection {
            return (None, None);
        }
        let reused = self.reused;
        let last = self.recent.remove(&at.node).filter(|l| l.reused == reused);
        let mut next = self.recent_spare.take().unwrap_or_default();
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
