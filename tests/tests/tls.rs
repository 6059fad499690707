//! TLS and mutual TLS between real reporters and a real central on
//! 127.0.0.1, with certificates made at run time; and the bounds on node
//! connections: one that opens no stream is closed, and past the cap new
//! ones wait.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use throttle_central::net::{ConnectionLimits, ServerTls};
use throttle_central::{Central, RunningCentral};
use throttle_clock::SlotLength;
use throttle_layer::reporter::{ReporterBuilder, ReporterError, ReporterHandle};
use throttle_layer::{Reporter, SlotStore};
use throttle_test_servers::Pki;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tonic::transport::{Certificate, ClientTlsConfig, Identity};

const SLOT_MS: u32 = 100;

/// What the central and the nodes set from a [`Pki`].
trait Sides {
    fn server_tls(&self, mutual: bool) -> ServerTls;
    fn client_tls(&self, identity: bool) -> ClientTlsConfig;
}

impl Sides for Pki {
    fn server_tls(&self, mutual: bool) -> ServerTls {
        let (cert, key) = &self.server;
        let ca = mutual.then(|| self.ca.clone().into_bytes());
        ServerTls::from_pem(cert.clone().into_bytes(), key.clone().into_bytes(), ca).unwrap()
    }

    /// What a node sets to trust the central, with its own identity if
    /// `identity`.
    fn client_tls(&self, identity: bool) -> ClientTlsConfig {
        let tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&self.ca))
            .domain_name("localhost");
        if identity {
            let (cert, key) = &self.client;
            return tls.identity(Identity::from_pem(cert, key));
        }
        tls
    }
}

async fn central(tls: Option<ServerTls>, limits: ConnectionLimits) -> RunningCentral {
    let grpc = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let http = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut builder = Central::builder()
        .slot(SlotLength::from_ms(SLOT_MS).unwrap())
        .connection_limits(limits);
    if let Some(tls) = tls {
        builder = builder.tls(tls);
    }
    builder.spawn(grpc, Some(http)).unwrap()
}

fn reporter(store: &SlotStore, url: String, node_id: &str) -> ReporterBuilder {
    Reporter::builder(store, node_id)
        .central(url)
        .report_delay(Duration::from_millis(5))
        .backoff(Duration::from_millis(20), Duration::from_millis(100))
}

fn store() -> SlotStore {
    let store = SlotStore::builder()
        .slot(SlotLength::from_ms(SLOT_MS).unwrap())
        .build();
    store.service("front").resource("requests");
    store
}

