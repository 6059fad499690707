//! [`Ingested`]: what filing a report did.

use super::dropped::Dropped;
use crate::arena::ids::Name;

/// What [`Ledger::ingest`](super::Ledger::ingest) did with a report.
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
    pub(super) fn add_totals(&mut self, service: &str, is_rejection: bool, sums: &[(Name, i64)]) {
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
