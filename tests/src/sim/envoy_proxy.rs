//! An Envoy proxy's `rate_limit_quota` filter as Envoy 1.40 behaves
//! (measured with the real binary, see `docs/guides/envoy.md`): a token
//! bucket per user bucket, enforced locally; a bucket's first request
//! reported at once; every bucket reported every 5 s from the stream's
//! start, with the whole seconds elapsed; `ALLOW_ALL` without an
//! assignment or after its TTL.

use std::collections::BTreeMap;

use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
use envoy_types::pb::google::protobuf::Duration;
use throttle_central::rlqs::REPORT_EVERY_S;

/// The service the proxy's filter names as its domain.
const DOMAIN: &str = "front";

/// An assignment as the filter holds it.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Rule {
    Allow,
    Deny,
    /// At most this many tokens, refilled with this many a second.
    Tokens(u32, f64),
}

#[derive(Debug)]
struct Bucket {
    /// The assignment and when it expires (ms).
    rule: Option<(Rule, i64)>,
    tokens: f64,
    /// When `tokens` was last refilled (ms).
    at: i64,
    allowed: u64,
    denied: u64,
    /// When it was last reported (ms).
    reported: i64,
}

/// One proxy's buckets, per user.
#[derive(Debug, Default)]
pub(super) struct EnvoyProxy {
    buckets: BTreeMap<String, Bucket>,
    /// When its stream opened: it reports every 5 s from then.
    opened: Option<i64>,
}

impl EnvoyProxy {
    /// Decides one request of `user` at `now`: whether it passes, and the
    /// report a new bucket sends at once.
    pub(super) fn admit(
        &mut self,
        user: &str,
        now: i64,
    ) -> (bool, Option<RateLimitQuotaUsageReports>) {
        let Some(bucket) = self.buckets.get_mut(user) else {
            // No assignment yet: `ALLOW_ALL`; the bucket starts at one
            // request, reported at once.
            self.opened.get_or_insert(now);
            let bucket = Bucket {
                rule: None,
                tokens: 0.0,
                at: now,
                allowed: 1,
                denied: 0,
                reported: now,
            };
            let first = usage(user, &bucket, 0);
            self.buckets.insert(
                user.to_owned(),
                Bucket {
                    allowed: 0,
                    ..bucket
                },
            );
            return (true, Some(reports(vec![first])));
        };
        let ok = bucket.decide(now);
        match ok {
            true => bucket.allowed += 1,
            false => bucket.denied += 1,
        }
        (ok, None)
    }

    /// Every bucket's usage since its last report, when `now` is one of
    /// the stream's 5 s ticks.
    pub(super) fn periodic(&mut self, now: i64) -> Option<RateLimitQuotaUsageReports> {
        let opened = self.opened?;
        let every = REPORT_EVERY_S * 1_000;
        if now == opened || (now - opened) % every != 0 {
            return None;
        }
        let usages = (self.buckets.iter_mut())
            .map(|(user, b)| {
                let elapsed = (now - b.reported) / 1_000;
                let u = usage(user, b, elapsed);
                (b.allowed, b.denied, b.reported) = (0, 0, now);
                u
            })
            .collect();
        Some(reports(usages))
    }

    /// Applies the central's assignments at `now`.
    pub(super) fn apply(&mut self, response: RateLimitQuotaResponse, now: i64) {
        for action in response.bucket_action {
            let Some(user) = action.bucket_id.and_then(|mut id| id.bucket.remove("user")) else {
                continue;
            };
            match action.bucket_action {
                Some(bucket_action::BucketAction::QuotaAssignmentAction(a)) => {
                    let ttl_ms = a.assignment_time_to_live.map_or(0, |d| d.seconds * 1_000);
                    let rule = match a.rate_limit_strategy.and_then(|s| s.strategy) {
                        Some(Strategy::TokenBucket(t)) => {
                            let fill = t.tokens_per_fill.map_or(1, |f| f.value);
                            let every = t.fill_interval.map_or(0, |d| d.seconds);
                            match every {
                                // Envoy cuts the interval to whole seconds:
                                // under one, nothing limits.
                                0 => Rule::Allow,
                                s => Rule::Tokens(t.max_tokens, f64::from(fill) / s as f64),
                            }
                        }
                        Some(Strategy::BlanketRule(r)) if r == BlanketRule::DenyAll as i32 => {
                            Rule::Deny
                        }
                        _ => Rule::Allow,
                    };
                    if let Some(b) = self.buckets.get_mut(&user) {
                        b.assign(rule, now, now + ttl_ms);
                    }
                }
                Some(bucket_action::BucketAction::AbandonAction(_)) => {
                    self.buckets.remove(&user);
                }
                None => {}
            }
        }
    }
}

impl Bucket {
    /// Takes `rule` until `expires`: a token bucket other than the one
    /// held starts full, the same one keeps its tokens.
    fn assign(&mut self, rule: Rule, now: i64, expires: i64) {
        let same = self.rule.is_some_and(|(r, _)| r == rule);
        if let (Rule::Tokens(max, _), false) = (rule, same) {
            (self.tokens, self.at) = (f64::from(max), now);
        }
        self.rule = Some((rule, expires));
    }

    /// Whether a request passes at `now`.
    fn decide(&mut self, now: i64) -> bool {
        match self.rule.filter(|(_, expires)| now < *expires) {
            None | Some((Rule::Allow, _)) => true,
            Some((Rule::Deny, _)) => false,
            Some((Rule::Tokens(max, per_second), _)) => {
                let refill = (now - self.at) as f64 / 1_000.0 * per_second;
                (self.tokens, self.at) = ((self.tokens + refill).min(f64::from(max)), now);
                let ok = self.tokens >= 1.0;
                if ok {
                    self.tokens -= 1.0;
                }
                ok
            }
        }
    }
}

fn usage(user: &str, b: &Bucket, elapsed_s: i64) -> BucketQuotaUsage {
    BucketQuotaUsage {
        bucket_id: Some(BucketId {
            bucket: [("user".to_owned(), user.to_owned())].into(),
        }),
        time_elapsed: Some(Duration {
            seconds: elapsed_s,
            nanos: 0,
        }),
        num_requests_allowed: b.allowed,
        num_requests_denied: b.denied,
    }
}

fn reports(usages: Vec<BucketQuotaUsage>) -> RateLimitQuotaUsageReports {
    RateLimitQuotaUsageReports {
        domain: DOMAIN.to_owned(),
        bucket_quota_usages: usages,
    }
}
