//! The central node of throttle.
//!
//! App nodes report, once per slot, what each user consumed and how many of
//! their requests were refused; the central node charges those amounts to one
//! token bucket per (service, user, resource) and sends every node its share
//! of what is left, as the quota of a coming slot.
//!
//! - [`bucket`], [`ledger`], [`policy`], [`limits`], [`assigner`]: the
//!   decision logic, plain synchronous code with an injected clock;
//! - [`server`]: the gRPC `Exchange` stream, the assigner timer and the HTTP
//!   monitor, which only move data in and out of the ledger.

pub mod assigner;
pub mod bucket;
pub mod leadership;
pub mod ledger;
pub mod limits;
pub mod policy;
pub mod server;

mod http;

pub use server::{Central, CentralBuilder, LEDGER_THREAD, RunningCentral, Subject};
