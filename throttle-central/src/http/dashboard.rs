//! `GET /dashboard`: one page, embedded in the binary, that polls the
//! monitor API and draws, per service, the heaviest users' admitted
//! consumption against their limit over the last 60 slots, who is being
//! refused, the connected nodes and the central's role.
//!
//! The page and its script and style are static (no data in them), so
//! they are served without the bearer token; the script sends the token
//! it is given in the address (`/dashboard#token=...`, kept in the
//! browser's local storage) with every API call. Plain JS and SVG: no
//! build step, nothing fetched from elsewhere (the `Content-Security-Policy`
//! forbids it).

use axum::Router;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;

const PAGE: &str = include_str!("dashboard/index.html");
const SCRIPT: &str = include_str!("dashboard/app.js");
const STYLE: &str = include_str!("dashboard/style.css");

/// Only this origin's scripts, styles and API; nothing inline.
const POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; base-uri 'none'; frame-ancestors 'none'";

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CONTENT_SECURITY_POLICY, POLICY),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

/// The dashboard's routes (outside the token's guard).
pub(super) fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route(
            "/dashboard",
            get(|| async { asset("text/html; charset=utf-8", PAGE) }),
        )
        .route(
            "/dashboard/app.js",
            get(|| async { asset("text/javascript; charset=utf-8", SCRIPT) }),
        )
        .route(
            "/dashboard/style.css",
            get(|| async { asset("text/css; charset=utf-8", STYLE) }),
        )
}
