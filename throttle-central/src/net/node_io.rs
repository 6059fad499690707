//! Node connections: each holds a place under the cap while it is open, and
//! is closed if no stream opens on it within the deadline, so connections
//! that never speak (or speak but never open a stream) do not pile up.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::Stream;
use metrics::{counter, gauge};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Sleep;
use tonic::transport::server::{Connected, TlsConnectInfo};

use super::ConnectionLimits;
use crate::log::{Throttled, peer};

static AT_CAP: Throttled = Throttled::new();
static NO_STREAM: Throttled = Throttled::new();

/// What the gRPC service learns of the connection a stream came on.
#[derive(Debug, Clone)]
pub(crate) struct NodeConnInfo {
    /// The peer's address.
    pub(crate) addr: Option<SocketAddr>,
    opened: Arc<AtomicBool>,
}

impl NodeConnInfo {
    /// The connection info of `request`'s connection, with or without TLS.
    pub(crate) fn of<T>(request: &tonic::Request<T>) -> Option<&Self> {
        let extensions = request.extensions();
        extensions.get::<Self>().or_else(|| {
            extensions
                .get::<TlsConnectInfo<Self>>()
                .map(TlsConnectInfo::get_ref)
        })
    }

    /// A stream opened: the connection is a node's, and stays.
    pub(crate) fn stream_opened(&self) {
        self.opened.store(true, Ordering::Relaxed);
    }
}

/// A node's TCP connection, as the gRPC server reads it.
#[derive(Debug)]
pub(crate) struct NodeIo {
    stream: TcpStream,
    info: NodeConnInfo,
    /// Until a stream opens: when the connection is closed.
    deadline: Option<Pin<Box<Sleep>>>,
    _place: OwnedSemaphorePermit,
}

impl NodeIo {
    fn new(
        stream: TcpStream,
        addr: SocketAddr,
        place: OwnedSemaphorePermit,
        first: Duration,
    ) -> Self {
        gauge!("throttle_central_node_connections").increment(1.0);
        Self {
            stream,
            info: NodeConnInfo {
                addr: Some(addr),
                opened: Arc::default(),
            },
            deadline: Some(Box::pin(tokio::time::sleep(first))),
            _place: place,
        }
    }

    /// `Err` once the deadline passed with no stream opened.
    fn check_deadline(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        let Some(deadline) = &mut self.deadline else {
            return Ok(());
        };
        if self.info.opened.load(Ordering::Relaxed) {
            self.deadline = None;
            return Ok(());
        }
        if deadline.as_mut().poll(cx).is_pending() {
            return Ok(());
        }
        counter!("throttle_central_connections_closed_total", "reason" => "no_stream").increment(1);
        if let Some(skipped) = NO_STREAM.allow_now() {
            let addr = peer(self.info.addr);
            tracing::warn!(
                %addr,
                skipped,
                "node connection closed: no stream opened in time"
            );
        }
        Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "no stream opened in time",
        ))
    }
}

impl Drop for NodeIo {
    fn drop(&mut self) {
        gauge!("throttle_central_node_connections").decrement(1.0);
    }
}

impl Connected for NodeIo {
    type ConnectInfo = NodeConnInfo;

    fn connect_info(&self) -> NodeConnInfo {
        self.info.clone()
    }
}

impl AsyncRead for NodeIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Err(e) = this.check_deadline(cx) {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut this.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for NodeIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

/// The node connections of `listener`: at most
/// [`ConnectionLimits::max_node_connections`] open at once (past it the
/// next waits in the listen queue), each with `TCP_NODELAY` and the
/// deadline for its first stream.
pub(crate) fn node_incoming(
    listener: TcpListener,
    limits: ConnectionLimits,
) -> impl Stream<Item = io::Result<NodeIo>> {
    let places = Arc::new(Semaphore::new(limits.max_node_connections.max(1)));
    futures_util::stream::unfold((listener, places), move |(listener, places)| async move {
        let place = match places.clone().try_acquire_owned() {
            Ok(place) => place,
            Err(_) => {
                counter!("throttle_central_node_connections_at_cap_total").increment(1);
                if let Some(skipped) = AT_CAP.allow_now() {
                    let max = limits.max_node_connections;
                    tracing::warn!(max, skipped, "node connections at the cap: new ones wait");
                }
                places.clone().acquire_owned().await.ok()?
            }
        };
        let item = match listener.accept().await {
            Ok((stream, addr)) => {
                // Answers are small writes right after a large read:
                // without TCP_NODELAY, Nagle's algorithm holds them until
                // the node's delayed ACK (40 ms across hosts).
                let _ = stream.set_nodelay(true);
                Ok(NodeIo::new(stream, addr, place, limits.first_stream))
            }
            Err(e) => {
                // Out of file descriptors, say: wait instead of spinning.
                tracing::warn!(error = %e, "accepting a node connection failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                Err(e)
            }
        };
        Some((item, (listener, places)))
    })
}
