//! Node keys against a real central on 127.0.0.1:0: a stream proves a key
//! before anything it sends is read, and one stream per node id lives.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use throttle_central::keys::NodeKeys;
use throttle_central::limits::{LimitSet, StaticLimits};
use throttle_central::{Central, RunningCentral, Subject};
use throttle_clock::{Clock, SlotLength, SystemClock};
use throttle_proto::auth::{Credentials, Signed};
use throttle_proto::legacy::report_from_json;
use throttle_proto::v1::central_client::CentralClient;
use throttle_proto::v1::{self, central_message, node_message};
use tokio::sync::mpsc;
use tonic::{Code, Streaming};

mod common;

const SLOT_MS: u32 = 100;
const SECRET: &str = "0123456789abcdef0123";
const KEYS: &str = r#"
[[key]]
access_key = "web"
secret_key = "0123456789abcdef0123"
node_ids = ["web-*"]
"#;

/// A central on 127.0.0.1:0 that requires the keys in `KEYS` and limits
/// alice to 100 requests a second; and the directory of its keys file.
async fn start(test: &str) -> (RunningCentral, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("throttle-auth-{test}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("keys.toml");
    std::fs::write(&path, KEYS).unwrap();
    let keys = Arc::new(NodeKeys::open(&path).unwrap());
    let limits = LimitSet::from_toml(
        "[[limit]]\nservice = \"front\"\nuser = \"alice\"\nper_second = { requests = 100 }\n",
    )
    .unwrap();
    let grpc = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let central = Central::builder()
        .slot(SlotLength::from_ms(SLOT_MS).unwrap())
        .limits(Arc::new(StaticLimits::new(limits)))
        .node_keys(keys)
        .spawn(grpc, None)
        .unwrap();
    (central, dir)
}

fn hello(node_id: &str) -> v1::NodeMessage {
    v1::NodeMessage {
        kind: Some(node_message::Kind::Hello(v1::Hello {
            node_id: node_id.into(),
            slot_ms: SLOT_MS,
            services: vec!["front".into()],
            version: "test".into(),
            accepts: Vec::new(),
            resumes: false,
            report_every_ms: 0,
        })),
    }
}

fn report(node_id: &str, requests: i64) -> v1::NodeMessage {
    let slot = SlotLength::from_ms(SLOT_MS)
        .unwrap()
        .slot_at(SystemClock.now_ms());
    let report = report_from_json(&format!(
        r#"{{"node_id": "{node_id}", "slot_number": {slot}, "consumption": {{"front": {{"alice": {{"requests": {requests}}}}}}}, "rejection": {{"front": {{}}}}}}"#
    ))
    .unwrap();
    v1::NodeMessage {
        kind: Some(node_message::Kind::Report(report)),
    }
}

/// A stream with `signed` in its metadata (none if `None`) that sends a
/// Hello for `node_id` and a report of alice's requests; its first
/// message, or the status it ended with.
async fn exchange(
    addr: SocketAddr,
    node_id: &str,
    signed: Option<Signed>,
) -> (
    mpsc::Sender<v1::NodeMessage>,
    Result<Streaming<v1::CentralMessage>, tonic::Status>,
) {
    let mut client = CentralClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    let (tx, rx) = mpsc::channel(16);
    tx.send(hello(node_id)).await.unwrap();
    tx.send(report(node_id, 5_000)).await.unwrap();
    let mut request = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(rx));
    for (key, value) in signed.iter().flat_map(Signed::entries) {
        request.metadata_mut().insert(key, value.parse().unwrap());
    }
    let inbound = client.exchange(request).await.map(|r| r.into_inner());
    (tx, inbound)
}

/// The first message on `inbound`, or the status the stream ended with.
async fn first(
    inbound: Result<Streaming<v1::CentralMessage>, tonic::Status>,
) -> Result<central_message::Kind, tonic::Status> {
    let mut inbound = inbound?;
    let m = tokio::time::timeout(Duration::from_secs(5), inbound.message())
        .await
        .expect("an answer within 5 s")?;
    Ok(m.and_then(|m| m.kind).expect("a message"))
}

/// The next message on `inbound` but block lists (a new stream hears one
/// per service, empty ones included).
async fn not_blocks_or_limits(
    inbound: &mut Streaming<v1::CentralMessage>,
) -> Option<central_message::Kind> {
    loop {
        match inbound.message().await.unwrap().and_then(|m| m.kind) {
            Some(
                central_message::Kind::Blocks(_)
                | central_message::Kind::Limits(_)
                | central_message::Kind::Bound(_),
            ) => continue,
            other => return other,
        }
    }
}

async fn distribution(central: &RunningCentral) -> serde_json::Value {
    central
        .monitor(Subject::Distribution, Default::default())
        .await
        .unwrap()
}

