//! The refusal's response, built once per set of figures.
//!
//! Under attack, every refusal in a slot carries the same headers and body:
//! the same resource, limit, nothing remaining, the same reset. Formatting
//! them and inserting them one by one (each insert hashes its name) was
//! most of a refusal's cost. The last refusal built (status, headers and
//! body) is kept beside the figures it was built from, and a refusal with
//! the same figures clones it: the response's own header map, and a
//! reference count for the body and each value that is not static.
//!
//! A head is kept once two refusals in a row have built it: where refusals
//! keep changing figures (many users over many different quotas), keeping
//! each head would only add a copy to every refusal.

use std::fmt::Write as _;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderName, HeaderValue, StatusCode};
use serde_json::Map;

use super::config::Config;
use super::future::Refusal;
use super::headers::{self, Stated, number, reset_seconds, sf_string, wait_ms};
use super::on_refusal::{Refused, RefusedBy};
use super::refusal_body::{Said, accepts_json};
use super::refusal_cache::{Figures, RefusalCache};
use crate::store::{Decision, period_name};
use crate::user::RequestHead;

const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
const GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");
const GRPC_PUSHBACK: HeaderName = HeaderName::from_static("grpc-retry-pushback-ms");
/// On a local limit's refusal, which: a refusal of the central quota names
/// its resource in the `RateLimit` headers instead.
const REFUSED_BY: HeaderName = HeaderName::from_static("throttle-refused-by");

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

/// The refusal: the kept one for its figures if there is one, so that
/// the only allocations are the response's own, else one built. Out of
/// line: inlined, its locals made the frame of every allowed request's
/// `decide` some 850 bytes.
#[cold]
#[inline(never)]
pub(crate) fn reject(
    cfg: &Config,
    refusals: &RefusalCache,
    req: RequestHead<'_>,
    user: &str,
    decision: &Decision,
) -> Refusal {
    let wait_ms = wait_ms(cfg);
    let grpc = is_grpc(req);
    let reset_seconds = reset_seconds(wait_ms);
    let stated = match decision.tightest {
        Some(t) => Stated::of(cfg, user, &t, 0, reset_seconds),
        None => Stated {
            limit: 0,
            window: None,
            remaining: 0,
            reset_seconds,
        },
    };
    let figures = Figures {
        grpc,
        json: !grpc && accepts_json(req),
        resource: decision.tightest.map(|t| t.resource),
        // gRPC's message states the configured limit only, and its reset
        // is the pushback, inserted below.
        stated: if grpc {
            Stated {
                limit: stated.window.map_or(0, |_| stated.limit),
                remaining: 0,
                reset_seconds: 0,
                ..stated
            }
        } else {
            stated
        },
    };
    let mut refusal = match refusals.get(&figures) {
        Some(refusal) => refusal,
        None => {
            let refusal = build(cfg, &figures);
            refusals.built(figures, &refusal);
            refusal
        }
    };
    if grpc {
        refusal
            .0
            .headers
            .insert(GRPC_PUSHBACK, HeaderValue::from(wait_ms));
    }
    match &cfg.on_refusal {
        None => refusal,
        Some(hook) => {
            let name = figures
                .resource
                .and_then(|id| cfg.service.resource_name(id));
            let why = Refused {
                resource: name.as_deref(),
                limit: figures.resource.map(|_| stated.limit),
                window_seconds: stated.window,
                ..refused(
                    cfg,
                    RefusedBy::Quota,
                    Some(user),
                    reset_seconds,
                    grpc,
                    figures.json,
                )
            };
            hook.apply(refusal, &why)
        }
    }
}

/// What refused, for the hook: the fields every refusal has.
fn refused<'a>(
    cfg: &'a Config,
    by: RefusedBy,
    user: Option<&'a str>,
    retry_after_seconds: u64,
    grpc: bool,
    accepts_json: bool,
) -> Refused<'a> {
    Refused {
        by,
        service: cfg.service.name(),
        user,
        resource: None,
        limit: None,
        window_seconds: None,
        rule: None,
        retry_after_seconds,
        grpc,
        accepts_json,
    }
}

