//! The attacks of an outsider who can reach a central, replayed against
//! the `throttle-central` program on 127.0.0.1: none locks a user out, none
//! balloons its memory, none stalls enforcement.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use throttle_clock::{Clock, SlotLength, SystemClock};
use throttle_proto::v1::central_client::CentralClient;
use throttle_proto::v1::{self, central_message, node_message};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

mod common;

const SLOT_MS: u32 = 1000;

/// The program, running with alice limited to 150 requests a second (burst
/// 2 s); stopped when dropped.
struct Program {
    child: Child,
    grpc: SocketAddr,
    http: SocketAddr,
    _dir: std::path::PathBuf,
}

impl Drop for Program {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The address logged after `field=` on `line`.
fn addr_after(line: &str, field: &str) -> Option<SocketAddr> {
    let rest = line.split(field).nth(1)?;
    let end = rest.find([' ', ')']).unwrap_or(rest.len());
    rest[..end].parse().ok()
}

fn start(test: &str) -> Program {
    start_with(test, &[])
}

/// [`start`], with `extra` flags.
fn start_with(test: &str, extra: &[&str]) -> Program {
    let dir = std::env::temp_dir().join(format!("throttle-attacks-{test}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let limits = dir.join("limits.toml");
    std::fs::write(
        &limits,
        "[[limit]]\nservice = \"front\"\nuser = \"alice\"\nper_second = { requests = 150 }\nburst_seconds = 2\n",
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_throttle-central"))
        .args(["--listen", "127.0.0.1:0", "--http", "127.0.0.1:0"])
        .arg("--limits")
        .arg(&limits)
        .args(extra)
        .env("THROTTLE_CENTRAL_LOG", "warn,throttle_central=info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary runs");
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let (mut grpc, mut http) = (None, None);
    while grpc.is_none() || http.is_none() {
        let line = lines.next().expect("logs its addresses").unwrap();
        grpc = grpc.or_else(|| addr_after(&line, "grpc_addr="));
        http = http.or_else(|| addr_after(&line, "http_addr="));
    }
    // Keep reading its log, so that it never blocks on a full pipe.
    std::thread::spawn(move || lines.map_while(Result::ok).for_each(drop));
    Program {
        child,
        grpc: grpc.unwrap(),
        http: http.unwrap(),
        _dir: dir,
    }
}

impl Program {
    /// Resident memory, in MB.
    fn rss_mb(&self) -> f64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let kb: f64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap();
        kb / 1024.0
    }

    async fn get(&self, path: &str) -> (u16, String) {
        let (status, _, body) = get(self.http, path).await;
        (status, body)
    }

    /// alice's bucket level, as the monitor shows it.
    async fn alice_level(&self) -> f64 {
        let (_, body) = self.get("/v1/monitor/distribution?user=alice").await;
        let json: serde_json::Value = serde_json::from_str(&body).unwrap();
        json["front"]["alice"]["requests"]["bucket"]["level"]
            .as_f64()
            .unwrap()
    }
}

/// `GET path`: the status, the head and the body.
async fn get(http: SocketAddr, path: &str) -> (u16, String, String) {
    let answer = common::get(http, path).await;
    (answer.status, answer.head, answer.body)
}

/// The path of the `Link` to the next page in `head`, if any.
fn next_page(head: &str) -> Option<String> {
    let link = head.lines().find_map(|l| l.strip_prefix("link: "))?;
    Some(link.strip_prefix('<')?.split_once('>')?.0.to_owned())
}

fn hello(node_id: &str, services: Vec<String>) -> v1::NodeMessage {
    v1::NodeMessage {
        kind: Some(node_message::Kind::Hello(v1::Hello {
            node_id: node_id.into(),
            slot_ms: SLOT_MS,
            services,
            version: "attacker".into(),
            accepts: Vec::new(),
            resumes: false,
            report_every_ms: 0,
        })),
    }
}

fn current_slot() -> i64 {
    SlotLength::from_ms(SLOT_MS)
        .unwrap()
        .slot_at(SystemClock.now_ms())
}

/// A report of `users` (name, requests) in service `front`.
fn report(node_id: &str, slot: i64, users: impl Iterator<Item = (String, i64)>) -> v1::NodeMessage {
    let users = users
        .map(|(u, n)| {
            (
                u,
                v1::Amounts {
                    resources: [("requests".to_owned(), n)].into(),
                },
            )
        })
        .collect();
    let usage = v1::Usage { users };
    v1::NodeMessage {
        kind: Some(node_message::Kind::Report(v1::Report {
            node_id: node_id.into(),
            slot_number: slot,
            consumption: [("front".to_owned(), usage)].into(),
            rejection: Default::default(),
            packed: Vec::new(),
            answered: false,
        })),
    }
}

/// A node stream that sends `messages`; what came back, until the answer
/// to a report, the stream's end or `within`.
async fn exchange(
    addr: SocketAddr,
    messages: Vec<v1::NodeMessage>,
    within: Duration,
) -> (Vec<central_message::Kind>, Option<tonic::Status>) {
    let mut client = CentralClient::connect(format!("http://{addr}"))
        .await
        .unwrap()
        .max_encoding_message_size(256 << 20);
    let (tx, rx) = mpsc::channel(messages.len().max(1));
    for m in messages {
        tx.send(m).await.unwrap();
    }
    let mut got = Vec::new();
    let inbound = client.exchange(ReceiverStream::new(rx)).await;
    let mut inbound = match inbound {
        Ok(r) => r.into_inner(),
        Err(status) => return (got, Some(status)),
    };
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, inbound.message()).await {
            Ok(Ok(Some(m))) => {
                let answer = matches!(&m.kind, Some(central_message::Kind::Quota(q)) if q.report_slot.is_some());
                got.extend(m.kind);
                if answer {
                    return (got, None);
                }
            }
            Ok(Ok(None)) | Err(_) => return (got, None),
            Ok(Err(status)) => return (got, Some(status)),
        }
    }
}

/// The longest of 20 `/connections` answers, 50 ms apart.
async fn worst_connections(central: &Program) -> Duration {
    let mut worst = Duration::ZERO;
    for _ in 0..20 {
        let asked = Instant::now();
        let (status, _) = central.get("/v1/monitor/connections").await;
        assert_eq!(status, 200);
        worst = worst.max(asked.elapsed());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    worst
}

fn quotas(got: &[central_message::Kind]) -> usize {
    got.iter()
        .filter(|k| matches!(k, central_message::Kind::Quota(_)))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn absurd_reports_cannot_lock_a_user_out() {
    let central = start("lockout");
    let slot = current_slot();
    let huge = [("alice".to_owned(), i64::MAX)].into_iter();
    let (_, status) = exchange(
        central.grpc,
        vec![
            hello("evil", vec!["front".into()]),
            report("evil", slot, huge),
        ],
        Duration::from_millis(500),
    )
    .await;
    assert!(status.is_none(), "the stream goes on: {status:?}");
    // Another node's 5,000 (the same node's for the same slot would be a
    // duplicate, dropped), of a slot after the central began (it charges
    // the slots before only out of what its buckets hold): charged, down
    // to the debt floor and no deeper.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let flood = [("alice".to_owned(), 5_000)].into_iter();
    let (_, status) = exchange(
        central.grpc,
        vec![
            hello("evil-2", vec!["front".into()]),
            report("evil-2", current_slot(), flood),
        ],
        Duration::from_millis(500),
    )
    .await;
    assert!(status.is_none(), "{status:?}");
    let level = central.alice_level().await;
    // max_debt defaults to the burst: 2 s of 150/s. Less than a second of
    // refill since: the level is still below zero.
    assert!(level < 0.0, "the flood was charged: {level}");
    assert!(level >= -300.0, "no deeper than -max_debt: {level}");
    let (_, metrics) = central.get("/metrics").await;
    assert!(
        metrics.contains("throttle_central_dropped_entries_total{reason=\"amount_too_large\"} 1"),
        "{metrics}"
    );
    // A slot not yet begun is refused, the rest of the stream's life goes on.
    let later = [("alice".to_owned(), 1)].into_iter();
    let (_, status) = exchange(
        central.grpc,
        vec![
            hello("evil", vec!["front".into()]),
            report("evil", slot + 59, later),
        ],
        Duration::from_millis(500),
    )
    .await;
    assert_eq!(status.map(|s| s.code()), Some(tonic::Code::InvalidArgument));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_hellos_and_reports_do_not_balloon_memory() {
    let central = start("memory");
    let before = central.rss_mb();
    for round in 0..5 {
        let services = (0..100_000).map(|i| format!("svc-{round}-{i}")).collect();
        let (_, status) = exchange(
            central.grpc,
            vec![hello("evil", services)],
            Duration::from_secs(5),
        )
        .await;
        assert_eq!(status.map(|s| s.code()), Some(tonic::Code::InvalidArgument));
    }
    let users = (0..1_000_001).map(|i| (format!("u{i}"), 1));
    let (_, status) = exchange(
        central.grpc,
        vec![
            hello("evil", vec!["front".into()]),
            report("evil", current_slot(), users),
        ],
        Duration::from_secs(10),
    )
    .await;
    let status = status.expect("refused");
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("users"), "{status:?}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = central.rss_mb();
    println!("RSS {before:.1} MB -> {after:.1} MB");
    assert!(after < 100.0, "RSS {before:.1} MB -> {after:.1} MB");
    let (_, sums) = central.get("/v1/monitor/consumption_sum").await;
    assert!(
        !sums.contains("u999"),
        "nothing of the refused report filed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_monitor_query_over_400k_users_stalls_nothing() {
    let central = start("monitor");
    let slot = current_slot();
    let users = (0..400_000).map(|i| (format!("user-{i:06}"), 1));
    let (got, status) = exchange(
        central.grpc,
        vec![
            hello("big", vec!["front".into()]),
            report("big", slot, users),
        ],
        Duration::from_secs(30),
    )
    .await;
    assert!(status.is_none() && quotas(&got) > 0, "filed: {status:?}");
    let alone = worst_connections(&central).await;
    // One client reads the distribution page after page; another asks
    // for the connections and a node reports, meanwhile.
    let reader = {
        let http = central.http;
        tokio::spawn(async move {
            let first = "/v1/monitor/distribution".to_owned();
            let mut path = Some(first);
            let mut pages = 0;
            while let Some(p) = path.take() {
                let (status, head, _) = get(http, &p).await;
                assert_eq!(status, 200);
                pages += 1;
                path = next_page(&head);
            }
            pages
        })
    };
    let with_reader = worst_connections(&central).await;
    let small = [("alice".to_owned(), 1)].into_iter();
    let asked = Instant::now();
    let (got, _) = exchange(
        central.grpc,
        vec![
            hello("n1", vec!["front".into()]),
            report("n1", current_slot(), small),
        ],
        Duration::from_millis(900),
    )
    .await;
    let pages = reader.await.unwrap();
    assert_eq!(
        pages, 401,
        "400,001 keys (alice's from the limits) in pages of 1,000"
    );
    println!(
        "/connections waited at most {with_reader:?} while {pages} pages were read, {alone:?} before"
    );
    // The ledger's own work (an assign of 400,000 keys each slot) delays
    // `/connections` too: the reader may add at most 100 ms to that.
    let added = with_reader.saturating_sub(alone);
    assert!(
        added < Duration::from_millis(100),
        "/connections waited {with_reader:?} with the reader, {alone:?} without"
    );
    assert!(
        quotas(&got) > 0,
        "quotas arrived within {:?}",
        asked.elapsed()
    );
}

/// The caps are flags: a report of more users than `--max-users-per-report`
/// is refused whole, a service past `--max-services` is not tracked; and
/// `--policy hierarchical` is refused with a word on how to choose it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_caps_are_flags() {
    let args = ["--max-users-per-report", "2", "--max-services", "1"];
    let central = start_with("caps", &args);
    let users = (0..3).map(|i| (format!("u{i}"), 1));
    let (_, status) = exchange(
        central.grpc,
        vec![
            hello("n1", vec!["front".into()]),
            report("n1", current_slot(), users),
        ],
        Duration::from_secs(5),
    )
    .await;
    let status = status.expect("refused");
    assert!(status.message().contains("limit of 2"), "{status:?}");
    let two = (0..2).map(|i| (format!("u{i}"), 1));
    let (_, status) = exchange(
        central.grpc,
        vec![
            hello("n2", vec!["front".into(), "back".into()]),
            report("n2", current_slot(), two),
        ],
        Duration::from_secs(5),
    )
    .await;
    assert!(status.is_none(), "two users are within the cap: {status:?}");
    let (_, metrics) = central.get("/metrics").await;
    assert!(
        metrics.contains("throttle_central_services_at_cap_total 1"),
        "back is past --max-services 1: {metrics}"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_throttle-central"))
        .args(["--policy", "hierarchical"])
        .output()
        .expect("the binary runs");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("capacity"), "{stderr}");
}
