//! What one legacy node has been granted, as the ledger told its
//! connection, and the answer to its report in the legacy form.
//!
//! The ledger speaks to a legacy connection as to any node stream: the
//! answer to a report holds the next slot's table, the mid-slot pushes the
//! following one, block lists come apart. A legacy node reads exactly one
//! frame per report, so nothing is pushed to it: [`LegacyQuotas`] keeps the
//! latest tables and writes them all into the next answer.

use std::collections::{BTreeMap, BTreeSet};

use throttle_proto::legacy::JsonQuota;
use throttle_proto::v1;

/// Slots an answer covers, from the report's: the current one, the next,
/// and a few more (the latest table again), so that a node whose central
/// is away keeps its last share that long before it fails open.
pub(super) const ANSWER_SLOTS: i64 = 8;

/// Tables kept per service, newest first.
const KEPT_SLOTS: usize = 4;

/// user -> resource -> amount.
type Table = BTreeMap<String, BTreeMap<String, f64>>;

/// The tables and block lists one legacy connection was sent.
#[derive(Debug, Default)]
pub(super) struct LegacyQuotas {
    /// service -> slot -> table.
    tables: BTreeMap<String, BTreeMap<i64, Table>>,
    /// service -> users blocked now.
    blocked: BTreeMap<String, BTreeSet<String>>,
}

impl LegacyQuotas {
    /// Takes a quota from the ledger: each (service, slot) table in it
    /// replaces the one held.
    pub(super) fn take(&mut self, quota: v1::Quota) {
        for (service, tables) in quota.services {
            let held = self.tables.entry(service).or_default();
            for (slot, users) in tables.slots {
                let table = users
                    .users
                    .into_iter()
                    .map(|(user, r)| (user, r.resources))
                    .collect();
                held.insert(slot, table);
            }
            while held.len() > KEPT_SLOTS {
                held.pop_first();
            }
        }
    }

    /// Takes a service's block list.
    pub(super) fn take_blocks(&mut self, blocks: v1::Blocks) {
        if blocks.users.is_empty() {
            self.blocked.remove(&blocks.service);
        } else {
            self.blocked
                .insert(blocks.service, blocks.users.into_iter().collect());
        }
    }

    /// Forgets the services not in `services` (the node no longer names
    /// them).
    pub(super) fn keep_only(&mut self, services: &BTreeSet<String>) {
        self.tables.retain(|s, _| services.contains(s));
        self.blocked.retain(|s, _| services.contains(s));
    }

    /// The answer to a report of `slot` naming `services`: for each, the
    /// slots `slot .. slot + ANSWER_SLOTS`, every one present (empty when
    /// nothing is known), each holding the latest table of that slot or
    /// before, in the amounts a legacy node reads ([`legacy_amount`]).
    pub(super) fn answer<'s>(
        &self,
        services: impl IntoIterator<Item = &'s str>,
        slot: i64,
    ) -> JsonQuota {
        services
            .into_iter()
            .map(|service| {
                let slots = (slot..slot + ANSWER_SLOTS)
                    .map(|k| (k.to_string(), self.table_at(service, k)))
                    .collect();
                (service.to_owned(), slots)
            })
            .collect()
    }

    /// The table a legacy node should use in `slot` of `service`.
    fn table_at(&self, service: &str, slot: i64) -> Table {
        let latest = self
            .tables
            .get(service)
            .and_then(|t| t.range(..=slot).next_back())
            .filter(|(at, _)| slot - **at < ANSWER_SLOTS);
        let mut table: Table = match latest {
            Some((_, table)) => table
                .iter()
                .map(|(user, resources)| {
                    let amounts = resources
                        .iter()
                        .map(|(r, q)| (r.clone(), legacy_amount(*q)))
                        .collect();
                    (user.clone(), amounts)
                })
                .collect(),
            None => Table::new(),
        };
        for user in self.blocked.get(service).into_iter().flatten() {
            let refused = self.resources_of(service, user);
            table.insert(user.clone(), refused.map(|r| (r, 0.0)).collect());
        }
        table
    }

    /// The resources a blocked user is refused on: those the tables give
    /// them, else every resource of the service's tables, else `requests`.
    /// A legacy node refuses a user on any resource whose amount is below 1.
    fn resources_of(&self, service: &str, user: &str) -> impl Iterator<Item = String> {
        let tables = self
            .tables
            .get(service)
            .into_iter()
            .flat_map(|t| t.values());
        let own: BTreeSet<&String> = tables
            .clone()
            .filter_map(|t| t.get(user))
            .flat_map(|r| r.keys())
            .collect();
        let all: BTreeSet<&String> = match own.is_empty() {
            true => tables
                .flat_map(|t| t.values().flat_map(|r| r.keys()))
                .collect(),
            false => own,
        };
        let mut names: Vec<String> = all.into_iter().cloned().collect();
        if names.is_empty() {
            names.push("requests".to_owned());
        }
        names.into_iter()
    }
}

