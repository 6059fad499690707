//! What a request costs when the cost is computed from its head, and what
//! the handler's `Usage` extractor tells it: the decision and what is
//! left.

mod common;

use axum::Router;
use axum::routing::get;
use common::{T, amount, builder, every_user, get_as, quota, store};
use http::StatusCode;
use http_body_util::BodyExt;
use throttle_layer::Usage;
use throttle_layer::store::Basis;
use tower::ServiceExt;

/// `x-batch-size` items a request, 1 when absent or unreadable, counted
/// as `items` beside the 1 `requests`; refused once the items' quota is
/// exceeded.
#[tokio::test]
async fn a_cost_computed_from_the_head_is_charged_and_decides() {
    let (clock, store) = store();
    quota(
        &store,
        r#"{"front": {"100": {"alice": {"requests": 100.0, "items": 10.0}}}}"#,
    );
    let layer = builder(&store)
        .cost_fn("items", |head| {
            head.headers
                .get("x-batch-size")
                .and_then(|v| v.to_str().ok()?.parse().ok())
                .unwrap_or(1)
        })
        .build()
        .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    let batch = |n: &str| {
        let mut req = get_as("alice", "/");
        req.headers_mut().insert("x-batch-size", n.parse().unwrap());
        req
    };
    let status = |res: http::Response<_>| res.status();
    assert_eq!(
        status(app.clone().oneshot(batch("8")).await.unwrap()),
        StatusCode::OK
    );
    assert_eq!(
        status(app.clone().oneshot(get_as("alice", "/")).await.unwrap()),
        StatusCode::OK
    );
    assert_eq!(
        status(app.clone().oneshot(batch("junk")).await.unwrap()),
        StatusCode::OK
    );
    assert_eq!(
        status(app.clone().oneshot(batch("5")).await.unwrap()),
        StatusCode::OK
    );
    // 15 items used of 10: refused, whatever the size.
    let res = app.clone().oneshot(batch("1")).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(res.headers()["ratelimit-policy"], r#""items";q=10;w=1"#);
    clock.set(T + 1_000);
    let r = store.collect(100);
    assert_eq!(amount(&r.consumption, "alice", "items"), 15);
    assert_eq!(amount(&r.consumption, "alice", "requests"), 4);
}

/// The handler reads the decision and what is left of a resource, with
/// the configured limit; a user no quota limits gets the decision and no
/// remainder.
#[tokio::test]
async fn the_handler_sees_the_decision_and_what_is_left() {
    let (_, store) = store();
    quota(
        &store,
        r#"{"front": {"100": {"alice": {"requests": 5.0}}}}"#,
    );
    every_user(&store, 60, 600.0);
    let layer = builder(&store).handler_usage().build().unwrap();
    let app = Router::new()
        .route(
            "/",
            get(|usage: Usage| async move {
                let d = usage.decision().expect("a user");
                let left = match usage.remaining("requests") {
                    Some(r) => format!("{}/{} {:?}", r.left, r.quota, r.limit),
                    None => "unlimited".to_owned(),
                };
                format!("{} {:?} {left}", d.is_allowed(), d.basis)
            }),
        )
        .layer(layer);
    let said = |res: http::Response<axum::body::Body>| async move {
        assert_eq!(res.status(), StatusCode::OK);
        let body = res.into_body().collect().await.unwrap().to_bytes();
        String::from_utf8(body.to_vec()).unwrap()
    };
    let first = said(app.clone().oneshot(get_as("alice", "/")).await.unwrap()).await;
    assert_eq!(first, "true Quota 4/5 Some((600.0, 60))");
    let second = said(app.clone().oneshot(get_as("alice", "/")).await.unwrap()).await;
    assert_eq!(second, "true Quota 3/5 Some((600.0, 60))");
    let bob = said(app.oneshot(get_as("bob", "/")).await.unwrap()).await;
    assert_eq!(bob, format!("true {:?} unlimited", Basis::Unlimited));
}
