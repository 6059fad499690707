//! An HTTP server's accept loop, the central's and the example apps': TLS
//! when configured, a request head within
//! [`ConnectionLimits::header_read`] (slow clients are closed, not held),
//! HTTP/2 pings, and at most [`ConnectionLimits::max_http_connections`]
//! open at once; the peer's address reaches the app as axum's
//! `ConnectInfo`. `axum::serve` has neither TLS nor a header timeout, hence
//! this loop over hyper-util's server, which has both.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::connect_info::ConnectInfo;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use hyper_util::service::TowerToHyperService;
use metrics::counter;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_rustls::TlsAcceptor;

use super::ConnectionLimits;
use crate::log::Throttled;

static AT_CAP: Throttled = Throttled::new();

/// Serves `router` on `listener` until `stop` completes, then lets open
/// requests finish.
pub async fn serve_http(
    listener: TcpListener,
    router: Router,
    tls: Option<TlsAcceptor>,
    limits: ConnectionLimits,
    stop: impl Future<Output = ()>,
) {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(limits.keepalive)
        .keep_alive_timeout(limits.keepalive);
    let places = Arc::new(Semaphore::new(limits.max_http_connections.max(1)));
    let graceful = GracefulShutdown::new();
    tokio::pin!(stop);
    loop {
        let (stream, peer, place) = tokio::select! {
            accepted = accept(&listener, &places, limits) => accepted,
            () = &mut stop => break,
        };
        let connection = Connection {
            builder: builder.clone(),
            router: router.clone().layer(axum::Extension(ConnectInfo(peer))),
            watcher: graceful.watcher(),
            _place: place,
        };
        let tls = tls.clone();
        let handshake = limits.header_read;
        tokio::spawn(async move {
            match tls {
                None => connection.serve(stream).await,
                Some(tls) => match tokio::time::timeout(handshake, tls.accept(stream)).await {
                    Ok(Ok(stream)) => connection.serve(stream).await,
                    Ok(Err(e)) => tracing::debug!(error = %e, "TLS handshake failed"),
                    Err(_) => tracing::debug!("TLS handshake timed out"),
                },
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
}

/// The next connection, once there is room for it.
async fn accept(
    listener: &TcpListener,
    places: &Arc<Semaphore>,
    limits: ConnectionLimits,
) -> (TcpStream, SocketAddr, OwnedSemaphorePermit) {
    loop {
        let place = match places.clone().try_acquire_owned() {
            Ok(place) => place,
            Err(_) => {
                counter!("throttle_central_http_connections_at_cap_total").increment(1);
                if let Some(skipped) = AT_CAP.allow_now() {
                    let max = limits.max_http_connections;
                    tracing::warn!(max, skipped, "HTTP connections at the cap: new ones wait");
                }
                match places.clone().acquire_owned().await {
                    Ok(place) => place,
                    // Never closed: the semaphore lives as long as the loop.
                    Err(_) => continue,
                }
            }
        };
        match listener.accept().await {
            Ok((stream, peer)) => return (stream, peer, place),
            Err(e) => {
                tracing::warn!(error = %e, "accepting an HTTP connection failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// One accepted connection and what serving it takes.
struct Connection {
    builder: auto::Builder<TokioExecutor>,
    router: Router,
    watcher: Watcher,
    _place: OwnedSemaphorePermit,
}

impl Connection {
    async fn serve<I>(self, io: I)
    where
        I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let service = TowerToHyperService::new(self.router);
        let conn = self.builder.serve_connection(TokioIo::new(io), service);
        if let Err(e) = self.watcher.watch(conn).await {
            tracing::debug!(error = %e, "HTTP connection ended");
        }
    }
}
