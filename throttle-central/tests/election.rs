//! Leader election on a real etcd between real `throttle-central`
//! processes, with a real node's reporter following the leader: one
//! leads, a killed leader's standby takes over, a stopped leader is
//! deposed and never leads beside another.

use std::time::{Duration, Instant};

use serde_json::Value;
use throttle_layer::{Reporter, SlotStore};
use throttle_proto::v1::{self, central_client::CentralClient, central_message, node_message};
use throttle_test_servers::{CentralProcess, Etcd, TempDir, until};
use tokio_stream::wrappers::ReceiverStream;

/// alice's limit, so that the leader has quotas to push.
const LIMITS: &str =
    "[[limit]]\nservice = \"front\"\nuser = \"alice\"\nper_second = { requests = 100 }\n";

/// A `throttle-central` process in election `test` on `etcd`, and the
/// directory of its limits file (kept as long as it runs).
struct Central {
    process: CentralProcess,
    _limits: TempDir,
}

impl Central {
    fn start(etcd: &Etcd) -> Self {
        let grpc = throttle_test_servers::free_port();
        let dir = TempDir::new("election");
        let limits = dir.path().join("limits.toml");
        std::fs::write(&limits, LIMITS).expect("limits written");
        let args = [
            "--limits",
            &limits.display().to_string(),
            "--slot-ms",
            "200",
            "--election",
            "test",
            "--etcd",
            &etcd.url(),
            "--advertise",
            &format!("http://127.0.0.1:{grpc}"),
        ];
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        let bin = env!("CARGO_BIN_EXE_throttle-central");
        Self {
            process: CentralProcess::start_on(bin, grpc, &args),
            _limits: dir,
        }
    }

    fn url(&self) -> String {
        self.process.url()
    }

    /// `/healthz`, or `None` if it does not answer within 80 ms (a
    /// stopped process).
    fn health(&self) -> Option<Value> {
        let body = self.process.get("/healthz", Duration::from_millis(80))?;
        serde_json::from_str(&body).ok()
    }

    fn leads(&self) -> bool {
        self.health().is_some_and(|h| h["leader"] == true)
    }

    fn signal(&self, name: &str) {
        self.process.signal(name);
    }
}

/// The first central, leading; the second, standing by and naming it.
fn pair(etcd: &Etcd) -> (Central, Central) {
    let a = Central::start(etcd);
    until(Duration::from_secs(10), "the first central leads", || {
        a.leads()
    });
    let b = Central::start(etcd);
    until(
        Duration::from_secs(10),
        "the second names the leader",
        || {
            b.health()
                .is_some_and(|h| h["role"] == "standby" && h["leader_address"] == a.url().as_str())
        },
    );
    (a, b)
}

#[test]
fn a_killed_leaders_standby_takes_over_and_the_node_follows() {
    let Some(etcd) = Etcd::start("a_killed_leaders_standby_takes_over_and_the_node_follows") else {
        return;
    };
    let (a, b) = pair(&etcd);
    let epoch_a = a.health().map(|h| h["epoch"].clone());
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let _guard = rt.enter();
    let slot = throttle_clock::SlotLength::from_ms(200).expect("slot");
    let store = SlotStore::builder().slot(slot).build();
    // The standby first: it sends the node to the leader.
    let reporter = Reporter::builder(&store, "node-1")
        .central(b.url())
        .central(a.url())
        .backoff(Duration::from_millis(50), Duration::from_millis(200))
        .spawn()
        .expect("reporter");
    until(
        Duration::from_secs(10),
        "the node reports to the leader",
        || {
            let s = reporter.status();
            s.connected && s.endpoint == a.url() && s.quotas_received > 0
        },
    );
    let killed = Instant::now();
    drop(a);
    let led = until(Duration::from_secs(10), "the standby leads", || b.leads());
    let before = reporter.status().quotas_received;
    until(
        Duration::from_secs(10),
        "the node gets quotas from it",
        || {
            let s = reporter.status();
            s.connected && s.endpoint == b.url() && s.quotas_received > before
        },
    );
    let served = killed.elapsed();
    eprintln!("after kill -9 of the leader: standby leads in {led:?}, node served in {served:?}");
    assert!(served < Duration::from_secs(3), "{served:?}");
    let epoch_b = b.health().map(|h| h["epoch"].clone());
    let (ea, eb) = (
        epoch_a.and_then(|e| e.as_u64()),
        epoch_b.and_then(|e| e.as_u64()),
    );
    assert!(
        ea.is_some_and(|a| eb.is_some_and(|b| b > a)),
        "{ea:?} -> {eb:?}"
    );
}

