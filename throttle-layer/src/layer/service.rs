use std::fmt::Write as _;
use std::marker::PhantomData;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderName, HeaderValue, Request, Response, StatusCode};
use tower_service::Service;

use super::body::{Meter, RefusalBody, RequestBody, ResponseBody};
use super::future::{PlainFuture, ResponseFuture};
use super::layer::{Config, Metered, Plain};
use crate::store::{Basis, Decision, UserHandle};
use crate::usage::Usage;
use crate::user::{MissingUser, RequestHead};

const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
const X_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
const X_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
const X_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");
const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
const GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");
const GRPC_PUSHBACK: HeaderName = HeaderName::from_static("grpc-retry-pushback-ms");

/// Throttles requests per user; see the [module docs](crate::layer).
///
/// `M` is the layer's mode: [`Plain`] or [`Metered`].
#[derive(Debug, Clone)]
pub struct Throttle<S, M = Plain> {
    pub(crate) inner: S,
    pub(crate) config: Arc<Config>,
    pub(crate) mode: PhantomData<M>,
}

impl<S, M> Throttle<S, M> {
    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The wrapped service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwraps the service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

/// What becomes of one request.
enum Outcome {
    /// No user and [`MissingUser::Skip`]: not throttled, not counted.
    Skip,
    /// Refused: the response head and its short body.
    Refuse(http::response::Parts, &'static [u8]),
    /// Allowed (or shadow-refused); the handle when amounts follow.
    Pass(Option<UserHandle>),
}

/// The decision, shared by both modes: find the user, ask the store, count
/// the metrics, build the refusal.
fn decide(cfg: &Config, head: RequestHead<'_>) -> Outcome {
    cfg.user.with_user(head, |found| {
        let user = match (found, &cfg.missing_user) {
            (Some(u), _) => u,
            (None, MissingUser::As(name)) => name.as_str(),
            (None, MissingUser::Skip) => {
                cfg.skipped.increment(1);
                return Outcome::Skip;
            }
        };
        admit(cfg, head, user)
    })
}

/// Asks the store for `user`, counts the metrics, builds the refusal.
#[inline]
fn admit(cfg: &Config, head: RequestHead<'_>, user: &str) -> Outcome {
    let wants_handle = cfg.traffic_up.is_some() || cfg.traffic_down.is_some() || cfg.handler_usage;
    let admission = if wants_handle || cfg.shadow {
        cfg.service
            .admit_with_handle(user, &cfg.costs, cfg.fallback, !cfg.shadow)
    } else {
        cfg.service.admit(user, &cfg.costs, cfg.fallback)
    };
    let decision = admission.decision;
    if decision.basis != Basis::Quota && decision.basis != Basis::Unlimited {
        cfg.fallback_decisions.increment(1);
    }
    if !decision.is_allowed() {
        if cfg.shadow {
            cfg.shadow_rejected.increment(1);
        } else {
            let (response, body) = reject(cfg, head, &decision);
            return Outcome::Refuse(response, body);
        }
    }
    Outcome::Pass(admission.handle)
}

impl<S, ReqB, ResB> Service<Request<ReqB>> for Throttle<S, Plain>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
    ResB: RefusalBody,
{
    type Response = Response<ResB>;
    type Error = S::Error;
    type Future = PlainFuture<S::Future, ResB>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<ReqB>) -> Self::Future {
        let cfg = &*self.config;
        let handle = match decide(cfg, RequestHead::of(&req)) {
            Outcome::Skip => None,
            Outcome::Refuse(parts, body) => {
                return PlainFuture::rejected(Response::from_parts(parts, ResB::refusal(body)));
            }
            Outcome::Pass(handle) => handle,
        };
        if cfg.handler_usage {
            // Also without a user, so the handler's extractor never fails.
            req.extensions_mut().insert(Usage::new(handle));
        }
        PlainFuture::passed(self.inner.call(req))
    }
}

impl<S, ReqB, ResB> Service<Request<ReqB>> for Throttle<S, Metered>
where
    S: Service<Request<RequestBody<ReqB>>, Response = Response<ResB>>,
{
    type Response = Response<ResponseBody<ResB>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        let cfg = &*self.config;
        let handle = match decide(cfg, RequestHead::of(&req)) {
            Outcome::Skip => None,
            Outcome::Refuse(parts, body) => return ResponseFuture::rejected(parts, body),
            Outcome::Pass(handle) => handle,
        };
        let meter = |r| {
            handle.clone().map(|handle| Meter {
                handle,
                resource: r,
            })
        };
        let up = cfg.traffic_up.and_then(meter);
        let down = cfg.traffic_down.and_then(meter);
        let (mut parts, body) = req.into_parts();
        if cfg.handler_usage {
            parts.extensions.insert(Usage::new(handle));
        }
        let req = Request::from_parts(parts, RequestBody::new(body, up));
        ResponseFuture::passed(self.inner.call(req), down)
    }
}

