//! An app node of ours as a process (`axum-node`, whose path is
//! `env!("CARGO_BIN_EXE_axum-node")` in the examples' tests), killed
//! with SIGKILL on drop.

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};

use crate::{free_port, wait_listening};

/// A running app node on a free port of 127.0.0.1.
#[derive(Debug)]
pub struct AppProcess {
    child: Option<Child>,
    bin: String,
    args: Vec<String>,
    /// Where it serves HTTP.
    pub addr: SocketAddr,
}

impl AppProcess {
    /// Starts `bin` with `--listen` on a free port and `args`; returns
    /// once it listens.
    pub fn start(bin: &str, args: &[&str]) -> Self {
        let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let mut node = Self {
            child: None,
            bin: bin.to_owned(),
            args: args.iter().map(|&a| a.to_owned()).collect(),
            addr,
        };
        node.restart();
        node
    }

    /// Kills it (SIGKILL): what it counted and kept is lost.
    pub fn kill(&mut self) {
        crate::kill(&mut self.child);
    }

    /// Starts it again, killed first if running, on the same address and
    /// flags; returns once it listens.
    pub fn restart(&mut self) {
        self.kill();
        let child = Command::new(&self.bin)
            .args(["--listen", &self.addr.to_string()])
            .args(&self.args)
            .stdout(Stdio::null())
            .spawn()
            .expect("the app node's binary runs");
        self.child = Some(child);
        wait_listening(self.addr);
    }
}

impl AppProcess {
    /// `bin` (an `axum-node`) at its default flags as node `id`, listing
    /// `centrals`, logging warnings only.
    pub fn node(bin: &str, id: &str, centrals: &[String]) -> Self {
        let mut args = vec!["--node-id", id, "--log", "warn"];
        args.extend(centrals.iter().flat_map(|c| ["--central", c.as_str()]));
        Self::start(bin, &args)
    }
}

impl Drop for AppProcess {
    fn drop(&mut self) {
        crate::kill(&mut self.child);
    }
}
