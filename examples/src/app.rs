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
use throttle_layer::bucket::RedisStore;
use throttle_layer::layer::LayerError;
use throttle_layer::local::LocalLimit;
use throttle_layer::{Fallback, SlotStore, ThrottleLayer, ThrottleLayerBuilder, Usage, UserKey};

/// The service name the demo counts under.
pub const SERVICE: &str = "front";
/// Largest download served, so a typo cannot exhaust memory or time.
const MAX_DOWNLOAD: u64 = 1 << 30;
/// Largest upload taken; a larger body is refused with 413 as soon as it
/// passes this, having been counted, not kept.
pub const MAX_UPLOAD: u64 = 1 << 30;
const CHUNK: usize = 16 * 1024;

/// The limits a node adds to the central quota on every route, keyed by
/// the user.
#[derive(Debug, Clone, Default)]
pub struct Limits {
    /// Decided on this node alone (one zone each, shared by the routes).
    pub local: Vec<LocalLimit>,
    /// Shared by every node on the same Redis.
    pub shared: Vec<LocalLimit>,
    /// The store of the shared limits.
    pub redis: Option<RedisStore>,
}

fn layer(store: &SlotStore, fallback: Fallback, limits: &Limits) -> ThrottleLayerBuilder {
    let mut layer = ThrottleLayer::builder(store, SERVICE)
        .user(UserKey::header("x-user"))
        .fallback(fallback);
    for limit in &limits.local {
        layer = layer.local_limit(limit.clone());
    }
    if let Some(redis) = &limits.redis {
        for limit in &limits.shared {
            layer = layer.shared_limit(redis.clone(), limit.clone());
        }
    }
    layer
}

/// The demo router over `store`.
///
/// # Errors
///
/// When a layer cannot be built (it always can, with these resources).
pub fn router(store: &SlotStore, fallback: Fallback) -> Result<Router, LayerError> {
    router_with(store, fallback, &Limits::default())
}

/// The demo router, every route also under `limits`.
///
/// # Errors
///
/// As [`router`].
pub fn router_with(
    store: &SlotStore,
    fallback: Fallback,
    local: &Limits,
) -> Result<Router, LayerError> {
    // One layer per route, all over the same store: each route decides once
    // and counts what it costs.
    Ok(Router::new()
        .route(
            "/",
            get(|| async { "hello\n" }).layer(layer(store, fallback, local).build()?),
        )
        .route(
            "/upload",
            post(upload).layer(layer(store, fallback, local).traffic_up().build()?),
        )
        .route(
            "/download",
            get(download).layer(layer(store, fallback, local).traffic_down().build()?),
        )
        .route(
            "/db",
            get(db).layer(layer(store, fallback, local).handler_usage().build()?),
        ))
}

/// Counts the body's bytes as they stream, keeping none of them.
async fn upload(mut body: Body) -> Response {
    let mut len: u64 = 0;
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(frame) => {
                len += frame.data_ref().map_or(0, |d| d.len() as u64);
                if len > MAX_UPLOAD {
                    let msg = format!("at most {MAX_UPLOAD} bytes\n");
                    return (StatusCode::PAYLOAD_TOO_LARGE, msg).into_response();
                }
            }
            Err(e) => return (StatusCode::BAD_REQUEST, format!("body: {e}\n")).into_response(),
        }
    }
    format!("{len}\n").into_response()
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
    reads: u64,
}

fn one() -> u64 {
    1
}

async fn db(
    usage: Usage,
    query: Result<Query<DbQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let reads = match query {
        Ok(Query(q)) => q.reads,
        Err(e) => return (StatusCode::BAD_REQUEST, format!("{}\n", e.body_text())).into_response(),
    };
    // A real handler would run its query here and count the rows it read.
    usage.add("database_read", reads);
    format!("read {reads} rows\n").into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::ServiceExt;

    async fn upload_of(chunks: usize, chunk: usize) -> (StatusCode, String) {
        let store = SlotStore::default();
        let app = router(&store, Fallback::Allow).unwrap();
        let data = Bytes::from(vec![b'x'; chunk]);
        let frames = (0..chunks).map(move |_| Ok::<_, std::convert::Infallible>(data.clone()));
        let request = axum::http::Request::post("/upload")
            .header("x-user", "alice")
            .body(Body::from_stream(futures_util::stream::iter(frames)))
            .unwrap();
        let response = app.oneshot(request).await.unwrap();
        let status = response.status();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    #[tokio::test]
    async fn uploads_are_counted_not_kept_and_capped() {
        assert_eq!(
            upload_of(3, 1000).await,
            (StatusCode::OK, "3000\n".to_owned())
        );
        // 1 GiB and one more MiB, streamed as clones of one chunk: refused
        // as soon as it passes the cap, without holding it.
        let (status, _) = upload_of(1025, 1 << 20).await;
        assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    }
}
