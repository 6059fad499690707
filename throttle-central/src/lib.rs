//! The central node of throttle.
//!
//! App nodes report, once per slot, what each user consumed and how many of
//! their requests were refused; the central node charges those amounts to one
//! token bucket per (service, user, resource) and sends every node its share
//! of what is left, as the quota of a coming slot.
//!
//! The modules, by role:
//!
//! - [`Central`] (`central.rs`): wires the gRPC server, the ledger's task,
//!   the timers and the HTTP monitor together;
//! - [`ledger_task`]: the task that owns the ledger, the commands it is
//!   sent and its timers; everything else only moves data to and from it;
//! - [`nodes`]: the three node protocols side by side (the library's gRPC
//!   stream, Envoy's RLQS, the nginx nodes' legacy HTTP), translated to
//!   and from the ledger's reports and quotas;
//! - [`ha`]: the election on etcd, the leadership the central reads, and
//!   where the leader's checkpoints are kept;
//! - `http` (the monitor, admin API and dashboard) and [`usage`] (the
//!   accounting store): the operator's surfaces;
//! - [`net`]: how connections reach the servers (the caps, the deadline
//!   for a node's first stream, TLS);
//! - [`limits`]: the core's limits model, and where limits come from (a
//!   file, an etcd key); `atomic_file`: a file replaced whole (the limits
//!   file's edits, the checkpoint file).
//!
//! The decisions themselves (the token buckets, the ledger, the policies,
//! the assigner) are the [`throttle_core`] crate: plain synchronous code
//! with an injected clock, which the simulator runs too.
//!
//! Embedding a central needs [`Central::builder`] and the modules of
//! what it is given: [`limits`], [`ha`], [`keys`], [`net`], [`usage`];
//! [`telemetry`] names its metrics.

mod atomic_file;
mod central;
/// A client of etcd's v3 API (package `etcdserverpb`), as much of it as
/// the central uses: leases, ranges, puts, deletes, transactions and
/// watches. Generated from `etcd/etcd.proto` without `protoc`.
#[allow(missing_docs, unreachable_pub, missing_debug_implementations)]
pub mod etcd_api {
    tonic::include_proto!("etcdserverpb");
}
pub mod ha;
mod http;
pub mod keys;
pub mod ledger_task;
pub mod limits;
mod log;
pub mod net;
pub mod nodes;
pub mod telemetry;
pub mod usage;
mod watched;

// The core's modules under the paths the central's own code names them by.
use throttle_core::{assigner, ledger, policy};

pub use central::{Central, CentralBuilder, LEDGER_THREAD, RunningCentral};
pub use ledger::{MAX_AMOUNT, MAX_KEYS, Page, SlotRange};
pub use ledger_task::Subject;
pub use nodes::rlqs::{
    DEFAULT_TTL as DEFAULT_RLQS_TTL, MAX_TTL as MAX_RLQS_TTL, MIN_TTL as MIN_RLQS_TTL,
};
