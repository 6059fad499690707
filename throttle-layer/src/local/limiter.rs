//! [`Limiter`]: a [`LocalLimit`]'s decision on its own, for code that
//! wants nginx's arithmetic without the layer (and for benchmarks).

use std::sync::Arc;

use super::excess::Verdict;
use super::limit::LocalLimit;
use super::zone::Zone;

/// Decides requests by key under one [`LocalLimit`], as the layer does:
/// `check` is governor's `check_key` with nginx's answer (pass, hold so
/// many ms, or refuse). Shares its zone with the layers built with clones
/// of the same limit.
#[derive(Debug, Clone)]
pub struct Limiter {
    zone: Arc<Zone>,
}

impl Limiter {
    /// The limiter of `limit`.
    pub fn new(limit: &LocalLimit) -> Self {
        Self { zone: limit.zone() }
    }

    /// Accounts one request of `key` now.
    #[inline]
    pub fn check(&self, key: &str) -> Verdict {
        self.zone.account(key)
    }
}
