//! [`World`]: the processes a live case runs and the faults it applies to
//! them.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use throttle_test_servers::{AppProcess, CentralProcess, Etcd, Relay, free_port, until};

use super::binaries::Binaries;
use super::case::{Case, Fault};
use crate::sim::{Comeback, NodeFaultKind};

/// The test that starts etcd for a leader failover, as it skips or fails
/// without it.
const TEST: &str = "the_promise_holds_over_random_cases_with_the_real_binaries";

/// The centrals, the nodes and, between each node and each central, a
/// relay a fault cuts. A case with a leader failover or an etcd fault
/// runs the high availability setup of `docs/guides/operations.md` (two
/// centrals with `--etcd --advertise --limits FILE --state etcd`, the
/// nodes listing both) where etcd is on `PATH`; any other, one central.
pub(super) struct World {
    /// One, or two on etcd.
    pub(super) centrals: Vec<CentralProcess>,
    /// The example nodes, in the case's order.
    pub(super) nodes: Vec<AppProcess>,
    /// Per node, one relay per central.
    relays: Vec<Vec<Relay>>,
    /// The central a failover killed, to start again as a standby.
    killed: Option<usize>,
    etcd: Option<Etcd>,
}

impl World {
    /// Starts the centrals of `case` (its limits file at `limits`, a
    /// checkpoint beside it) and its nodes, and waits for every node to
    /// be on the one that leads.
    ///
    /// # Panics
    ///
    /// If a process does not start, or the nodes do not connect in 10 s.
    pub(super) fn start(case: &Case, bins: &Binaries, limits: &Path) -> Self {
        let failover = (case.faults.iter())
            .any(|f| f.kind() == "leader failover" || matches!(f, Fault::Etcd { .. }));
        let etcd = if failover { Etcd::start(TEST) } else { None };
        let limits = limits.display().to_string();
        let centrals = match &etcd {
            Some(etcd) => pair(bins, &etcd.url(), &limits),
            None => vec![one(case, bins, &limits)],
        };
        let relays: Vec<Vec<Relay>> = (0..case.nodes)
            .map(|_| {
                (centrals.iter())
                    .map(|c| Relay::to(SocketAddr::from(([127, 0, 0, 1], c.grpc))))
                    .collect()
            })
            .collect();
        let nodes = (relays.iter().enumerate())
            .map(|(i, r)| {
                let urls: Vec<String> = r.iter().map(Relay::url).collect();
                AppProcess::node(&bins.node, &format!("node-{i}"), &urls)
            })
            .collect();
        let world = Self {
            centrals,
            nodes,
            relays,
            killed: None,
            etcd,
        };
        until(Duration::from_secs(10), "the nodes on the leader", || {
            (world.leader()).is_some_and(|l| world.centrals[l].streams().len() == case.nodes)
        });
        world
    }

    /// The central that leads (the only one, alone).
    fn leader(&self) -> Option<usize> {
        match self.centrals.len() {
            1 => Some(0),
            _ => (0..self.centrals.len())
                .find(|&i| self.centrals[i].role().as_deref() == Some("leader")),
        }
    }

    /// Begins `fault` (`down`) or ends it. A central cut off is stopped
    /// (`SIGSTOP`) and continued; one restarted is killed and started
    /// again; in a pair, the leader is killed and started again as a
    /// standby. etcd is stopped and continued, or killed and started
    /// again. A node restarted is killed and started again; one cut off
    /// has its relays cut and mended.
    pub(super) fn apply(&mut self, fault: &Fault, down: bool) {
        match *fault {
            Fault::Central { comeback, .. } => self.central(comeback, down),
            Fault::Etcd { killed, .. } => {
                if let Some(etcd) = &mut self.etcd {
                    match (killed, down) {
                        (false, true) => etcd.signal("STOP"),
                        (false, false) => etcd.signal("CONT"),
                        (true, true) => etcd.kill(),
                        (true, false) => etcd.restart(),
                    }
                }
            }
            Fault::Node { node, kind, .. } => match (kind, down) {
                (NodeFaultKind::Cut, true) => self.relays[node].iter().for_each(Relay::cut),
                (NodeFaultKind::Cut, false) => self.relays[node].iter().for_each(Relay::mend),
                (NodeFaultKind::Restart, true) => self.nodes[node].kill(),
                (NodeFaultKind::Restart, false) => self.nodes[node].restart(),
            },
        }
    }

    /// A central fault begun (`down`) or ended.
    fn central(&mut self, comeback: Comeback, down: bool) {
        if self.centrals.len() > 1 {
            match (down, self.killed.take()) {
                (true, _) => {
                    self.killed = self.leader();
                    if let Some(l) = self.killed {
                        self.centrals[l].kill();
                    }
                }
                (false, Some(l)) => self.centrals[l].restart(),
                (false, None) => {}
            }
            return;
        }
        let central = &mut self.centrals[0];
        match (comeback, down) {
            (Comeback::Same, true) => central.signal("STOP"),
            (Comeback::Same, false) => central.signal("CONT"),
            (_, true) => central.kill(),
            (_, false) => central.restart(),
        }
    }
}

/// One central on `limits`, with `--state FILE` beside it where a fault
/// restarts it on its checkpoint.
fn one(case: &Case, bins: &Binaries, limits: &str) -> CentralProcess {
    let mut args = vec!["--limits".to_owned(), limits.to_owned()];
    let state = case.faults.iter().any(|f| {
        matches!(
            f,
            Fault::Central {
                comeback: Comeback::Checkpoint { .. },
                ..
            }
        )
    });
    if state {
        let file = Path::new(limits).with_file_name("checkpoint");
        args.extend(["--state".to_owned(), file.display().to_string()]);
    }
    CentralProcess::start(&bins.central, &args)
}

/// Two centrals on the etcd at `etcd`, as the operations guide sets them.
fn pair(bins: &Binaries, etcd: &str, limits: &str) -> Vec<CentralProcess> {
    let ports = [free_port(), free_port()];
    (ports.iter())
        .map(|&port| {
            let advertise = format!("http://127.0.0.1:{port}");
            let args = ["--etcd", etcd, "--advertise", &advertise];
            let more = ["--limits", limits, "--state", "etcd"];
            let args: Vec<String> = args.iter().chain(&more).map(|s| s.to_string()).collect();
            CentralProcess::start_on(&bins.central, port, &args)
        })
        .collect()
}
