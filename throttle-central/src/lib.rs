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
//! - [`assigner`]: what to answer a report, what to push and when, and
//!   how quotas are written onto the wire (`assigner::render`);
//! - [`ledger`]: files the reports, keeps each service's book of
//!   assignments, its checkpoints and the monitor's answers, and asks the
//!   service's policy to assign;
//! - [`policy`]: how a service's tokens are split between nodes;
//! - `arena`: what policies read, each service's keys (user, resource)
//!   with their buckets, distribution and per-slot sums;
//! - [`bucket`], [`limits`]: the token bucket and where limits come from;
//!   [`state`]: where checkpoints are kept; `atomic_file`: a file replaced
//!   whole (the limits file's edits, the checkpoint file).
//!
//! Everything from the assigner down is plain synchronous code with an
//! injected clock.

mod arena;
pub mod assigner;
mod atomic_file;
pub mod bucket;
mod central;
pub mod election;
mod http;
pub mod keys;
pub mod leadership;
pub mod ledger;
mod legacy;
pub mod limits;
mod log;
pub mod net;
pub mod policy;
mod rlqs;
pub mod server;
pub mod state;
pub mod telemetry;
pub mod usage;
pub mod watched;

pub use central::{Central, CentralBuilder, LEDGER_THREAD, RunningCentral};
pub use rlqs::{DEFAULT_TTL as DEFAULT_RLQS_TTL, MAX_TTL as MAX_RLQS_TTL, MIN_TTL as MIN_RLQS_TTL};
pub use server::Subject;
