//! The central's side of the stream: reports kept as bytes ([`Inbound`]),
//! quotas sent built or already encoded ([`Outbound`]).

use bytes::{Buf, BufMut, Bytes};
use prost::Message;
use prost::encoding::{DecodeContext, WireType, encode_varint, skip_field};

use super::fields::*;
use super::write::*;
use crate::v1;

/// The central's gRPC service, sending [`Outbound`] messages.
#[cfg(feature = "grpc")]
#[allow(missing_docs, unreachable_pub, missing_debug_implementations)]
pub mod server {
    include!(concat!(env!("OUT_DIR"), "/throttle.v1.Central.rs"));
}

/// One message from the central node to a node: a built message, or the
/// bytes of one already encoded (by [`QuotaEncoder`](super::QuotaEncoder)).
#[derive(Debug, Clone, PartialEq)]
pub enum Outbound {
    /// A message to encode.
    Message(v1::CentralMessage),
    /// The encoding of a [`v1::CentralMessage`].
    Encoded(Bytes),
}

impl Outbound {
    /// The message, decoded if it was sent encoded: what a peer that
    /// translates the central's messages (the legacy and RLQS endpoints)
    /// reads.
    ///
    /// # Errors
    ///
    /// prost's, for encoded bytes that are not a message.
    pub fn into_message(self) -> Result<v1::CentralMessage, prost::DecodeError> {
        match self {
            Self::Message(m) => Ok(m),
            Self::Encoded(bytes) => v1::CentralMessage::decode(bytes),
        }
    }
}

impl From<v1::CentralMessage> for Outbound {
    fn from(m: v1::CentralMessage) -> Self {
        Self::Message(m)
    }
}

impl Message for Outbound {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        match self {
            Self::Message(m) => m.encode_raw(buf),
            Self::Encoded(b) => buf.put_slice(b),
        }
    }

    /// Only ever sent: whatever is decoded into it is skipped.
    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl bytes::Buf,
        ctx: DecodeContext,
    ) -> Result<(), prost::DecodeError> {
        skip_field(wire_type, tag, buf, ctx)
    }

    fn encoded_len(&self) -> usize {
        match self {
            Self::Message(m) => m.encoded_len(),
            Self::Encoded(b) => b.len(),
        }
    }

    fn clear(&mut self) {
        *self = Self::Encoded(Bytes::new());
    }
}

/// One message from a node, as the central node receives it: a
/// [`v1::NodeMessage`](crate::v1::NodeMessage) whose report is kept as bytes (see [`RawReport`](super::RawReport)).
#[derive(Debug, Clone, Default, PartialEq)]
pub enum Inbound {
    /// Neither a hello nor a report (an empty or unknown message).
    #[default]
    Empty,
    /// The stream's first message.
    Hello(v1::Hello),
    /// The encoding of a [`v1::Report`], not decoded yet.
    Report(Bytes),
}

impl Message for Inbound {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        match self {
            Self::Empty => {}
            Self::Hello(h) => prost::encoding::message::encode(NODE_MESSAGE_HELLO, h, buf),
            Self::Report(b) => {
                encode_varint(
                    u64::from(NODE_MESSAGE_REPORT << 3 | WireType::LengthDelimited as u32),
                    buf,
                );
                encode_varint(b.len() as u64, buf);
                buf.put_slice(b);
            }
        }
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), prost::DecodeError> {
        match (tag, wire_type) {
            (NODE_MESSAGE_HELLO, _) => {
                merge_oneof!(self, Self::Hello, wire_type, buf, ctx);
                Ok(())
            }
            (NODE_MESSAGE_REPORT, _) => {
                // Shares the received buffer: no copy.
                let mut report = Bytes::new();
                prost::encoding::bytes::merge(wire_type, &mut report, buf, ctx)?;
                *self = Self::Report(report);
                Ok(())
            }
            _ => skip_field(wire_type, tag, buf, ctx),
        }
    }

    fn encoded_len(&self) -> usize {
        match self {
            Self::Empty => 0,
            Self::Hello(h) => prost::encoding::message::encoded_len(NODE_MESSAGE_HELLO, h),
            Self::Report(b) => delimited_len(NODE_MESSAGE_REPORT, b.len()),
        }
    }

    fn clear(&mut self) {
        *self = Self::Empty;
    }
}

/// Reads a oneof's message kind `$kind` from the wire into `$oneof` (an
/// enum of the kinds): merged into the kind it held if the same
/// ([`merge_kind`]), else read fresh. Returns early with a decode error.
macro_rules! merge_oneof {
    ($oneof:expr, $kind:path, $wire_type:expr, $buf:expr, $ctx:expr) => {{
        let held = match std::mem::take($oneof) {
            $kind(m) => Some(m),
            _ => None,
        };
        *$oneof = $kind(merge_kind(held, $wire_type, $buf, $ctx)?);
    }};
}
pub(super) use merge_oneof;

/// A oneof's message kind read from the wire: merged into the same kind
/// the oneof `held`, as prost merges a message given twice, or else read
/// fresh (the last kind given wins).
pub(super) fn merge_kind<M: Message + Default>(
    held: Option<M>,
    wire_type: WireType,
    buf: &mut impl Buf,
    ctx: DecodeContext,
) -> Result<M, prost::DecodeError> {
    let mut message = held.unwrap_or_default();
    prost::encoding::message::merge(wire_type, &mut message, buf, ctx)?;
    Ok(message)
}
