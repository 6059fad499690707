//! Why a reporter could not start.

use std::time::Duration;

/// Why the reporter could not start.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReporterError {
    /// No central endpoint was given.
    #[error("no central endpoint: call .central(\"http://host:7075\")")]
    NoEndpoint,
    /// An endpoint is not a valid URI.
    #[error("invalid central endpoint {0:?}")]
    InvalidEndpoint(String),
    /// A central's address has no scheme (`127.0.0.1:7075`): tonic would
    /// accept it and fail at every connect.
    #[error("central endpoint {0:?} has no scheme: write http://{0} (https:// with TLS)")]
    NoScheme(String),
    /// TLS is set but a central's address is not `https://`.
    #[error("central endpoint {0:?} must be https:// when TLS is set")]
    TlsNeedsHttps(String),
    /// A central's address is `https://` but no TLS is set
    /// ([`ReporterBuilder::tls`](super::ReporterBuilder::tls)).
    #[error("central endpoint {0:?} is https://: set the CA with .tls(..)")]
    HttpsNeedsTls(String),
    /// tonic refused the TLS settings.
    #[error("TLS settings: {0}")]
    Tls(String),
    /// The node id is empty or longer than 256 bytes.
    #[error("node id must be 1 to 256 bytes")]
    InvalidNodeId,
    /// The report delay and spread reach mid-slot, when the central node
    /// assigns the quotas: a report sent then may miss the assign.
    #[error(
        "report delay {delay:?} + spread {spread:?} must end before mid-slot ({half_slot:?}), when the central node assigns"
    )]
    ReportsPastMidSlot {
        /// [`ReporterBuilder::report_delay`](super::ReporterBuilder::report_delay).
        delay: Duration,
        /// [`ReporterBuilder::report_spread`](super::ReporterBuilder::report_spread).
        spread: Duration,
        /// Half the store's slot length.
        half_slot: Duration,
    },
}
