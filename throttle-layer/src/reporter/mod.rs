//! The reporter: the node's one stream to the central node.
//!
//! A Tokio task that
//!
//! - holds one `Exchange` stream: `Hello`, then at every slot boundary +
//!   50 ms the report of the slot that just ended, written straight from the
//!   store ([`SlotStore::collect_encoded`](crate::SlotStore::collect_encoded)); with
//!   [`ReporterBuilder::report_spread`] each node of a fleet sends at its
//!   own moment of a window after that instead, so that the central node
//!   does not meet every report of the fleet at once;
//! - installs every `Quota` as soon as it arrives, answers and pushes alike,
//!   read where it arrived ([`SlotStore::apply_raw_quota`](crate::SlotStore::apply_raw_quota)); a quota that is
//!   not valid protobuf is logged, counted and ignored, and the stream goes
//!   on;
//! - knows several central endpoints: it sticks to the one that works,
//!   follows `NotLeader { leader }`, and otherwise tries the next, with
//!   exponential backoff and jitter (100 ms up to 5 s);
//! - keeps its last reports (60 slots at most) and sends the unanswered
//!   ones again, in order, after reconnecting, so a short outage loses no
//!   consumption; to a central whose ledger is new (`Welcome.incarnation`
//!   changed: a new leader, a restart) it sends the answered ones too,
//!   marked `answered`, so the new ledger gets back the kept history's
//!   sums. The central node ignores a report it has already filed.
//!
//! While no quota arrives for the current slot, each layer's
//! [`Fallback`](crate::Fallback) decides.
//!
//! Metrics: `throttle_reporter_connected` (gauge), `throttle_report_rtt_seconds`
//! (histogram), `throttle_reports_buffered` (gauge),
//! `throttle_reports_dropped_total`, `throttle_reporter_connect_failures_total`,
//! `throttle_quotas_malformed_total`.

mod builder;
mod dial;
mod error;
mod handle;
mod repeats;
mod run;
mod settings;
mod status;
mod stream;

#[cfg(test)]
mod tests;

pub use builder::{Reporter, ReporterBuilder, report_point};
pub use error::ReporterError;
pub use handle::ReporterHandle;
pub use status::ReporterStatus;
