//! A refused request allocates nothing besides its response.
//!
//! A test binary of its own, for its counting allocator: a refusal's
//! allocations are compared with those of the response it returns.

use std::alloc::System;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use http::{Request, Response, StatusCode};
use http_body_util::Full;
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};
use throttle_clock::ManualClock;
use throttle_layer::layer::RefusalBody;
use throttle_layer::{SlotStore, ThrottleLayer, UserKey};
use throttle_proto::legacy::quota_from_json;
use tower::{Layer, Service};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// Allocations (and reallocations) made while `f` runs, and its result.
/// The binary runs this one test on one thread, and the store's clock is a
/// manual one: no other thread allocates meanwhile.
fn counted<T>(f: impl FnOnce() -> T) -> (usize, T) {
    let region = Region::new(GLOBAL);
    let out = f();
    let stats = region.change();
    (stats.allocations + stats.reallocations, out)
}

type Body = Full<bytes::Bytes>;

/// Sends one request as `user`; the response and the allocations of the
/// call and its one poll.
fn send<S>(svc: &mut S, user: &str) -> (usize, Response<Body>)
where
    S: Service<Request<Body>, Response = Response<Body>>,
    S::Error: std::fmt::Debug,
{
    let req = Request::builder()
        .header("x-user", user)
        .body(Body::default())
        .unwrap();
    let mut cx = Context::from_waker(Waker::noop());
    counted(|| {
        let mut future = std::pin::pin!(svc.call(req));
        match future.as_mut().poll(&mut cx) {
            Poll::Ready(res) => res.unwrap(),
            Poll::Pending => panic!("the service answers at once"),
        }
    })
}

/// [`send`], for a request that must be refused.
fn refuse<S>(svc: &mut S, user: &str) -> (usize, Response<Body>)
where
    S: Service<Request<Body>, Response = Response<Body>>,
    S::Error: std::fmt::Debug,
{
    let (n, res) = send(svc, user);
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS, "{user}");
    (n, res)
}

/// What a response needs of its own: a header map like `res`'s, and a body
/// (a kept refusal's body is shared, as a static one is).
fn own(res: &Response<Body>) -> usize {
    let body =
        bytes::Bytes::from_static(b"Too Many Requests: requests of service front exhausted\n");
    counted(|| {
        let mut copy = Response::new(<Body as RefusalBody>::refusal(body));
        *copy.headers_mut() = res.headers().clone();
        copy
    })
    .0
}

async fn hello(_: Request<Body>) -> Result<Response<Body>, std::convert::Infallible> {
    Ok(Response::new(Body::from("hello")))
}

/// A hello app behind a layer for service "front", users from `x-user`,
/// refusing with `status`.
fn front(
    store: &SlotStore,
    status: StatusCode,
) -> impl Service<Request<Body>, Response = Response<Body>, Error = std::convert::Infallible> {
    let layer = ThrottleLayer::builder(store, "front")
        .user(UserKey::header("x-user"))
        .reject_status(status)
        .build()
        .unwrap();
    layer.layer(tower::service_fn(hello))
}

#[test]
fn a_refusal_allocates_only_its_response() {
    let clock = Arc::new(ManualClock::new(100_250));
    let store = SlotStore::builder().clock(clock).build();
    let quota = r#"{"front": {"100": {"alice": {"requests": 0.0}, "bob": {"requests": 25.0}}}}"#;
    store.apply_quota(&quota_from_json(quota).unwrap());
    let mut svc = front(&store, StatusCode::TOO_MANY_REQUESTS);
    // The first two refusals with a set of figures build their head...
    for _ in 0..2 {
        let (n, res) = refuse(&mut svc, "alice");
        assert!(n > own(&res), "{n} allocations: the head is built");
    }
    // ... and the next ones allocate their response and nothing else.
    for _ in 0..3 {
        let (n, res) = refuse(&mut svc, "alice");
        assert_eq!(n, own(&res), "{res:?}");
        assert_eq!(res.headers()["x-ratelimit-limit"], "0");
    }
    // Bob has other figures, and his limit in his headers.
    for _ in 0..26 {
        let (_, res) = send(&mut svc, "bob");
        assert_eq!(res.status(), StatusCode::OK);
    }
    refuse(&mut svc, "bob");
    refuse(&mut svc, "bob");
    let (n, res) = refuse(&mut svc, "bob");
    assert_eq!(n, own(&res));
    assert_eq!(res.headers()["x-ratelimit-limit"], "25");
    assert_eq!(res.headers()["ratelimit-policy"], r#""requests";q=25;w=1"#);

    // Layers refusing in turn on one thread each keep their own head: none
    // pushes another's out, and none answers with another's.
    let statuses = [429, 503, 509, 529].map(|s| StatusCode::from_u16(s).unwrap());
    let mut services = statuses.map(|status| front(&store, status));
    for round in 0..4 {
        for (svc, status) in services.iter_mut().zip(statuses) {
            let (n, res) = send(svc, "alice");
            assert_eq!(res.status(), status);
            if round < 2 {
                assert!(n > own(&res), "{n} allocations: the head is built");
            } else {
                assert_eq!(n, own(&res), "round {round}, {status}");
            }
        }
    }
}
