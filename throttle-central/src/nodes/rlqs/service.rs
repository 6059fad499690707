//! Envoy's Rate Limit Quota Service on the central's gRPC address: each
//! proxy's stream is a node of the ledger.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::RateLimitQuotaService;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use throttle_proto::MAX_NAME_LEN;
use throttle_proto::auth::AuthError;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::MetadataMap;
use tonic::{Request, Response, Status, Streaming};

use super::certified;
use super::session::RlqsSession;
use super::settings::StreamSettings;
use crate::keys::NodeKeys;
use crate::log::{Throttled, peer};
use crate::net::NodeConnInfo;

/// The metadata header that names a proxy: its node id.
pub(super) const NODE_HEADER: &str = "x-throttle-node";

/// Messages queued for one proxy.
const QUEUE: usize = 16;

/// Streams opened without a node id, to tell them apart.
static ANONYMOUS: AtomicU64 = AtomicU64::new(0);

/// The RLQS gRPC service: spawns a [`RlqsSession`] per proxy stream.
#[derive(Clone)]
pub(crate) struct Rlqs {
    /// What every stream reads.
    pub(crate) settings: StreamSettings,
    /// With node keys, a proxy shows its token.
    pub(crate) keys: Option<Arc<NodeKeys>>,
}

/// Lines about refused proxies, at most once a second.
static REFUSED: Throttled = Throttled::new();

impl Rlqs {
    /// The proxy's node id: its [`NODE_HEADER`], proven by its bearer
    /// token when the central has node keys; without the header, the
    /// identity of the client certificate it showed (`certified`), which
    /// the TLS handshake proved.
    fn authenticated(
        &self,
        metadata: &MetadataMap,
        addr: Option<SocketAddr>,
        certified: Option<String>,
    ) -> Result<String, Status> {
        if metadata.get(NODE_HEADER).is_none()
            && let Some(id) = certified
        {
            return Ok(id);
        }
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
        if !self.settings.leadership.is_leader() {
            return Err(Status::unavailable("not the leader"));
        }
        let conn = NodeConnInfo::of(&request);
        conn.inspect(|c| c.stream_opened());
        let addr = conn.and_then(|c| c.addr).or_else(|| request.remote_addr());
        let certified = certified::identity(&request);
        let node_id = self.authenticated(request.metadata(), addr, certified)?;
        let (out, rx) = mpsc::channel(QUEUE);
        let inbound = request.into_inner();
        let session = RlqsSession::new(self.settings.clone(), node_id, addr, out);
        tokio::spawn(session.run(inbound));
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
