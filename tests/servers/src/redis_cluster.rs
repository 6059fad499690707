//! A Redis Cluster of three primaries, each with a replica, from
//! `redis-server` and `redis-cli` on `PATH`.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::{TempDir, available, free_port, kill, listening_unless_exited, until};

/// Primaries, each with one replica.
const PRIMARIES: usize = 3;

/// Six `redis-server`s in cluster mode on ephemeral 127.0.0.1 ports (their
/// bus ports too), no persistence, a node timeout of 500 ms: a replica
/// takes over about a second after its primary dies.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<ClusterNode>,
    _dir: TempDir,
}

#[derive(Debug)]
struct ClusterNode {
    child: Option<Child>,
    port: u16,
}

impl RedisCluster {
    /// Starts one and waits until every slot is served, or `None`
    /// (skipped) if `redis-server` or `redis-cli` is missing.
    pub fn start(test: &str) -> Option<Self> {
        if !available("redis-server", test) || !available("redis-cli", test) {
            return None;
        }
        let dir = TempDir::new("redis-cluster");
        let nodes = (0..PRIMARIES * 2)
            .map(|i| ClusterNode::start(&dir.path().join(i.to_string())))
            .collect::<Vec<_>>();
        let cluster = Self { nodes, _dir: dir };
        let addrs: Vec<String> = cluster
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let created = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("redis-cli runs");
        assert!(created.success(), "redis-cli --cluster create failed");
        until(
            Duration::from_secs(20),
            "the cluster serves every slot",
            || {
                cluster
                    .nodes
                    .iter()
                    .all(|n| n.cli(&["cluster", "info"]).contains("cluster_state:ok"))
            },
        );
        Some(cluster)
    }

    /// `redis://127.0.0.1:PORT` of every node.
    pub fn urls(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|n| format!("redis://127.0.0.1:{}", n.port))
            .collect()
    }

    /// Kills (SIGKILL) the primary that serves `key`; its replica takes
    /// over once the others see it gone.
    pub fn kill_primary_of(&mut self, key: &str) {
        let slot = self.nodes[0].cli(&["cluster", "keyslot", key]);
        let slot: u16 = slot.trim().parse().expect("a hash slot");
        let port = self.primary_port(slot).expect("a primary serves the slot");
        if let Some(n) = self.nodes.iter_mut().find(|n| n.port == port) {
            kill(&mut n.child);
        }
    }

    /// Kills (SIGKILL) a primary that holds a key; false if none does.
    pub fn kill_a_primary_with_keys(&mut self) -> bool {
        let holder = self.nodes.iter_mut().find(|n| {
            n.child.is_some()
                && n.cli(&["role"]).starts_with("master")
                && n.cli(&["dbsize"])
                    .trim()
                    .parse::<u64>()
                    .is_ok_and(|k| k > 0)
        });
        match holder {
            Some(n) => {
                kill(&mut n.child);
                true
            }
            None => false,
        }
    }

    /// Whether a live node sees a node failed and every slot served: a
    /// replica took over from a killed primary.
    pub fn failed_over(&self) -> bool {
        let Some(live) = self.nodes.iter().find(|n| n.child.is_some()) else {
            return false;
        };
        let failed = live.cli(&["cluster", "nodes"]).lines().any(|l| {
            l.split_whitespace()
                .nth(2)
                .is_some_and(|flags| flags.split(',').any(|f| f == "fail"))
        });
        failed && live.cli(&["cluster", "info"]).contains("cluster_state:ok")
    }

    /// Whether a live primary serves `key` again, as a live node sees it.
    pub fn serves(&self, key: &str) -> bool {
        let Some(live) = self.nodes.iter().find(|n| n.child.is_some()) else {
            return false;
        };
        let slot: Option<u16> = live.cli(&["cluster", "keyslot", key]).trim().parse().ok();
        let port = slot.and_then(|s| self.primary_port(s));
        port.is_some_and(|p| self.nodes.iter().any(|n| n.port == p && n.child.is_some()))
            && live.cli(&["cluster", "info"]).contains("cluster_state:ok")
    }

    /// The port of the primary that a live node says serves `slot`.
    fn primary_port(&self, slot: u16) -> Option<u16> {
        let live = self.nodes.iter().find(|n| n.child.is_some())?;
        live.cli(&["cluster", "nodes"]).lines().find_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let primary = fields.get(2)?.contains("master") && !fields[2].contains("fail");
            let serves = fields.iter().skip(8).any(|range| {
                let mut ends = range.split('-').map(str::parse::<u16>);
                match (ends.next(), ends.next()) {
                    (Some(Ok(a)), Some(Ok(b))) => (a..=b).contains(&slot),
                    (Some(Ok(a)), None) => a == slot,
                    _ => false,
                }
            });
            let port = fields.get(1)?.split([':', '@']).nth(1)?.parse().ok()?;
            (primary && serves).then_some(port)
        })
    }
}

impl ClusterNode {
    /// Starts one with its data in `dir` and waits until it listens. A
    /// port the kernel called free can be taken before the server binds it
    /// (by a test running beside this one), so a server that exits first
    /// is started again on other ports, up to five times.
    fn start(dir: &Path) -> Self {
        std::fs::create_dir_all(dir).expect("node directory");
        for _ in 0..5 {
            let (port, bus) = (free_port(), free_port());
            let mut child = Some(spawn_node(dir, port, bus));
            let addr = SocketAddr::from(([127, 0, 0, 1], port));
            if listening_unless_exited(addr, &mut child) {
                return Self { child, port };
            }
        }
        panic!("no redis-server of the cluster listened in five tries")
    }

    /// What `redis-cli` prints for `args` sent to this node ("" if it
    /// cannot run).
    fn cli(&self, args: &[&str]) -> String {
        Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(args)
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        for n in &mut self.nodes {
            kill(&mut n.child);
        }
    }
}

/// A `redis-server` in cluster mode on `port` and bus port `bus`.
fn spawn_node(dir: &Path, port: u16, bus: u16) -> Child {
    Command::new("redis-server")
        .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
        .args([
            "--cluster-enabled",
            "yes",
            "--cluster-port",
            &bus.to_string(),
        ])
        .args(["--cluster-node-timeout", "500"])
        .args(["--cluster-config-file", "nodes.conf"])
        // A replica takes over however long ago it last heard from its
        // primary (the default refuses past about 15 s, which a quiet test
        // cluster reaches).
        .args(["--cluster-replica-validity-factor", "0"])
        .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
        .arg("--dir")
        .arg(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server starts")
}
