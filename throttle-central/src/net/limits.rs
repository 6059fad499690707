//! [`ConnectionLimits`]: what bounds the connections a central holds.

use std::time::Duration;

/// Bounds on the connections of a central node's servers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Most node (gRPC) connections open at once; past it new ones wait in
    /// the listen queue until one closes. Default 4,096.
    pub max_node_connections: usize,
    /// Most HTTP connections open at once. Default 256.
    pub max_http_connections: usize,
    /// How long a node connection may stay open without opening a stream
    /// (and a TLS handshake may take). Default 10 s.
    pub first_stream: Duration,
    /// How often an idle HTTP/2 connection is pinged; one whose peer does
    /// not answer within the same time again is closed. Default 10 s.
    pub keepalive: Duration,
    /// How long an HTTP client may take to send a request's head, from
    /// its first byte. Default 10 s.
    pub header_read: Duration,
    /// How long an HTTP connection with no request under way is kept
    /// open before it is closed gracefully. Default 60 s.
    pub idle: Duration,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self {
            max_node_connections: 4096,
            max_http_connections: 256,
            first_stream: Duration::from_secs(10),
            keepalive: Duration::from_secs(10),
            header_read: Duration::from_secs(10),
            idle: Duration::from_secs(60),
        }
    }
}
