//! The legacy nodes' endpoint: a WebSocket handshake at `/throttle` (or
//! `/`), refused at once by a central that does not lead, checked against
//! the node keys, then served by a [`LegacySession`].

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::extract::connect_info::ConnectInfo;
use axum::extract::ws::WebSocketUpgrade;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use metrics::counter;
use throttle_clock::Clock;
use throttle_proto::auth::AuthError;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, mpsc, watch};
use tokio_rustls::TlsAcceptor;

use super::answer::MAX_FRAME_BYTES;
use super::presigned::Presigned;
use super::session::LegacySession;
use crate::ha::leadership::Leadership;
use crate::keys::NodeKeys;
use crate::ledger_task::Command;
use crate::log::{Throttled, peer};
use crate::net::{ConnectionLimits, serve_http};

/// Lines about refused handshakes, at most once a second.
static REFUSED: Throttled = Throttled::new();

/// What every legacy connection of a central shares.
#[derive(Clone)]
pub(crate) struct Endpoint {
    pub(crate) commands: mpsc::Sender<Command>,
    pub(crate) leadership: Arc<dyn Leadership>,
    /// The keys a node's URL must be signed with, if any.
    pub(crate) keys: Option<Arc<NodeKeys>>,
    pub(crate) clock: Arc<dyn Clock>,
    /// With a state store: the epoch whose checkpoint is restored.
    pub(crate) restored: Option<watch::Receiver<Option<u64>>>,
    pub(crate) max_users_per_report: usize,
    /// Places for open connections.
    pub(crate) sessions: Arc<Semaphore>,
}

impl Endpoint {
    /// Serves legacy nodes on `listener` until `stop`.
    pub(crate) fn serve(
        self,
        listener: TcpListener,
        tls: Option<TlsAcceptor>,
        limits: ConnectionLimits,
        stop: impl Future<Output = ()> + Send + 'static,
    ) -> tokio::task::JoinHandle<()> {
        let router = Router::new()
            .route("/throttle", get(upgrade))
            .route("/", get(upgrade))
            .with_state(self);
        tokio::spawn(serve_http(listener, router, tls, limits, stop))
    }

    /// The access key whose signature the URL carries, when keys are
    /// required (`None` when they are not).
    fn authenticate(&self, uri: &Uri, headers: &HeaderMap) -> Result<Option<String>, AuthError> {
        let Some(keys) = &self.keys else {
            return Ok(None);
        };
        let url = Presigned::parse(uri.query().unwrap_or_default())?;
        if !url.current(self.clock.now_ms()) {
            return Err(AuthError::Expired);
        }
        let keys = keys.current();
        let secret = keys
            .secret_of(url.access_key())
            .ok_or(AuthError::UnknownKey)?;
        let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
        url.verify(secret, uri.path(), header)?;
        Ok(Some(url.access_key().to_owned()))
    }
}

/// A legacy node's handshake: 503 from a central that does not lead (the
/// node tries its next central), 403 for a URL the keys do not sign, else
/// the WebSocket.
async fn upgrade(
    State(endpoint): State<Endpoint>,
    ConnectInfo(addr): ConnectInfo<SocketAddr>,
    uri: Uri,
    headers: HeaderMap,
    ws: WebSocketUpgrade,
) -> Response {
    if !endpoint.leadership.is_leader() {
        return (StatusCode::SERVICE_UNAVAILABLE, "not the leader\n").into_response();
    }
    let access_key = match endpoint.authenticate(&uri, &headers) {
        Ok(key) => key,
        Err(e) => {
            counter!("throttle_central_unauthenticated_total", "reason" => e.as_str()).increment(1);
            if let Some(skipped) = REFUSED.allow_now() {
                let addr = peer(Some(addr));
                tracing::warn!(reason = e.as_str(), %addr, skipped, "legacy node refused: {e}");
            }
            return (StatusCode::FORBIDDEN, format!("{e}\n")).into_response();
        }
    };
    let Ok(place) = endpoint.sessions.clone().try_acquire_owned() else {
        counter!("throttle_central_http_connections_at_cap_total").increment(1);
        return (StatusCode::SERVICE_UNAVAILABLE, "too many connections\n").into_response();
    };
    let session = LegacySession {
        commands: endpoint.commands,
        leadership: endpoint.leadership,
        signed: endpoint.keys.zip(access_key),
        restored: endpoint.restored,
        max_users_per_report: endpoint.max_users_per_report,
        addr,
    };
    ws.max_message_size(MAX_FRAME_BYTES)
        .max_frame_size(MAX_FRAME_BYTES)
        .on_upgrade(move |socket| async move {
            session.run(socket).await;
            drop(place);
        })
}
