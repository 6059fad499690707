//! Helpers of the layer's integration tests (each test file uses some).
#![allow(dead_code)]

use std::collections::BTreeMap;

use axum::body::Body;
use http::Request;
use throttle_proto::v1;

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
