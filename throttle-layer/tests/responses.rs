//! What a response tells the client of the limits: a refusal's body, in
//! text or in JSON when the request accepts it, naming what refused; the
//! rate-limit headers on allowed responses when the layer is asked; and
//! a hook that builds the refusal response itself.

mod common;

use std::sync::{Arc, Mutex};

use axum::body::Body;
use common::{ALICE_HAS_NONE, builder, every_user, get_as, hello, quota, store};
use http::header::{ACCEPT, CONTENT_TYPE};
use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use serde_json::Value;
use throttle_layer::layer::RefusedBy;
use throttle_layer::local::LocalLimit;
use tower::ServiceExt;

/// A GET of `/` by `user` that accepts JSON.
fn get_json(user: &str) -> Request<Body> {
    let mut req = get_as(user, "/");
    req.headers_mut()
        .insert(ACCEPT, "application/json".parse().unwrap());
    req
}

async fn body(res: Response<Body>) -> String {
    let bytes = res.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(bytes.to_vec()).unwrap()
}

async fn json(res: Response<Body>) -> Value {
    assert_eq!(res.headers()[CONTENT_TYPE], "application/json");
    serde_json::from_str(&body(res).await).unwrap()
}

/// The quota's refusal names the resource, its configured limit and
/// period and the service; in JSON with its figures when the request
/// accepts JSON. A blocked user's and a local limit's refusals say so in
/// JSON too.
#[tokio::test]
async fn a_refusal_says_what_refused_in_text_or_json() {
    let (_, store) = store();
    quota(&store, ALICE_HAS_NONE);
    every_user(&store, 1, 100.0);
    let app = hello().layer(builder(&store).build().unwrap());

    let res = app.clone().oneshot(get_as("alice", "/")).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(res.headers()[CONTENT_TYPE], "text/plain; charset=utf-8");
    assert_eq!(
        body(res).await,
        "Too Many Requests: requests (100 per second) of service front exhausted\n"
    );

    let res = app.clone().oneshot(get_json("alice")).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    let v = json(res).await;
    assert_eq!(v["error"], "rate_limited");
    assert_eq!(
        v["message"],
        "requests (100 per second) of service front exhausted"
    );
    assert_eq!(v["service"], "front");
    assert_eq!(v["resource"], "requests");
    assert_eq!(v["limit"], 100);
    assert_eq!(v["window_seconds"], 1);
    assert_eq!(v["remaining"], 0);
    assert_eq!(v["retry_after_seconds"], 1, "750 ms to the next slot");

    store.set_blocked("front", vec!["mallory".into()]);
    let res = app.clone().oneshot(get_json("mallory")).await.unwrap();
    assert_eq!(res.status(), StatusCode::FORBIDDEN);
    let v = json(res).await;
    assert_eq!(v["error"], "blocked");
    assert_eq!(v["message"], "user blocked from service front");

    // bob has no quota row: only the local limit of 1 a second applies.
    let local: LocalLimit = "1r/s".parse().unwrap();
    let app = hello().layer(builder(&store).local_limit(local).build().unwrap());
    let res = app.clone().oneshot(get_json("bob")).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let res = app.clone().oneshot(get_json("bob")).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    let v = json(res).await;
    assert_eq!(v["error"], "rate_limited");
    assert_eq!(v["by"], "local");
    assert_eq!(v["limit"], "1r/s");
    assert_eq!(v["message"], "local limit 1r/s");
}

