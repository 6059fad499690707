//! The central node's side of the stream, encoded without building messages.
//!
//! A [`v1::Quota`] for a node with 1,000 users is 4,000 map entries. Built
//! as prost messages, each user and resource name is a `String` in a
//! `BTreeMap`, all allocated, sorted, measured four times over (prost
//! recomputes the length of every nested map at each level) and freed again,
//! for every answer and every push. [`QuotaEncoder`] writes the same bytes
//! straight from borrowed names, and [`Outbound`] carries them to the stream
//! as they are. A node decodes them as an ordinary [`v1::CentralMessage`].
//!
//! [`server`] is the central's gRPC service, generated like the one in
//! [`v1`] but sending [`Outbound`] instead of [`v1::CentralMessage`].
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

use bytes::{BufMut, Bytes};
use prost::Message;
use prost::encoding::{DecodeContext, WireType, encode_varint, encoded_len_varint, skip_field};

use crate::v1;

/// The central's gRPC service, sending [`Outbound`] messages.
#[allow(missing_docs, unreachable_pub, missing_debug_implementations)]
pub mod server {
    include!(concat!(env!("OUT_DIR"), "/throttle.v1.Central.rs"));
}

/// One message from the central node to a node: a built message, or the
/// bytes of one already encoded (by [`QuotaEncoder`]).
#[derive(Debug, Clone, PartialEq)]
pub enum Outbound {
    /// A message to encode.
    Message(v1::CentralMessage),
    /// The encoding of a [`v1::CentralMessage`].
    Encoded(Bytes),
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

// Field numbers of `throttle/v1/throttle.proto`; a map entry is a message
// with the key in field 1 and the value in field 2.
const CENTRAL_MESSAGE_QUOTA: u32 = 2;
const QUOTA_SERVICES: u32 = 1;
const QUOTA_REPORT_SLOT: u32 = 2;
/// `ServiceQuota.slots`, `UserQuotas.users` and `ResourceQuotas.resources`.
const MAP_FIELD: u32 = 1;
const ENTRY_KEY: u32 = 1;
const ENTRY_VALUE: u32 = 2;

fn key_len(field: u32) -> usize {
    encoded_len_varint(u64::from(field << 3))
}

fn put_key(buf: &mut Vec<u8>, field: u32, wire_type: WireType) {
    encode_varint(u64::from(field << 3 | wire_type as u32), buf);
}

/// Length of a length-delimited field holding `len` bytes.
fn delimited_len(field: u32, len: usize) -> usize {
    key_len(field) + encoded_len_varint(len as u64) + len
}

fn put_delimited_header(buf: &mut Vec<u8>, field: u32, len: usize) {
    put_key(buf, field, WireType::LengthDelimited);
    encode_varint(len as u64, buf);
}

fn put_str(buf: &mut Vec<u8>, field: u32, s: &str) {
    put_delimited_header(buf, field, s.len());
    buf.extend_from_slice(s.as_bytes());
}

/// Length of one `resources` map entry (name -> double), without its header.
fn resource_entry_len(name: &str) -> usize {
    delimited_len(ENTRY_KEY, name.len()) + key_len(ENTRY_VALUE) + 8
}

/// Writes a [`v1::CentralMessage`] holding a [`v1::Quota`], entry by entry.
///
/// Call [`begin`](Self::begin) for each (service, slot), then
/// [`user`](Self::user) once per user of it, then [`finish`](Self::finish).
/// A service begun twice, or a user given twice within one slot, decodes as
/// the last one written, as with any protobuf map.
#[derive(Debug, Default)]
pub struct QuotaEncoder {
    /// Encoded `services` entries of the services already ended.
    services: Vec<u8>,
    /// The (service, slot) under way and its encoded `users` entries.
    open: Option<(String, i64)>,
    users: Vec<u8>,
}

impl QuotaEncoder {
    /// An empty quota.
    pub fn new() -> Self {
        Self::default()
    }

    /// Starts the quotas of `service` for `slot` (ending the one under way).
    pub fn begin(&mut self, service: &str, slot: i64) {
        self.end();
        self.open = Some((service.to_owned(), slot));
    }

