//! What one legacy node has been granted, as the ledger told its
//! connection, and the answer to its report in the legacy form.
//!
//! The ledger speaks to a legacy connection as to any node stream: the
//! answer to a report holds the next slot's table, the mid-slot pushes the
//! following one, block lists come apart. A legacy node reads exactly one
//! frame per report, so nothing is pushed to it: [`LegacyQuotas`] keeps the
//! latest tables and writes them all into the next answer.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use throttle_proto::v1::{self, central_message};

use super::answer::Answer;
use super::whole_table::WholeTable;

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

    /// Takes a message the ledger queued for the node: its quotas and
    /// block lists; nothing else reaches a legacy node.
    pub(super) fn absorb(&mut self, message: v1::CentralMessage) {
        match message.kind {
            Some(central_message::Kind::Quota(q)) => self.take(q),
            Some(central_message::Kind::Blocks(b)) => self.take_blocks(b),
            _ => {}
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

    /// The answer to a report of `slot` naming `services`, written in at
    /// most `max_bytes` (a legacy node reads no larger frame): for each
    /// service the next slot's table, then the current slot's, then the
    /// latest again for the slots after, as many as fit ([`ANSWER_SLOTS`]
    /// at most). Every table is the latest of its slot or before, in the
    /// amounts a legacy node reads ([`legacy_amount`]). When even the next
    /// slot's tables do not fit, the users with the largest amounts are
    /// left out (a legacy node admits a user it has no quota for).
    pub(super) fn answer<'s>(
        &self,
        services: impl IntoIterator<Item = &'s str>,
        slot: i64,
        max_bytes: usize,
    ) -> Answer {
        let mut services: Vec<&str> = services.into_iter().collect();
        services.sort_unstable();
        services.dedup();
        let order = std::iter::once(slot + 1)
            .chain(std::iter::once(slot))
            .chain(slot + 2..slot + ANSWER_SLOTS);
        let mut answer = Answer::new(&services, max_bytes);
        // Tables written once each: the slots ahead repeat the latest.
        let mut written: BTreeMap<(&str, Option<i64>), Arc<str>> = BTreeMap::new();
        for k in order {
            let tables: Vec<Arc<str>> = services
                .iter()
                .map(|&s| {
                    let source = self.source_of(s, k);
                    let json = written.entry((s, source));
                    json.or_insert_with(|| self.whole(s, source).to_json())
                        .clone()
                })
                .collect();
            let added = answer.add(k, tables, || {
                services
                    .iter()
                    .map(|&s| self.whole(s, self.source_of(s, k)))
                    .collect()
            });
            if !added {
                break;
            }
        }
        answer
    }

    /// The slot whose table a legacy node should use in `slot` of
    /// `service`: the latest at or before it, within [`ANSWER_SLOTS`].
    fn source_of(&self, service: &str, slot: i64) -> Option<i64> {
        let tables = self.tables.get(service)?;
        let (at, _) = tables.range(..=slot).next_back()?;
        (slot - at < ANSWER_SLOTS).then_some(*at)
    }

    /// The table of `source` (none: an empty one), with the blocked users,
    /// in whole amounts.
    fn whole(&self, service: &str, source: Option<i64>) -> WholeTable {
        let table = source.and_then(|k| self.tables.get(service)?.get(&k));
        let mut whole = WholeTable::default();
        for (user, resources) in table.into_iter().flatten() {
            let amounts = resources
                .iter()
                .map(|(r, q)| (r.clone(), legacy_amount(*q)));
            whole.users.insert(user.clone(), amounts.collect());
        }
        for user in self.blocked.get(service).into_iter().flatten() {
            let refused = self.resources_of(service, user).map(|r| (r, 0));
            whole.users.insert(user.clone(), refused.collect());
        }
        whole
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

/// The amount to tell a legacy node for a grant of `q`, a whole number.
/// A legacy node admits while what its slot consumed is at most the
/// amount, so an amount of N lets N + 1 unit requests through: it is told
/// one less than the whole part of the grant. An amount below 1 refuses
/// everything, so a grant of 1 to 2 is told 1 (two requests may pass; the
/// ledger charges both, and the user's next grants pay for the second).
pub(super) fn legacy_amount(q: f64) -> u64 {
    match q.floor() {
        q if q >= 2.0 => q as u64 - 1,
        q if q >= 1.0 => 1,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const MAX: usize = 65_535;

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

    fn requests(answer: &Answer, service: &str, slot: i64, user: &str) -> Option<f64> {
        let json: serde_json::Value = serde_json::from_str(&answer.to_json()).ok()?;
        json[service][slot.to_string()][user]["requests"].as_f64()
    }

    fn table(answer: &Answer, service: &str, slot: i64) -> Option<serde_json::Value> {
        let json: serde_json::Value = serde_json::from_str(&answer.to_json()).ok()?;
        json[service].get(slot.to_string()).cloned()
    }

    #[test]
    fn an_answer_holds_the_current_slot_and_the_latest_share_ahead() {
        let mut q = LegacyQuotas::default();
        q.take(quota("front", 10, "alice", 30.0));
        q.take(quota("front", 11, "alice", 20.5));
        let answer = q.answer(["front", "api"], 10, MAX);
        assert_eq!(requests(&answer, "front", 10, "alice"), Some(29.0));
        assert_eq!(requests(&answer, "front", 11, "alice"), Some(19.0));
        assert_eq!(requests(&answer, "front", 17, "alice"), Some(19.0));
        assert_eq!(answer.slots(), 8);
        // A service with nothing granted: every slot, empty.
        let empty = Some(serde_json::json!({}));
        assert!((10..18).all(|k| table(&answer, "api", k) == empty));
        let json: serde_json::Value = serde_json::from_str(&answer.to_json()).unwrap();
        assert_eq!(json["front"]["11"]["alice"]["requests"], 19);
        assert_eq!(json["api"]["10"], serde_json::json!({}));
        // A table older than the answer's reach is not used.
        let later = q.answer(["front"], 19, MAX);
        assert!((19..27).all(|k| table(&later, "front", k) == empty));
    }

    #[test]
    fn a_later_table_replaces_and_old_ones_go() {
        let mut q = LegacyQuotas::default();
        for slot in 0..10 {
            q.take(quota("front", slot, "alice", 5.0));
        }
        q.take(quota("front", 9, "bob", 5.0));
        assert_eq!(q.tables["front"].len(), KEPT_SLOTS);
        let answer = q.answer(["front"], 9, MAX);
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
        let answer = q.answer(["front", "api"], 5, MAX);
        assert_eq!(requests(&answer, "front", 5, "alice"), Some(0.0));
        assert_eq!(requests(&answer, "front", 5, "mallory"), Some(0.0));
        q.take_blocks(blocks(&[]));
        let answer = q.answer(["front"], 5, MAX);
        assert_eq!(requests(&answer, "front", 5, "alice"), Some(29.0));
        assert_eq!(requests(&answer, "front", 5, "mallory"), None);
    }

    #[test]
    fn a_legacy_node_admits_what_it_was_granted() {
        // The legacy node admits the (n+1)th unit request while n <= amount.
        let admitted = |amount: f64| (0..).take_while(|n| f64::from(*n) <= amount).count();
        for grant in [2.0, 2.9, 3.0, 10.5, 57.0, 1000.0] {
            assert_eq!(admitted(legacy_amount(grant) as f64) as f64, grant.floor());
        }
        assert_eq!(admitted(legacy_amount(1.5) as f64), 2);
        assert_eq!(
            (legacy_amount(0.9), legacy_amount(0.0), legacy_amount(-3.0)),
            (0, 0, 0)
        );
    }

    /// `users` users with amounts from `amounts`, in `slots` slots.
    fn many(users: usize, amounts: &[f64], slots: i64) -> LegacyQuotas {
        let mut q = LegacyQuotas::default();
        for k in 0..slots {
            let mut all = quota("front", k, "user-00000", amounts[0]);
            let table = &mut all
                .services
                .get_mut("front")
                .unwrap()
                .slots
                .get_mut(&k)
                .unwrap()
                .users;
            for u in 1..users {
                let mut resources = table["user-00000"].clone();
                resources
                    .resources
                    .insert("requests".into(), amounts[u % amounts.len()]);
                table.insert(format!("user-{u:05}"), resources);
            }
            if users == 0 {
                table.clear();
            }
            q.take(all);
        }
        q
    }

    #[test]
    fn an_answer_fits_a_legacy_frame_first_slots_first() {
        // About 35 bytes a user: 1,000 fit in a frame twice, not eight times.
        let q = many(1_000, &[1e6, 20.0, 3.0], 2);
        let answer = q.answer(["front"], 0, MAX);
        let json = answer.to_json();
        assert!(json.len() <= MAX, "{}", json.len());
        assert_eq!(json.len(), answer.len());
        assert_eq!(answer.slots(), 2, "the next slot, then the current");
        assert!(table(&answer, "front", 0).is_some() && table(&answer, "front", 1).is_some());
        assert_eq!(answer.left_out, 0);
        // 5,000 do not fit in one: the largest amounts are left out.
        let q = many(5_000, &[1e6, 20.0], 2);
        let answer = q.answer(["front"], 0, MAX);
        let json = answer.to_json();
        assert!(json.len() <= MAX && answer.slots() == 1, "{}", json.len());
        assert!(answer.left_out > 2_500 - 1);
        let next = table(&answer, "front", 1).expect("the next slot's table");
        let users = next.as_object().expect("a table");
        assert!(users.values().all(|r| r["requests"] == 19));
    }

    proptest! {
        #[test]
        fn the_length_is_counted_exactly_and_within_the_frame(
            users in 0usize..1_500,
            amounts in prop::collection::vec(0.0f64..1e12, 1..4),
            slots in 1i64..4,
            max in 200usize..MAX,
        ) {
            let q = many(users, &amounts, slots);
            let answer = q.answer(["front", "api \"quoted\""], 0, max);
            let json = answer.to_json();
            prop_assert_eq!(json.len(), answer.len());
            prop_assert!(json.len() <= max);
        }
    }
}
