//! The rate-limit headers of a response: the IETF draft's
//! `RateLimit-Policy` and `RateLimit`, and the older `X-RateLimit-*`.
//! Written on refusals, and on allowed responses when the layer was built
//! with [`headers_on_success`](super::ThrottleLayerBuilder::headers_on_success).

use std::fmt::Write as _;

use http::{HeaderMap, HeaderName, HeaderValue};

use super::config::Config;
use crate::store::{ResourceId, Tightest};

const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
const X_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
const X_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
const X_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

/// The figures the headers state, for one resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Stated {
    /// The user's configured limit of the resource, where the central's
    /// limits give one; else this node's share of the slot.
    pub(crate) limit: u64,
    /// The window of `limit` in seconds, when it is the configured one.
    pub(crate) window: Option<u32>,
    /// What is left of this node's share of the slot.
    pub(crate) remaining: u64,
    /// Seconds until the next slot, at least 1.
    pub(crate) reset_seconds: u64,
}

impl Stated {
    /// The figures of `tightest` for `user`, with `spent` more of it
    /// taken (the request's own cost, on an allowed response) and
    /// `reset_seconds` to the next slot.
    pub(crate) fn of(
        cfg: &Config,
        user: &str,
        tightest: &Tightest,
        spent: i64,
        reset_seconds: u64,
    ) -> Self {
        let left = tightest.quota - (tightest.used.saturating_add(spent)) as f64;
        let configured = cfg.service.configured(user, tightest.resource);
        Self {
            // The configured limit is the same on every response, as the
            // draft means `q`.
            limit: configured.map_or(tightest.quota.max(0.0).floor() as u64, |a| {
                a.amount.floor() as u64
            }),
            window: configured.map(|a| a.window_seconds),
            remaining: left.max(0.0).floor() as u64,
            reset_seconds,
        }
    }

    /// The window the headers give: the configured limit's, else the
    /// slot's length rounded up to whole seconds.
    pub(crate) fn window_seconds(&self, cfg: &Config) -> u64 {
        self.window.map_or_else(
            || {
                u64::from(cfg.store.slot_length().as_ms())
                    .div_ceil(1000)
                    .max(1)
            },
            u64::from,
        )
    }
}

/// Milliseconds from now to the next slot.
pub(crate) fn wait_ms(cfg: &Config) -> u64 {
    let slot = cfg.store.slot_length();
    u64::from(slot.ms_until_next(cfg.store.clock().now_ms()))
}

/// `wait_ms` in whole seconds, rounded up, at least 1: the reset the
/// headers state.
pub(crate) fn reset_seconds(wait_ms: u64) -> u64 {
    wait_ms.div_ceil(1000).max(1)
}

/// Writes the rate-limit headers of `resource` (named `name`) into `h`:
/// `q` and `w` the limit and its window, `qu="content-bytes"` for a
/// resource counting body bytes; `r` and `t` what is left and the reset.
pub(crate) fn write(
    cfg: &Config,
    h: &mut HeaderMap,
    resource: ResourceId,
    name: &str,
    stated: &Stated,
) {
    // Each value is written once and handed over without a copy.
    let mut policy = sf_string(name);
    let mut ratelimit = policy.clone();
    let _ = write!(
        policy,
        ";q={};w={}",
        stated.limit,
        stated.window_seconds(cfg)
    );
    if [cfg.traffic_up, cfg.traffic_down].contains(&Some(resource)) {
        policy.push_str(";qu=\"content-bytes\"");
    }
    let _ = write!(
        ratelimit,
        ";r={};t={}",
        stated.remaining, stated.reset_seconds
    );
    for (header, value) in [(RATELIMIT_POLICY, policy), (RATELIMIT, ratelimit)] {
        if let Ok(v) = HeaderValue::from_maybe_shared(bytes::Bytes::from(value)) {
            h.insert(header, v);
        }
    }
    h.insert(X_LIMIT, number(stated.limit));
    h.insert(X_REMAINING, number(stated.remaining));
    h.insert(X_RESET, number(stated.reset_seconds));
}

/// A number as a header value; the usual small ones (a reset in 1 s, none
/// remaining) without an allocation.
pub(crate) fn number(n: u64) -> HeaderValue {
    const DIGITS: [&str; 10] = ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9"];
    match DIGITS.get(n as usize) {
        Some(d) => HeaderValue::from_static(d),
        None => HeaderValue::from(n),
    }
}

/// A structured-field string (RFC 8941): quoted, `"` and `\` escaped.
pub(crate) fn sf_string(s: &str) -> String {
    // Room for the parameters appended to it.
    let mut out = String::with_capacity(s.len() + 32);
    out.push('"');
    for c in s.chars().filter(|c| (' '..='~').contains(c)) {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodings() {
        assert_eq!(sf_string("db \"read\"\n"), r#""db \"read\"""#);
        for n in [0, 1, 9, 10, 1234, u64::MAX] {
            assert_eq!(number(n).to_str().unwrap(), n.to_string());
        }
    }
}
