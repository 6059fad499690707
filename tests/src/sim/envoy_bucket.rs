//! [`EnvoyBucket`]: one bucket of Envoy's `rate_limit_quota` filter, its
//! assignment and the usage it has not reported yet.

use envoy_types::pb::envoy::r#type::v3::RateLimitStrategy;
use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};

/// An assignment as the filter holds it.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Rule {
    Allow,
    Deny,
    /// At most this many tokens, refilled with this many a second.
    Tokens(u32, f64),
}

/// One bucket: what it was told, its tokens, and what it admitted and
/// denied since its last report.
#[derive(Debug)]
pub(super) struct EnvoyBucket {
    /// The assignment and when it expires (ms).
    rule: Option<(Rule, i64)>,
    tokens: f64,
    /// When `tokens` was last refilled (ms).
    at: i64,
    pub(super) allowed: u64,
    pub(super) denied: u64,
    /// When it was last reported (ms).
    pub(super) reported: i64,
}

impl EnvoyBucket {
    /// A bucket made by a request at `now`, with no assignment yet.
    pub(super) fn new(now: i64) -> Self {
        Self {
            rule: None,
            tokens: 0.0,
            at: now,
            allowed: 0,
            denied: 0,
            reported: now,
        }
    }

    /// Takes `strategy` until `expires`: a token bucket other than the one
    /// held starts full, the same one keeps its tokens.
    pub(super) fn assign(&mut self, strategy: Option<RateLimitStrategy>, now: i64, expires: i64) {
        let rule = match strategy.and_then(|s| s.strategy) {
            Some(Strategy::TokenBucket(t)) => {
                let fill = t.tokens_per_fill.map_or(1, |f| f.value);
                match t.fill_interval.map_or(0, |d| d.seconds) {
                    // Envoy cuts the interval to whole seconds: under one,
                    // nothing limits.
                    0 => Rule::Allow,
                    s => Rule::Tokens(t.max_tokens, f64::from(fill) / s as f64),
                }
            }
            Some(Strategy::BlanketRule(r)) if r == BlanketRule::DenyAll as i32 => Rule::Deny,
            _ => Rule::Allow,
        };
        let same = self.rule.is_some_and(|(r, _)| r == rule);
        if let (Rule::Tokens(max, _), false) = (rule, same) {
            (self.tokens, self.at) = (f64::from(max), now);
        }
        self.rule = Some((rule, expires));
    }

    /// Whether a request passes at `now` (`ALLOW_ALL` without an
    /// assignment in force), counted.
    pub(super) fn admit(&mut self, now: i64) -> bool {
        let ok = match self.rule.filter(|(_, expires)| now < *expires) {
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
        };
        match ok {
            true => self.allowed += 1,
            false => self.denied += 1,
        }
        ok
    }
}