/// The amount to tell a legacy node for a grant of `q`. A legacy node
/// admits while what its slot consumed is at most the amount, so an
/// amount of N lets N + 1 unit requests through: it is told one less. An
/// amount below 1 refuses everything, so a grant of 1 to 2 is told 1
/// (two requests may pass; the ledger charges both, and the user's next
/// grants pay for the second).
pub(super) fn legacy_amount(q: f64) -> f64 {
    match q {
        q if q >= 2.0 => q - 1.0,
        q if q >= 1.0 => 1.0,
        q => q.max(0.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quota(service: &str, slot: i64, user: &str, amount: f64) -> v1::Quota {
        let resources = v1::ResourceQuotas {
            resources: [("requests".to_owned(), amount)].into(),
        };
        let users = v1::UserQuotas {
            users: [(user.to_owned(), resources)].into(),
        };
        let service_quota = v1::ServiceQuota {
            slots: [(slot, users)].into(),
        };
        v1::Quota {
            services: [(service.to_owned(), service_quota)].into(),
            ..Default::default()
        }
    }

    fn requests(answer: &JsonQuota, service: &str, slot: i64, user: &str) -> Option<f64> {
        let table = answer.get(service)?.get(&slot.to_string())?;
        table.get(user)?.get("requests").copied()
    }

    #[test]
    fn an_answer_holds_the_current_slot_and_the_latest_share_ahead() {
        let mut q = LegacyQuotas::default();
        q.take(quota("front", 10, "alice", 30.0));
        q.take(quota("front", 11, "alice", 20.0));
        let answer = q.answer(["front", "api"], 10);
        assert_eq!(requests(&answer, "front", 10, "alice"), Some(29.0));
        assert_eq!(requests(&answer, "front", 11, "alice"), Some(19.0));
        assert_eq!(requests(&answer, "front", 17, "alice"), Some(19.0));
        assert_eq!(answer["front"].len(), 8);
        // A service with nothing granted: every slot, empty.
        assert_eq!(answer["api"].len(), 8);
        assert!(answer["api"].values().all(BTreeMap::is_empty));
        // A table older than the answer's reach is not used.
        let later = q.answer(["front"], 19);
        assert!(later["front"].values().all(BTreeMap::is_empty));
    }

    #[test]
    fn a_later_table_replaces_and_old_ones_go() {
        let mut q = LegacyQuotas::default();
        for slot in 0..10 {
            q.take(quota("front", slot, "alice", 5.0));
        }
        q.take(quota("front", 9, "bob", 5.0));
        assert_eq!(q.tables["front"].len(), KEPT_SLOTS);
        let answer = q.answer(["front"], 9);
        assert_eq!(requests(&answer, "front", 9, "alice"), None);
        assert_eq!(requests(&answer, "front", 9, "bob"), Some(4.0));
        q.keep_only(&BTreeSet::new());
        assert!(q.tables.is_empty());
    }

    #[test]
    fn blocked_users_are_refused_on_their_resources() {
        let mut q = LegacyQuotas::default();
        q.take(quota("front", 5, "alice", 30.0));
        let blocks = |users: &[&str]| v1::Blocks {
            service: "front".into(),
            users: users.iter().map(|u| (*u).to_owned()).collect(),
        };
        q.take_blocks(blocks(&["alice", "mallory"]));
        let answer = q.answer(["front", "api"], 5);
        assert_eq!(requests(&answer, "front", 5, "alice"), Some(0.0));
        assert_eq!(requests(&answer, "front", 5, "mallory"), Some(0.0));
        q.take_blocks(blocks(&[]));
        let answer = q.answer(["front"], 5);
        assert_eq!(requests(&answer, "front", 5, "alice"), Some(29.0));
        assert_eq!(requests(&answer, "front", 5, "mallory"), None);
    }

    #[test]
    fn a_legacy_node_admits_what_it_was_granted() {
        // The legacy node admits the (n+1)th unit request while n <= amount.
        let admitted = |amount: f64| (0..).take_while(|n| f64::from(*n) <= amount).count();
        for grant in [2.0, 3.0, 10.0, 57.0, 1000.0] {
            assert_eq!(admitted(legacy_amount(grant)) as f64, grant);
        }
        assert_eq!(admitted(legacy_amount(1.0)), 2);
        assert!(legacy_amount(0.5) < 1.0 && legacy_amount(0.0) < 1.0);
        assert_eq!(legacy_amount(-3.0), 0.0);
    }
}