fn is_grpc(head: RequestHead<'_>) -> bool {
    head.headers
        .get(CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

/// Builds the refusal: the only allocations are the response's own. Out of
/// line: inlined, its locals made the frame of every allowed request's
/// `decide` some 850 bytes.
#[cold]
#[inline(never)]
fn reject(
    cfg: &Config,
    req: RequestHead<'_>,
    decision: &Decision,
) -> (http::response::Parts, &'static [u8]) {
    let slot = cfg.store.slot_length();
    let wait = slot.until_next(cfg.store.clock().now_ms());
    let wait_ms = wait.as_millis() as u64;
    let reset_secs = wait_ms.div_ceil(1000).max(1);
    let mut res = Response::new(()).into_parts().0;
    // Sized for every header below at once: no regrowth.
    res.headers = http::HeaderMap::with_capacity(8);
    let resource = decision
        .tightest
        .and_then(|t| Some((cfg.service.resource_name(t.resource)?, t)));
    if is_grpc(req) {
        res.status = StatusCode::OK;
        let h = &mut res.headers;
        h.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
        h.insert(GRPC_STATUS, HeaderValue::from_static("8"));
        let mut message = String::from("rate limit exceeded");
        match &resource {
            Some((name, _)) => {
                let _ = write!(
                    message,
                    ": {} of service {} exhausted",
                    name,
                    cfg.service.name()
                );
            }
            None => {
                let _ = write!(message, ": no quota for service {}", cfg.service.name());
            }
        }
        if let Ok(v) = HeaderValue::from_str(&percent_encode(&message)) {
            h.insert(GRPC_MESSAGE, v);
        }
        h.insert(GRPC_PUSHBACK, HeaderValue::from(wait_ms));
        return (res, b"");
    }
    res.status = cfg.reject_status;
    let h = &mut res.headers;
    let reset = number(reset_secs);
    h.insert(RETRY_AFTER, reset.clone());
    h.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    if cfg.rate_limit_headers
        && let Some((name, t)) = &resource
    {
        let limit = t.quota.max(0.0).floor() as u64;
        let remaining = (t.quota - t.used as f64).max(0.0).floor() as u64;
        let window = u64::from(slot.as_ms()).div_ceil(1000).max(1);
        // Each value is written once and handed over without a copy.
        let mut policy = sf_string(name);
        let mut ratelimit = policy.clone();
        let _ = write!(policy, ";q={limit};w={window}");
        let _ = write!(ratelimit, ";r={remaining};t={reset_secs}");
        for (header, value) in [(RATELIMIT_POLICY, policy), (RATELIMIT, ratelimit)] {
            if let Ok(v) = HeaderValue::from_maybe_shared(bytes::Bytes::from(value)) {
                h.insert(header, v);
            }
        }
        h.insert(X_LIMIT, number(limit));
        h.insert(X_REMAINING, number(remaining));
        h.insert(X_RESET, reset);
    }
    (res, b"Too Many Requests\n")
}

/// A structured-field string (RFC 8941): quoted, `"` and `\` escaped.
/// A number as a header value; the usual small ones (a reset in 1 s, none
/// remaining) without an allocation.
fn number(n: u64) -> HeaderValue {
    const DIGITS: [&str; 10] = ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9"];
    match DIGITS.get(n as usize) {
        Some(d) => HeaderValue::from_static(d),
        None => HeaderValue::from(n),
    }
}

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
