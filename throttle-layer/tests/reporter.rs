//! The reporter against a small in-test central node (a tonic server on
//! 127.0.0.1:0), with 100 ms slots so tests take well under a few seconds.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use throttle_clock::{Clock, SlotLength, SystemClock};
use throttle_layer::reporter::{Reporter, ReporterError, ReporterHandle};
use throttle_layer::store::{Basis, Fallback, SlotStore};
use throttle_proto::v1::central_server::{Central, CentralServer};
use throttle_proto::v1::{self, central_message, node_message};
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tonic::{Request, Response, Status, Streaming};

const SLOT_MS: u32 = 100;

#[derive(Debug, Clone)]
enum Event {
    Hello(v1::Hello),
    Report(v1::Report),
}

type Outbound = mpsc::Sender<Result<v1::CentralMessage, Status>>;

#[derive(Clone)]
struct Fake {
    events: mpsc::UnboundedSender<Event>,
    streams: Arc<Mutex<Vec<Outbound>>>,
    redirect: Option<String>,
    /// Quota answered for slot S+1: user -> requests.
    answer: Option<(&'static str, f64)>,
    /// What its Welcome accepts.
    accepts: Vec<String>,
    /// Its leadership's epoch, as its Welcome says.
    epoch: u64,
}

fn quota_message(
    service: &str,
    slot: i64,
    users: &[(&str, f64)],
    report_slot: Option<i64>,
) -> v1::CentralMessage {
    let users = users
        .iter()
        .map(|(u, q)| {
            let resources = [("requests".to_string(), *q)].into();
            (u.to_string(), v1::ResourceQuotas { resources })
        })
        .collect();
    let slots = [(slot, v1::UserQuotas { users })].into();
    let quota = v1::Quota {
        services: [(service.to_string(), v1::ServiceQuota { slots })].into(),
        report_slot,
        packed: Vec::new(),
        refs: Vec::new(),
    };
    v1::CentralMessage {
        kind: Some(central_message::Kind::Quota(quota)),
    }
}

#[tonic::async_trait]
impl Central for Fake {
    type ExchangeStream = ReceiverStream<Result<v1::CentralMessage, Status>>;

