//! What the ledger granted one proxy, for the requests of its users, and
//! the assignment each user's bucket gets from it.

use std::collections::{BTreeMap, BTreeSet};

use throttle_proto::v1::{self, central_message};

use super::bucket_rule::BucketRule;

/// The one resource an Envoy bucket counts.
pub(super) const REQUESTS: &str = "requests";

/// Tables kept, newest last.
const KEPT_SLOTS: usize = 4;

/// The grants, defaults and blocks the ledger told one proxy's stream,
/// for its service.
#[derive(Debug)]
pub(super) struct Shares {
    /// Slots a second: grants are per slot, token buckets per second.
    per_second: f64,
    /// slot -> user -> requests granted.
    tables: BTreeMap<i64, BTreeMap<String, f64>>,
    /// The `*` rule's share of a user with no row, if it limits requests.
    default: Option<f64>,
    /// Users with a rule of their own: their share when they have no row
    /// (`None`: their rule does not limit requests).
    own: BTreeMap<String, Option<f64>>,
    blocked: BTreeSet<String>,
}

impl Default for Shares {
    fn default() -> Self {
        Self::new(1_000)
    }
}

impl Shares {
    /// Nothing told yet, with slots of `slot_ms`.
    pub(super) fn new(slot_ms: u32) -> Self {
        Self {
            per_second: 1_000.0 / f64::from(slot_ms.max(1)),
            tables: BTreeMap::new(),
            default: None,
            own: BTreeMap::new(),
            blocked: BTreeSet::new(),
        }
    }

    /// Takes a quota: each slot's table of `service` replaces the one
    /// held.
    pub(super) fn take_quota(&mut self, service: &str, quota: v1::Quota) {
        let Some(tables) = quota.services.into_iter().find(|(s, _)| s == service) else {
            return;
        };
        for (slot, users) in tables.1.slots {
            let table = users
                .users
                .into_iter()
                .filter_map(|(user, r)| Some((user, *r.resources.get(REQUESTS)?)))
                .collect();
            self.tables.insert(slot, table);
        }
        while self.tables.len() > KEPT_SLOTS {
            self.tables.pop_first();
        }
    }

    /// Takes a message the ledger queued for the proxy of `service`: its
    /// quotas, limits and block lists.
    pub(super) fn absorb(&mut self, service: Option<&str>, message: v1::CentralMessage) {
        let service = service.unwrap_or_default();
        match message.kind {
            Some(central_message::Kind::Quota(q)) => self.take_quota(service, q),
            Some(central_message::Kind::Limits(l)) if l.service == service => self.take_limits(l),
            Some(central_message::Kind::Blocks(b)) if b.service == service => self.take_blocks(b),
            _ => {}
        }
    }

    /// Takes the service's limits: the shares of users with no row.
    pub(super) fn take_limits(&mut self, limits: v1::Limits) {
        self.default = limits.default_quota.get(REQUESTS).copied();
        self.own = limits
            .users
            .into_iter()
            .map(|u| (u.user, u.default_quota.get(REQUESTS).copied()))
            .collect();
    }

    /// Takes the service's block list.
    pub(super) fn take_blocks(&mut self, blocks: v1::Blocks) {
        self.blocked = blocks.users.into_iter().collect();
    }

    /// What `user`'s bucket should hold in `slot`, a second's worth:
    /// blocked, their grant of that slot's table or the one before (unless
    /// the bucket is `fresh`; never the next slot's, which the quota policy
    /// counts from that slot on), else the share of their own rule or of the `*` rule, else
    /// everything allowed.
    pub(super) fn assignment(&self, user: Option<&str>, slot: i64, fresh: bool) -> BucketRule {
        if user.is_some_and(|u| self.blocked.contains(u)) {
            return BucketRule::Deny;
        }
        let latest = self
            .tables
            .range(..=slot)
            .next_back()
            .filter(|(at, _)| slot - **at <= 1);
        let granted = user.filter(|_| !fresh).and_then(|u| latest?.1.get(u));
        if let Some(q) = granted {
            return BucketRule::of(q * self.per_second);
        }
        let share = match user.and_then(|u| self.own.get(u)) {
            Some(own) => *own,
            None => self.default,
        };
        share.map_or(BucketRule::Allow, |q| BucketRule::of(q * self.per_second))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quota(slot: i64, user: &str, requests: f64) -> v1::Quota {
        let table = v1::UserQuotas {
            users: [(
                user.to_owned(),
                v1::ResourceQuotas {
                    resources: [(REQUESTS.to_owned(), requests)].into(),
                },
            )]
            .into(),
        };
        v1::Quota {
            services: [(
                "front".to_owned(),
                v1::ServiceQuota {
                    slots: [(slot, table)].into(),
                },
            )]
            .into(),
            ..Default::default()
        }
    }

    #[test]
    fn a_grant_then_a_rule_then_everything() {
        let mut shares = Shares::default();
        assert_eq!(
            shares.assignment(Some("alice"), 10, false),
            BucketRule::Allow
        );
        shares.take_limits(v1::Limits {
            service: "front".into(),
            default_quota: [(REQUESTS.to_owned(), 16.7)].into(),
            users: vec![
                v1::UserLimits {
                    user: "alice".into(),
                    default_quota: [(REQUESTS.to_owned(), 33.4)].into(),
                    ..Default::default()
                },
                v1::UserLimits {
                    user: "bytes-only".into(),
                    ..Default::default()
                },
            ],
            ..Default::default()
        });
        assert_eq!(
            shares.assignment(Some("alice"), 10, false),
            BucketRule::Tokens(33)
        );
        assert_eq!(
            shares.assignment(Some("carol"), 10, false),
            BucketRule::Tokens(17)
        );
        assert_eq!(shares.assignment(None, 10, false), BucketRule::Tokens(17));
        assert_eq!(
            shares.assignment(Some("bytes-only"), 10, false),
            BucketRule::Allow
        );
        shares.take_quota("front", quota(11, "alice", 0.4));
        assert_eq!(
            shares.assignment(Some("alice"), 11, false),
            BucketRule::Tokens(1)
        );
        shares.take_quota("front", quota(12, "alice", 0.0));
        // The next slot's grant waits for that slot.
        assert_eq!(
            shares.assignment(Some("alice"), 11, false),
            BucketRule::Tokens(1)
        );
        assert_eq!(
            shares.assignment(Some("alice"), 12, false),
            BucketRule::Deny
        );
        // A fresh bucket: the share of the rule.
        assert_eq!(
            shares.assignment(Some("alice"), 12, true),
            BucketRule::Tokens(33)
        );
        // A table too old is not used.
        assert_eq!(
            shares.assignment(Some("alice"), 20, false),
            BucketRule::Tokens(33)
        );
        shares.take_quota("other", quota(13, "alice", 5.0));
        assert_eq!(
            shares.assignment(Some("alice"), 13, false),
            BucketRule::Deny
        );
        shares.take_blocks(v1::Blocks {
            service: "front".into(),
            users: vec!["carol".into()],
        });
        assert_eq!(
            shares.assignment(Some("carol"), 11, false),
            BucketRule::Deny
        );
    }
}
