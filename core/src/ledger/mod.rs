//! What the central node knows: buckets, distribution, per-slot sums, quotas.
//!
//! The [`Ledger`] is plain synchronous code driven by the caller's clock: the
//! gRPC server feeds it reports and timer ticks, the simulator feeds it the
//! same from virtual time. Per (service, user, resource) it keeps
//!
//! - the [`Bucket`](crate::bucket::Bucket), when the user has a limit for that resource;
//! - the *distribution*: per node, the latest `{slot, consumption, rejection}`;
//! - the per-slot sums of consumption and rejection (`nr_slot` slots).
//!
//! Slots in the ledger are *data* slots: a report sent at the start of slot
//! `S` carries slot `S - 1`, and that is the slot its amounts are filed under.
//!
//! # Examples
//!
//! ```
//! use throttle_core::ledger::{Ledger, LedgerConfig};
//! use throttle_core::limits::Limit;
//! use throttle_proto::legacy;
//!
//! let mut ledger = Ledger::new(LedgerConfig::default());
//! let limit = Limit {
//!     user: "alice".into(),
//!     per_second: [("requests".into(), 100.0)].into(),
//!     burst_seconds: 10.0,
//!     ..Limit::default()
//! };
//! ledger.apply_limits("front", &[limit], 10_000);
//! let report = legacy::report_from_json(
//!     r#"{"node_id": "n1", "slot_number": 10, "consumption": {"front": {"alice": {"requests": 40}}}, "rejection": {"front": {}}}"#,
//! )?;
//! ledger.ingest(&report, 10_050).unwrap();
//! assert_eq!(ledger.bucket_level("front", "alice", "requests", 10_050), Some(60.0 + 5.0));
//! # Ok::<(), throttle_proto::legacy::LegacyError>(())
//! ```

//!
//! The files, over the arena (`arena/`: keys, buckets, sums)
//! and from the ground floor up:
//!
//! - `source`: [`ReportSource`], the reports the ledger can file;
//! - `config`: [`LedgerConfig`] and the check of a whole report;
//! - `checkpoint`: [`Ledger::checkpoint`] and [`Ledger::restore`], the
//!   levels a new ledger cannot rebuild from reports sent again;
//! - `filing`: a report's usages filed into a service's state;
//! - `gaps`: a proxy's unreported slots, charged when it is back;
//! - `catch_up`: grants held after a restore until the nodes' kept
//!   reports are filed;
//! - `ingested`: [`Ingested`], what filing a report did;
//! - `dropped`: entries of a report left out, counted per reason;
//! - `page`: monitor answers a page at a time;
//! - `json`: the monitor's pages as the legacy monitor's JSON;
//! - `bound`: the keys a longer period binds, for the nodes' refusals;
//! - `told`: what the nodes are told of a service's limits (the default
//!   quota for users new to a node, every rule's allowances, the pool
//!   for newcomers);
//! - `service`: one service's state, policy and book of assignments;
//! - `views`: the rows of monitor answers;
//! - `monitor`: [`Monitor`], the monitor's questions, a page at a time;
//! - `top`: the heaviest users of each resource, slot by slot;
//! - `ledger`: the [`Ledger`] itself.

mod bound;
mod catch_up;
mod checkpoint;
mod config;
mod dropped;
mod filing;
mod gaps;
mod ingested;
pub mod json;
#[allow(clippy::module_inception)]
mod ledger;
mod monitor;
mod page;
mod service;
mod source;
mod told;
mod top;
mod views;

#[cfg(test)]
pub(crate) mod tests;

pub use crate::arena::valid_name;
pub use crate::arena::{Cuts, Key, KeyId, Map, NodeId, NodeUsage, ServiceState};
pub use bound::MAX_BOUND_KEYS;
pub use catch_up::hold_ms;
pub use checkpoint::{CheckpointError, Restoration};
pub use config::{LedgerConfig, MAX_AMOUNT, MAX_KEYS, ReportError};
pub use dropped::{DROPPED_EXAMPLES, DropReason, Dropped};
pub use ingested::Ingested;
pub use ledger::Ledger;
pub use monitor::Monitor;
pub use page::{Cursor, Page, Paged, ServiceRows};
pub use service::PolicyFactory;
pub use source::{FromNode, OwnedReport, ReportSource};
pub use told::MAX_TOLD_USERS;
pub use top::{RankBy, TopUsers, UserSeries};
pub use views::{BucketView, KeyView, NodeEntry, QuotaRow, QuotaSlot, SlotRange, SumRow};