/// With `headers_on_success`, an allowed response states the configured
/// limit and what is left of this node's share after the request; a
/// user no quota limits gets none, nor does a layer not asked.
#[tokio::test]
async fn allowed_responses_carry_the_headers_when_asked() {
    let (_, store) = store();
    quota(
        &store,
        r#"{"front": {"100": {"bob": {"requests": 5.0}, "carol": {"requests": 3.0}}}}"#,
    );
    every_user(&store, 1, 100.0);
    let app = hello().layer(builder(&store).headers_on_success(true).build().unwrap());
    for left in [4, 3, 2, 1, 0] {
        let res = app.clone().oneshot(get_as("bob", "/")).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        let h = res.headers();
        assert_eq!(h["ratelimit-policy"], r#""requests";q=100;w=1"#);
        assert_eq!(h["ratelimit"], format!("\"requests\";r={left};t=1"));
        assert_eq!(h["x-ratelimit-limit"], "100");
        assert_eq!(h["x-ratelimit-remaining"], left.to_string());
        assert_eq!(h["x-ratelimit-reset"], "1");
        assert_eq!(body(res).await, "hello");
    }
    let res = app.clone().oneshot(get_as("dave", "/")).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert!(!res.headers().contains_key("ratelimit-policy"), "unlimited");

    let quiet = hello().layer(builder(&store).build().unwrap());
    let res = quiet.oneshot(get_as("carol", "/")).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert!(!res.headers().contains_key("ratelimit-policy"));

    // A metered layer adds them too, `qu` for a resource of body bytes.
    quota(
        &store,
        r#"{"front": {"100": {"erin": {"requests": 50.0, "traffic_down": 1000.0}}}}"#,
    );
    let metered = hello().layer(
        builder(&store)
            .traffic_down()
            .headers_on_success(true)
            .build()
            .unwrap(),
    );
    let res = metered.oneshot(get_as("erin", "/")).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.headers()["ratelimit-policy"], r#""requests";q=100;w=1"#);
    assert_eq!(res.headers()["x-ratelimit-remaining"], "49");
}

/// The hook sees what refused and the layer's response, and its answer is
/// sent: for the quota, for a blocked user and for a gRPC call.
#[tokio::test]
async fn a_hook_builds_the_refusal() {
    let (_, store) = store();
    quota(&store, ALICE_HAS_NONE);
    every_user(&store, 1, 100.0);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let layer = builder(&store)
        .on_refusal(move |why, mut res| {
            log.lock().unwrap().push((
                why.by,
                why.user.map(str::to_owned),
                why.resource.map(str::to_owned),
                why.limit,
                why.window_seconds,
                why.grpc,
            ));
            if !why.grpc {
                *res.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
                let said = String::from_utf8_lossy(res.body()).into_owned();
                *res.body_mut() = format!("custom: {said}").into();
            }
            res
        })
        .build()
        .unwrap();
    let app = hello()
        .route("/pkg.Svc/Call", axum::routing::post(|| async { "never" }))
        .layer(layer);
    let res = app.clone().oneshot(get_as("alice", "/")).await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(res.headers().contains_key("ratelimit-policy"), "kept");
    assert_eq!(
        body(res).await,
        "custom: Too Many Requests: requests (100 per second) of service front exhausted\n"
    );
    store.set_blocked("front", vec!["mallory".into()]);
    let res = app.clone().oneshot(get_as("mallory", "/")).await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    let grpc = Request::builder()
        .method(Method::POST)
        .uri("/pkg.Svc/Call")
        .header("x-user", "alice")
        .header(CONTENT_TYPE, "application/grpc")
        .body(Body::empty())
        .unwrap();
    let res = app.clone().oneshot(grpc).await.unwrap();
    assert_eq!(res.headers()["grpc-status"], "8");
    let bob = app.oneshot(get_as("bob", "/")).await.unwrap();
    assert_eq!(bob.status(), StatusCode::OK, "no hook for what passes");

    let seen = seen.lock().unwrap();
    let alice = Some("alice".to_owned());
    let requests = Some("requests".to_owned());
    assert_eq!(
        *seen,
        [
            (
                RefusedBy::Quota,
                alice.clone(),
                requests.clone(),
                Some(100),
                Some(1),
                false
            ),
            (
                RefusedBy::Blocked,
                Some("mallory".to_owned()),
                None,
                None,
                None,
                false
            ),
            (RefusedBy::Quota, alice, requests, Some(100), Some(1), true),
        ]
    );
}
