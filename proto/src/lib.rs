//! Wire protocol v1 of throttle.
//!
//! App nodes and the central node talk over one gRPC bidirectional stream,
//! [`v1::central_client::CentralClient::exchange`]: the node sends a
//! [`v1::Hello`] and then one [`v1::Report`] per slot; the central node answers
//! [`v1::Welcome`], then a [`v1::Quota`] for every report and whenever it has
//! assigned new quotas.
//!
//! Besides the generated code this crate holds what both sides must agree on:
//!
//! - [`slot`]: slot arithmetic and the injectable [`slot::Clock`];
//! - [`legacy`]: the JSON documents of the original system and their lossless
//!   conversion to and from the protobuf messages.
//!
//! # Examples
//!
//! ```
//! use throttle_proto::v1::{node_message, Hello, NodeMessage};
//!
//! let hello = NodeMessage {
//!     kind: Some(node_message::Kind::Hello(Hello {
//!         node_id: "00163e0069ec".into(),
//!         slot_ms: 1000,
//!         services: vec!["front".into()],
//!         version: env!("CARGO_PKG_VERSION").into(),
//!     })),
//! };
//! assert!(matches!(hello.kind, Some(node_message::Kind::Hello(_))));
//! ```

pub mod legacy;
pub mod slot;
pub mod wire;

/// Generated messages, client and server of package `throttle.v1`.
#[allow(missing_docs, unreachable_pub, missing_debug_implementations)]
pub mod v1 {
    tonic::include_proto!("throttle.v1");
}

/// Longest service, user, resource or node name accepted, in bytes.
pub const MAX_NAME_LEN: usize = 256;

/// The largest `f32` not above `x`: how quotas are kept in `f32`s, by the
/// central's grants and the nodes' quota rows, so that rounding never
/// grants more than was computed.
pub fn f32_at_most(x: f64) -> f32 {
    let f = x as f32;
    if f64::from(f) > x { f.next_down() } else { f }
}

/// The crate version, sent in [`v1::Hello::version`].
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
