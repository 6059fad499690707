//! The buckets one proxy reports, the user each stands for, and what
//! each was last told.

use std::collections::{BTreeMap, HashMap};
use std::ops::RangeInclusive;

use envoy_types::pb::envoy::service::rate_limit_quota::v3::BucketId;

use super::bucket_rule::BucketRule;
use super::shares::Shares;

/// Most buckets one stream may hold: more are not tracked (their usage is
/// not filed, they get no assignment), and counted.
pub(super) const MAX_BUCKETS: usize = 100_000;

/// A bucket id's entries, sorted: the key of a bucket.
type Key = Vec<(String, String)>;

#[derive(Debug)]
struct Bucket {
    id: BucketId,
    user: Option<String>,
    /// What it was last told, and in which slot.
    sent: Option<(BucketRule, i64)>,
    /// The last slot a report showed it used.
    active: i64,
    /// The slot it was first reported in.
    first: i64,
}

/// When assignments are sent again, and buckets given up, in slots.
#[derive(Debug, Clone, Copy)]
pub(super) struct Timing {
    /// An unchanged assignment is sent again this long after the last.
    pub(super) refresh: i64,
    /// A bucket unused this long is abandoned.
    pub(super) idle: i64,
    /// A bucket this new gets its user's share of their rule rather than
    /// a grant: the ledger has not yet seen the proxy report its demand.
    pub(super) fresh: i64,
}

/// What to tell the proxy about one bucket.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Action {
    Assign(BucketId, BucketRule),
    Abandon(BucketId),
}

/// Per user, the slots of their buckets' first share and its tokens a
/// second.
pub(super) type FirstTold = BTreeMap<String, (RangeInclusive<i64>, u32)>;

/// One proxy's buckets.
#[derive(Debug)]
pub(super) struct Buckets {
    known: HashMap<Key, Bucket>,
    /// The bucket id entry that names the user.
    user_key: String,
}

impl Buckets {
    /// No bucket yet; `user_key` names the user in a bucket id.
    pub(super) fn new(user_key: &str) -> Self {
        Self {
            known: HashMap::new(),
            user_key: user_key.to_owned(),
        }
    }

    /// A report of `id` in `slot` (`used`: it admitted or denied some):
    /// the user it stands for (`None`: its id has no user entry), or
    /// `Err` when the stream holds [`MAX_BUCKETS`] others.
    pub(super) fn seen(
        &mut self,
        id: &BucketId,
        used: bool,
        slot: i64,
    ) -> Result<Option<&str>, ()> {
        let mut key: Key = id
            .bucket
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        key.sort_unstable();
        if !self.known.contains_key(&key) && self.known.len() >= MAX_BUCKETS {
            return Err(());
        }
        let user_key = &self.user_key;
        let bucket = self.known.entry(key).or_insert_with(|| Bucket {
            id: id.clone(),
            user: id.bucket.get(user_key).filter(|u| !u.is_empty()).cloned(),
            sent: None,
            active: slot,
            first: slot,
        });
        if used {
            bucket.active = slot;
        }
        Ok(bucket.user.as_deref())
    }

    /// What to tell the proxy in `slot`: a bucket never told, or whose
    /// assignment changed ([`BucketRule::differs`]) or is due again, gets
    /// its assignment; a bucket idle too long is abandoned and forgotten.
    pub(super) fn due(&mut self, shares: &Shares, slot: i64, timing: Timing) -> Vec<Action> {
        let mut actions = Vec::new();
        self.known.retain(|_, bucket| {
            if slot - bucket.active > timing.idle {
                actions.push(Action::Abandon(bucket.id.clone()));
                return false;
            }
            let fresh = slot - bucket.first <= timing.fresh;
            let next = shares.assignment(bucket.user.as_deref(), slot, fresh);
            let send = match bucket.sent {
                None => Some(next),
                Some((last, _)) if last.differs(next) => Some(next),
                // The same again: Envoy keeps the bucket's tokens.
                Some((last, at)) => (slot - at >= timing.refresh).then_some(last),
            };
            if let Some(assignment) = send {
                bucket.sent = Some((assignment, slot));
                actions.push(Action::Assign(bucket.id.clone(), assignment));
            }
            true
        });
        actions
    }

