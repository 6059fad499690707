//! The demo node: an axum app with `ThrottleLayer` on service `front`, the
//! user taken from the `x-user` header.
//!
//! | route | what it costs |
//! |---|---|
//! | `GET /` | 1 `requests` |
//! | `POST /upload` | 1 `requests` + the body bytes as `traffic_up` |
//! | `GET /download?bytes=N` | 1 `requests` + N streamed bytes as `traffic_down` |
//! | `GET /db?reads=N` | 1 `requests` + N `database_read`, reported by the handler |

use axum::Router;
use axum::body::Body;
use axum::extract::Query;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use bytes::Bytes;
use http_body_util::BodyExt;
use serde::Deserialize;
use throttle_layer::layer::LayerError;
use throttle_layer::{Fallback, SlotStore, ThrottleLayer, ThrottleLayerBuilder, Usage, UserKey};

/// The service name the demo counts under.
pub const SERVICE: &str = "front";
/// Largest download served, so a typo cannot exhaust memory or time.
const MAX_DOWNLOAD: u64 = 1 << 30;
const CHUNK: usize = 16 * 1024;

fn layer(store: &SlotStore, fallback: Fallback) -> ThrottleLayerBuilder {
    ThrottleLayer::builder(store, SERVICE)
        .user(UserKey::header("x-user"))
        .fallback(fallback)
}

/// The demo router over `store`.
///
/// # Errors
///
/// When a layer cannot be built (it always can, with these resources).
pub fn router(store: &SlotStore, fallback: Fallback) -> Result<Router, LayerError> {
    // One layer per route, all over the same store: each route decides once
    // and counts what it costs.
    Ok(Router::new()
        .route(
            "/",
            get(|| async { "hello\n" }).layer(layer(store, fallback).build()?),
        )
        .route(
            "/upload",
            post(upload).layer(layer(store, fallback).traffic_up().build()?),
        )
        .route(
            "/download",
            get(download).layer(layer(store, fallback).traffic_down().build()?),
        )
        .route(
            "/db",
            get(db).layer(layer(store, fallback).handler_usage().build()?),
        ))
}

async fn upload(body: Body) -> Response {
    match body.collect().await {
        Ok(b) => format!("{}\n", b.to_bytes().len()).into_response(),
        Err(e) => (StatusCode::BAD_REQUEST, format!("body: {e}\n")).into_response(),
    }
}

#[derive(Debug, Deserialize)]
struct DownloadQuery {
    bytes: u64,
}

async fn download(
    query: Result<Query<DownloadQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let n = match query {
        Ok(Query(q)) if q.bytes <= MAX_DOWNLOAD => q.bytes,
        Ok(_) => {
            return (
                StatusCode::BAD_REQUEST,
                format!("at most {MAX_DOWNLOAD} bytes\n"),
            )
                .into_response();
        }
        Err(e) => return (StatusCode::BAD_REQUEST, format!("{}\n", e.body_text())).into_response(),
    };
    let chunk = Bytes::from(vec![b'.'; CHUNK]);
    let chunks = (0..n.div_ceil(CHUNK as u64)).map(move |i| {
        let len = (n - i * CHUNK as u64).min(CHUNK as u64) as usize;
        Ok::<_, std::convert::Infallible>(chunk.slice(..len))
    });
    Body::from_stream(futures_util::stream::iter(chunks)).into_response()
}

#[derive(Debug, Deserialize)]
struct DbQuery {
    #[serde(default = "one")]
    reads: i64,
}

fn one() -> i64 {
    1
}

async fn db(
    usage: Usage,
    query: Result<Query<DbQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let reads = match query {
        Ok(Query(q)) if q.reads >= 0 => q.reads,
        Ok(_) => return (StatusCode::BAD_REQUEST, "reads must be >= 0\n").into_response(),
        Err(e) => return (StatusCode::BAD_REQUEST, format!("{}\n", e.body_text())).into_response(),
    };
    // A real handler would run its query here and count the rows it read.
    usage.add("database_read", reads);
    format!("read {reads} rows\n").into_response()
}
