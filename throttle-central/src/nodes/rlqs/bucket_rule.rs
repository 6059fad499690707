//! What a proxy's bucket is told to do, and its Envoy form.

use std::time::Duration;

use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
use envoy_types::pb::envoy::r#type::v3::{RateLimitStrategy, TokenBucket};
use envoy_types::pb::google::protobuf::{self, UInt32Value};

use crate::policy::moved;

/// The fewest tokens a bucket holds, unless its share a second is
/// smaller: a burst of that many requests within a tenth of a second
/// passes.
const MIN_BURST: u32 = 10;

/// One bucket's assignment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum BucketRule {
    /// No limit applies (ALLOW_ALL).
    Allow,
    /// Nothing is admitted: a share of 0, an exhausted or blocked user
    /// (DENY_ALL).
    Deny,
    /// A token bucket refilled with this many tokens each second, holding
    /// as many at most: the central's bucket keeps the user's burst, and
    /// each second's share already holds what of it the proxy may spend.
    Tokens(u32),
}

impl BucketRule {
    /// The assignment for a share of `q` requests a second, to the nearest
    /// token: at least one while the share is above 0.
    pub(super) fn of(q: f64) -> Self {
        if q.is_nan() || q <= 0.0 {
            return Self::Deny;
        }
        let tokens = q.round().clamp(1.0, f64::from(u32::MAX));
        Self::Tokens(tokens as u32)
    }

    /// Whether a bucket holding `self` should be told `next`: another kind,
    /// or a number of tokens the quota policy counts as [`moved`].
    pub(super) fn differs(self, next: Self) -> bool {
        match (self, next) {
            (Self::Tokens(a), Self::Tokens(b)) => moved(f64::from(a), f64::from(b)),
            (a, b) => a != b,
        }
    }

    /// Envoy's rate-limit strategy.
    pub(super) fn strategy(self) -> RateLimitStrategy {
        let strategy = match self {
            Self::Allow => Strategy::BlanketRule(BlanketRule::AllowAll as i32),
            Self::Deny => Strategy::BlanketRule(BlanketRule::DenyAll as i32),
            Self::Tokens(n) => Strategy::TokenBucket(TokenBucket {
                max_tokens: n.div_ceil(10).max(n.min(MIN_BURST)),
                tokens_per_fill: Some(UInt32Value { value: n }),
                fill_interval: Some(duration(Duration::from_secs(1))),
            }),
        };
        RateLimitStrategy {
            strategy: Some(strategy),
        }
    }
}

/// A protobuf duration.
pub(super) fn duration(d: Duration) -> protobuf::Duration {
    protobuf::Duration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_become_token_buckets() {
        assert_eq!(BucketRule::of(0.0), BucketRule::Deny);
        assert_eq!(BucketRule::of(-1.0), BucketRule::Deny);
        assert_eq!(BucketRule::of(0.2), BucketRule::Tokens(1));
        assert_eq!(BucketRule::of(33.4), BucketRule::Tokens(33));
        assert_eq!(BucketRule::of(33.9), BucketRule::Tokens(34));
        assert!(!BucketRule::Tokens(100).differs(BucketRule::Tokens(109)));
        assert!(BucketRule::Tokens(100).differs(BucketRule::Tokens(111)));
        assert!(!BucketRule::Tokens(3).differs(BucketRule::Tokens(4)));
        assert!(BucketRule::Tokens(3).differs(BucketRule::Tokens(5)));
        assert!(BucketRule::Allow.differs(BucketRule::Deny));
        let Some(Strategy::TokenBucket(b)) = BucketRule::Tokens(7).strategy().strategy else {
            panic!("a token bucket");
        };
        assert_eq!(
            (b.max_tokens, b.tokens_per_fill.map(|t| t.value)),
            (7, Some(7))
        );
        assert_eq!(b.fill_interval.map(|d| d.seconds), Some(1));
    }

    #[test]
    fn a_bucket_holds_a_tenth_of_its_second_and_at_least_ten_tokens() {
        let held = |n: u32| match BucketRule::Tokens(n).strategy().strategy {
            Some(Strategy::TokenBucket(b)) => (b.max_tokens, b.tokens_per_fill.map(|t| t.value)),
            _ => panic!("a token bucket"),
        };
        assert_eq!(held(1_000), (100, Some(1_000)));
        assert_eq!(held(333), (34, Some(333)));
        assert_eq!(held(33), (10, Some(33)));
        assert_eq!(held(4), (4, Some(4)));
    }
}