    /// Per user, the tokens a second told to its buckets still on the
    /// share of their rule in `slot` ([`Timing::fresh`] slots from their
    /// first), and the slots of that share.
    pub(super) fn first_shares(&self, slot: i64, fresh: i64) -> FirstTold {
        let mut out = FirstTold::new();
        for b in self.known.values().filter(|b| slot - b.first <= fresh) {
            let (Some(user), Some((BucketRule::Tokens(n), _))) = (&b.user, b.sent) else {
                continue;
            };
            let (first, last) = (b.first, b.first + fresh);
            out.entry(user.clone())
                .and_modify(|(slots, tokens)| {
                    *slots = first.min(*slots.start())..=last.max(*slots.end());
                    *tokens = tokens.saturating_add(n);
                })
                .or_insert((first..=last, n));
        }
        out
    }

    /// Buckets held.
    pub(super) fn len(&self) -> usize {
        self.known.len()
    }
}

#[cfg(test)]
mod tests {
    use throttle_proto::v1;

    use super::*;

    fn id(pairs: &[(&str, &str)]) -> BucketId {
        BucketId {
            bucket: pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        }
    }

    const TIMING: Timing = Timing {
        refresh: 7,
        idle: 60,
        fresh: 0,
    };

    #[test]
    fn buckets_are_told_once_then_on_change_then_again_then_abandoned() {
        let mut buckets = Buckets::new("user");
        let mut shares = Shares::default();
        assert_eq!(
            buckets.seen(&id(&[("user", "alice")]), true, 0),
            Ok(Some("alice"))
        );
        assert_eq!(buckets.seen(&id(&[("path", "/")]), true, 0), Ok(None));
        let first = buckets.due(&shares, 0, TIMING);
        assert_eq!(first.len(), 2);
        assert!(
            first
                .iter()
                .all(|a| matches!(a, Action::Assign(_, BucketRule::Allow)))
        );
        assert!(buckets.due(&shares, 1, TIMING).is_empty());
        shares.take_blocks(v1::Blocks {
            service: "front".into(),
            users: vec!["alice".into()],
        });
        let changed = buckets.due(&shares, 2, TIMING);
        assert_eq!(
            changed,
            [Action::Assign(id(&[("user", "alice")]), BucketRule::Deny)]
        );
        assert_eq!(
            buckets.due(&shares, 7, TIMING).len(),
            1,
            "the other, told at 0"
        );
        assert_eq!(buckets.due(&shares, 9, TIMING).len(), 1, "alice, told at 2");
        buckets.seen(&id(&[("user", "alice")]), true, 50).unwrap();
        let idle = buckets.due(&shares, 61, TIMING);
        assert!(idle.contains(&Action::Abandon(id(&[("path", "/")]))));
        assert_eq!(buckets.len(), 1);
    }

    #[test]
    fn a_users_new_buckets_hold_their_first_share_for_the_fresh_slots() {
        let mut buckets = Buckets::new("user");
        let mut shares = Shares::default();
        shares.take_limits(v1::Limits {
            service: "front".into(),
            default_quota: [("requests".to_owned(), 20.0)].into(),
            ..Default::default()
        });
        let timing = Timing { fresh: 6, ..TIMING };
        let alice = |path: &str| id(&[("user", "alice"), ("path", path)]);
        let _ = buckets.seen(&alice("/a"), true, 10);
        let _ = buckets.seen(&id(&[("path", "/")]), true, 10);
        assert!(buckets.first_shares(10, 6).is_empty(), "nothing told yet");
        buckets.due(&shares, 10, timing);
        let _ = buckets.seen(&alice("/b"), true, 12);
        buckets.due(&shares, 12, timing);
        // Two buckets of alice: their shares summed, over both their
        // slots; a bucket with no user is nobody's.
        let told = buckets.first_shares(12, 6);
        assert_eq!(told.len(), 1);
        assert_eq!(told["alice"], (10..=18, 40));
        // The first bucket's share has ended.
        assert_eq!(buckets.first_shares(17, 6)["alice"], (12..=18, 20));
        assert!(buckets.first_shares(19, 6).is_empty());
    }

    #[test]
    fn buckets_past_the_cap_are_refused() {
        let mut buckets = Buckets::new("user");
        for n in 0..MAX_BUCKETS {
            assert!(
                buckets
                    .seen(&id(&[("user", &n.to_string())]), true, 0)
                    .is_ok()
            );
        }
        assert_eq!(buckets.seen(&id(&[("user", "one more")]), true, 0), Err(()));
        assert!(buckets.seen(&id(&[("user", "7")]), true, 0).is_ok());
    }
}
