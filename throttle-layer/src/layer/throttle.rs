use std::marker::PhantomData;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower_service::Service;

use super::body::{Meter, RefusalBody, RequestBody, ResponseBody};
use super::built::Built;
use super::config::{Metered, Plain};
use super::cost;
use super::future::{Headers, Hold, PlainFuture, Refusal, ResponseFuture};
use super::gate::gate;
use super::local::{Local, LocalZones};
use super::refusal::{refuse_blocked, refuse_long_user, reject};
use super::shared::SharedLimits;
use super::success::success_headers;
use crate::store::{Basis, Decision, UserHandle};
use crate::usage::Usage;
use crate::user::{MissingUser, RequestHead};
use throttle_proto::MAX_NAME_LEN;

/// Throttles requests per user; see the [module docs](crate::layer).
///
/// `M` is the layer's mode: [`Plain`] or [`Metered`].
#[derive(Debug, Clone)]
pub struct Throttle<S, M = Plain> {
    pub(crate) inner: S,
    pub(crate) built: Arc<Built>,
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
    Refuse(Refusal),
    /// Allowed (or shadow-refused), held this many ms by a local limit
    /// first.
    Pass(Passed, u64),
    /// Passed so far, and waiting for the shared limits' answer first.
    Gated(Passed, Hold),
}

/// What follows a request let through.
#[derive(Default)]
struct Passed {
    /// The user's handle, when amounts follow.
    handle: Option<UserHandle>,
    /// The decision, when the handler's [`Usage`] tells it.
    decision: Option<Decision>,
    /// The headers to add to the response.
    headers: Headers,
}

/// A local limit's hold of `delay_ms`, if any.
fn hold_for(delay_ms: u64) -> Option<Hold> {
    (delay_ms > 0).then(|| Hold::ms(delay_ms))
}

/// The decision, shared by both modes: find the user, ask the store, count
/// the metrics, build the refusal.
fn outcome_of(built: &Arc<Built>, head: RequestHead<'_>) -> Outcome {
    let cfg = &built.config;
    cfg.user.with_user(head, |found| {
        let user = match (found, &cfg.missing_user) {
            (Some(u), _) if u.len() > MAX_NAME_LEN => {
                cfg.long_users.increment(1);
                return Outcome::Refuse(refuse_long_user(cfg, head, u));
            }
            (Some(u), _) => u,
            (None, MissingUser::As(name)) => name.as_str(),
            (None, MissingUser::Skip) => {
                cfg.skipped.increment(1);
                if built.local.is_none() && built.shared.is_none() {
                    return Outcome::Skip;
                }
                return limits_only(built, head);
            }
        };
        if cfg.service.is_blocked(user) {
            cfg.blocked.increment(1);
            if !cfg.shadow {
                return Outcome::Refuse(refuse_blocked(cfg, head, user));
            }
        }
        match &built.shared {
            None => admit_here(built, head, user),
            Some(shared) => admit_shared(built, shared, head, user),
        }
    })
}

/// What this node decides: the local limits, if any, and the central
/// quota.
#[inline]
fn admit_here(built: &Built, head: RequestHead<'_>, user: &str) -> Outcome {
    match &built.local {
        None => admit(built, head, user, 0),
        Some(local) => admit_local(built, local, head, user),
    }
}

/// The local limits and the central quota, then, if they pass, the
/// shared limits' gate. Out of line, as [`admit_local`].
#[inline(never)]
fn admit_shared(
    built: &Arc<Built>,
    shared: &SharedLimits,
    head: RequestHead<'_>,
    user: &str,
) -> Outcome {
    match admit_here(built, head, user) {
        Outcome::Pass(passed, delay) => {
            Outcome::Gated(passed, gate(built, shared, head, Some(user), delay))
        }
        outcome => outcome,
    }
}

