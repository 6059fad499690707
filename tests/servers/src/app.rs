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
    /// Where it serves HTTP.
    pub addr: SocketAddr,
}

impl AppProcess {
    /// Starts `bin` with `--listen` on a free port and `args`; returns
    /// once it listens.
    pub fn start(bin: &str, args: &[&str]) -> Self {
        let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let child = Command::new(bin)
            .args(["--listen", &addr.to_string()])
            .args(args)
            .stdout(Stdio::null())
            .spawn()
            .expect("the app node's binary runs");
        wait_listening(addr);
        Self {
            child: Some(child),
            addr,
        }
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
