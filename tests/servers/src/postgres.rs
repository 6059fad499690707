//! A PostgreSQL server for the tests ([`Postgres`]): `initdb` in a
//! temporary directory, `postgres` on an ephemeral 127.0.0.1 port.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::{TempDir, free_port, until, wait_listening};

/// Where Debian's `postgresql` package puts the binaries, one directory
/// per major version.
const DEBIAN_DIR: &str = "/usr/lib/postgresql";

/// A PostgreSQL cluster of one database, `postgres`, trusting local
/// connections, with no fsync (the tests kill processes, not machines).
/// As root (CI), its processes run as `nobody`: PostgreSQL refuses root.
#[derive(Debug)]
pub struct Postgres {
    bin: PathBuf,
    child: Option<Child>,
    port: u16,
    dir: TempDir,
    as_nobody: bool,
    /// More `-c name=value` settings for `postgres`.
    settings: Vec<String>,
}

/// The directory holding `postgres` and `initdb`: on `PATH`, else the
/// newest of Debian's.
fn bin_dir() -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .find(|d| d.join("postgres").is_file() && d.join("initdb").is_file())
    });
    on_path.or_else(|| {
        let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir(DEBIAN_DIR)
            .ok()?
            .filter_map(|e| {
                let e = e.ok()?;
                let version = e.file_name().to_str()?.parse().ok()?;
                Some((version, e.path().join("bin")))
            })
            .filter(|(_, bin)| bin.join("postgres").is_file())
            .collect();
        versions.sort();
        versions.pop().map(|(_, bin)| bin)
    })
}

fn is_root() -> bool {
    let out = Command::new("id").arg("-u").output();
    out.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

impl Postgres {
    /// Starts one, or `None` (skipped, saying why) when the binaries are
    /// missing; under `THROTTLE_REQUIRE_SERVERS=1` that fails instead.
    pub fn start(test: &str) -> Option<Self> {
        let Some(bin) = bin_dir() else {
            let why = format!("no postgres on PATH or in {DEBIAN_DIR}");
            crate::missing(test, &why, "apt-get install postgresql");
            return None;
        };
        let mut pg = Self {
            bin,
            child: None,
            port: free_port(),
            dir: TempDir::new("postgres"),
            as_nobody: is_root(),
            settings: Vec::new(),
        };
        if pg.as_nobody {
            let status = Command::new("chown")
                .args(["-R", "nobody:nogroup"])
                .arg(pg.dir.path())
                .status()
                .expect("chown runs");
            assert!(status.success(), "chown of the data directory");
        }
        let status = pg
            .command("initdb")
            .arg("-D")
            .arg(pg.data())
            .args(["-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("initdb runs");
        assert!(status.success(), "initdb");
        pg.restart();
        Some(pg)
    }

    /// [`Postgres::start`] taking TLS connections only, with `cert_pem`
    /// and `key_pem` (a connection without TLS is rejected).
    pub fn start_tls(test: &str, cert_pem: &str, key_pem: &str) -> Option<Self> {
        let mut pg = Self::start(test)?;
        pg.stop();
        let (cert, key) = (pg.dir().join("server.crt"), pg.dir().join("server.key"));
        std::fs::write(&cert, cert_pem).expect("certificate written");
        std::fs::write(&key, key_pem).expect("key written");
        let hba = pg.data().join("pg_hba.conf");
        let rules = std::fs::read_to_string(&hba).expect("pg_hba.conf");
        std::fs::write(&hba, format!("hostnossl all all all reject\n{rules}"))
            .expect("pg_hba.conf written");
        if pg.as_nobody {
            let status = Command::new("chown")
                .args(["nobody:nogroup"])
                .args([&cert, &key])
                .status()
                .expect("chown runs");
            assert!(status.success(), "chown of the certificate");
        }
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).expect("key mode");
        pg.settings = vec![
            "ssl=on".into(),
            format!("ssl_cert_file={}", cert.display()),
            format!("ssl_key_file={}", key.display()),
        ];
        pg.restart();
        Some(pg)
    }

    /// `binary` of the cluster's directory, run as `nobody` under root.
    fn command(&self, binary: &str) -> Command {
        let path = self.bin.join(binary);
        if self.as_nobody {
            let mut c = Command::new("setpriv");
            c.args(["--reuid=nobody", "--regid=nogroup", "--clear-groups"])
                .arg(path);
            c
        } else {
            Command::new(path)
        }
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// `postgres://postgres@127.0.0.1:PORT/postgres`.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Stops it at once (an immediate shutdown: connections drop, the
    /// port refuses), its data left on disk.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            crate::signal(&child, "QUIT");
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port and data (after
    /// [`Postgres::stop`]); returns once it takes connections.
    pub fn restart(&mut self) {
        self.stop();
        let child = self
            .command("postgres")
            .arg("-D")
            .arg(self.data())
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .arg("-k")
            .arg(self.dir())
            .args(["-c", "fsync=off", "-c", "full_page_writes=off"])
            .args(self.settings.iter().flat_map(|s| ["-c", s.as_str()]))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("postgres starts");
        self.child = Some(child);
        wait_listening(SocketAddr::from(([127, 0, 0, 1], self.port)));
        // The postmaster writes its status last in its pid file: "ready"
        // once it takes connections.
        let pid_file = self.data().join("postmaster.pid");
        until(Duration::from_secs(20), "postgres ready", || {
            std::fs::read_to_string(&pid_file).is_ok_and(|t| t.lines().any(|l| l.trim() == "ready"))
        });
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        self.stop();
    }
}
