//! Envoy proxies as nodes: the central serves Envoy's Rate Limit Quota
//! Service (`envoy.service.rate_limit_quota.v3`) on its gRPC address.
//!
//! A proxy opens one stream (`StreamRateLimitQuotas`) at its first
//! request, reports each bucket's admitted and denied requests every 5 s,
//! and enforces the assignments it is sent. Here the report's `domain` is
//! the service, a bucket id's `user` entry the user, and the resource
//! `requests`; the stream is a node of the ledger, named by its
//! `x-throttle-node` metadata:
//!
//! - `service`: the gRPC service, which names the proxy and spawns its
//!   session;
//! - `settings`: what every stream reads;
//! - `session`: one stream's IO, running its `stream`: each
//!   report filed at once over the slots it covers (`backfill`),
//!   assignments sent as the shares change (`buckets`, `shares`,
//!   `bucket_rule`).
//!
//! `docs/guides/envoy.md` gives the Envoy configuration.

mod backfill;
mod bucket_rule;
mod buckets;
mod certified;
mod service;
mod session;
mod settings;
mod shares;
mod stream;

use std::time::Duration;

pub(crate) use service::Rlqs;
pub(crate) use settings::StreamSettings;
pub use stream::{FirstShareTold, REPORT_EVERY_S, Refused, RlqsStream, Taken, Told};

/// How long a proxy keeps an assignment by default: three of Envoy's 5 s
/// reports.
pub const DEFAULT_TTL: Duration = Duration::from_secs(15);
/// The shortest assignment TTL: above Envoy's 5 s report interval, or an
/// assignment refreshed at each report expires in between.
pub const MIN_TTL: Duration = Duration::from_secs(6);
/// The longest assignment TTL.
pub const MAX_TTL: Duration = Duration::from_secs(3600);
