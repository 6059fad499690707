//! Log helpers: a peer's address, and the core's (names cut short,
//! lines rate-limited).

use std::net::SocketAddr;

pub(crate) use throttle_core::log::{Throttled, truncate};

/// A peer's address for a log line: the address, or "unknown".
pub(crate) fn peer(addr: Option<SocketAddr>) -> String {
    addr.map_or_else(|| "unknown".to_owned(), |a| a.to_string())
}
