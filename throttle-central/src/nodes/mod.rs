//! The three node protocols, side by side, each translated to and from the
//! ledger's reports and quotas:
//!
//! - `grpc`: the library's own stream (`throttle.v1.Central`), which the
//!   layer's reporter speaks;
//! - [`rlqs`]: Envoy's Rate Limit Quota Service;
//! - `legacy`: the nginx nodes' HTTP protocol.
//!
//! None of them decides anything: each hands what it read to the ledger's
//! task (`crate::ledger_task`) and writes back what it is given.

pub(crate) mod grpc;
pub(crate) mod legacy;
pub mod rlqs;
