//! [`Activity`]: what one HTTP connection is doing, for the idle and
//! request-head timeouts that the accept loop enforces itself.
//!
//! hyper's own `header_read_timeout` starts when it waits for the next
//! request head, right after a response: it closes a kept-alive HTTP/1.1
//! connection that waits longer than the timeout between two requests.
//! Here the head's clock starts at its first byte instead, and a
//! connection with no request under way is closed, gracefully, after its
//! own idle timeout.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::time::Instant;

/// No request head under way.
const NONE: u64 = u64::MAX;

/// What [`Activity::verdict`] says of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Verdict {
    /// Keep serving it.
    Serve,
    /// A request head did not arrive whole in time: close it now.
    SlowHead,
    /// No request for the idle timeout: close it gracefully.
    Idle,
}

/// One connection's activity, shared by its IO, its service and its
/// watch; all in milliseconds since the connection opened.
#[derive(Debug)]
pub(super) struct Activity {
    opened: Instant,
    /// When the last request ended (or the connection opened).
    last_ms: AtomicU64,
    /// When the first byte of a request head under way came; [`NONE`].
    head_ms: AtomicU64,
    /// Requests whose response (body included) is not done.
    in_flight: AtomicUsize,
    /// An HTTP/2 connection: its bytes between requests are frames
    /// (pings, settings), not request heads.
    h2: AtomicBool,
}

impl Activity {
    pub(super) fn new() -> Self {
        Self {
            opened: Instant::now(),
            last_ms: AtomicU64::new(0),
            // The first request's head is under way from the start.
            head_ms: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
            h2: AtomicBool::new(false),
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.opened.elapsed().as_millis()).unwrap_or(u64::MAX - 1)
    }

    /// Bytes came in: the first of a request head, if no request is under
    /// way on an HTTP/1.1 connection.
    pub(super) fn read(&self) {
        let idle = self.in_flight.load(Ordering::Relaxed) == 0;
        if idle && !self.h2.load(Ordering::Relaxed) {
            let now = self.now_ms();
            let _ =
                (self.head_ms).compare_exchange(NONE, now, Ordering::Relaxed, Ordering::Relaxed);
        }
    }

    /// A request's head was read whole and it is served now.
    pub(super) fn request(&self, http2: bool) {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        self.head_ms.store(NONE, Ordering::Relaxed);
        if http2 {
            self.h2.store(true, Ordering::Relaxed);
        }
    }

    /// A request's response was sent whole (or abandoned).
    pub(super) fn done(&self) {
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
        self.last_ms.store(self.now_ms(), Ordering::Relaxed);
    }

    /// What to do with the connection given the timeouts.
    pub(super) fn verdict(&self, head: Duration, idle: Duration) -> Verdict {
        let now = self.now_ms();
        let head_ms = self.head_ms.load(Ordering::Relaxed);
        let waited = |since: u64| Duration::from_millis(now.saturating_sub(since));
        if head_ms != NONE && waited(head_ms) >= head {
            return Verdict::SlowHead;
        }
        let quiet = self.in_flight.load(Ordering::Relaxed) == 0 && head_ms == NONE;
        if quiet && waited(self.last_ms.load(Ordering::Relaxed)) >= idle {
            return Verdict::Idle;
        }
        Verdict::Serve
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEAD: Duration = Duration::from_secs(10);
    const IDLE: Duration = Duration::from_secs(60);

    #[tokio::test(start_paused = true)]
    async fn a_kept_alive_connection_waits_its_idle_time_and_a_head_its_own() {
        let a = Activity::new();
        a.read();
        a.request(false);
        tokio::time::advance(Duration::from_secs(30)).await;
        assert_eq!(a.verdict(HEAD, IDLE), Verdict::Serve, "a slow response");
        a.done();
        tokio::time::advance(Duration::from_secs(30)).await;
        assert_eq!(
            a.verdict(HEAD, IDLE),
            Verdict::Serve,
            "30 s between requests"
        );
        a.read();
        tokio::time::advance(Duration::from_secs(9)).await;
        assert_eq!(a.verdict(HEAD, IDLE), Verdict::Serve);
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(
            a.verdict(HEAD, IDLE),
            Verdict::SlowHead,
            "10 s from its first byte"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_connection_is_let_go_and_http2_frames_are_no_heads() {
        let a = Activity::new();
        a.request(true);
        a.done();
        a.read();
        tokio::time::advance(IDLE).await;
        assert_eq!(a.verdict(HEAD, IDLE), Verdict::Idle, "a ping is no request");
        let silent = Activity::new();
        tokio::time::advance(HEAD).await;
        assert_eq!(
            silent.verdict(HEAD, IDLE),
            Verdict::SlowHead,
            "no first request"
        );
    }
}