/// The refusal for `figures`: its status, headers and body.
fn build(cfg: &Config, f: &Figures) -> Refusal {
    let name = f.resource.and_then(|id| cfg.service.resource_name(id));
    let message = quota_message(cfg, name.as_deref(), &f.stated);
    let mut head = http::Response::new(()).into_parts().0;
    let h = &mut head.headers;
    h.reserve(8);
    if f.grpc {
        h.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
        h.insert(GRPC_STATUS, HeaderValue::from_static("8"));
        let message = format!("rate limit exceeded: {message}");
        if let Ok(v) = HeaderValue::from_str(&percent_encode(&message)) {
            h.insert(GRPC_MESSAGE, v);
        }
        return (head, Bytes::new());
    }
    head.status = cfg.reject_status;
    h.insert(RETRY_AFTER, number(f.stated.reset_seconds));
    if let (Some(id), Some(name), true) = (f.resource, &name, cfg.rate_limit_headers) {
        headers::write(cfg, h, id, name, &f.stated);
    }
    let mut fields = Map::new();
    fields.insert("service".into(), cfg.service.name().into());
    fields.insert("resource".into(), name.as_deref().into());
    if name.is_some() {
        fields.insert("limit".into(), f.stated.limit.into());
        fields.insert("window_seconds".into(), f.stated.window_seconds(cfg).into());
        fields.insert("remaining".into(), f.stated.remaining.into());
    }
    fields.insert("retry_after_seconds".into(), f.stated.reset_seconds.into());
    let said = Said {
        title: cfg.reject_status.canonical_reason().unwrap_or("Refused"),
        error: "rate_limited",
        message: &message,
        fields,
    };
    let (kind, body) = said.render(f.json);
    h.insert(CONTENT_TYPE, kind);
    (head, body)
}

/// What a quota refusal says: the exhausted resource, its configured
/// limit and period when known, and the service; or that the user has no
/// quota at all.
fn quota_message(cfg: &Config, resource: Option<&str>, stated: &Stated) -> String {
    let service = cfg.service.name();
    let mut message = String::with_capacity(64);
    match resource {
        Some(name) => {
            let _ = write!(message, "{name}");
            if let Some(window) = stated.window {
                let _ = write!(message, " ({} per {})", stated.limit, period_name(window));
            }
            let _ = write!(message, " of service {service} exhausted");
        }
        None => {
            let _ = write!(message, "no quota for service {service}");
        }
    }
    message
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
pub(crate) fn refuse_long_user(cfg: &Config, req: RequestHead<'_>, user: &str) -> Refusal {
    let (grpc, json) = (is_grpc(req), accepts_json(req));
    let said = Said {
        title: "Request Header Fields Too Large",
        error: "user_key_too_long",
        message: "user key too long",
        fields: Map::new(),
    };
    let status = StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE;
    let refusal = plain_refusal(grpc, json, status, said, ("3", "user key too long"));
    finish(cfg, refusal, || {
        refused(cfg, RefusedBy::UserKeyTooLong, Some(user), 0, grpc, json)
    })
}

/// The refusal of a user the central has blocked: the layer's blocked
/// status (403 by default) and a body that says blocked, or gRPC
/// `PERMISSION_DENIED`. No rate-limit headers: waiting does not help.
#[cold]
#[inline(never)]
pub(crate) fn refuse_blocked(cfg: &Config, req: RequestHead<'_>, user: &str) -> Refusal {
    let (grpc, json) = (is_grpc(req), accepts_json(req));
    let message = format!("user blocked from service {}", cfg.service.name());
    let mut fields = Map::new();
    fields.insert("service".into(), cfg.service.name().into());
    let said = Said {
        title: "Blocked",
        error: "blocked",
        message: &message,
        fields,
    };
    let refusal = plain_refusal(grpc, json, cfg.blocked_status, said, ("7", &message));
    finish(cfg, refusal, || {
        refused(cfg, RefusedBy::Blocked, Some(user), 0, grpc, json)
    })
}

/// `refusal`, or the response the layer's hook makes of it.
fn finish<'a>(cfg: &'a Config, refusal: Refusal, why: impl FnOnce() -> Refused<'a>) -> Refusal {
    match &cfg.on_refusal {
        None => refusal,
        Some(hook) => hook.apply(refusal, &why()),
    }
}

