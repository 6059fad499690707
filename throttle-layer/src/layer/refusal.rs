//! The refusal's response head, built once per set of figures.
//!
//! Under attack, every refusal in a slot carries the same headers: the same
//! resource, limit, nothing remaining, the same reset. Formatting them and
//! inserting them one by one (each insert hashes its name) was most of a
//! refusal's cost. The last head built (status and headers) is kept beside
//! the figures it was built from, and a refusal with the same figures clones
//! it: the response's own header map, and a reference count for each value
//! that is not static.
//!
//! A head is kept once two refusals in a row have built it: where refusals
//! keep changing figures (many users over many different quotas), keeping
//! each head would only add a copy to every refusal.

use std::fmt::Write as _;

use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::response::Parts;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};

use super::config::Config;
use super::refusal_cache::Figures;
use crate::store::{Decision, ResourceId, period_name};
use crate::user::RequestHead;

const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
const X_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
const X_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
const X_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");
const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
const GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");
const GRPC_PUSHBACK: HeaderName = HeaderName::from_static("grpc-retry-pushback-ms");
/// On a local limit's refusal, which: a refusal of the central quota names
/// its resource in the `RateLimit` headers instead.
const REFUSED_BY: HeaderName = HeaderName::from_static("throttle-refused-by");

/// The body of an HTTP refusal (a gRPC one has none).
const HTTP_BODY: &[u8] = b"Too Many Requests\n";

