//! One filed report, as the usage store keeps it ([`FiledUsage`]).

use std::collections::BTreeMap;

use crate::ledger::{FromNode, OwnedReport, ReportSource, valid_name};

/// What one node reported for one data slot, per (service, user,
/// resource): the unit the usage store writes exactly once, keyed by
/// (node, slot).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FiledUsage {
    /// The reporting node.
    pub node: String,
    /// The data slot (the slot before the one the report was sent in).
    pub slot: i64,
    /// When the data slot starts, in Unix seconds: the minute, hour and
    /// day it counts in.
    pub start_s: i64,
    /// The entries, in (service, user, resource) order.
    pub entries: Vec<UsageEntry>,
}

/// One (service, user, resource) of a [`FiledUsage`].
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct UsageEntry {
    /// The service.
    pub service: String,
    /// The user.
    pub user: String,
    /// The resource.
    pub resource: String,
    /// Amount admitted (the report's consumption).
    pub admitted: i64,
    /// Amount refused (the report's rejection).
    pub refused: i64,
}

impl FiledUsage {
    /// [`FiledUsage::of`] an owned report.
    pub fn of_owned(report: &OwnedReport, start_ms: i64, max_amount: i64) -> Self {
        match report {
            OwnedReport::Raw(Some(node), raw) => {
                Self::of(&FromNode(node, raw), start_ms, max_amount)
            }
            OwnedReport::Raw(None, raw) => Self::of(raw, start_ms, max_amount),
            OwnedReport::Decoded(decoded) => Self::of(decoded, start_ms, max_amount),
        }
    }

    /// The usage of `report`, whose data slot starts at `start_ms`. An
    /// entry the ledger would leave out (a name it does not take, an
    /// amount that is not positive or is above `max_amount`, a refusal above
    /// `u32::MAX`) is left out
    /// here too, so the store counts what the ledger counts.
    pub fn of<R: ReportSource>(report: &R, start_ms: i64, max_amount: i64) -> Self {
        let mut sums: BTreeMap<(&str, &str, &str), (i64, i64)> = BTreeMap::new();
        for (service, is_rejection, users) in report.usages() {
            if !valid_name(service) {
                continue;
            }
            for (user, amounts) in users {
                if !valid_name(user) {
                    continue;
                }
                for (resource, amount) in amounts {
                    let most = if is_rejection {
                        max_amount.min(i64::from(u32::MAX))
                    } else {
                        max_amount
                    };
                    if !valid_name(resource) || !(1..=most).contains(&amount) {
                        continue;
                    }
                    let sum = sums.entry((service, user, resource)).or_default();
                    let side = if is_rejection { &mut sum.1 } else { &mut sum.0 };
                    *side = side.saturating_add(amount);
                }
            }
        }
        let entries = sums
            .into_iter()
            .map(
                |((service, user, resource), (admitted, refused))| UsageEntry {
                    service: service.to_owned(),
                    user: user.to_owned(),
                    resource: resource.to_owned(),
                    admitted,
                    refused,
                },
            )
            .collect();
        Self {
            node: report.node_id().to_owned(),
            slot: report.slot_number() - 1,
            start_s: start_ms.div_euclid(1000),
            entries,
        }
    }
}

#[cfg(test)]
mod tests {
    use throttle_proto::legacy;

    use super::*;

    #[test]
    fn a_report_becomes_its_entries_with_consumption_and_rejection_together() {
        let report = legacy::report_from_json(
            r#"{"node_id": "n1", "slot_number": 11,
                "consumption": {"front": {"alice": {"requests": 3, "bytes": 500}, "bob": {"requests": 0}}},
                "rejection": {"front": {"alice": {"requests": 2}, "": {"requests": 9}}}}"#,
        )
        .unwrap();
        let filed = FiledUsage::of(&report, 10_000, 1_000);
        assert_eq!(filed.node, "n1");
        assert_eq!((filed.slot, filed.start_s), (10, 10));
        let entries: Vec<_> = filed
            .entries
            .iter()
            .map(|e| (e.user.as_str(), e.resource.as_str(), e.admitted, e.refused))
            .collect();
        // bob's 0, the empty user and the amount above max_amount are left out.
        assert_eq!(
            entries,
            [("alice", "bytes", 500, 0), ("alice", "requests", 3, 2)]
        );
        let over = FiledUsage::of(&report, 10_000, 400);
        assert_eq!(over.entries.len(), 1);
    }
}
