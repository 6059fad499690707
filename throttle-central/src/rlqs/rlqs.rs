//! Envoy's Rate Limit Quota Service on the central's gRPC address: each
//! proxy's stream is a node of the ledger.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::RateLimitQuotaService;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use throttle_clock::{Clock, SlotLength};
use throttle_proto::MAX_NAME_LEN;
use throttle_proto::auth::AuthError;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::MetadataMap;
use tonic::{Request, Response, Status, Streaming};

use crate::keys::NodeKeys;
use crate::leadership::Leadership;
use crate::limits::LimitSource;
use crate::log::{Throttled, peer};
use crate::net::NodeConnInfo;
use crate::server::Command;

/// The metadata header that names a proxy: its node id.
pub(super) const NODE_HEADER: &str = "x-throttle-node";

/// The bucket id entry that names the user, unless a service sets
/// another (`[service.NAME] envoy_user_key`).
pub(super) const USER_KEY: &str = "user";

/// Messages queued for one proxy.
const QUEUE: usize = 16;

/// Streams opened without a node id, to tell them apart.
static ANONYMOUS: AtomicU64 = AtomicU64::new(0);

/// The RLQS gRPC service: spawns a task per proxy stream.
#[derive(Clone)]
pub(crate) struct Rlqs {
    pub(crate) commands: mpsc::Sender<Command>,
    pub(crate) leadership: Arc<dyn Leadership>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) slot: SlotLength,
    /// With a state store: the epoch whose checkpoint is restored.
    pub(crate) restored: Option<watch::Receiver<Option<u64>>>,
    /// The largest count one bucket may report.
    pub(crate) max_amount: i64,
    /// The limits, which may name a service's user entry
    /// (`envoy_user_key`).
    pub(crate) limits: Arc<dyn LimitSource>,
    /// With node keys, a proxy shows its token.
    pub(crate) keys: Option<Arc<NodeKeys>>,
    /// Seconds an assignment lives ([`super::DEFAULT_TTL`] unless set).
    pub(crate) ttl_s: i64,
}

/// Lines about refused proxies, at most once a second.
static REFUSED: Throttled = Throttled::new();

impl Rlqs {
    /// The proxy's node id, proven by its bearer token when the central
    /// has node keys.
    fn authenticated(
        &self,
        metadata: &MetadataMap,
        addr: Option<SocketAddr>,
    ) -> Result<String, Status> {
        let Some(keys) = &self.keys else {
            return Self::node_id(metadata, addr);
        };
        let token = metadata
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        match (metadata.get(NODE_HEADER), token) {
            (Some(_), Some(token)) => Self::node_id(metadata, addr).and_then(|id| {
                match keys.current().authenticate_proxy(&id, token) {
                    Ok(()) => Ok(id),
                    Err(e) => Err(refused(e, addr)),
                }
            }),
            _ => Err(refused(AuthError::Malformed, addr)),
        }
    }

    /// The proxy's node id: its [`NODE_HEADER`], else a name of its own
    /// for this stream (a restarted proxy is then a new node).
    fn node_id(
        metadata: &tonic::metadata::MetadataMap,
        addr: Option<SocketAddr>,
    ) -> Result<String, Status> {
        let Some(value) = metadata.get(NODE_HEADER) else {
            let n = ANONYMOUS.fetch_add(1, Ordering::Relaxed);
            if n == 0 {
                tracing::info!(addr = %peer(addr), "an RLQS stream without {NODE_HEADER}: each such stream is a node of its own");
            }
            return Ok(format!("envoy@{}#{n}", peer(addr)));
        };
        match value.to_str() {
            Ok(id) if !id.is_empty() && id.len() <= MAX_NAME_LEN => Ok(id.to_owned()),
            _ => Err(Status::invalid_argument(format!(
                "{NODE_HEADER} must be 1 to {MAX_NAME_LEN} visible ASCII characters"
            ))),
        }
    }
}

#[tonic::async_trait]
impl RateLimitQuotaService for Rlqs {
    type StreamRateLimitQuotasStream = ReceiverStream<Result<RateLimitQuotaResponse, Status>>;

    async fn stream_rate_limit_quotas(
        &self,
        request: Request<Streaming<RateLimitQuotaUsageReports>>,
    ) -> Result<Response<Self::StreamRateLimitQuotasStream>, Status> {
        if !self.leadership.is_leader() {
            return Err(Status::unavailable("not the leader"));
        }
        let conn = NodeConnInfo::of(&request);
        conn.inspect(|c| c.stream_opened());
        let addr = conn.and_then(|c| c.addr).or_else(|| request.remote_addr());
        let node_id = self.authenticated(request.metadata(), addr)?;
        let (out, rx) = mpsc::channel(QUEUE);
        let inbound = request.into_inner();
        tokio::spawn(self.clone().serve(node_id, addr, inbound, out));
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

/// A proxy refused: `UNAUTHENTICATED`, counted and logged.
fn refused(e: AuthError, addr: Option<SocketAddr>) -> Status {
    metrics::counter!("throttle_central_unauthenticated_total", "reason" => e.as_str())
        .increment(1);
    if let Some(skipped) = REFUSED.allow_now() {
        let addr = peer(addr);
        tracing::warn!(reason = e.as_str(), %addr, skipped, "RLQS stream refused: {e}");
    }
    Status::unauthenticated(format!(
        "{e}: show {NODE_HEADER} and authorization: Bearer <token>"
    ))
}
