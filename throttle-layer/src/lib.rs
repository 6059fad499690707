//! Distributed, per-user, multi-resource throttling for Tower services.
//!
//! Every process keeps per-slot counters of what each user consumed
//! (requests, bytes up and down, database reads, anything the app counts)
//! and checks them against the quota that the central node
//! (`throttle-central`) sent it for the slot. Once per slot the
//! [`Reporter`] sends the counters to the central node over one gRPC stream
//! and installs the quotas it gets back. The request path never waits on the
//! network and takes no global lock.
//!
//! - [`ThrottleLayer`]: the Tower layer, for axum (`Router::layer`,
//!   `route_layer`, `MethodRouter::layer`) and tonic (`Server::builder().layer`).
//! - [`SlotStore`]: the counters and quotas, synchronous and clock-injected.
//! - [`Reporter`]: the task that talks to the central node.
//! - [`local`]: nginx-style limits decided on this node alone.
//! - [`bucket`]: token buckets in memory or Redis (feature `redis`), the
//!   store of the layer's shared limits.
//! - [`telemetry`]: the metrics a node exports, and their help text.
//!
//! # Features
//!
//! - `axum` (default): the peer address from axum's `ConnectInfo`, and
//!   [`Usage`] as an axum extractor;
//! - `tonic` (default): the peer address from tonic's `TcpConnectInfo`,
//!   refusals in tonic's body type;
//! - `redis`: `bucket::RedisStore`, for shared limits across nodes;
//! - `sim`: the setters and counts the simulator and the integration tests
//!   drive a store by; not an API to build on.
//!
//! # Examples
//!
//! ```no_run
//! use axum::{Router, routing::get};
//! use throttle_layer::{Reporter, SlotStore, ThrottleLayer, UserKey};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let store = SlotStore::default();
//! let _reporter = Reporter::builder(&store, "node-1")
//!     .central("http://127.0.0.1:7075")
//!     .spawn()?;
//! let layer = ThrottleLayer::builder(&store, "front")
//!     .user(UserKey::header("x-user"))
//!     .traffic_down()
//!     .build()?;
//! let app: Router = Router::new().route("/", get(|| async { "hello" })).layer(layer);
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//! axum::serve(listener, app).await?;
//! # Ok(()) }
//! ```

#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod bucket;
mod every_second;
pub mod layer;
pub mod local;
pub mod reporter;
pub mod store;
pub mod telemetry;
mod tokio_clock;
pub mod usage;
pub mod user;

pub use layer::{Throttle, ThrottleLayer, ThrottleLayerBuilder};
pub use reporter::Reporter;
pub use store::{Fallback, SlotStore};
pub use tokio_clock::TokioClock;
pub use usage::{Exhausted, Usage};
pub use user::{MissingUser, RequestHead, UserKey};

/// The README's code, compiled with the crate's doctests.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
struct ReadmeDoctests;
