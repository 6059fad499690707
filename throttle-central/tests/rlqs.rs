//! Envoy's Rate Limit Quota Service on a real central on 127.0.0.1:0,
//! through a tonic client of Envoy's own types: what a proxy reports is
//! filed exactly, its buckets get their share, bad input is refused or
//! counted, proxies show their token, a standby turns them away.

use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::BucketAction as Action;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use envoy_types::pb::google::protobuf::Duration as ProtoDuration;
use throttle_central::keys::NodeKeys;
use throttle_central::ha::leadership::Follower;
use throttle_central::SlotRange;
use throttle_central::limits::{LimitSet, StaticLimits};
use throttle_central::{Central, CentralBuilder, RunningCentral, Subject};
use throttle_clock::SlotLength;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use throttle_central::net::ServerTls;
use throttle_test_servers::Pki;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};
use tonic::{Code, Request, Streaming};

const SLOT_MS: u32 = 100;
const LIMITS: &str =
    "[[limit]]\nservice = \"front\"\nuser = \"alice\"\nper_second = { requests = 100 }\n";

fn builder() -> CentralBuilder {
    let limits = LimitSet::from_toml(LIMITS).unwrap();
    Central::builder()
        .slot(SlotLength::from_ms(SLOT_MS).unwrap())
        .limits(Arc::new(StaticLimits::new(limits)))
}

async fn spawn(builder: CentralBuilder) -> RunningCentral {
    let grpc = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    builder.spawn(grpc, None).unwrap()
}

fn bucket(pairs: &[(&str, &str)]) -> BucketId {
    BucketId {
        bucket: pairs
            .iter()
            .map(|(k, v)| ((*k).into(), (*v).into()))
            .collect(),
    }
}

fn usage(id: BucketId, allowed: u64, denied: u64, seconds: i64) -> BucketQuotaUsage {
    BucketQuotaUsage {
        bucket_id: Some(id),
        time_elapsed: Some(ProtoDuration { seconds, nanos: 0 }),
        num_requests_allowed: allowed,
        num_requests_denied: denied,
    }
}

fn reports(domain: &str, usages: Vec<BucketQuotaUsage>) -> RateLimitQuotaUsageReports {
    RateLimitQuotaUsageReports {
        domain: domain.into(),
        bucket_quota_usages: usages,
    }
}

/// An open stream's sender of reports and its answers, or the status it
/// was refused with.
type Opened = Result<
    (
        mpsc::Sender<RateLimitQuotaUsageReports>,
        Streaming<RateLimitQuotaResponse>,
    ),
    Code,
>;

