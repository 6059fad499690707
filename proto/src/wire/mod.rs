//! Both sides of the stream, encoded and read without building messages.
//!
//! A [`v1::Quota`](crate::v1::Quota) for a node with 1,000 users is 4,000 map entries. Built
//! as prost messages, each user and resource name is a `String` in a
//! `BTreeMap`, all allocated, sorted, measured four times over (prost
//! recomputes the length of every nested map at each level) and freed again,
//! for every answer and every push. [`QuotaEncoder`] writes the same bytes
//! straight from borrowed names, and [`Outbound`] carries them to the stream
//! as they are. They decode as an ordinary [`v1::CentralMessage`](crate::v1::CentralMessage); a node
//! reads them where they arrived ([`Answer`], [`RawQuota`]), in either form
//! ([`QuotaEncoder::begin_packed`] writes a [`v1::PackedQuota`](crate::v1::PackedQuota)).
//!
//! The other way, a [`v1::Report`](crate::v1::Report) of 1,000 users decoded by prost is 5,000
//! `String`s and as many map nodes. [`Inbound`] keeps a report's bytes as
//! they arrived, and [`RawReport`] checks them once, listing the amounts and
//! keeping the names in one checked string, from which filing reads them.
//!
//! A node writes its reports with [`ReportEncoder`], byte for byte as prost
//! would, without building a [`v1::Report`](crate::v1::Report).
//!
//! [`server`] is the central's gRPC service, generated like the one in
//! [`v1`](crate::v1) but receiving [`Inbound`] and sending [`Outbound`]; [`client`] is
//! a node's, sending [`Inbound`] and receiving [`Answer`].
//!
//! # Examples
//!
//! ```
//! use prost::Message;
//! use throttle_proto::v1::{self, central_message};
//! use throttle_proto::wire::QuotaEncoder;
//!
//! let mut q = QuotaEncoder::new();
//! q.begin("front", 12);
//! q.user("alice", [("requests", 40.0), ("bytes_down", 1e6)]);
//! let bytes = q.finish(Some(11));
//!
//! let msg = v1::CentralMessage::decode(&bytes[..])?;
//! let Some(central_message::Kind::Quota(quota)) = msg.kind else { panic!() };
//! assert_eq!(quota.report_slot, Some(11));
//! assert_eq!(quota.services["front"].slots[&12].users["alice"].resources["requests"], 40.0);
//! # Ok::<(), prost::DecodeError>(())
//! ```

mod answer;
pub mod fields;
pub(crate) mod quota_encoder;
mod raw_quota;
mod raw_report;
mod read;
mod report_encoder;
mod stream;
mod write;

#[cfg(test)]
mod node_tests;
#[cfg(test)]
mod tests;

pub use answer::Answer;
#[cfg(feature = "grpc")]
pub use answer::client;
pub use quota_encoder::QuotaEncoder;
pub use raw_quota::{QuotaResources, QuotaUsers, RawQuota, RawQuotaError};
pub use raw_report::{RawAmounts, RawReport, RawUsers};
pub use read::RawReportError;
pub use report_encoder::{
    ReportEncoder, UnpackError, UsageEncoder, packed_report, unpacked_report,
};
#[cfg(feature = "grpc")]
pub use stream::server;
pub use stream::{Inbound, Outbound};
