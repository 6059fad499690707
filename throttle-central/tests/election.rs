//! Leader election on a real etcd between real `throttle-central`
//! processes, with a real node's reporter following the leader: one
//! leads, a killed leader's standby takes over, a stopped leader is
//! deposed and never leads beside another.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use throttle_layer::{Reporter, SlotStore};
use throttle_test_servers::{Etcd, free_port, wait_listening};

/// A `throttle-central` process in election `test` on `etcd`.
struct Central {
    child: Child,
    grpc: u16,
    http: SocketAddr,
}

impl Central {
    fn start(etcd: &Etcd) -> Self {
        let (grpc, http) = (free_port(), free_port());
        let child = Command::new(env!("CARGO_BIN_EXE_throttle-central"))
            .args(["--listen", &format!("127.0.0.1:{grpc}")])
            .args(["--http", &format!("127.0.0.1:{http}")])
            .args(["--slot-ms", "200", "--election", "test"])
            .args(["--etcd", &etcd.url()])
            .args(["--advertise", &format!("http://127.0.0.1:{grpc}")])
            .env("THROTTLE_CENTRAL_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("the binary runs");
        let http = SocketAddr::from(([127, 0, 0, 1], http));
        wait_listening(http);
        Self { child, grpc, http }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.grpc)
    }

    /// `/healthz`, or `None` if it does not answer within 80 ms (a
    /// stopped process).
    fn health(&self) -> Option<Value> {
        let wait = Duration::from_millis(80);
        let mut s = TcpStream::connect_timeout(&self.http, wait).ok()?;
        s.set_read_timeout(Some(wait)).ok()?;
        s.write_all(b"GET /healthz HTTP/1.0\r\n\r\n").ok()?;
        let mut text = String::new();
        s.read_to_string(&mut text).ok()?;
        serde_json::from_str(text.split("\r\n\r\n").nth(1)?).ok()
    }

    fn leads(&self) -> bool {
        self.health().is_some_and(|h| h["leader"] == true)
    }

    fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .args([&format!("-{name}"), &self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success());
    }
}

impl Drop for Central {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Polls `f` every 50 ms until it holds, up to `within`; how long it took.
fn until(within: Duration, what: &str, mut f: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < within, "{what}: not within {within:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    start.elapsed()
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
