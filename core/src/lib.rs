//! The decision core of throttle's central node: plain synchronous code
//! with an injected clock, no runtime, no network.
//!
//! App nodes report, once per slot, what each user consumed and how many
//! of their requests were refused; the [`ledger`] charges those amounts to
//! one token bucket per (service, user, resource) and a service's
//! [`policy`] splits what is left between its nodes, as the quotas of a
//! coming slot. The [`assigner`] decides what to answer a report and what
//! to push and when, and writes quotas onto the wire. `throttle-central`
//! runs all of it on one thread fed by its node streams; the simulator
//! (`throttle-tests`) runs the same code through minutes of virtual time.
//!
//! The modules, from the ground up:
//!
//! - [`bucket`]: the token bucket, which may go into debt;
//! - [`limits`]: the limits model: rules per user and period, blocks,
//!   hierarchies, the TOML form ([`toml_text`]) and [`LimitSource`](limits::LimitSource),
//!   what the central's sources (a file, an etcd key) implement;
//! - `arena` (private, read through [`ledger`] and [`policy`]): each
//!   service's keys (user, resource) with their buckets, distribution
//!   and per-slot sums;
//! - [`policy`]: how a service's tokens are split between nodes;
//! - [`ledger`]: files the reports, keeps each service's book of
//!   assignments, its checkpoints and the monitor's answers;
//! - [`assigner`]: what to answer a report, what to push and when;
//! - [`usage_tap`]: where filed reports leave for the usage store;
//! - [`Published`], [`log`]: a value read again and again, and log lines
//!   cut short and rate-limited.
//!
//! # Examples
//!
//! ```
//! use throttle_core::ledger::{Ledger, LedgerConfig};
//! use throttle_core::limits::{LimitSet, LimitSource, StaticLimits};
//!
//! let set = LimitSet::from_toml(r#"
//! [[limit]]
//! service = "front"
//! user = "alice"
//! per_second = { requests = 100 }
//! "#)?;
//! let source = StaticLimits::new(set);
//! let mut ledger = Ledger::new(LedgerConfig::default());
//! ledger.apply_limits("front", &source.list_limits("front"), 10_000);
//! assert_eq!(ledger.bucket_level("front", "alice", "requests", 10_000), Some(100.0));
//! # Ok::<(), throttle_core::limits::LimitsError>(())
//! ```

mod arena;
pub mod assigner;
pub mod bucket;
pub mod ledger;
pub mod limits;
pub mod log;
pub mod policy;
mod published;
pub mod toml_text;
pub mod usage_tap;

pub use published::Published;