/// Which of the layer's own limits refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OwnLimit {
    /// A [`LocalLimit`](crate::local::LocalLimit) of this node.
    Local,
    /// A shared limit, in a bucket store.
    Shared,
}

impl OwnLimit {
    /// As `throttle-refused-by` and the logs name it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            OwnLimit::Local => "local",
            OwnLimit::Shared => "shared",
        }
    }
}

/// A request as the layer's own limits refuse it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LimitRefusal<'a> {
    pub(crate) status: StatusCode,
    pub(crate) grpc: bool,
    pub(crate) json: bool,
    pub(crate) retry_seconds: u64,
    pub(crate) by: OwnLimit,
    /// The limit, in nginx's form.
    pub(crate) limit: &'a str,
    pub(crate) user: Option<&'a str>,
}

/// The refusal of a local or shared limit: its status, a `Retry-After`
/// and `throttle-refused-by` naming the limit, or gRPC
/// `RESOURCE_EXHAUSTED` with the pushback.
#[cold]
#[inline(never)]
pub(crate) fn refuse_limit(cfg: &Config, r: LimitRefusal<'_>) -> Refusal {
    let message = format!("{} limit {}", r.by.name(), r.limit);
    let mut fields = Map::new();
    fields.insert("service".into(), cfg.service.name().into());
    fields.insert("by".into(), r.by.name().into());
    fields.insert("limit".into(), r.limit.into());
    fields.insert("retry_after_seconds".into(), r.retry_seconds.into());
    let said = Said {
        title: r.status.canonical_reason().unwrap_or("Refused"),
        error: "rate_limited",
        message: &message,
        fields,
    };
    let grpc_message = format!("rate limit exceeded: {message}");
    let (mut head, body) = plain_refusal(r.grpc, r.json, r.status, said, ("8", &grpc_message));
    let h = &mut head.headers;
    if r.grpc {
        h.insert(GRPC_PUSHBACK, HeaderValue::from(r.retry_seconds * 1000));
    } else {
        h.insert(RETRY_AFTER, number(r.retry_seconds));
    }
    let by = format!("{}; limit={}", r.by.name(), sf_string(r.limit));
    if let Ok(v) = HeaderValue::from_str(&by) {
        h.insert(REFUSED_BY, v);
    }
    let kind = match r.by {
        OwnLimit::Local => RefusedBy::LocalLimit,
        OwnLimit::Shared => RefusedBy::SharedLimit,
    };
    finish(cfg, (head, body), || Refused {
        rule: Some(r.limit),
        ..refused(cfg, kind, r.user, r.retry_seconds, r.grpc, r.json)
    })
}

/// A refusal with no rate-limit figures: over HTTP, `status` and the body
/// `said`; over gRPC, status `code` and `message`.
fn plain_refusal(
    grpc: bool,
    json: bool,
    status: StatusCode,
    said: Said<'_>,
    (code, message): (&'static str, &str),
) -> Refusal {
    let mut head = http::Response::new(()).into_parts().0;
    if !grpc {
        head.status = status;
        let (kind, body) = said.render(json);
        head.headers.insert(CONTENT_TYPE, kind);
        return (head, body);
    }
    let h = &mut head.headers;
    h.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    h.insert(GRPC_STATUS, HeaderValue::from_static(code));
    if let Ok(v) = HeaderValue::from_str(&percent_encode(message)) {
        h.insert(GRPC_MESSAGE, v);
    }
    (head, Bytes::new())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_messages_are_percent_encoded() {
        assert_eq!(percent_encode("a%b é"), "a%25b %C3%A9");
    }
}