/// Whether the reporter gets a quota within `within`.
async fn served(handle: &ReporterHandle, within: Duration) -> bool {
    tokio::time::timeout(within, handle.wait_for(|s| s.quotas_received > 0))
        .await
        .is_ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reporter_over_tls_is_served_and_a_plaintext_one_is_not() {
    let pki = Pki::new(&["web-1"]);
    let central = central(Some(pki.server_tls(false)), ConnectionLimits::default()).await;
    let port = central.grpc_addr().port();
    let (tls, plain) = (store(), store());
    let secure = reporter(&tls, format!("https://127.0.0.1:{port}"), "web-1")
        .tls(pki.client_tls(false))
        .spawn()
        .unwrap();
    let plaintext = reporter(&plain, format!("http://127.0.0.1:{port}"), "web-2")
        .spawn()
        .unwrap();
    assert!(
        served(&secure, Duration::from_secs(5)).await,
        "TLS reporter served"
    );
    assert!(
        !served(&plaintext, Duration::from_millis(800)).await,
        "plaintext reporter is not"
    );
    let status = plaintext.status();
    assert!(!status.connected, "{status:?}");
    assert_eq!(status.connections, 0, "{status:?}");
    central.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_serves_a_node_with_a_certificate_only() {
    let pki = Pki::new(&["web-1"]);
    let central = central(Some(pki.server_tls(true)), ConnectionLimits::default()).await;
    let url = format!("https://127.0.0.1:{}", central.grpc_addr().port());
    let (with, without) = (store(), store());
    let with = reporter(&with, url.clone(), "web-1")
        .tls(pki.client_tls(true))
        .spawn()
        .unwrap();
    let without = reporter(&without, url, "web-2")
        .tls(pki.client_tls(false))
        .spawn()
        .unwrap();
    assert!(
        served(&with, Duration::from_secs(5)).await,
        "node with a certificate served"
    );
    assert!(
        !served(&without, Duration::from_millis(800)).await,
        "node without one is not"
    );
    assert_eq!(without.status().connections, 0);
    central.shutdown().await;
}

#[tokio::test]
async fn tls_settings_and_addresses_must_agree() {
    let pki = Pki::new(&["web-1"]);
    let store = store();
    let https_without_tls = reporter(&store, "https://127.0.0.1:1".into(), "n").spawn();
    assert!(matches!(
        https_without_tls,
        Err(ReporterError::HttpsNeedsTls(_))
    ));
    let tls_over_http = reporter(&store, "http://127.0.0.1:1".into(), "n")
        .tls(pki.client_tls(false))
        .spawn();
    assert!(matches!(
        tls_over_http,
        Err(ReporterError::TlsNeedsHttps(_))
    ));
    let garbage = ServerTls::from_pem(b"not pem".to_vec(), b"not pem".to_vec(), None);
    assert!(garbage.is_err());
}

/// `GET /healthz` over TLS, trusting `ca`; the response's status line.
async fn https_healthz(addr: SocketAddr, ca: &str) -> String {
    let mut roots = rustls::RootCertStore::empty();
    let ca = rustls::pki_types::CertificateDer::from_pem_slice(ca.as_bytes()).unwrap();
    roots.add(ca).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let mut tls = connector.connect(name, tcp).await.unwrap();
    tls.write_all(b"GET /healthz HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = String::new();
    let _ = tls.read_to_string(&mut answer).await;
    answer.lines().next().unwrap_or_default().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_side_speaks_tls_too() {
    let pki = Pki::new(&["web-1"]);
    let central = central(Some(pki.server_tls(true)), ConnectionLimits::default()).await;
    let http = central.http_addr().unwrap();
    // No client certificate: the monitor API's guard is its bearer token.
    assert_eq!(https_healthz(http, &pki.ca).await, "HTTP/1.1 200 OK");
    let mut plain = tokio::net::TcpStream::connect(http).await.unwrap();
    plain
        .write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), plain.read_to_end(&mut answer)).await;
    assert!(!answer.starts_with(b"HTTP/1.1 200"), "no plaintext answer");
    central.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_opens_no_stream_is_closed() {
    let limits = ConnectionLimits {
        first_stream: Duration::from_millis(300),
        ..ConnectionLimits::default()
    };
    let central = central(None, limits).await;
    let addr = central.grpc_addr();
    let store = store();
    let node = reporter(&store, format!("http://{addr}"), "web-1")
        .spawn()
        .unwrap();
    let mut silent = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut out = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(5), silent.read_to_end(&mut out)).await;
    assert!(closed.is_ok(), "a silent connection is closed");
    // The node's connection opened a stream: it outlives the deadline.
    assert!(served(&node, Duration::from_secs(5)).await);
    let seen = node.status().quotas_received;
    tokio::time::sleep(Duration::from_millis(600)).await;
    let status = node.status();
    assert!(status.connected, "{status:?}");
    assert!(status.quotas_received > seen, "{status:?}");
    assert_eq!(
        status.connections, 1,
        "one stream, never reopened: {status:?}"
    );
    central.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_connection_cap_a_node_waits_for_room() {
    let limits = ConnectionLimits {
        max_node_connections: 2,
        ..ConnectionLimits::default()
    };
    let central = central(None, limits).await;
    let addr = central.grpc_addr();
    let first = tokio::net::TcpStream::connect(addr).await.unwrap();
    let _second = tokio::net::TcpStream::connect(addr).await.unwrap();
    let store = store();
    let node = reporter(&store, format!("http://{addr}"), "web-1")
        .spawn()
        .unwrap();
    assert!(
        !served(&node, Duration::from_millis(800)).await,
        "no room for a third connection"
    );
    drop(first);
    assert!(
        served(&node, Duration::from_secs(5)).await,
        "served once one closed"
    );
    central.shutdown().await;
}
