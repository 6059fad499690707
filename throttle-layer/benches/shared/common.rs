//! What the layer's benchmarks share: the request they send, the key
//! tower_governor reads from it, governor's keyed limiter, and the
//! two-thread runner.

use std::time::{Duration, Instant};

use axum::body::Body;

/// A request of `user`, named in the `x-user` header.
pub(crate) fn request(user: &str) -> http::Request<Body> {
    http::Request::builder()
        .header("x-user", user)
        .body(Body::empty())
        .expect("valid request")
}

/// tower_governor's key: the same `x-user` header.
#[derive(Clone, Copy, Debug)]
pub(crate) struct HeaderKey;

impl tower_governor::key_extractor::KeyExtractor for HeaderKey {
    type Key = String;

    fn extract<T>(&self, req: &http::Request<T>) -> Result<String, tower_governor::GovernorError> {
        req.headers()
            .get("x-user")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
            .ok_or(tower_governor::GovernorError::UnableToExtractKey)
    }
}

/// governor's keyed limiter on `String` keys.
pub(crate) type Governor = governor::RateLimiter<
    String,
    governor::state::keyed::DefaultKeyedStateStore<String>,
    governor::clock::DefaultClock,
>;

/// Runs `f(thread, i)` `iters` times on each of two threads; returns the
/// wall time, which is per decision per thread.
pub(crate) fn two_threads<F>(iters: u64, f: F) -> Duration
where
    F: Fn(usize, u64) + Sync,
{
    let start = Instant::now();
    std::thread::scope(|s| {
        for t in 0..2 {
            let f = &f;
            s.spawn(move || {
                for i in 0..iters {
                    f(t, i);
                }
            });
        }
    });
    start.elapsed()
}
