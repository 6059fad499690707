//! [`ServerTls`]: the central's certificate and key, and the CA its nodes'
//! client certificates must chain to, read from PEM and checked once, for
//! both servers: tonic's rustls for gRPC, tokio-rustls for HTTP (ring as
//! the provider: no OpenSSL, no cmake).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tonic::transport::{Certificate, Identity, ServerTlsConfig};

/// Why TLS could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The PEM holds no certificate, or one that cannot be read.
    #[error("no certificate in the PEM of {0}")]
    NoCertificate(&'static str),
    /// The PEM holds no private key, or one that cannot be read.
    #[error("no private key in the PEM of the key")]
    NoKey,
    /// rustls refused the certificate and key.
    #[error("certificate and key: {0}")]
    Rustls(#[from] tokio_rustls::rustls::Error),
}

/// A server's TLS material, checked.
#[derive(Clone)]
pub struct ServerTls {
    cert_pem: Vec<u8>,
    key_pem: Vec<u8>,
    client_ca_pem: Option<Vec<u8>>,
    http: Arc<ServerConfig>,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls")
            .field("client_ca", &self.client_ca_pem.is_some())
            .finish_non_exhaustive()
    }
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.display().to_string(),
        source,
    })
}

impl ServerTls {
    /// Reads the certificate chain and key (PEM files) and, for mutual TLS,
    /// the CA that node certificates must chain to.
    ///
    /// # Errors
    ///
    /// A file that cannot be read, or PEM rustls cannot use.
    pub fn read(cert: &Path, key: &Path, client_ca: Option<&Path>) -> Result<Self, TlsError> {
        let client_ca = client_ca.map(read).transpose()?;
        Self::from_pem(read(cert)?, read(key)?, client_ca)
    }

    /// As [`ServerTls::read`], from PEM in memory.
    ///
    /// # Errors
    ///
    /// PEM rustls cannot use.
    pub fn from_pem(
        cert_pem: Vec<u8>,
        key_pem: Vec<u8>,
        client_ca_pem: Option<Vec<u8>>,
    ) -> Result<Self, TlsError> {
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&cert_pem)
            .collect::<Result<_, _>>()
            .map_err(|_| TlsError::NoCertificate("the certificate"))?;
        if certs.is_empty() {
            return Err(TlsError::NoCertificate("the certificate"));
        }
        let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|_| TlsError::NoKey)?;
        if let Some(ca) = &client_ca_pem {
            let first = CertificateDer::pem_slice_iter(ca).next();
            if !matches!(first, Some(Ok(_))) {
                return Err(TlsError::NoCertificate("the client CA"));
            }
        }
        let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
        let mut http = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(certs, key)?;
        http.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Self {
            cert_pem,
            key_pem,
            client_ca_pem,
            http: Arc::new(http),
        })
    }

    /// Whether nodes must show a client certificate.
    pub fn requires_client_certificates(&self) -> bool {
        self.client_ca_pem.is_some()
    }

    /// The gRPC server's configuration: a handshake must end within
    /// `handshake`.
    pub(crate) fn grpc(&self, handshake: Duration) -> ServerTlsConfig {
        let identity = Identity::from_pem(&self.cert_pem, &self.key_pem);
        let config = ServerTlsConfig::new().identity(identity).timeout(handshake);
        match &self.client_ca_pem {
            Some(ca) => config.client_ca_root(Certificate::from_pem(ca)),
            None => config,
        }
    }

    /// The HTTP server's acceptor. The monitor API is for operators and
    /// browsers: it asks for no client certificate (its guard is the bearer
    /// token).
    pub(crate) fn http(&self) -> TlsAcceptor {
        TlsAcceptor::from(self.http.clone())
    }
}