/// Whether the request is a gRPC call (gRPC-Web included): a POST, as
/// every gRPC call is, with a gRPC content type. Checking the method first
/// spares a refused GET the header lookup.
pub(crate) fn is_grpc(head: RequestHead<'_>) -> bool {
    head.method == http::Method::POST
        && head
            .headers
            .get(CONTENT_TYPE)
            .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

/// The refusal: the kept head for its figures if there is one, so that
/// the only allocations are the response's own, else one built. Out of
/// line: inlined, its locals made the frame of every allowed request's
/// `decide` some 850 bytes.
#[cold]
#[inline(never)]
pub(crate) fn reject(
    cfg: &Config,
    req: RequestHead<'_>,
    user: &str,
    decision: &Decision,
) -> (Parts, &'static [u8]) {
    let slot = cfg.store.slot_length();
    let wait_ms = u64::from(slot.ms_until_next(cfg.store.clock().now_ms()));
    let grpc = is_grpc(req);
    let named = decision.tightest.filter(|_| grpc || cfg.rate_limit_headers);
    // Limit and remaining are an HTTP refusal's only; gRPC's reset is its
    // pushback, inserted below.
    let (limit, remaining) = match named.filter(|_| !grpc) {
        Some(t) => (
            t.quota.max(0.0).floor() as u64,
            (t.quota - t.used as f64).max(0.0).floor() as u64,
        ),
        None => (0, 0),
    };
    let configured = named.and_then(|t| configured(cfg, user, t.resource));
    let figures = Figures {
        grpc,
        resource: named.map(|t| t.resource),
        // The configured limit where the central's limits give one: the
        // same on every response, as the IETF draft means `q`; else this
        // node's share of the slot.
        limit: configured.map_or(limit, |(amount, _)| amount),
        window: configured.map(|(_, window)| window),
        remaining,
        reset_secs: if grpc {
            0
        } else {
            wait_ms.div_ceil(1000).max(1)
        },
    };
    let mut res = match cfg.refusals.get(&figures) {
        Some(head) => head,
        None => {
            let head = build(cfg, &figures);
            cfg.refusals.built(figures, &head);
            head
        }
    };
    if grpc {
        res.headers
            .insert(GRPC_PUSHBACK, HeaderValue::from(wait_ms));
        (res, b"")
    } else {
        (res, HTTP_BODY)
    }
}

/// `user`'s configured limit of `resource` that binds (see
/// [`ServiceStore::configured`](crate::store::ServiceStore::configured)):
/// (amount, window in seconds).
fn configured(cfg: &Config, user: &str, resource: ResourceId) -> Option<(u64, u32)> {
    let allowance = cfg.service.configured(user, resource)?;
    Some((allowance.amount.floor() as u64, allowance.window_seconds))
}

/// The head for `figures`: its status and [`headers`].
fn build(cfg: &Config, figures: &Figures) -> Parts {
    let mut head = http::Response::new(()).into_parts().0;
    head.status = if figures.grpc {
        StatusCode::OK
    } else {
        cfg.reject_status
    };
    head.headers = headers(cfg, figures);
    head
}

/// The headers for `figures`, sized for all of them at once.
fn headers(cfg: &Config, figures: &Figures) -> HeaderMap {
    let mut h = HeaderMap::with_capacity(8);
    let resource = figures
        .resource
        .and_then(|id| cfg.service.resource_name(id));
    if figures.grpc {
        h.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
        h.insert(GRPC_STATUS, HeaderValue::from_static("8"));
        let mut message = String::from("rate limit exceeded");
        match &resource {
            Some(name) => {
                let _ = write!(message, ": {name}");
                if let Some(window) = figures.window {
                    let _ = write!(message, " ({} per {})", figures.limit, period_name(window));
                }
                let _ = write!(message, " of service {} exhausted", cfg.service.name());
            }
            None => {
                let _ = write!(message, ": no quota for service {}", cfg.service.name());
            }
        }
        if let Ok(v) = HeaderValue::from_str(&percent_encode(&message)) {
            h.insert(GRPC_MESSAGE, v);
        }
        return h;
    }
    let reset = number(figures.reset_secs);
    h.insert(RETRY_AFTER, reset.clone());
    h.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    if let Some(name) = resource {
        let window = figures.window.map_or_else(
            || {
                u64::from(cfg.store.slot_length().as_ms())
                    .div_ceil(1000)
                    .max(1)
            },
            u64::from,
        );
        // Each value is written once and handed over without a copy.
        let mut policy = sf_string(&name);
        let mut ratelimit = policy.clone();
        let _ = write!(policy, ";q={};w={window}", figures.limit);
        if [cfg.traffic_up, cfg.traffic_down].contains(&figures.resource) {
            policy.push_str(";qu=\"content-bytes\"");
        }
        let _ = write!(
            ratelimit,
            ";r={};t={}",
            figures.remaining, figures.reset_secs
        );
        for (header, value) in [(RATELIMIT_POLICY, policy), (RATELIMIT, ratelimit)] {
            if let Ok(v) = HeaderValue::from_maybe_shared(bytes::Bytes::from(value)) {
                h.insert(header, v);
            }
        }
        h.insert(X_LIMIT, number(figures.limit));
        h.insert(X_REMAINING, number(figures.remaining));
        h.insert(X_RESET, reset);
    }
    h
}

/// A number as a header value; the usual small ones (a reset in 1 s, none
/// remaining) without an allocation.
fn number(n: u64) -> HeaderValue {
    const DIGITS: [&str; 10] = ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9"];
    match DIGITS.get(n as usize) {
        Some(d) => HeaderValue::from_static(d),
        None => HeaderValue::from(n),
    }
}

/// A structured-field string (RFC 8941): quoted, `"` and `\` escaped.
fn sf_string(s: &str) -> String {
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

/// gRPC's percent-encoding of `grpc-message`.
fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// The answer to a request whose user key is longer than a name may be
/// ([`MAX_NAME_LEN`](throttle_proto::MAX_NAME_LEN)): the central could not
/// account for it, so the user would never be limited. 431 (or a gRPC
/// `INVALID_ARGUMENT`), decided before the store is asked.
#[cold]
#[inline(never)]
pub(crate) fn refuse_long_user(req: RequestHead<'_>) -> (Parts, &'static [u8]) {
    let http = (
        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
        &b"User key too long\n"[..],
    );
    plain_refusal(req, http, ("3", "user key too long"))
}

/// The refusal of a user the central has blocked: `status` (403 by
/// default) and a body that says blocked, or gRPC `PERMISSION_DENIED`. No
/// rate-limit headers: waiting does not help.
#[cold]
#[inline(never)]
pub(crate) fn refuse_blocked(status: StatusCode, req: RequestHead<'_>) -> (Parts, &'static [u8]) {
    plain_refusal(req, (status, b"Blocked\n"), ("7", "blocked"))
}

/// The refusal of a local limit (nginx's form in `limit`): `status`, a
/// `Retry-After` of `retry_secs`, `throttle-refused-by: local` and the
/// limit; or gRPC `RESOURCE_EXHAUSTED` with the pushback.
#[cold]
#[inline(never)]
pub(crate) fn refuse_local(
    status: StatusCode,
    req: RequestHead<'_>,
    retry_secs: u64,
    limit: &str,
) -> (Parts, &'static [u8]) {
    refuse_limit(status, is_grpc(req), retry_secs, Limiter::Local, limit)
}

/// Which of the layer's own limits refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Limiter {
    /// A [`LocalLimit`](crate::local::LocalLimit) of this node.
    Local,
    /// A shared limit, in a bucket store.
    Shared,
}

impl Limiter {
    /// As `throttle-refused-by` and the logs name it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Limiter::Local => "local",
            Limiter::Shared => "shared",
        }
    }
}

