//! Leader election on a real etcd between real `throttle-central`
//! processes, with a real node's reporter following the leader: one
//! leads, a killed leader's standby takes over, a stopped leader is
//! deposed and never leads beside another.

use std::time::{Duration, Instant};

use serde_json::Value;
use throttle_layer::{Reporter, SlotStore};
use throttle_test_servers::{CentralProcess, Etcd, until};

/// A `throttle-central` process in election `test` on `etcd`.
struct Central(CentralProcess);

impl Central {
    fn start(etcd: &Etcd) -> Self {
        let grpc = throttle_test_servers::free_port();
        let args = [
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
        Self(CentralProcess::start_on(
            env!("CARGO_BIN_EXE_throttle-central"),
            grpc,
            &args,
        ))
    }

    fn url(&self) -> String {
        self.0.url()
    }

    /// `/healthz`, or `None` if it does not answer within 80 ms (a
    /// stopped process).
    fn health(&self) -> Option<Value> {
        let body = self.0.get("/healthz", Duration::from_millis(80))?;
        serde_json::from_str(&body).ok()
    }

    fn leads(&self) -> bool {
        self.health().is_some_and(|h| h["leader"] == true)
    }

    fn signal(&self, name: &str) {
        self.0.signal(name);
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
