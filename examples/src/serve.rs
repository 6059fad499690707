//! Serving an example app as a hardened server would, with the central's
//! own accept loop ([`serve_http`]): a request's head must arrive within
//! [`HEADER_READ_TIMEOUT`] of its first byte, so connections that never
//! finish a request (slowloris) are closed instead of held; a kept-alive
//! connection waits for its next request for its idle timeout
//! ([`IDLE_TIMEOUT`] by default) and is then closed gracefully; HTTP/2
//! connections are pinged;
//! the peer's address reaches the app as axum's `ConnectInfo`, for
//! `UserKey::peer_ip`.

use std::future::Future;
use std::time::Duration;

use axum::Router;
use throttle_central::net::{ConnectionLimits, serve_http};
use tokio::net::TcpListener;

/// How long a client may take to send a request's head.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a connection with no request under way stays open, by
/// default: what nginx and most load balancers keep.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// How often an idle HTTP/2 connection is pinged.
const KEEP_ALIVE: Duration = Duration::from_secs(20);

/// Connections an app serves at once (the central's HTTP API, for
/// operators, holds far fewer).
const MAX_CONNECTIONS: usize = 10_000;

/// Serves `app` on `listener` until `shutdown` completes, closing
/// connections idle for `idle`.
///
/// # Errors
///
/// None today: a failed accept is logged and the loop goes on; the
/// `Result` leaves room for setup that can fail.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    idle: Duration,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let limits = ConnectionLimits {
        max_http_connections: MAX_CONNECTIONS,
        keepalive: KEEP_ALIVE,
        header_read: HEADER_READ_TIMEOUT,
        idle,
        ..ConnectionLimits::default()
    };
    serve_http(listener, app, None, limits, shutdown).await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test(start_paused = true)]
    async fn a_request_head_that_never_ends_is_closed() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = Router::new().route("/", axum::routing::get(|| async { "hello" }));
        tokio::spawn(serve(listener, app, IDLE_TIMEOUT, std::future::pending()));
        let mut slow = tokio::net::TcpStream::connect(addr).await.unwrap();
        slow.write_all(b"GET / HTTP/1.1\r\nhost: t\r\n")
            .await
            .unwrap();
        let mut out = Vec::new();
        // Paused time jumps to the timeout once everything is idle.
        let read = tokio::time::timeout(HEADER_READ_TIMEOUT * 2, slow.read_to_end(&mut out)).await;
        assert!(read.is_ok(), "closed within the timeout");
        let mut fine = tokio::net::TcpStream::connect(addr).await.unwrap();
        fine.write_all(b"GET / HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut answer = String::new();
        fine.read_to_string(&mut answer).await.unwrap();
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(answer.ends_with("hello"), "{answer}");
    }

    /// Reads one response to a `GET /` of the test app: up to its body.
    async fn response(conn: &mut tokio::net::TcpStream) -> String {
        let mut got = Vec::new();
        let mut buf = [0u8; 1024];
        while !got.ends_with(b"hello") {
            let n = conn.read(&mut buf).await.unwrap();
            assert!(n > 0, "closed before the answer: {got:?}");
            got.extend_from_slice(&buf[..n]);
        }
        String::from_utf8(got).unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn a_kept_alive_connection_serves_after_a_pause_and_closes_when_idle() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = Router::new().route("/", axum::routing::get(|| async { "hello" }));
        tokio::spawn(serve(listener, app, IDLE_TIMEOUT, std::future::pending()));
        let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
        for pause in [Duration::ZERO, HEADER_READ_TIMEOUT * 3, IDLE_TIMEOUT / 2] {
            tokio::time::sleep(pause).await;
            conn.write_all(b"GET / HTTP/1.1\r\nhost: t\r\n\r\n")
                .await
                .unwrap();
            let answer = response(&mut conn).await;
            assert!(
                answer.starts_with("HTTP/1.1 200"),
                "after {pause:?}: {answer}"
            );
        }
        let started = tokio::time::Instant::now();
        let mut rest = Vec::new();
        conn.read_to_end(&mut rest).await.unwrap();
        let waited = started.elapsed();
        assert!(rest.is_empty(), "{rest:?}");
        assert!(
            waited >= IDLE_TIMEOUT && waited <= IDLE_TIMEOUT + Duration::from_secs(2),
            "closed after {waited:?} idle"
        );
    }
}