/// Opens a stream with `metadata`; the sender of its reports and its
/// answers, or the status it was refused with.
async fn open(central: &RunningCentral, metadata: &[(&'static str, &str)]) -> Opened {
    let url = format!("http://{}", central.grpc_addr());
    let channel = Channel::from_shared(url).unwrap().connect().await.unwrap();
    open_on(channel, metadata).await
}

/// [`open`], on `channel`.
async fn open_on(channel: Channel, metadata: &[(&'static str, &str)]) -> Opened {
    let mut client = RateLimitQuotaServiceClient::new(channel);
    let (tx, rx) = mpsc::channel(8);
    let mut request = Request::new(ReceiverStream::new(rx));
    for (key, value) in metadata {
        request.metadata_mut().insert(*key, value.parse().unwrap());
    }
    match client.stream_rate_limit_quotas(request).await {
        Ok(answers) => Ok((tx, answers.into_inner())),
        Err(status) => Err(status.code()),
    }
}

/// The next answer's actions, by the bucket's `user` or `path` entry.
async fn next_actions(answers: &mut Streaming<RateLimitQuotaResponse>) -> Vec<(String, Action)> {
    let answer = tokio::time::timeout(Duration::from_secs(5), answers.message()).await;
    let answer = answer
        .expect("an answer in time")
        .expect("a message")
        .expect("open");
    answer
        .bucket_action
        .into_iter()
        .map(|a| {
            let id = a.bucket_id.unwrap_or_default().bucket;
            let name = id
                .get("user")
                .or(id.get("path"))
                .cloned()
                .unwrap_or_default();
            (name, a.bucket_action.expect("an action"))
        })
        .collect()
}

fn strategy(action: &Action) -> Option<Strategy> {
    match action {
        Action::QuotaAssignmentAction(q) => q.rate_limit_strategy.and_then(|s| s.strategy),
        Action::AbandonAction(_) => None,
    }
}

/// alice's filed requests over every slot held.
async fn filed(central: &RunningCentral) -> i64 {
    let sums = central
        .monitor(Subject::ConsumptionSum, SlotRange::default())
        .await
        .unwrap();
    let slots = sums["front"].as_object().cloned().unwrap_or_default();
    slots
        .values()
        .filter_map(|u| u["alice"]["requests"].as_i64())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxys_usage_is_filed_exactly_and_its_buckets_get_their_share() {
    let central = spawn(builder()).await;
    let (tx, mut answers) = open(&central, &[("x-throttle-node", "envoy-1")])
        .await
        .unwrap();
    // The subscription: answered at once with alice's share of her rule.
    let alice = bucket(&[("user", "alice")]);
    tx.send(reports("front", vec![usage(alice.clone(), 1, 0, 0)]))
        .await
        .unwrap();
    let first = next_actions(&mut answers).await;
    let Some(Strategy::TokenBucket(b)) = strategy(&first[0].1) else {
        panic!("{first:?}");
    };
    assert_eq!(
        (first[0].0.as_str(), b.tokens_per_fill.map(|t| t.value)),
        ("alice", Some(100))
    );
    // A user no rule names, and a bucket without a user: no limit.
    let others = vec![
        usage(bucket(&[("user", "carol")]), 3, 0, 0),
        usage(bucket(&[("path", "/")]), 4, 0, 0),
    ];
    tx.send(reports("front", others)).await.unwrap();
    let allowed = next_actions(&mut answers).await;
    let allow = Some(Strategy::BlanketRule(BlanketRule::AllowAll as i32));
    assert_eq!(allowed.len(), 2);
    assert!(
        allowed.iter().all(|(_, a)| strategy(a) == allow),
        "{allowed:?}"
    );
    // 499 more of alice over no time, and an absurd count that is not
    // filed. A report covering no whole second tells no rate: it waits for
    // the next report, or the stream's end.
    let absurd = usage(alice.clone(), u64::MAX / 2, 0, 0);
    tx.send(reports(
        "front",
        vec![usage(alice.clone(), 499, 20, 0), absurd],
    ))
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(filed(&central).await, 0, "nothing filed yet");
    // Another domain on the same stream is refused, and the stream ends.
    tx.send(reports("other", vec![usage(alice, 1, 0, 0)]))
        .await
        .unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match answers.message().await {
                Ok(Some(_)) => continue,
                Ok(None) => return None,
                Err(status) => return Some(status.code()),
            }
        }
    });
    assert_eq!(ended.await.unwrap(), Some(Code::InvalidArgument));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while filed(&central).await < 500 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        filed(&central).await,
        500,
        "the subscription's 1 and the 499, as the stream ended"
    );
    central.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_node_keys_a_proxy_shows_its_token() {
    let dir = std::env::temp_dir().join(format!("throttle-rlqs-keys-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("keys.toml");
    std::fs::write(
        &path,
        "[[proxy]]\nnode_id = \"envoy-1\"\ntoken = \"0123456789abcdef\"\n",
    )
    .unwrap();
    let keys = Arc::new(NodeKeys::open(&path).unwrap());
    let central = spawn(builder().node_keys(keys)).await;
    let node = ("x-throttle-node", "envoy-1");
    let refused = |r: Result<_, Code>| r.err();
    assert_eq!(
        refused(open(&central, &[node]).await),
        Some(Code::Unauthenticated)
    );
    let wrong = ("authorization", "Bearer 0123456789abcdeF");
    assert_eq!(
        refused(open(&central, &[node, wrong]).await),
        Some(Code::Unauthenticated)
    );
    let other = ("x-throttle-node", "envoy-2");
    let right = ("authorization", "Bearer 0123456789abcdef");
    assert_eq!(
        refused(open(&central, &[other, right]).await),
        Some(Code::Unauthenticated)
    );
    let (tx, mut answers) = open(&central, &[node, right]).await.unwrap();
    tx.send(reports(
        "front",
        vec![usage(bucket(&[("user", "alice")]), 1, 0, 0)],
    ))
    .await
    .unwrap();
    assert_eq!(next_actions(&mut answers).await.len(), 1);
    central.shutdown().await;
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_turns_proxies_away() {
    let central = spawn(builder().leadership(Arc::new(Follower::default()))).await;
    let refused = open(&central, &[("x-throttle-node", "envoy-1")])
        .await
        .err();
    assert_eq!(refused, Some(Code::Unavailable));
    central.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_may_name_its_user_entry() {
    let text = format!("[service.front]\nenvoy_user_key = \"api_key\"\n\n{LIMITS}");
    let limits = LimitSet::from_toml(&text).unwrap();
    let builder = Central::builder()
        .slot(SlotLength::from_ms(SLOT_MS).unwrap())
        .limits(Arc::new(StaticLimits::new(limits)));
    let central = spawn(builder).await;
    let (tx, mut answers) = open(&central, &[("x-throttle-node", "envoy-1")])
        .await
        .unwrap();
    let by_key = usage(bucket(&[("api_key", "alice")]), 1, 0, 0);
    tx.send(reports("front", vec![by_key])).await.unwrap();
    let actions = next_actions(&mut answers).await;
    assert!(
        matches!(strategy(&actions[0].1), Some(Strategy::TokenBucket(_))),
        "{actions:?}"
    );
    // `user` names nobody here: no rule, no limit.
    let by_user = usage(bucket(&[("user", "alice")]), 1, 0, 0);
    tx.send(reports("front", vec![by_user])).await.unwrap();
    let actions = next_actions(&mut answers).await;
    let allow = Some(Strategy::BlanketRule(BlanketRule::AllowAll as i32));
    assert_eq!(strategy(&actions[0].1), allow, "{actions:?}");
    central.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_mutual_tls_a_proxy_is_the_node_its_certificate_names() {
    let pki = Pki::new(&["envoy-7.edge"]);
    let (cert, key) = &pki.server;
    let ca = Some(pki.ca.clone().into_bytes());
    let tls = ServerTls::from_pem(cert.clone().into_bytes(), key.clone().into_bytes(), ca);
    let central = spawn(builder().tls(tls.unwrap())).await;
    let (cert, key) = &pki.client;
    let client = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(&pki.ca))
        .domain_name("localhost")
        .identity(Identity::from_pem(cert, key));
    let url = format!("https://localhost:{}", central.grpc_addr().port());
    let channel = || async {
        let endpoint = Channel::from_shared(url.clone()).unwrap();
        endpoint
            .tls_config(client.clone())
            .unwrap()
            .connect()
            .await
            .unwrap()
    };
    // Without the header, the certificate names the node; with it, the
    // header does (replicas that share a certificate stay apart).
    let (by_cert, mut answers) = open_on(channel().await, &[]).await.unwrap();
    let header = [("x-throttle-node", "envoy-8")];
    let (by_header, mut answered) = open_on(channel().await, &header).await.unwrap();
    for (tx, answers) in [(&by_cert, &mut answers), (&by_header, &mut answered)] {
        let alice = usage(bucket(&[("user", "alice")]), 1, 0, 0);
        tx.send(reports("front", vec![alice])).await.unwrap();
        assert_eq!(next_actions(answers).await.len(), 1);
    }
    let connections = central
        .monitor(Subject::Connections, SlotRange::default())
        .await
        .unwrap()
        .to_string();
    for id in ["envoy-7.edge", "envoy-8"] {
        let named = format!(r#""node_id":"{id}""#);
        assert!(connections.contains(&named), "{id}: {connections}");
    }
    central.shutdown().await;
}
