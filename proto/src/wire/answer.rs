//! A node's side of the stream: what the central sends, quotas kept as
//! bytes ([`Answer`]).

use bytes::{Buf, BufMut, Bytes};
use prost::Message;
use prost::encoding::{DecodeContext, WireType, skip_field};

use super::fields::*;
use super::stream::*;
use super::write::*;
use crate::v1;

/// A node's gRPC client of the central, sending [`Inbound`](super::Inbound)
/// messages (reports already encoded) and receiving [`Answer`]s.
#[cfg(feature = "grpc")]
#[allow(missing_docs, unreachable_pub, missing_debug_implementations)]
pub mod client {
    include!(concat!(env!("OUT_DIR"), "/node/throttle.v1.Central.rs"));
}

/// One message from the central node, as a node receives it: a
/// [`v1::CentralMessage`](crate::v1::CentralMessage) whose quota is kept as bytes (see [`RawQuota`](super::RawQuota)).
#[derive(Debug, Clone, Default, PartialEq)]
pub enum Answer {
    /// None of the kinds below (an empty or unknown message).
    #[default]
    Empty,
    /// The stream's first message.
    Welcome(v1::Welcome),
    /// The encoding of a [`v1::Quota`], not decoded yet.
    Quota(Bytes),
    /// This central node is not the leader.
    NotLeader(v1::NotLeader),
    /// The users of a service blocked now.
    Blocks(v1::Blocks),
    /// A service's limits.
    Limits(v1::Limits),
    /// A service's users bound by a longer period.
    Bound(v1::Bound),
}

impl Message for Answer {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        match self {
            Self::Empty => {}
            Self::Welcome(w) => prost::encoding::message::encode(CENTRAL_MESSAGE_WELCOME, w, buf),
            Self::Quota(b) => prost::encoding::bytes::encode(CENTRAL_MESSAGE_QUOTA, b, buf),
            Self::NotLeader(n) => {
                prost::encoding::message::encode(CENTRAL_MESSAGE_NOT_LEADER, n, buf);
            }
            Self::Blocks(b) => prost::encoding::message::encode(CENTRAL_MESSAGE_BLOCKS, b, buf),
            Self::Limits(l) => prost::encoding::message::encode(CENTRAL_MESSAGE_LIMITS, l, buf),
            Self::Bound(b) => prost::encoding::message::encode(CENTRAL_MESSAGE_BOUND, b, buf),
        }
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), prost::DecodeError> {
        // A oneof: the last kind given wins, and a message kind given twice
        // in a row is merged, as prost does.
        match tag {
            CENTRAL_MESSAGE_WELCOME => merge_oneof!(self, Self::Welcome, wire_type, buf, ctx),
            CENTRAL_MESSAGE_QUOTA => {
                let mut quota = Bytes::new();
                // Shares the received buffer: no copy.
                prost::encoding::bytes::merge(wire_type, &mut quota, buf, ctx)?;
                *self = match std::mem::take(self) {
                    // A quota split in parts: its parts' bytes, one after
                    // the other, decode as prost merges them.
                    Self::Quota(first) if !first.is_empty() => {
                        Self::Quota([first, quota].concat().into())
                    }
                    _ => Self::Quota(quota),
                };
            }
            CENTRAL_MESSAGE_NOT_LEADER => merge_oneof!(self, Self::NotLeader, wire_type, buf, ctx),
            CENTRAL_MESSAGE_BLOCKS => merge_oneof!(self, Self::Blocks, wire_type, buf, ctx),
            CENTRAL_MESSAGE_LIMITS => merge_oneof!(self, Self::Limits, wire_type, buf, ctx),
            CENTRAL_MESSAGE_BOUND => merge_oneof!(self, Self::Bound, wire_type, buf, ctx),
            _ => skip_field(wire_type, tag, buf, ctx)?,
        }
        Ok(())
    }

    fn encoded_len(&self) -> usize {
        match self {
            Self::Empty => 0,
            Self::Welcome(w) => prost::encoding::message::encoded_len(CENTRAL_MESSAGE_WELCOME, w),
            Self::Quota(b) => delimited_len(CENTRAL_MESSAGE_QUOTA, b.len()),
            Self::NotLeader(n) => {
                prost::encoding::message::encoded_len(CENTRAL_MESSAGE_NOT_LEADER, n)
            }
            Self::Blocks(b) => prost::encoding::message::encoded_len(CENTRAL_MESSAGE_BLOCKS, b),
            Self::Limits(l) => prost::encoding::message::encoded_len(CENTRAL_MESSAGE_LIMITS, l),
            Self::Bound(b) => prost::encoding::message::encoded_len(CENTRAL_MESSAGE_BOUND, b),
        }
    }

    fn clear(&mut self) {
        *self = Self::Empty;
    }
}
