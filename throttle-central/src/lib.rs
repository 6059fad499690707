//! The central node of throttle.
//!
//! App nodes report, once per slot, what each user consumed and how many of
//! their requests were refused; the central node charges those amounts to one
//! token bucket per (service, user, resource) and sends every node its share
//! of what is left, as the quota of a coming slot.
//!
//! The modules, from the shells down:
//!
//! - [`Central`] (`central.rs`): wires the gRPC server, the ledger's task,
//!   the timers and the HTTP monitor together;
//! - [`net`]: how connections reach the two servers (the caps, the
//!   deadline for a node's first stream, TLS);
//! - [`server`]: the ledger's task and the node streams, which only move
//!   data in and out; the HTTP monitor (`http`) asks it and renders JSON;
//! - [`rlqs`] and `legacy`: Envoy's and the legacy nodes' protocols,
//!   translated to and from the ledger's reports and quotas;
//! - [`limits`]: the core's limits model, and where limits come from (a
//!   file, an etcd key); [`state`]: where checkpoints are kept;
//!   `atomic_file`: a file replaced whole (the limits file's edits, the
//!   checkpoint file).
//!
//! The decisions themselves (the token buckets, the ledger, the policies,
//! the assigner) are the [`throttle_core`] crate: plain synchronous code
//! with an injected clock, which the simulator runs too.
//!
//! Embedding a central needs [`Central::builder`] and the modules of
//! what it is given: [`limits`], [`state`], [`keys`], [`net`],
//! [`leadership`] and [`election`], [`usage`]; [`telemetry`] names its
//! metrics.

mod atomic_file;
mod central;
pub mod election;
/// A client of etcd's v3 API (package `etcdserverpb`), as much of it as
/// the central uses: leases, ranges, puts, deletes, transactions and
/// watches. Generated from `etcd/etcd.proto` without `protoc`.
#[allow(missing_docs, unreachable_pub, missing_debug_implementations)]
pub mod etcd_api {
    tonic::include_proto!("etcdserverpb");
}
mod http;
pub mod keys;
pub mod leadership;
mod legacy;
pub mod limits;
mod log;
pub mod net;
pub mod rlqs;
pub mod server;
pub mod state;
pub mod telemetry;
pub mod usage;
mod watched;

// The core's modules under the paths the central's own code names them by.
use throttle_core::{assigner, ledger, policy};

pub use central::{Central, CentralBuilder, LEDGER_THREAD, RunningCentral};
pub use ledger::{MAX_AMOUNT, MAX_KEYS, Page, SlotRange};
pub use rlqs::{DEFAULT_TTL as DEFAULT_RLQS_TTL, MAX_TTL as MAX_RLQS_TTL, MIN_TTL as MIN_RLQS_TTL};
pub use server::Subject;