    async fn exchange(
        &self,
        request: Request<Streaming<v1::NodeMessage>>,
    ) -> Result<Response<Self::ExchangeStream>, Status> {
        let (tx, rx) = mpsc::channel(64);
        if let Some(leader) = &self.redirect {
            let kind = central_message::Kind::NotLeader(v1::NotLeader {
                leader: leader.clone(),
            });
            let _ = tx.try_send(Ok(v1::CentralMessage { kind: Some(kind) }));
            return Ok(Response::new(ReceiverStream::new(rx)));
        }
        self.streams.lock().push(tx.clone());
        let mut inbound = request.into_inner();
        let this = self.clone();
        tokio::spawn(async move {
            while let Ok(Some(m)) = inbound.message().await {
                match m.kind {
                    Some(node_message::Kind::Hello(h)) => {
                        let _ = this.events.send(Event::Hello(h));
                        let w = central_message::Kind::Welcome(v1::Welcome {
                            slot_ms: SLOT_MS,
                            epoch: this.epoch,
                            accepts: this.accepts.clone(),
                            incarnation: 0,
                        });
                        let _ = tx.send(Ok(v1::CentralMessage { kind: Some(w) })).await;
                    }
                    Some(node_message::Kind::Report(r)) => {
                        let s = r.slot_number;
                        let _ = this.events.send(Event::Report(r));
                        let users: Vec<(&str, f64)> = this.answer.into_iter().collect();
                        if tx
                            .send(Ok(quota_message("front", s + 1, &users, Some(s))))
                            .await
                            .is_err()
                        {
                            break;
                        }
                    }
                    None => {}
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

struct FakeServer {
    addr: SocketAddr,
    fake: Fake,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl FakeServer {
    async fn start(addr: SocketAddr, fake: Fake) -> Self {
        let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, rx) = oneshot::channel::<()>();
        let server = tonic::transport::Server::builder()
            .add_service(CentralServer::new(fake.clone()))
            .serve_with_incoming_shutdown(TcpListenerStream::new(listener), async {
                let _ = rx.await;
            });
        let task = tokio::spawn(async move {
            let _ = server.await;
        });
        Self {
            addr,
            fake,
            stop: Some(stop),
            task,
        }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Ends every stream and stops listening, as a crashed central would.
    async fn stop(mut self) {
        for tx in self.fake.streams.lock().drain(..) {
            let _ = tx.try_send(Err(Status::unavailable("going away")));
        }
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        let _ = tokio::time::timeout(Duration::from_secs(2), &mut self.task).await;
        self.task.abort();
    }

    fn push(&self, msg: v1::CentralMessage) {
        for tx in self.fake.streams.lock().iter() {
            let _ = tx.try_send(Ok(msg.clone()));
        }
    }
}

fn fake(answer: Option<(&'static str, f64)>) -> (Fake, mpsc::UnboundedReceiver<Event>) {
    let (events, rx) = mpsc::unbounded_channel();
    (
        Fake {
            events,
            streams: Arc::default(),
            redirect: None,
            answer,
            accepts: Vec::new(),
            epoch: 1,
        },
        rx,
    )
}

fn store() -> SlotStore {
    SlotStore::builder()
        .slot(SlotLength::from_ms(SLOT_MS).unwrap())
        .build()
}

fn reporter(store: &SlotStore, endpoints: &[String]) -> ReporterHandle {
    let mut b = Reporter::builder(store, "node-a")
        .report_delay(Duration::from_millis(10))
        .backoff(Duration::from_millis(20), Duration::from_millis(100))
        .connect_timeout(Duration::from_millis(200));
    for e in endpoints {
        b = b.central(e.clone());
    }
    b.spawn().unwrap()
}

async fn next(rx: &mut mpsc::UnboundedReceiver<Event>) -> Event {
    tokio::time::timeout(Duration::from_secs(5), rx.recv())
        .await
        .expect("no event within 5 s")
        .expect("server gone")
}

async fn next_report(rx: &mut mpsc::UnboundedReceiver<Event>) -> v1::Report {
    loop {
        if let Event::Report(r) = next(rx).await {
            return r;
        }
    }
}

/// With the central node away: alice admitted once in each of five
/// slots, her reports buffered; then the central back at `addr` as `back`,
/// and the reporter reconnected (its second connection) and drained.
/// Returns the central, every report received from `events` until one
/// after the drain, and how many requests alice was admitted.
async fn away_then_back(
    front: &Arc<throttle_layer::store::ServiceStore>,
    req: throttle_layer::store::ResourceId,
    handle: &ReporterHandle,
    (addr, back): (SocketAddr, Fake),
    events: &mut mpsc::UnboundedReceiver<Event>,
) -> (FakeServer, Vec<v1::Report>, i64) {
    for _ in 0..5 {
        front.admit("alice", &[(req, 1)], Fallback::Allow);
        tokio::time::sleep(Duration::from_millis(u64::from(SLOT_MS))).await;
    }
    assert!(handle.status().buffered >= 3, "{:?}", handle.status());
    let server = FakeServer::start(addr, back).await;
    within("reconnected and drained", || {
        let s = handle.status();
        s.connected && s.buffered == 0 && s.connections == 2
    })
    .await;
    let mut reports = vec![next_report(events).await];
    while let Ok(e) = events.try_recv() {
        if let Event::Report(r) = e {
            reports.push(r);
        }
    }
    (server, reports, 5)
}

/// alice's requests over `reports`, each slot's once (a report replayed
/// counts once): all `admitted` but at most the current slot's.
fn alice_counted_once(reports: &[v1::Report], admitted: i64) {
    let mut seen = std::collections::BTreeMap::new();
    for r in reports {
        seen.entry(r.slot_number)
            .or_insert_with(|| requests(r, "alice"));
    }
    let counted: i64 = seen.values().sum();
    assert!(
        counted >= admitted - 1 && counted <= admitted,
        "at most the current slot is still unreported: {counted} of {admitted}"
    );
}

/// `user`'s requests in service front, packed or not.
fn requests(r: &v1::Report, user: &str) -> i64 {
    let mut r = r.clone();
    r.unpack().unwrap();
    r.consumption
        .get("front")
        .and_then(|u| u.users.get(user))
        .and_then(|a| a.resources.get("requests"))
        .copied()
        .unwrap_or(0)
}

async fn within<F: FnMut() -> bool>(what: &str, mut f: F) {
    for _ in 0..250 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("not within 5 s: {what}");
}

#[tokio::test]
async fn hello_then_one_report_per_slot_with_the_counts() {
    let (f, mut events) = fake(None);
    let server = FakeServer::start("127.0.0.1:0".parse().unwrap(), f).await;
    let store = store();
    let front = store.service("front");
    let req = front.resource("requests").unwrap();
    let _reporter = reporter(&store, &[server.url()]);
    match next(&mut events).await {
        Event::Hello(h) => {
            assert_eq!(h.node_id, "node-a");
            assert_eq!(h.slot_ms, SLOT_MS);
            assert_eq!(h.services, vec!["front".to_string()]);
            assert!(!h.version.is_empty());
            assert_eq!(
                h.accepts,
                [throttle_proto::PACKED_QUOTAS, throttle_proto::QUOTA_REFS]
            );
        }
        e => panic!("expected Hello, got {e:?}"),
    }
    let first = next_report(&mut events).await;
    for _ in 0..3 {
        front.admit("alice", &[(req, 1)], Fallback::Allow);
    }
    let mut total = 0;
    let mut last = first.slot_number;
    for _ in 0..3 {
        let r = next_report(&mut events).await;
        assert_eq!(r.slot_number, last + 1, "one report per slot, in order");
        assert_eq!(r.node_id, "node-a");
        assert!(r.rejection.contains_key("front"));
        last = r.slot_number;
        total += requests(&r, "alice");
    }
    assert_eq!(total, 3);
    server.stop().await;
}

#[tokio::test]
async fn a_spread_reporter_reports_every_slot_at_its_point() {
    let (f, mut events) = fake(None);
    let server = FakeServer::start("127.0.0.1:0".parse().unwrap(), f).await;
    let store = store();
    let front = store.service("front");
    let req = front.resource("requests").unwrap();
    // A node whose point is late in the spread, so that reporting at it
    // and reporting at the delay alone are told apart.
    let builder = (0..)
        .map(|n| {
            Reporter::builder(&store, &format!("node-{n}"))
                .central(server.url())
                .report_delay(Duration::from_millis(5))
                .report_spread(Duration::from_millis(40))
        })
        .find(|b| b.report_at() >= Duration::from_millis(35))
        .unwrap();
    let at = builder.report_at();
    let _reporter = builder.spawn().unwrap();
    assert!(matches!(next(&mut events).await, Event::Hello(_)));
    let mut last = next_report(&mut events).await.slot_number;
    front.admit("alice", &[(req, 2)], Fallback::Allow);
    let mut total = 0;
    for _ in 0..4 {
        let r = next_report(&mut events).await;
        // Received at least at its point: timers never fire early, and the
        // store's coarse clock may read the boundary a tick (up to 10 ms)
        // late at most.
        let in_slot = Duration::from_millis(
            (SystemClock.now_ms() - r.slot_number * i64::from(SLOT_MS)) as u64,
        );
        assert!(
            in_slot + Duration::from_millis(12) >= at,
            "{in_slot:?} < {at:?}"
        );
        assert_eq!(r.slot_number, last + 1, "one report per slot, in order");
        last = r.slot_number;
        total += requests(&r, "alice");
    }
    assert_eq!(total, 2);
    server.stop().await;
}

#[tokio::test]
async fn answers_and_pushes_are_applied() {
    let (f, mut events) = fake(Some(("alice", 0.0)));
    let server = FakeServer::start("127.0.0.1:0".parse().unwrap(), f).await;
    let store = store();
    let front = store.service("front");
    let req = front.resource("requests").unwrap();
    let handle = reporter(&store, &[server.url()]);
    next_report(&mut events).await;
    next_report(&mut events).await;
    // The answer to the report sent at the start of this slot covers it.
    within("answer applied", || front.has_quota(store.current_slot())).await;
    let d = front.admit("alice", &[(req, 1)], Fallback::Allow).decision;
    assert!(!d.is_allowed() && d.basis == Basis::Quota, "{d:?}");
    let far = store.current_slot() + 5;
    server.push(quota_message("front", far, &[("bob", 3.0)], None));
    within("push applied", || front.has_quota(far)).await;
    assert!(handle.status().quotas_received >= 3);
    server.stop().await;
}

#[tokio::test]
async fn reconnects_and_replays_buffered_reports_in_order() {
    let (f, mut events) = fake(None);
    let server = FakeServer::start("127.0.0.1:0".parse().unwrap(), f.clone()).await;
    let addr = server.addr;
    let store = store();
    let front = store.service("front");
    let req = front.resource("requests").unwrap();
    let handle = reporter(&store, &[server.url()]);
    let mut reports = vec![next_report(&mut events).await];
    server.stop().await;
    within("disconnected", || !handle.status().connected).await;
    // Traffic while the central node is away, spread over several slots;
    // then everything received up to one more report.
    let (server, after, admitted) =
        away_then_back(&front, req, &handle, (addr, f), &mut events).await;
    reports.extend(after);
    let mut received: Vec<i64> = reports.iter().map(|r| r.slot_number).collect();
    received.dedup();
    let replay = &received[1..];
    assert!(
        replay.windows(2).all(|w| w[1] == w[0] + 1),
        "in order, no gap: {received:?}"
    );
    alice_counted_once(&reports, admitted);
    server.stop().await;
}

#[tokio::test]
async fn reports_are_packed_for_a_central_that_reads_them_and_unpacked_for_one_that_does_not() {
    let (mut f, mut events) = fake(None);
    f.accepts = vec![throttle_proto::PACKED_REPORTS.to_owned()];
    let server = FakeServer::start("127.0.0.1:0".parse().unwrap(), f.clone()).await;
    let addr = server.addr;
    let store = store();
    let front = store.service("front");
    let req = front.resource("requests").unwrap();
    let handle = reporter(&store, &[server.url()]);
    let first = next_report(&mut events).await;
    assert!(
        first.consumption.is_empty() && first.packed.len() == 2,
        "front's consumption and rejection, packed: {first:?}"
    );
    server.stop().await;
    within("disconnected", || !handle.status().connected).await;
    while events.try_recv().is_ok() {}
    // Reports written packed while away, for the central last reached;
    // back without packed reports.
    f.accepts.clear();
    let (server, reports, admitted) =
        away_then_back(&front, req, &handle, (addr, f), &mut events).await;
    assert!(
        reports.iter().all(|r| r.packed.is_empty()),
        "rewritten as maps: {reports:?}"
    );
    alice_counted_once(&reports, admitted);
    server.stop().await;
}

#[tokio::test]
async fn follows_not_leader_to_the_leader() {
    let (leader_fake, mut leader_events) = fake(None);
    let leader = FakeServer::start("127.0.0.1:0".parse().unwrap(), leader_fake).await;
    let (mut follower_fake, _follower_events) = fake(None);
    follower_fake.redirect = Some(leader.url());
    let follower = FakeServer::start("127.0.0.1:0".parse().unwrap(), follower_fake).await;
    let store = store();
    store.service("front");
    let handle = reporter(&store, &[follower.url()]);
    assert!(matches!(next(&mut leader_events).await, Event::Hello(_)));
    within("connected to the leader", || handle.status().connected).await;
    assert_eq!(handle.status().endpoint, leader.url());
    leader.stop().await;
    follower.stop().await;
}

#[tokio::test]
async fn a_central_of_an_older_epoch_is_not_followed() {
    // The node reported under epoch 5; that leader goes away, and a
    // central of epoch 3 (a deposed leader still answering) welcomes it.
    let (mut newer, mut newer_events) = fake(Some(("alice", 7.0)));
    newer.epoch = 5;
    let first = FakeServer::start("127.0.0.1:0".parse().unwrap(), newer).await;
    let (mut older, mut older_events) = fake(Some(("alice", 1000.0)));
    older.epoch = 3;
    let stale = FakeServer::start("127.0.0.1:0".parse().unwrap(), older).await;
    let store = store();
    store.service("front");
    let handle = reporter(&store, &[first.url(), stale.url()]);
    within("reporting under epoch 5", || {
        handle.status().quotas_received > 0
    })
    .await;
    let _ = next_report(&mut newer_events).await;
    let (addr, newest) = (first.addr, first.fake.clone());
    first.stop().await;
    // It tries the stale central (a Hello) and leaves it: no report, no
    // quota taken from it.
    assert!(matches!(next(&mut older_events).await, Event::Hello(_)));
    tokio::time::sleep(Duration::from_millis(4 * u64::from(SLOT_MS))).await;
    let s = handle.status();
    assert!(!(s.connected && s.endpoint == stale.url()), "{s:?}");
    while let Ok(e) = older_events.try_recv() {
        assert!(matches!(e, Event::Hello(_)), "no report to epoch 3: {e:?}");
    }
    // The newer leader back: followed again.
    let back = FakeServer::start(addr, newest).await;
    within("back with the newer leader", || {
        let s = handle.status();
        s.connected && s.endpoint == back.url()
    })
    .await;
    back.stop().await;
    stale.stop().await;
}

#[tokio::test]
async fn unreachable_central_buffers_and_fallback_decides() {
    // A port with nothing behind it.
    let addr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let store = store();
    let front = store.service("front");
    let req = front.resource("requests").unwrap();
    let handle = reporter(&store, &[format!("http://{addr}")]);
    within("reports buffered", || handle.status().buffered >= 3).await;
    assert!(!handle.status().connected);
    assert!(
        !front
            .admit("alice", &[(req, 1)], Fallback::Deny)
            .decision
            .is_allowed()
    );
    assert!(
        front
            .admit("alice", &[(req, 1)], Fallback::Allow)
            .decision
            .is_allowed()
    );
    let (f, mut events) = fake(None);
    let server = FakeServer::start(addr, f).await;
    assert!(matches!(next(&mut events).await, Event::Hello(_)));
    within("drained", || handle.status().buffered == 0).await;
    server.stop().await;
}

#[tokio::test]
async fn builder_refuses_bad_settings() {
    let store = store();
    assert!(Reporter::builder(&store, "n").spawn().is_err());
    assert!(
        Reporter::builder(&store, "")
            .central("http://127.0.0.1:1")
            .spawn()
            .is_err()
    );
    assert!(
        Reporter::builder(&store, "n")
            .central("not a uri")
            .spawn()
            .is_err()
    );
    // 100 ms slots: the central assigns at 50 ms.
    let late = Reporter::builder(&store, "n")
        .central("http://127.0.0.1:1")
        .report_delay(Duration::from_millis(10))
        .report_spread(Duration::from_millis(40))
        .spawn();
    assert_eq!(
        late.err(),
        Some(ReporterError::ReportsPastMidSlot {
            delay: Duration::from_millis(10),
            spread: Duration::from_millis(40),
            half_slot: Duration::from_millis(50),
        })
    );
    assert!(
        Reporter::builder(&store, "n")
            .central("http://127.0.0.1:1")
            .report_delay(Duration::from_millis(10))
            .report_spread(Duration::from_millis(39))
            .spawn()
            .is_ok()
    );
}

#[tokio::test]
async fn a_service_registered_after_connecting_is_announced_at_once() {
    let (f, mut events) = fake(None);
    let server = FakeServer::start("127.0.0.1:0".parse().unwrap(), f).await;
    let store = store();
    store.service("front");
    let _reporter = reporter(&store, &[server.url()]);
    match next(&mut events).await {
        Event::Hello(h) => assert_eq!(h.services, vec!["front".to_string()]),
        e => panic!("expected Hello, got {e:?}"),
    }
    // A layer built after the reporter was spawned.
    back_is_announced_within(&store, &mut events, Duration::from_millis(500)).await;
    server.stop().await;
}

/// Registers service `back` beside `front` and expects a Hello naming both
/// within `within`.
async fn back_is_announced_within(
    store: &SlotStore,
    events: &mut mpsc::UnboundedReceiver<Event>,
    within: Duration,
) {
    store.service("back");
    let hello = tokio::time::timeout(within, next_hello(events))
        .await
        .unwrap_or_else(|_| panic!("no new Hello within {within:?}"));
    assert_eq!(
        hello.services,
        vec!["front".to_string(), "back".to_string()]
    );
}

/// The next Hello, past any reports.
async fn next_hello(rx: &mut mpsc::UnboundedReceiver<Event>) -> v1::Hello {
    loop {
        if let Event::Hello(h) = next(rx).await {
            return h;
        }
    }
}

/// A service registered long after the stream opened is announced at
/// once: the store tells the reporter, which then neither waits for its
/// next report (a minute away with these slots) nor needs to poll.
#[tokio::test]
async fn a_service_registered_later_is_announced_without_waiting_for_a_report() {
    let (f, mut events) = fake(None);
    let server = FakeServer::start("127.0.0.1:0".parse().unwrap(), f).await;
    let store = SlotStore::builder()
        .slot(SlotLength::from_ms(60_000).unwrap())
        .build();
    store.service("front");
    let _reporter = reporter(&store, &[server.url()]);
    assert_eq!(
        next_hello(&mut events).await.services,
        vec!["front".to_string()]
    );
    // Past the shortest life of a stream closed to announce a service.
    tokio::time::sleep(Duration::from_millis(300)).await;
    back_is_announced_within(&store, &mut events, Duration::from_secs(2)).await;
    server.stop().await;
}

/// A central that answers a Hello with a Welcome, then sends `messages` as
/// they are: encodings a prost-built central could not send.
#[derive(Clone)]
struct RawSender {
    messages: Vec<bytes::Bytes>,
}

#[tonic::async_trait]
impl throttle_proto::wire::server::central_server::Central for RawSender {
    type ExchangeStream = ReceiverStream<Result<throttle_proto::wire::Outbound, Status>>;

    async fn exchange(
        &self,
        request: Request<Streaming<throttle_proto::wire::Inbound>>,
    ) -> Result<Response<Self::ExchangeStream>, Status> {
        use throttle_proto::wire::{Inbound, Outbound};
        let (tx, rx) = mpsc::channel(64);
        let mut inbound = request.into_inner();
        let messages = self.messages.clone();
        tokio::spawn(async move {
            while let Ok(Some(m)) = inbound.message().await {
                if let Inbound::Hello(_) = m {
                    let w = central_message::Kind::Welcome(v1::Welcome {
                        slot_ms: SLOT_MS,
                        epoch: 1,
                        accepts: Vec::new(),
                        incarnation: 0,
                    });
                    let _ = tx
                        .send(Ok(Outbound::Message(v1::CentralMessage { kind: Some(w) })))
                        .await;
                    for m in &messages {
                        let _ = tx.send(Ok(Outbound::Encoded(m.clone()))).await;
                    }
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

/// A `CentralMessage` holding a quota of these bytes.
fn quota_bytes(quota: &[u8]) -> bytes::Bytes {
    let mut out = vec![0x12];
    prost::encoding::encode_varint(quota.len() as u64, &mut out);
    out.extend_from_slice(quota);
    out.into()
}

#[tokio::test]
async fn a_malformed_quota_is_ignored_and_the_stream_goes_on() {
    use prost::Message;
    let store = store();
    let front = store.service("front");
    front.resource("requests").unwrap();
    let now = store.current_slot();
    let table = |slot: i64| match quota_message("front", slot, &[("bob", 3.0)], None).kind {
        Some(central_message::Kind::Quota(q)) => q.encode_to_vec(),
        _ => unreachable!(),
    };
    let (a, b, c) = (now + 5, now + 6, now + 7);
    let messages = vec![
        // A services entry that claims 5 bytes and has none.
        quota_bytes(&[0x0a, 0x05]),
        // The same service twice: prost keeps the last table only, and so
        // must the node.
        quota_bytes(&[table(a), table(b)].concat()),
        // Then a whole one.
        quota_bytes(&table(c)),
    ];
    let (url, task) = raw_central(messages);
    let handle = reporter(&store, &[url]);
    within("the whole quota applied", || front.has_quota(c)).await;
    assert!(front.has_quota(b), "the repeated service's last table");
    assert!(
        !front.has_quota(a),
        "the repeated service's first table, which prost drops"
    );
    let status = handle.status();
    assert_eq!(
        status.quotas_received, 2,
        "the malformed one is not counted"
    );
    assert_eq!(status.connections, 1, "the stream went on");
    task.abort();
}

/// Serves `messages` (after a Welcome) from a central on 127.0.0.1.
/// A quota as the central writes it (the encoded `CentralMessage`): for
/// each of `slots`, a packed table of service front where bob may make 3
/// requests, then `refs` as (slot, from slot) of front.
fn central_quota(slots: &[i64], refs: &[(i64, i64)]) -> bytes::Bytes {
    let mut q = throttle_proto::wire::QuotaEncoder::new();
    for &slot in slots {
        q.begin_packed("front", slot);
        q.user("bob", [("requests", 3.0)]);
    }
    for &(slot, from_slot) in refs {
        q.refer("front", slot, from_slot);
    }
    q.finish(None)
}

fn raw_central(messages: Vec<bytes::Bytes>) -> (String, tokio::task::JoinHandle<()>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let listener = tokio::net::TcpListener::from_std(listener).unwrap();
    let server = tonic::transport::Server::builder()
        .add_service(
            throttle_proto::wire::server::central_server::CentralServer::new(RawSender {
                messages,
            }),
        )
        .serve_with_incoming(TcpListenerStream::new(listener));
    let task = tokio::spawn(async move {
        let _ = server.await;
    });
    (url, task)
}

#[tokio::test]
async fn packed_quotas_are_installed_and_a_bad_one_is_ignored() {
    use prost::Message;
    let store = store();
    let front = store.service("front");
    front.resource("requests").unwrap();
    let now = store.current_slot();
    let (a, b, c, d, e) = (now + 5, now + 6, now + 7, now + 8, now + 9);
    let mut short = match v1::CentralMessage::decode(&central_quota(&[d], &[])[..])
        .unwrap()
        .kind
    {
        Some(central_message::Kind::Quota(q)) => q,
        other => panic!("{other:?}"),
    };
    short.packed[0].amounts.clear();
    let messages = vec![
        central_quota(&[a], &[]),
        // Bits for one amount, and none: nothing of it is installed.
        quota_bytes(&short.encode_to_vec()),
        // One service for two slots: two tables, read in place.
        central_quota(&[b, c], &[]),
        // The same table twice: read by prost, then unpacked.
        central_quota(&[e, e], &[]),
    ];
    let (url, task) = raw_central(messages);
    let handle = reporter(&store, &[url]);
    within("the packed quotas applied", || front.has_quota(e)).await;
    assert!(front.has_quota(a) && front.has_quota(b) && front.has_quota(c));
    assert!(!front.has_quota(d), "the table with too few amounts");
    assert_eq!(
        handle.status().quotas_received,
        3,
        "the bad one is not counted"
    );
    assert_eq!(handle.status().connections, 1, "the stream went on");
    task.abort();
}

/// Refs on the stream: one to a table the node received installs it for
/// its slot; one to a table it never received installs nothing, and the
/// stream goes on.
#[tokio::test]
async fn quota_refs_install_the_tables_they_name() {
    let store = store();
    let front = store.service("front");
    front.resource("requests").unwrap();
    let now = store.current_slot();
    let messages = vec![
        central_quota(&[now + 1], &[]),
        // now + 1 was received: now + 2 takes its table.
        central_quota(&[], &[(now + 2, now + 1)]),
        // now + 4 never was: nothing for now + 3.
        central_quota(&[], &[(now + 3, now + 4)]),
        // The stream goes on.
        central_quota(&[], &[(now + 5, now + 2)]),
    ];
    let (url, task) = raw_central(messages);
    let handle = reporter(&store, &[url]);
    within("the refs applied", || front.has_quota(now + 5)).await;
    assert!(front.has_quota(now + 2));
    assert!(!front.has_quota(now + 3), "a ref to a table never received");
    assert_eq!(handle.status().connections, 1, "the stream went on");
    task.abort();
}

#[tokio::test]
async fn a_quota_over_tonics_default_4_mib_is_installed() {
    use prost::Message;
    let store = store();
    let front = store.service("front");
    front.resource("requests").unwrap();
    let slot = store.current_slot() + 5;
    // 200,000 users of one resource: a table of about 8 MB, as a node of
    // that many active users receives every slot.
    let users: Vec<(String, f64)> = (0..200_000)
        .map(|u| (format!("user-{u:06}"), 5.0))
        .collect();
    let users: Vec<(&str, f64)> = users.iter().map(|(u, q)| (u.as_str(), *q)).collect();
    let quota = match quota_message("front", slot, &users, None).kind {
        Some(central_message::Kind::Quota(q)) => q.encode_to_vec(),
        _ => unreachable!(),
    };
    assert!(quota.len() > 4 << 20, "{} bytes", quota.len());
    let (url, task) = raw_central(vec![quota_bytes(&quota)]);
    let handle = reporter(&store, &[url]);
    within("the large quota applied", || front.has_quota(slot)).await;
    assert_eq!(handle.status().connections, 1, "one stream, never failed");
    assert_eq!(store.service("front").users(), 200_000);
    task.abort();
}