#[tokio::test]
async fn only_a_valid_signature_for_an_allowed_node_id_is_heard() {
    let (central, dir) = start("signature").await;
    let addr = central.grpc_addr();
    let now = SystemClock.now_ms();
    let right = Credentials::new("web", SECRET);
    let attempts = [
        ("web-1", None, "no credentials"),
        (
            "web-1",
            Some(Credentials::new("web", "not the secret at all").sign("web-1", now)),
            "a wrong secret",
        ),
        (
            "web-1",
            Some(right.sign("web-1", now - 10 * 60_000)),
            "an expired signature",
        ),
        (
            "db-1",
            Some(right.sign("db-1", now)),
            "a node id the key may not use",
        ),
        (
            "web-2",
            Some(right.sign("web-1", now)),
            "a Hello for another node id than signed",
        ),
        (
            "web-1",
            Some(Credentials::new("api", SECRET).sign("web-1", now)),
            "an unknown key",
        ),
    ];
    for (node_id, signed, what) in attempts {
        let (_tx, inbound) = exchange(addr, node_id, signed).await;
        let got = first(inbound).await;
        assert_eq!(
            got.err().map(|s| s.code()),
            Some(Code::Unauthenticated),
            "{what}"
        );
    }
    // Nothing any of them sent was counted: alice's bucket is untouched.
    let before = distribution(&central).await;
    assert!(
        before["front"]["alice"]["requests"]["nodes"]
            .as_object()
            .is_none_or(|n| n.is_empty()),
        "{before}"
    );

    let (_tx, inbound) = exchange(addr, "web-1", Some(right.sign("web-1", now))).await;
    let mut inbound = inbound.expect("the right key opens a stream");
    let welcome = inbound.message().await.unwrap().and_then(|m| m.kind);
    assert!(matches!(welcome, Some(central_message::Kind::Welcome(_))));
    let answer = tokio::time::timeout(Duration::from_secs(5), not_blocks_or_limits(&mut inbound))
        .await
        .unwrap();
    assert!(
        matches!(answer, Some(central_message::Kind::Quota(_))),
        "{answer:?}"
    );
    let after = distribution(&central).await;
    assert_eq!(
        after["front"]["alice"]["requests"]["nodes"]["web-1"]["consumption"], 5_000,
        "{after}"
    );
    central.shutdown().await;
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn a_second_stream_of_a_node_id_replaces_the_first() {
    let (central, dir) = start("replace").await;
    let addr = central.grpc_addr();
    let creds = Credentials::new("web", SECRET);
    let (_tx1, first_stream) = exchange(
        addr,
        "web-1",
        Some(creds.sign("web-1", SystemClock.now_ms())),
    )
    .await;
    let mut first_stream = first_stream.unwrap();
    // Welcome, then the answer to its report: it is connected.
    first_stream.message().await.unwrap().unwrap();
    not_blocks_or_limits(&mut first_stream).await;
    let (_tx2, second) = exchange(
        addr,
        "web-1",
        Some(creds.sign("web-1", SystemClock.now_ms())),
    )
    .await;
    let mut second = second.unwrap();
    assert!(matches!(
        second.message().await.unwrap().and_then(|m| m.kind),
        Some(central_message::Kind::Welcome(_))
    ));
    // The first ends with ABORTED, after whatever was queued before.
    let ended = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match first_stream.message().await {
                Ok(Some(_)) => continue,
                Ok(None) => return None,
                Err(status) => return Some(status.code()),
            }
        }
    })
    .await
    .expect("the first stream ends");
    assert_eq!(ended, Some(Code::Aborted));
    let connections = central
        .monitor(Subject::Connections, Default::default())
        .await
        .unwrap();
    let open = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            let c = central
                .monitor(Subject::Connections, Default::default())
                .await
                .unwrap();
            if c["connections"].as_array().map(Vec::len) == Some(1) {
                return c;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .unwrap_or(connections);
    assert_eq!(
        open["connections"].as_array().map(Vec::len),
        Some(1),
        "{open}"
    );
    // Both streams reported the same slot: filed once.
    let d = distribution(&central).await;
    assert_eq!(
        d["front"]["alice"]["requests"]["nodes"]["web-1"]["consumption"], 5_000,
        "{d}"
    );
    central.shutdown().await;
    std::fs::remove_dir_all(&dir).unwrap();
}

async fn http_get(addr: SocketAddr, path: &str, token: Option<&str>) -> u16 {
    common::request(addr, "GET", path, "", token).await.status
}

#[tokio::test]
async fn the_http_api_wants_the_token_but_for_healthz() {
    let grpc = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let http = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let central = Central::builder()
        .slot(SlotLength::from_ms(SLOT_MS).unwrap())
        .http_token("t0ken")
        .spawn(grpc, Some(http))
        .unwrap();
    let addr = central.http_addr().unwrap();
    for path in ["/v1/monitor/connections", "/v1/limits", "/metrics"] {
        assert_eq!(http_get(addr, path, None).await, 401, "{path}");
        assert_eq!(http_get(addr, path, Some("wrong")).await, 401, "{path}");
        assert_ne!(http_get(addr, path, Some("t0ken")).await, 401, "{path}");
    }
    assert_eq!(
        http_get(addr, "/v1/monitor/connections", Some("t0ken")).await,
        200
    );
    assert_eq!(http_get(addr, "/healthz", None).await, 200);
    central.shutdown().await;
}
