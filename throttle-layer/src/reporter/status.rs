//! What a reporter is doing.

/// What the reporter is doing, for health checks and tests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReporterStatus {
    /// A stream to a central node is open.
    pub connected: bool,
    /// The endpoint in use or being tried.
    pub endpoint: String,
    /// Reports not yet answered by a central node.
    pub buffered: usize,
    /// Reports sent (including re-sent ones).
    pub reports_sent: u64,
    /// Quota messages received.
    pub quotas_received: u64,
    /// Times a stream was opened.
    pub connections: u64,
}