/// The refusal of a local or shared limit (`limit` in nginx's syntax),
/// over gRPC if `grpc`.
pub(crate) fn refuse_limit(
    status: StatusCode,
    grpc: bool,
    retry_secs: u64,
    by: Limiter,
    limit: &str,
) -> (Parts, &'static [u8]) {
    let message = match by {
        Limiter::Local => "rate limit exceeded: local limit",
        Limiter::Shared => "rate limit exceeded: shared limit",
    };
    let (mut head, body) = plain_refusal_as(grpc, (status, HTTP_BODY), ("8", message));
    let h = &mut head.headers;
    if grpc {
        h.insert(GRPC_PUSHBACK, HeaderValue::from(retry_secs * 1000));
    } else {
        h.insert(RETRY_AFTER, number(retry_secs));
    }
    let by = format!("{}; limit={}", by.name(), sf_string(limit));
    if let Ok(v) = HeaderValue::from_str(&by) {
        h.insert(REFUSED_BY, v);
    }
    (head, body)
}

/// A refusal with no rate-limit figures: over HTTP, `status` and a text
/// body; over gRPC, a grpc-status code and message.
fn plain_refusal(
    req: RequestHead<'_>,
    answer: (StatusCode, &'static [u8]),
    grpc_answer: (&'static str, &'static str),
) -> (Parts, &'static [u8]) {
    plain_refusal_as(is_grpc(req), answer, grpc_answer)
}

/// [`plain_refusal`], knowing whether the request was gRPC.
fn plain_refusal_as(
    grpc: bool,
    (status, body): (StatusCode, &'static [u8]),
    (code, message): (&'static str, &'static str),
) -> (Parts, &'static [u8]) {
    let mut head = http::Response::new(()).into_parts().0;
    let content_type = if grpc {
        "application/grpc"
    } else {
        "text/plain"
    };
    head.headers
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    if !grpc {
        head.status = status;
        return (head, body);
    }
    head.headers
        .insert(GRPC_STATUS, HeaderValue::from_static(code));
    head.headers
        .insert(GRPC_MESSAGE, HeaderValue::from_static(message));
    (head, b"")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodings() {
        assert_eq!(percent_encode("a%b é"), "a%25b %C3%A9");
        assert_eq!(sf_string("db \"read\"\n"), r#""db \"read\"""#);
        for n in [0, 1, 9, 10, 1234, u64::MAX] {
            assert_eq!(number(n).to_str().unwrap(), n.to_string());
        }
    }
}
