//! A `throttle-central` process, for the tests that run the binary itself
//! (its path is `env!("CARGO_BIN_EXE_throttle-central")` in the central's
//! own tests): killed with SIGKILL on drop, started again on the same
//! ports and arguments by [`CentralProcess::restart`].

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::free_port;

/// A running `throttle-central` on ephemeral ports of 127.0.0.1.
#[derive(Debug)]
pub struct CentralProcess {
    bin: PathBuf,
    args: Vec<String>,
    child: Option<Child>,
    /// Its gRPC port.
    pub grpc: u16,
    /// Its HTTP address.
    pub http: SocketAddr,
}

impl CentralProcess {
    /// Starts `bin` with `--listen`, `--http` on free ports and `args`;
    /// returns once its HTTP port listens.
    pub fn start(bin: &str, args: &[String]) -> Self {
        Self::start_on(bin, free_port(), args)
    }

    /// [`CentralProcess::start`] with its gRPC on `grpc` (a port the
    /// arguments name, as `--advertise` does).
    pub fn start_on(bin: &str, grpc: u16, args: &[String]) -> Self {
        let mut central = Self {
            bin: bin.into(),
            args: args.to_vec(),
            child: None,
            grpc,
            http: SocketAddr::from(([127, 0, 0, 1], free_port())),
        };
        central.restart();
        central
    }

    /// Starts it again, on the same ports with the same arguments (after
    /// [`CentralProcess::kill`]).
    pub fn restart(&mut self) {
        // `THROTTLE_TEST_CENTRAL_LOG=info` shows its logs among the test's.
        let log = std::env::var("THROTTLE_TEST_CENTRAL_LOG").ok();
        let stderr = match log {
            Some(_) => Stdio::inherit(),
            None => Stdio::null(),
        };
        let child = Command::new(&self.bin)
            .args(["--listen", &format!("127.0.0.1:{}", self.grpc)])
            .args(["--http", &self.http.to_string()])
            .args(&self.args)
            .env("THROTTLE_CENTRAL_LOG", log.as_deref().unwrap_or("warn"))
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("the central's binary runs");
        self.child = Some(child);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while TcpStream::connect_timeout(&self.http, Duration::from_millis(100)).is_err() {
            let exited = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten());
            if let Some(status) = exited {
                panic!(
                    "throttle-central {:?} exited ({status}) before listening on {}",
                    self.args, self.http
                );
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{} never listened",
                self.http
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Its gRPC address as nodes dial it.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.grpc)
    }

    /// The body of `GET path`, or `None` if it does not answer within
    /// `wait` (a stopped or killed process).
    pub fn get(&self, path: &str, wait: Duration) -> Option<String> {
        let mut s = TcpStream::connect_timeout(&self.http, wait).ok()?;
        s.set_read_timeout(Some(wait)).ok()?;
        write!(s, "GET {path} HTTP/1.0\r\n\r\n").ok()?;
        let mut text = String::new();
        s.read_to_string(&mut text).ok()?;
        text.split_once("\r\n\r\n").map(|(_, body)| body.to_owned())
    }

    /// The status of `PUT path` with an empty JSON object, or `None` if
    /// it does not answer within a second.
    pub fn put(&self, path: &str) -> Option<u16> {
        let wait = Duration::from_secs(1);
        let mut s = TcpStream::connect_timeout(&self.http, wait).ok()?;
        s.set_read_timeout(Some(wait)).ok()?;
        let head = "Content-Type: application/json\r\nContent-Length: 2";
        write!(s, "PUT {path} HTTP/1.0\r\n{head}\r\n\r\n{{}}").ok()?;
        let mut text = String::new();
        s.read_to_string(&mut text).ok()?;
        text.split(' ').nth(1)?.parse().ok()
    }

    /// The role its `/healthz` names (`leader`, `standby`, `single`), or
    /// `None` when it does not answer within 300 ms.
    pub fn role(&self) -> Option<String> {
        let body = self.get("/healthz", Duration::from_millis(300))?;
        let health: serde_json::Value = serde_json::from_str(&body).ok()?;
        health["role"].as_str().map(str::to_owned)
    }

    /// The node ids with a stream open on it (none when it does not
    /// answer within 300 ms).
    pub fn streams(&self) -> Vec<String> {
        let body = self.get("/v1/monitor/connections", Duration::from_millis(300));
        let json: serde_json::Value = body
            .and_then(|b| serde_json::from_str(&b).ok())
            .unwrap_or_default();
        let streams = json["connections"].as_array().cloned().unwrap_or_default();
        streams
            .iter()
            .filter_map(|s| s["node_id"].as_str().map(str::to_owned))
            .collect()
    }

    /// Sends signal `name` (`STOP`, `CONT`...) to the process.
    pub fn signal(&self, name: &str) {
        if let Some(child) = &self.child {
            crate::signal(child, name);
        }
    }

    /// `kill -9`, and waits for the process to be gone.
    pub fn kill(&mut self) {
        crate::kill(&mut self.child);
    }
}

impl Drop for CentralProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The `throttle-central` binary beside `node_bin` (another binary of the
/// same build, such as `env!("CARGO_BIN_EXE_axum-node")`), which `cargo
/// test --workspace` builds; `None` (`test` is skipped, saying why) if it
/// was not built, a failure under `THROTTLE_REQUIRE_SERVERS=1`.
pub fn central_beside(node_bin: &str, test: &str) -> Option<String> {
    let bin = PathBuf::from(node_bin).with_file_name("throttle-central");
    if bin.exists() {
        return bin.to_str().map(str::to_owned);
    }
    let why = format!("{} not built: run `cargo test --workspace`", bin.display());
    assert!(
        std::env::var_os("THROTTLE_REQUIRE_SERVERS").is_none(),
        "{test}: {why}"
    );
    eprintln!("SKIPPED {test}: {why}");
    None
}