#[test]
fn a_stopped_leader_is_deposed_and_never_leads_beside_another() {
    let Some(etcd) = Etcd::start("a_stopped_leader_is_deposed_and_never_leads_beside_another")
    else {
        return;
    };
    let (a, b) = pair(&etcd);
    a.signal("STOP");
    let mut samples = Vec::new();
    let mut sample = |for_: Duration| {
        let end = Instant::now() + for_;
        while Instant::now() < end {
            let (la, lb) = (a.leads(), b.leads());
            assert!(!(la && lb), "two leaders after {} samples", samples.len());
            samples.push((la, lb));
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    sample(Duration::from_secs(5));
    a.signal("CONT");
    sample(Duration::from_secs(3));
    assert!(samples.iter().any(|(_, lb)| *lb), "the standby took over");
    let last = a.health().expect("the resumed central answers");
    assert_eq!(last["role"], "standby", "{last}");
    assert_eq!(last["leader_address"], b.url().as_str(), "{last}");
    assert!(b.leads());
    eprintln!("{} samples 100 ms apart, never two leaders", samples.len());
}

/// A node stream opened with the generated client: its sender and what
/// the central sends back.
struct RawStream {
    tx: tokio::sync::mpsc::Sender<v1::NodeMessage>,
    inbound: tonic::Streaming<v1::CentralMessage>,
}

impl RawStream {
    async fn open(url: String) -> Self {
        let mut client = CentralClient::connect(url).await.expect("connects");
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        let hello = v1::Hello {
            node_id: "raw".into(),
            slot_ms: SLOT_MS,
            services: vec!["front".into()],
            version: "test".into(),
            accepts: Vec::new(),
            resumes: false,
            report_every_ms: 0,
        };
        let hello = node_message::Kind::Hello(hello);
        tx.send(v1::NodeMessage { kind: Some(hello) })
            .await
            .expect("Hello sent");
        let stream = client.exchange(ReceiverStream::new(rx)).await;
        let inbound = stream.expect("stream opened").into_inner();
        Self { tx, inbound }
    }

    /// The next message within `wait`: `None` once the stream ended or
    /// nothing came.
    async fn next(&mut self, wait: Duration) -> Option<central_message::Kind> {
        let message = tokio::time::timeout(wait, self.inbound.message()).await;
        message.ok()?.ok()??.kind
    }

    /// Sends an empty report of the slot that just ended.
    async fn report(&self) {
        let report = v1::Report {
            node_id: "raw".into(),
            slot_number: slot_now(),
            ..v1::Report::default()
        };
        let report = node_message::Kind::Report(report);
        let _ = self.tx.send(v1::NodeMessage { kind: Some(report) }).await;
    }
}

const SLOT_MS: u32 = 200;

fn slot_now() -> i64 {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    ms / i64::from(SLOT_MS)
}

/// The newest slot a quota message holds a table of.
fn newest_slot(kind: &central_message::Kind) -> Option<i64> {
    let central_message::Kind::Quota(q) = kind else {
        return None;
    };
    q.services
        .values()
        .flat_map(|s| s.slots.keys())
        .copied()
        .max()
}

/// A leader stopped past its lease's deadline and resumed sends its open
/// streams no quota computed after it resumed, answers no report, tells
/// them `NotLeader`, and tells a new stream the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_leader_pushes_no_quota_and_says_it_does_not_lead() {
    let test = "a_resumed_leader_pushes_no_quota_and_says_it_does_not_lead";
    let Some(etcd) = Etcd::start(test) else {
        return;
    };
    let (a, b) = tokio::task::block_in_place(|| pair(&etcd));
    let mut old = RawStream::open(a.url()).await;
    let welcome = old.next(Duration::from_secs(2)).await;
    assert!(
        matches!(welcome, Some(central_message::Kind::Welcome(_))),
        "{welcome:?}"
    );
    old.report().await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    a.signal("STOP");
    // What was sent before the stop is read now, and set aside.
    while old.next(Duration::from_millis(300)).await.is_some() {}
    tokio::time::sleep(Duration::from_secs(4)).await;
    a.signal("CONT");
    let resumed = slot_now();
    old.report().await;
    let mut told_not_leader = false;
    while let Some(kind) = old.next(Duration::from_secs(2)).await {
        assert!(
            newest_slot(&kind).is_none_or(|s| s < resumed),
            "a quota computed after the leader resumed: {kind:?}"
        );
        told_not_leader |= matches!(kind, central_message::Kind::NotLeader(_));
    }
    assert!(told_not_leader, "the open stream is told NotLeader");
    tokio::task::block_in_place(|| {
        until(Duration::from_secs(10), "the standby leads", || b.leads())
    });
    let mut new = RawStream::open(a.url()).await;
    match new.next(Duration::from_secs(5)).await {
        Some(central_message::Kind::NotLeader(nl)) => assert_eq!(nl.leader, b.url()),
        other => panic!("a new stream to the resumed central got {other:?}"),
    }
}