/// [`admit`] behind the local limits: refused by one, the central is not
/// asked; refused by the central, the request is taken back from them.
/// Out of line, so a layer without local limits keeps its request path
/// as it was.
#[inline(never)]
fn admit_local(built: &Built, local: &LocalZones, head: RequestHead<'_>, user: &str) -> Outcome {
    match local.check(&built.config, head, Some(user)) {
        Local::Refuse(refusal) => Outcome::Refuse(refusal),
        Local::Pass(delay) => {
            let outcome = admit(built, head, user, delay);
            if matches!(outcome, Outcome::Refuse(..)) {
                local.refund(head, Some(user));
            }
            outcome
        }
    }
}

/// A request with no user: only local and shared limits keyed on their
/// own (the peer's address, say) apply.
#[inline(never)]
fn limits_only(built: &Arc<Built>, head: RequestHead<'_>) -> Outcome {
    let delay = match built
        .local
        .as_ref()
        .map(|l| l.check(&built.config, head, None))
    {
        Some(Local::Refuse(refusal)) => return Outcome::Refuse(refusal),
        Some(Local::Pass(delay)) => delay,
        None => 0,
    };
    match &built.shared {
        Some(shared) => Outcome::Gated(Passed::default(), gate(built, shared, head, None, delay)),
        None if delay > 0 => Outcome::Pass(Passed::default(), delay),
        None => Outcome::Skip,
    }
}

/// Asks the store for `user`, counts the metrics, builds the refusal or
/// the allowed response's headers; an allowed request is held `delay` ms
/// first.
#[inline]
fn admit(built: &Built, head: RequestHead<'_>, user: &str, delay: u64) -> Outcome {
    let cfg = &built.config;
    let wants_handle = cfg.traffic_up.is_some() || cfg.traffic_down.is_some() || cfg.handler_usage;
    let dynamic;
    let costs = if built.cost_fns.is_empty() {
        &cfg.costs[..]
    } else {
        dynamic = cost::computed(cfg, &built.cost_fns, head);
        &dynamic[..]
    };
    let admission = if wants_handle || cfg.shadow {
        cfg.service
            .admit_with_handle(user, costs, cfg.fallback, !cfg.shadow)
    } else {
        cfg.service.admit(user, costs, cfg.fallback)
    };
    let decision = admission.decision;
    if matches!(decision.basis, Basis::Fallback | Basis::AtCap) {
        cfg.fallback_decisions.increment(1);
    }
    if !decision.is_allowed() {
        if cfg.shadow {
            cfg.shadow_rejected.increment(1);
        } else {
            return Outcome::Refuse(reject(cfg, &built.refusals, head, user, &decision));
        }
    }
    let headers = if cfg.headers_on_success {
        success_headers(cfg, head, user, &decision, costs)
    } else {
        None
    };
    let passed = Passed {
        handle: admission.handle,
        decision: cfg.handler_usage.then_some(decision),
        headers,
    };
    Outcome::Pass(passed, delay)
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
        let cfg = &self.built.config;
        let (passed, hold) = match outcome_of(&self.built, RequestHead::of(&req)) {
            Outcome::Skip => (Passed::default(), None),
            Outcome::Refuse((parts, body)) => {
                return PlainFuture::rejected(Response::from_parts(parts, ResB::refusal(body)));
            }
            Outcome::Pass(passed, delay) => (passed, hold_for(delay)),
            Outcome::Gated(passed, hold) => (passed, Some(hold)),
        };
        if cfg.handler_usage {
            // Also without a user, so the handler's extractor never fails.
            let usage = Usage::new(passed.handle, passed.decision);
            req.extensions_mut().insert(usage);
        }
        PlainFuture::passed(self.inner.call(req), hold, passed.headers)
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
        let cfg = &self.built.config;
        let (passed, hold) = match outcome_of(&self.built, RequestHead::of(&req)) {
            Outcome::Skip => (Passed::default(), None),
            Outcome::Refuse(refusal) => return ResponseFuture::rejected(refusal),
            Outcome::Pass(passed, delay) => (passed, hold_for(delay)),
            Outcome::Gated(passed, hold) => (passed, Some(hold)),
        };
        let Passed {
            handle,
            decision,
            headers,
        } = passed;
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
            parts.extensions.insert(Usage::new(handle, decision));
        }
        let req = Request::from_parts(parts, RequestBody::new(body, up));
        ResponseFuture::passed(self.inner.call(req), down, hold, headers)
    }
}
