//! The reports the ledger can file: decoded, or read in place.

use throttle_proto::v1;
use throttle_proto::wire::{RawAmounts, RawReport, RawUsers};

/// A report the ledger can file: a decoded [`v1::Report`], or a
/// [`RawReport`] whose names and amounts are read in place.
pub trait ReportSource {
    /// One usage's users, each with its amounts.
    type Users<'a>: Iterator<Item = (&'a str, Self::Amounts<'a>)>
    where
        Self: 'a;
    /// One user's amount per resource.
    type Amounts<'a>: Iterator<Item = (&'a str, i64)>
    where
        Self: 'a;

    /// The reporting node.
    fn node_id(&self) -> &str;
    /// The slot the report was sent in (its data is of the slot before).
    fn slot_number(&self) -> i64;
    /// Sent again after another central answered it (`Report.answered`).
    fn answered(&self) -> bool;
    /// Users over every usage.
    fn user_count(&self) -> usize;
    /// Every (service, rejection or consumption, users).
    fn usages(&self) -> impl Iterator<Item = (&str, bool, Self::Users<'_>)>;

    /// The report, owned, for work off the ledger's task (the usage
    /// store): a copy of its bytes' reading where it has one, else a
    /// [`v1::Report`] built from its entries.
    fn to_owned_report(&self) -> OwnedReport {
        let mut report = v1::Report {
            node_id: self.node_id().to_owned(),
            slot_number: self.slot_number(),
            answered: self.answered(),
            ..v1::Report::default()
        };
        for (service, is_rejection, users) in self.usages() {
            let side = if is_rejection {
                &mut report.rejection
            } else {
                &mut report.consumption
            };
            let usage = side.entry(service.to_owned()).or_default();
            for (user, amounts) in users {
                let user = usage.users.entry(user.to_owned()).or_default();
                for (resource, amount) in amounts {
                    let sum = user.resources.entry(resource.to_owned()).or_default();
                    *sum = sum.saturating_add(amount);
                }
            }
        }
        OwnedReport::Decoded(report)
    }
}

/// A report of any [`ReportSource`], owned ([`ReportSource::to_owned_report`]).
#[derive(Debug, Clone)]
pub enum OwnedReport {
    /// Read in place, with the stream's node id when it is filed under
    /// that ([`FromNode`]).
    Raw(Option<String>, RawReport),
    /// Decoded.
    Decoded(v1::Report),
}

type ReportUsers<'a> = std::iter::Map<
    std::collections::btree_map::Iter<'a, String, v1::Amounts>,
    fn((&'a String, &'a v1::Amounts)) -> (&'a str, ReportAmounts<'a>),
>;
type ReportAmounts<'a> = std::iter::Map<
    std::collections::btree_map::Iter<'a, String, i64>,
    fn((&'a String, &'a i64)) -> (&'a str, i64),
>;

fn report_users(usage: &v1::Usage) -> ReportUsers<'_> {
    usage.users.iter().map(|(user, amounts)| {
        let amounts: ReportAmounts<'_> = amounts.resources.iter().map(|(r, a)| (r.as_str(), *a));
        (user.as_str(), amounts)
    })
}

impl ReportSource for v1::Report {
    type Users<'a> = ReportUsers<'a>;
    type Amounts<'a> = ReportAmounts<'a>;

    fn node_id(&self) -> &str {
        &self.node_id
    }

    fn slot_number(&self) -> i64 {
        self.slot_number
    }

    fn answered(&self) -> bool {
        self.answered
    }

    fn user_count(&self) -> usize {
        let usages = self.consumption.values().chain(self.rejection.values());
        usages.map(|u| u.users.len()).sum()
    }

    fn to_owned_report(&self) -> OwnedReport {
        OwnedReport::Decoded(self.clone())
    }

    fn usages(&self) -> impl Iterator<Item = (&str, bool, ReportUsers<'_>)> {
        let consumption = self
            .consumption
            .iter()
            .map(|(s, u)| (s.as_str(), false, report_users(u)));
        let rejection = self
            .rejection
            .iter()
            .map(|(s, u)| (s.as_str(), true, report_users(u)));
        consumption.chain(rejection)
    }
}

impl ReportSource for RawReport {
    type Users<'a> = RawUsers<'a>;
    type Amounts<'a> = RawAmounts<'a>;

    fn node_id(&self) -> &str {
        RawReport::node_id(self)
    }

    fn slot_number(&self) -> i64 {
        RawReport::slot_number(self)
    }

    fn answered(&self) -> bool {
        RawReport::answered(self)
    }

    fn user_count(&self) -> usize {
        RawReport::user_count(self)
    }

    fn usages(&self) -> impl Iterator<Item = (&str, bool, RawUsers<'_>)> {
        RawReport::usages(self)
    }

    fn to_owned_report(&self) -> OwnedReport {
        OwnedReport::Raw(None, self.clone())
    }
}

/// A report filed under the name of the stream it came on, whatever node id
/// it carries (the server checks that the two agree, or that it has none).
#[derive(Debug)]
pub struct FromNode<'a, R>(pub &'a str, pub &'a R);

impl<R: ReportSource> ReportSource for FromNode<'_, R> {
    type Users<'a>
        = R::Users<'a>
    where
        Self: 'a;
    type Amounts<'a>
        = R::Amounts<'a>
    where
        Self: 'a;

    fn node_id(&self) -> &str {
        self.0
    }

    fn slot_number(&self) -> i64 {
        self.1.slot_number()
    }

    fn answered(&self) -> bool {
        self.1.answered()
    }

    fn user_count(&self) -> usize {
        self.1.user_count()
    }

    fn usages(&self) -> impl Iterator<Item = (&str, bool, R::Users<'_>)> {
        self.1.usages()
    }

    fn to_owned_report(&self) -> OwnedReport {
        match self.1.to_owned_report() {
            OwnedReport::Raw(_, raw) => OwnedReport::Raw(Some(self.0.to_owned()), raw),
            OwnedReport::Decoded(mut report) => {
                report.node_id = self.0.to_owned();
                OwnedReport::Decoded(report)
            }
        }
    }
}
