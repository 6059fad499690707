//! What a [`Reporter`](super::Reporter) was built with, as its task reads it.

use std::time::Duration;

use throttle_proto::auth::Credentials;
use tonic::transport::ClientTlsConfig;

use crate::store::SlotStore;

/// The reporter's settings ([`ReporterBuilder`](super::ReporterBuilder)'s
/// setters say what each does).
#[derive(Debug)]
pub(super) struct Settings {
    pub(super) store: SlotStore,
    pub(super) node_id: String,
    pub(super) endpoints: Vec<String>,
    pub(super) report_delay: Duration,
    pub(super) report_spread: Duration,
    pub(super) max_buffered: usize,
    pub(super) connect_timeout: Duration,
    pub(super) backoff_min: Duration,
    pub(super) backoff_max: Duration,
    pub(super) max_message_bytes: usize,
    pub(super) credentials: Option<Credentials>,
    pub(super) tls: Option<ClientTlsConfig>,
}
