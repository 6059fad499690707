//! The Tower middleware: [`ThrottleLayer`] and [`Throttle`].
//!
//! For each request the layer finds the user ([`UserKey`](crate::UserKey)),
//! asks the [`ServiceStore`](crate::store::ServiceStore) whether the user's
//! quota for this slot allows it, and either
//!
//! - refuses it with `429 Too Many Requests` (configurable), `Retry-After`
//!   and `RateLimit-Policy`/`RateLimit`/`X-RateLimit-*` headers, or for a gRPC
//!   request a trailers-only `RESOURCE_EXHAUSTED` with
//!   `grpc-retry-pushback-ms`; or
//! - passes it on and counts what it costs: 1 `requests`, fixed extra costs,
//!   request and response body bytes as they stream, and amounts the handler
//!   adds through [`Usage`](crate::Usage).
//!
//! A refusal is a response, never an error: the error type is the inner
//! service's, so axum's `Infallible` stays `Infallible`.
//!
//! # Examples
//!
//! ```
//! use axum::{Router, routing::{get, post}};
//! use throttle_layer::{SlotStore, ThrottleLayer, UserKey};
//!
//! let store = SlotStore::default();
//! let base = ThrottleLayer::builder(&store, "front").user(UserKey::header("x-user"));
//! let reads = base.cost("database_read", 3).build().unwrap();
//! let uploads = ThrottleLayer::builder(&store, "front")
//!     .user(UserKey::header("x-user"))
//!     .traffic_up()
//!     .build()
//!     .unwrap();
//! let app: Router = Router::new()
//!     .route("/search", get(|| async { "found" }).layer(reads))
//!     .route("/upload", post(|body: String| async move { body.len().to_string() }).layer(uploads));
//! ```
//!
//! # Bodies pass through unless bytes are counted
//!
//! A layer that does not count body bytes is [`Plain`]: the inner service
//! gets the request exactly as it came and the response goes out exactly as
//! the service made it, so an allowed request costs the decision and
//! nothing else. A refusal is built in the service's own response body type
//! (a [`RefusalBody`]: axum's and tonic's bodies, `Full<Bytes>`, `String`).
//!
//! ```
//! use tower::{ServiceBuilder, ServiceExt};
//! use throttle_layer::{SlotStore, ThrottleLayer, UserKey};
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let store = SlotStore::default();
//! let layer = ThrottleLayer::builder(&store, "front").user(UserKey::header("x-user")).build().unwrap();
//! let svc = ServiceBuilder::new().layer(layer).service_fn(|_req: http::Request<String>| async {
//!     Ok::<_, std::convert::Infallible>(http::Response::new(String::from("hello")))
//! });
//! let res = svc.oneshot(http::Request::builder().header("x-user", "alice").body(String::new()).unwrap()).await.unwrap();
//! assert_eq!(res.status(), 200);
//! # }
//! ```
//!
//! [`traffic_up`](ThrottleLayerBuilder::traffic_up) or
//! [`traffic_down`](ThrottleLayerBuilder::traffic_down) make the layer
//! [`Metered`]: the inner service receives the request body wrapped in
//! [`RequestBody`] and the response body becomes a [`ResponseBody`], both
//! counting bytes frame by frame. axum routes and tonic servers accept any
//! body, so there this is invisible.
//!
//! ```
//! use tower::{ServiceBuilder, ServiceExt};
//! use throttle_layer::{SlotStore, ThrottleLayer, UserKey, layer::RequestBody};
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let store = SlotStore::default();
//! let layer = ThrottleLayer::builder(&store, "front")
//!     .user(UserKey::header("x-user"))
//!     .traffic_down()
//!     .build()
//!     .unwrap();
//! let svc = ServiceBuilder::new().layer(layer).service_fn(|_req: http::Request<RequestBody<String>>| async {
//!     Ok::<_, std::convert::Infallible>(http::Response::new(String::from("hello")))
//! });
//! let res = svc.oneshot(http::Request::builder().header("x-user", "alice").body(String::new()).unwrap()).await.unwrap();
//! assert_eq!(res.status(), 200);
//! # }
//! ```
//!
//! # Names, beside tower_governor and tower-http
//!
//! - [`ThrottleLayer::builder`] then [`build`](ThrottleLayerBuilder::build),
//!   as tower_governor's `GovernorConfigBuilder` ... `finish`; `build`
//!   returns a `Result` ([`LayerError`]) where `finish` returns an
//!   `Option`, so a bad resource name says what is wrong.
//! - [`user`](ThrottleLayerBuilder::user) with a [`UserKey`](crate::UserKey)
//!   is tower_governor's `key_extractor` with a `KeyExtractor`: the key is a
//!   user here, and the same user counts across resources and nodes, so
//!   the word stays `user`. `UserKey::peer_ip` and `UserKey::forwarded_for`
//!   are its `PeerIpKeyExtractor` and `SmartIpKeyExtractor`, the latter
//!   trusting only the proxies named.
//! - [`headers_on_success`](ThrottleLayerBuilder::headers_on_success) is
//!   `use_headers`, kept as a `bool` setter: refusals carry the headers
//!   by default ([`rate_limit_headers`](ThrottleLayerBuilder::rate_limit_headers)),
//!   and this adds them to allowed responses only.
//! - [`on_refusal`](ThrottleLayerBuilder::on_refusal) is tower_governor's
//!   `error_handler`, named as tower-http's `TraceLayer` callbacks
//!   (`on_request`, `on_failure`) and on the builder rather than the
//!   service; it receives the layer's own response to adjust, not an
//!   error to turn into one.
//! - [`cost`](ThrottleLayerBuilder::cost) and
//!   [`cost_fn`](ThrottleLayerBuilder::cost_fn) have no counterpart there
//!   (governor's `check_n` is a direct call): they name the resource,
//!   since a request costs several.
//! - The extractor is [`Usage`](crate::Usage): it adds amounts as well as
//!   telling the decision and what is left, which tower_governor keeps in
//!   headers only.

mod body;
mod built;
mod config;
mod cost;
pub mod future;
mod gate;
mod headers;
#[allow(clippy::module_inception)]
mod layer;
mod local;
mod on_refusal;
mod refusal;
mod refusal_body;
mod refusal_cache;
mod shared;
mod success;
mod throttle;

pub use body::{RefusalBody, RequestBody, ResponseBody};
pub use config::{Metered, Plain};
pub use layer::{LayerError, ThrottleLayer, ThrottleLayerBuilder};
pub use on_refusal::{Refused, RefusedBy};
pub use throttle::Throttle;
