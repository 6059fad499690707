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
use envoy_types::pb::google::protobuf::Duration;
use throttle_central::nodes::rlqs::REPORT_EVERY_S;

use super::envoy_bucket::EnvoyBucket;

/// The service the proxy's filter names as its domain.
const DOMAIN: &str = "front";

/// One proxy's buckets, per user.
#[derive(Debug, Default)]
pub(super) struct EnvoyProxy {
    buckets: BTreeMap<String, EnvoyBucket>,
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
            let mut bucket = EnvoyBucket::new(now);
            bucket.allowed = 1;
            let first = usage(user, &bucket, 0);
            bucket.allowed = 0;
            self.buckets.insert(user.to_owned(), bucket);
            return (true, Some(reports(vec![first])));
        };
        (bucket.admit(now), None)
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
                    if let Some(b) = self.buckets.get_mut(&user) {
                        b.assign(a.rate_limit_strategy, now, now + ttl_ms);
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

fn usage(user: &str, b: &EnvoyBucket, elapsed_s: i64) -> BucketQuotaUsage {
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
