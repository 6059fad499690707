//! Helpers of the layer's integration tests (each test file uses some).
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use http::Request;
use throttle_clock::ManualClock;
use throttle_layer::store::SlotStore;
use throttle_layer::{ThrottleLayer, ThrottleLayerBuilder, UserKey};
use throttle_proto::legacy::quota_from_json;
use throttle_proto::v1;

pub(crate) const T: i64 = 100_250; // a quarter into slot 100

pub(crate) fn store() -> (Arc<ManualClock>, SlotStore) {
    let clock = Arc::new(ManualClock::new(T));
    (clock.clone(), SlotStore::builder().clock(clock).build())
}

pub(crate) fn quota(store: &SlotStore, json: &str) {
    store.apply_quota(&quota_from_json(json).unwrap());
}

/// A quota of no requests for alice in slot 100.
pub(crate) const ALICE_HAS_NONE: &str = r#"{"front": {"100": {"alice": {"requests": 0.0}}}}"#;

pub(crate) fn builder(store: &SlotStore) -> ThrottleLayerBuilder {
    ThrottleLayer::builder(store, "front").user(UserKey::header("x-user"))
}

/// An app answering `GET /` with "hello".
pub(crate) fn hello() -> Router {
    Router::new().route("/", get(|| async { "hello" }))
}

/// A GET of `uri` by `user` (the `x-user` header).
pub(crate) fn get_as(user: &str, uri: &str) -> Request<Body> {
    Request::builder()
        .uri(uri)
        .header("x-user", user)
        .body(Body::empty())
        .unwrap()
}

/// What `user` of service `front` consumed of `resource` in a report.
pub(crate) fn amount(usage: &BTreeMap<String, v1::Usage>, user: &str, resource: &str) -> i64 {
    usage
        .get("front")
        .and_then(|u| u.users.get(user))
        .and_then(|a| a.resources.get(resource))
        .copied()
        .unwrap_or(0)
}

/// Every user of `front` may use `amount` requests per `window_seconds`.
pub(crate) fn every_user(store: &SlotStore, window_seconds: u32, amount: f64) {
    store.set_limits(v1::Limits {
        service: "front".into(),
        every: vec![v1::Allowance {
            resource: "requests".into(),
            window_seconds,
            amount,
        }],
        ..v1::Limits::default()
    });
}