    /// Adds `user`'s quota per resource to the (service, slot) under way; a
    /// call before any [`begin`](Self::begin) is ignored.
    pub fn user<'a, I>(&mut self, user: &str, resources: I)
    where
        I: IntoIterator<Item = (&'a str, f64)>,
        I::IntoIter: Clone,
    {
        if self.open.is_none() {
            return;
        }
        let resources = resources.into_iter();
        let quotas_len: usize = resources
            .clone()
            .map(|(name, _)| delimited_len(MAP_FIELD, resource_entry_len(name)))
            .sum();
        let entry_len =
            delimited_len(ENTRY_KEY, user.len()) + delimited_len(ENTRY_VALUE, quotas_len);
        let buf = &mut self.users;
        buf.reserve(delimited_len(MAP_FIELD, entry_len));
        put_delimited_header(buf, MAP_FIELD, entry_len);
        put_str(buf, ENTRY_KEY, user);
        put_delimited_header(buf, ENTRY_VALUE, quotas_len);
        for (name, amount) in resources {
            put_delimited_header(buf, MAP_FIELD, resource_entry_len(name));
            put_str(buf, ENTRY_KEY, name);
            put_key(buf, ENTRY_VALUE, WireType::SixtyFourBit);
            buf.put_f64_le(amount);
        }
    }

    /// Ends the (service, slot) under way: `services[service] = {slots:
    /// {slot: {users}}}`.
    fn end(&mut self) {
        let Some((service, slot)) = self.open.take() else {
            return;
        };
        // ServiceQuota { slots: { slot: UserQuotas { users } } }
        let slot_entry_len = key_len(ENTRY_KEY)
            + encoded_len_varint(slot as u64)
            + delimited_len(ENTRY_VALUE, self.users.len());
        let service_quota_len = delimited_len(MAP_FIELD, slot_entry_len);
        let entry_len =
            delimited_len(ENTRY_KEY, service.len()) + delimited_len(ENTRY_VALUE, service_quota_len);
        let buf = &mut self.services;
        buf.reserve(delimited_len(QUOTA_SERVICES, entry_len));
        put_delimited_header(buf, QUOTA_SERVICES, entry_len);
        put_str(buf, ENTRY_KEY, &service);
        put_delimited_header(buf, ENTRY_VALUE, service_quota_len);
        put_delimited_header(buf, MAP_FIELD, slot_entry_len);
        put_key(buf, ENTRY_KEY, WireType::Varint);
        encode_varint(slot as u64, buf);
        put_delimited_header(buf, ENTRY_VALUE, self.users.len());
        buf.extend_from_slice(&self.users);
        self.users.clear();
    }

    /// The encoded [`v1::CentralMessage`], answering the report of
    /// `report_slot` if given.
    pub fn finish(mut self, report_slot: Option<i64>) -> Bytes {
        self.end();
        let report_len = report_slot.map_or(0, |s| {
            key_len(QUOTA_REPORT_SLOT) + encoded_len_varint(s as u64)
        });
        let quota_len = self.services.len() + report_len;
        let mut out = Vec::with_capacity(delimited_len(CENTRAL_MESSAGE_QUOTA, quota_len));
        put_delimited_header(&mut out, CENTRAL_MESSAGE_QUOTA, quota_len);
        out.extend_from_slice(&self.services);
        if let Some(s) = report_slot {
            put_key(&mut out, QUOTA_REPORT_SLOT, WireType::Varint);
            encode_varint(s as u64, &mut out);
        }
        out.into()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;
    use crate::v1::central_message::Kind;

    type Users = BTreeMap<String, BTreeMap<String, f64>>;

    fn encode(services: &BTreeMap<String, (i64, Users)>, report_slot: Option<i64>) -> Bytes {
        let mut q = QuotaEncoder::new();
        for (service, (slot, users)) in services {
            q.begin(service, *slot);
            for (user, resources) in users {
                q.user(user, resources.iter().map(|(r, a)| (r.as_str(), *a)));
            }
        }
        q.finish(report_slot)
    }

    fn built(
        services: &BTreeMap<String, (i64, Users)>,
        report_slot: Option<i64>,
    ) -> v1::CentralMessage {
        let services = services
            .iter()
            .map(|(service, (slot, users))| {
                let users = users
                    .iter()
                    .map(|(u, r)| {
                        (
                            u.clone(),
                            v1::ResourceQuotas {
                                resources: r.clone(),
                            },
                        )
                    })
                    .collect();
                let slots = [(*slot, v1::UserQuotas { users })].into();
                (service.clone(), v1::ServiceQuota { slots })
            })
            .collect();
        v1::CentralMessage {
            kind: Some(Kind::Quota(v1::Quota {
                services,
                report_slot,
            })),
        }
    }

    fn name() -> impl Strategy<Value = String> {
        // Long enough names need two-byte lengths.
        prop_oneof![".{0,12}", ".{120,300}"]
    }

    proptest! {
        /// What the encoder writes decodes to the message prost would
        /// build from the same quotas.
        #[test]
        fn decodes_as_the_built_message(
            services in proptest::collection::btree_map(
                name(),
                (
                    any::<i64>(),
                    proptest::collection::btree_map(
                        name(),
                        proptest::collection::btree_map(name(), -1e12f64..1e12, 0..5),
                        0..6,
                    ),
                ),
                0..4,
            ),
            report_slot in proptest::option::of(any::<i64>()),
        ) {
            let bytes = encode(&services, report_slot);
            let decoded = v1::CentralMessage::decode(&bytes[..]);
            prop_assert_eq!(decoded, Ok(built(&services, report_slot)));
            prop_assert_eq!(Outbound::Encoded(bytes.clone()).encoded_len(), bytes.len());
        }
    }

    #[test]
    fn built_and_encoded_messages_go_out_alike() {
        let mut users = Users::new();
        users.insert("alice".into(), [("requests".to_string(), 2.5)].into());
        let services: BTreeMap<_, _> = [("front".to_string(), (7, users))].into();
        let message = built(&services, Some(6));
        let built_bytes = Outbound::Message(message.clone()).encode_to_vec();
        assert_eq!(built_bytes, message.encode_to_vec());
        let encoded = Outbound::Encoded(encode(&services, Some(6)));
        assert_eq!(
            v1::CentralMessage::decode(&encoded.encode_to_vec()[..]),
            Ok(message)
        );
    }

    #[test]
    fn users_before_any_service_are_ignored() {
        let mut q = QuotaEncoder::new();
        q.user("ghost", [("requests", 1.0)]);
        let decoded = v1::CentralMessage::decode(&q.finish(None)[..]);
        assert_eq!(
            decoded,
            Ok(v1::CentralMessage {
                kind: Some(Kind::Quota(v1::Quota::default())),
            })
        );
    }
}
