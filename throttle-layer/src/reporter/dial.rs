//! How every connection to a central is set up: its address checked
//! against the TLS settings, the connect timeout, `TCP_NODELAY`, and HTTP/2
//! keep-alive pings so a central that vanishes without a word is noticed.

use std::time::Duration;

use tonic::transport::{ClientTlsConfig, Endpoint};

use super::error::ReporterError;

/// How often an idle connection is pinged, and how long an answer may
/// take before the connection is dropped.
const KEEP_ALIVE: Duration = Duration::from_secs(10);

/// The endpoint of `url`, with TLS when `tls` is given.
///
/// # Errors
///
/// An address without `http://` or `https://`, that is not a URI, or whose scheme does not match the TLS
/// settings: with TLS every central must be `https://` (tonic would speak
/// plaintext to an `http://` one), without it none may be.
pub(super) fn endpoint(
    url: &str,
    timeout: Duration,
    tls: Option<&ClientTlsConfig>,
) -> Result<Endpoint, ReporterError> {
    if !(url.starts_with("http://") || url.starts_with("https://")) {
        return Err(ReporterError::NoScheme(url.to_owned()));
    }
    let endpoint = Endpoint::from_shared(url.to_owned())
        .map_err(|_| ReporterError::InvalidEndpoint(url.to_owned()))?
        .connect_timeout(timeout)
        .tcp_nodelay(true)
        .http2_keep_alive_interval(KEEP_ALIVE)
        .keep_alive_timeout(KEEP_ALIVE);
    let https = endpoint.uri().scheme_str() == Some("https");
    match tls {
        Some(tls) if https => endpoint
            .tls_config(tls.clone())
            .map_err(|e| ReporterError::Tls(e.to_string())),
        Some(_) => Err(ReporterError::TlsNeedsHttps(url.to_owned())),
        None if https => Err(ReporterError::HttpsNeedsTls(url.to_owned())),
        None => Ok(endpoint),
    }
}
