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
//! - `server`: the ledger's task and the node streams, which only move
//!   data in and out; the HTTP monitor (`http`) asks it and renders JSON;
//! - `assigner`: what to answer a report, what to push and when, and
//!   how quotas are written onto the wire (`assigner::render`);
//! - `ledger`: files the reports, keeps each service's book of
//!   assignments, its checkpoints and the monitor's answers, and asks the
//!   service's policy to assign;
//! - `policy`: how a service's tokens are split between nodes;
//! - `arena`: what policies read, each service's keys (user, resource)
//!   with their buckets, distribution and per-slot sums;
//! - `bucket`, [`limits`]: the token bucket and where limits come from;
//!   [`state`]: where checkpoints are kept; `atomic_file`: a file replaced
//!   whole (the limits file's edits, the checkpoint file).
//!
//! Everything from the assigner down is plain synchronous code with an
//! injected clock.

//! Embedding a central needs [`Central::builder`] and the modules of
//! what it is given: [`limits`], [`state`], [`keys`], [`net`],
//! [`leadership`] and [`election`], [`usage`]; [`telemetry`] names its
//! metrics. The rest (the ledger, the policies, the assigner, the
//! streams) is the crate's own; the `internals` feature opens it to the
//! simulator and the benches, with no promise of stability.

/// Declares the crate's own modules: public only under the `internals`
/// feature.
macro_rules! internal {
    ($($name:ident;)*) => {$(
        #[cfg(feature = "internals")]
        pub mod $name;
        #[cfg(not(feature = "internals"))]
        #[allow(dead_code, unreachable_pub, unused_imports)]
        mod $name;
    )*};
}

// What policies read, public through `ledger` and `policy`.
#[cfg_attr(
    not(feature = "internals"),
    allow(dead_code, unreachable_pub, unused_imports)
)]
mod arena;
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
pub mod state;
pub mod telemetry;
pub mod usage;
mod watched;

internal! {
    assigner;
    bucket;
    ledger;
    policy;
    rlqs;
    server;
}

pub use central::{Central, CentralBuilder, LEDGER_THREAD, RunningCentral};
pub use ledger::{MAX_AMOUNT, MAX_KEYS, Page, SlotRange};
pub use rlqs::{DEFAULT_TTL as DEFAULT_RLQS_TTL, MAX_TTL as MAX_RLQS_TTL, MIN_TTL as MIN_RLQS_TTL};
pub use server::Subject;
