//! An HTTP server's accept loop, the central's and the example apps': TLS
//! when configured, a request head within
//! [`ConnectionLimits::header_read`] of its first byte (slow clients are
//! closed, not held), connections kept alive between requests for
//! [`ConnectionLimits::idle`] and then closed gracefully, HTTP/2 pings,
//! and at most [`ConnectionLimits::max_http_connections`] open at once;
//! the peer's address reaches the app as axum's `ConnectInfo`.
//! `axum::serve` has neither TLS nor a header timeout, hence this loop
//! over hyper-util's server; the two timeouts are its own
//! ([`Activity`]), since hyper's header timeout also runs between the
//! requests of a kept-alive connection.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::connect_info::ConnectInfo;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use metrics::counter;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio_rustls::TlsAcceptor;

use super::ConnectionLimits;
use super::activity::{Activity, Verdict};
use super::counted::Counted;
use super::watched_io::WatchedIo;
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
    // The head's timeout is the connection's own (see the module docs).
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(None);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(limits.keepalive)
        .keep_alive_timeout(limits.keepalive);
    let places = Arc::new(Semaphore::new(limits.max_http_connections.max(1)));
    let (stopping, stopped) = watch::channel(false);
    tokio::pin!(stop);
    loop {
        let (stream, peer, place) = tokio::select! {
            accepted = accept(&listener, &places, limits) => accepted,
            () = &mut stop => break,
        };
        let connection = Connection {
            builder: builder.clone(),
            router: router.clone().layer(axum::Extension(ConnectInfo(peer))),
            stopping: stopped.clone(),
            limits,
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
    // Open requests finish; every connection gives its place back.
    let _ = stopping.send(true);
    let all = u32::try_from(limits.max_http_connections.max(1)).unwrap_or(u32::MAX);
    let _ = places.acquire_many(all).await;
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
    /// Turns true when the server stops.
    stopping: watch::Receiver<bool>,
    limits: ConnectionLimits,
    _place: OwnedSemaphorePermit,
}

impl Connection {
    /// Serves the connection until it ends, its request head is too slow,
    /// it stays idle too long, or the server stops (the last two close it
    /// gracefully, once its requests are answered).
    async fn serve<I>(mut self, io: I)
    where
        I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let activity = Arc::new(Activity::new());
        let io = TokioIo::new(WatchedIo::new(io, activity.clone()));
        let service = TowerToHyperService::new(Counted {
            router: self.router,
            activity: activity.clone(),
        });
        // Upgrades: the legacy nodes' WebSocket.
        let conn = self.builder.serve_connection_with_upgrades(io, service);
        tokio::pin!(conn);
        let (head, idle) = (self.limits.header_read, self.limits.idle);
        let mut look = tokio::time::interval(look_every(head, idle));
        look.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut closing = false;
        loop {
            tokio::select! {
                ended = conn.as_mut() => {
                    if let Err(e) = ended {
                        tracing::debug!(error = %e, "HTTP connection ended");
                    }
                    return;
                }
                _ = look.tick() => match activity.verdict(head, idle) {
                    Verdict::Serve => {}
                    Verdict::SlowHead => {
                        tracing::debug!("request head not whole in time; connection closed");
                        return;
                    }
                    Verdict::Idle => {
                        if !std::mem::replace(&mut closing, true) {
                            conn.as_mut().graceful_shutdown();
                        }
                    }
                },
                _ = self.stopping.wait_for(|s| *s), if !closing => {
                    closing = true;
                    conn.as_mut().graceful_shutdown();
                }
            }
        }
    }
}

/// How often a connection's timeouts are looked at: a tenth of the
/// shorter, between 100 ms and 1 s.
fn look_every(head: Duration, idle: Duration) -> Duration {
    (head.min(idle) / 10).clamp(Duration::from_millis(100), Duration::from_secs(1))
}
