//! A node's side of the stream: quotas read where they arrived.
//!
//! Decoded by prost, the answer to a report of 3,000 users is two tables of
//! 3,000 users, each user a `String` and a `BTreeMap` of `String`s, all
//! allocated, installed once and freed: most of the node's work each slot.
//! [`Answer`] keeps a quota's bytes as received, and [`RawQuota`] checks
//! them once, listing its tables, users and quotas as the store installs
//! them.

use bytes::{Buf, BufMut, Bytes};
use prost::Message;
use prost::encoding::{DecodeContext, WireType, encode_varint, encoded_len_varint, skip_field};

use super::{
    CENTRAL_MESSAGE_QUOTA, ENTRY_KEY, ENTRY_VALUE, Field, Fields, MAP_FIELD, Names, PACKED_AMOUNTS,
    PACKED_RESOURCES, PACKED_SERVICE, PACKED_SLOT, PACKED_USERS, QUOTA_PACKED, QUOTA_REF,
    QUOTA_REPORT_SLOT, QUOTA_SERVICES, REF_FROM_SLOT, REF_SERVICE, REF_SLOT, RawReportError,
    RawUser, delimited_len, key_len, map_entry, merge_kind, name_at, put_delimited_header, put_key,
    put_str, two_delimited, utf8,
};
use crate::v1;

// Field numbers of `Report`.
const REPORT_NODE_ID: u32 = 1;
const REPORT_SLOT_NUMBER: u32 = 2;
const REPORT_CONSUMPTION: u32 = 3;
const REPORT_REJECTION: u32 = 4;

/// A node's gRPC client of the central, sending [`Inbound`](super::Inbound)
/// messages (reports already encoded) and receiving [`Answer`]s.
#[allow(missing_docs, unreachable_pub, missing_debug_implementations)]
pub mod client {
    include!(concat!(env!("OUT_DIR"), "/node/throttle.v1.Central.rs"));
}

const CENTRAL_MESSAGE_WELCOME: u32 = 1;
const CENTRAL_MESSAGE_NOT_LEADER: u32 = 3;

/// One message from the central node, as a node receives it: a
/// [`v1::CentralMessage`] whose quota is kept as bytes (see [`RawQuota`]).
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
            CENTRAL_MESSAGE_WELCOME => {
                let held = match std::mem::take(self) {
                    Self::Welcome(w) => Some(w),
                    _ => None,
                };
                *self = Self::Welcome(merge_kind(held, wire_type, buf, ctx)?);
            }
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
            CENTRAL_MESSAGE_NOT_LEADER => {
                let held = match std::mem::take(self) {
                    Self::NotLeader(n) => Some(n),
                    _ => None,
                };
                *self = Self::NotLeader(merge_kind(held, wire_type, buf, ctx)?);
            }
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
        }
    }

    fn clear(&mut self) {
        *self = Self::Empty;
    }
}

/// Why [`RawQuota::parse`] did not accept a quota.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RawQuotaError {
    /// Not a valid encoding of a [`v1::Quota`].
    #[error("malformed quota: {0}")]
    Malformed(&'static str),
    /// Valid, but a service's table is given twice (prost keeps only the
    /// last), or a message value in parts that prost would merge: decode
    /// it with prost instead.
    #[error("quota repeats a service or splits a value")]
    Repeated,
}

impl From<RawReportError> for RawQuotaError {
    fn from(e: RawReportError) -> Self {
        match e {
            RawReportError::Malformed(m) => Self::Malformed(m),
            RawReportError::Unordered => Self::Repeated,
        }
    }
}

/// A [`v1::Quota`] read from its bytes: checked once by
/// [`RawQuota::parse`], which lists its tables, users and quotas and keeps
/// their names in one checked string, so that installing it reads neither
/// the framing nor UTF-8 again.
#[derive(Debug, Clone)]
pub struct RawQuota {
    /// Every name, one after the other.
    names: String,
    report_slot: Option<i64>,
    tables: Vec<RawTable>,
    /// Every table's users, then every user's quotas, in the order sent.
    users: Vec<RawUser>,
    quotas: Vec<RawQuotaEntry>,
    /// The quota's [`v1::QuotaRef`]s: (service, slot, from slot).
    refs: Vec<((u32, u32), i64, i64)>,
}

/// One (service, slot) table of a [`RawQuota`].
#[derive(Debug, Clone)]
struct RawTable {
    service: (u32, u32),
    slot: i64,
    /// Its users in [`RawQuota::users`].
    users: std::ops::Range<usize>,
}

/// One (resource, quota) of a user.
#[derive(Debug, Clone, Copy)]
struct RawQuotaEntry {
    resource: (u32, u32),
    quota: f64,
}

/// A map entry's key and value fields, each the last one given (prost's
/// rule for scalars); `None` where absent.
type EntryFields<'a> = (Option<Field<'a>>, Option<Field<'a>>);

/// A map entry in any layout protobuf allows: the way every service and
/// slot entry is read, and a user's or quota's not laid out as prost
/// writes it.
fn entry_fields(body: &[u8]) -> Result<EntryFields<'_>, RawQuotaError> {
    let (mut key, mut value) = (None, None);
    let mut f = Fields::new(body);
    while let Some((n, field)) = f.next_field()? {
        match n {
            ENTRY_KEY => key = Some(field),
            // A message value given twice is merged by prost, field by
            // field: leave such an entry to prost.
            ENTRY_VALUE if matches!((&value, &field), (Some(Field::Bytes(_)), Field::Bytes(_))) => {
                return Err(RawQuotaError::Repeated);
            }
            ENTRY_VALUE => value = Some(field),
            _ => {}
        }
    }
    Ok((key, value))
}

/// A string key, checked ("" when absent).
fn string_key(key: Option<Field<'_>>) -> Result<&[u8], RawQuotaError> {
    match key {
        None => Ok(&[]),
        Some(Field::Bytes(b)) => Ok(utf8(b)?),
        Some(_) => Err(RawQuotaError::Malformed("map key of the wrong type")),
    }
}

/// A message value (empty when absent).
fn message_value(value: Option<Field<'_>>) -> Result<&[u8], RawQuotaError> {
    match value {
        None => Ok(&[]),
        Some(Field::Bytes(b)) => Ok(b),
        Some(_) => Err(RawQuotaError::Malformed("map value of the wrong type")),
    }
}

/// A (string, message) map entry: its checked key and the value's body.
/// Read without [`Fields::next_field`]'s loop when laid out as prost and
/// the central write it (the key, then the value, each once).
#[inline]
fn message_entry(body: &[u8]) -> Result<(&[u8], &[u8]), RawQuotaError> {
    if let Some((key, value)) = two_delimited(body, ENTRY_KEY, ENTRY_VALUE) {
        return Ok((utf8(key)?, value));
    }
    let (key, value) = entry_fields(body)?;
    Ok((string_key(key)?, message_value(value)?))
}

/// A (string, double) map entry: its checked key and the quota; as
/// [`message_entry`], without the general loop for the usual layout.
#[inline]
fn quota_entry(body: &[u8]) -> Result<(&[u8], f64), RawQuotaError> {
    const DOUBLE: u8 = (ENTRY_VALUE << 3 | WireType::SixtyFourBit as u32) as u8;
    let mut f = Fields::new(body);
    if let Some(key) = f.short_delimited(ENTRY_KEY)
        && let [DOUBLE, rest @ ..] = f.buf
        && let Ok(quota) = <[u8; 8]>::try_from(rest)
    {
        return Ok((utf8(key)?, f64::from_le_bytes(quota)));
    }
    let (key, value) = entry_fields(body)?;
    let quota = match value {
        None => 0.0,
        Some(Field::Fixed(b)) => f64::from_le_bytes(
            b.try_into()
                .map_err(|_| RawQuotaError::Malformed("quota is not a double"))?,
        ),
        Some(_) => return Err(RawQuotaError::Malformed("quota is not a double")),
    };
    Ok((string_key(key)?, quota))
}

/// A `QuotaRef` body's (service, slot, from slot), each field the last
/// one given, as prost reads them.
fn check_ref(body: &[u8]) -> Result<(&[u8], i64, i64), RawQuotaError> {
    let (mut service, mut slot, mut from) = (&[][..], 0, 0);
    let mut f = Fields::new(body);
    while let Some((n, field)) = f.next_field()? {
        match (n, field) {
            (REF_SERVICE, Field::Bytes(b)) => service = utf8(b)?,
            (REF_SLOT, Field::Varint(v)) => slot = v as i64,
            (REF_FROM_SLOT, Field::Varint(v)) => from = v as i64,
            (REF_SERVICE | REF_SLOT | REF_FROM_SLOT, _) => {
                return Err(RawQuotaError::Malformed(
                    "quota ref field of the wrong type",
                ));
            }
            _ => {}
        }
    }
    Ok((service, slot, from))
}

/// The `float`s of a packed table's amounts, given in one or more fields
/// (each a multiple of 4 bytes).
struct Floats<'a> {
    at: &'a [u8],
    rest: std::slice::Iter<'a, &'a [u8]>,
}

impl Iterator for Floats<'_> {
    type Item = f32;

    #[inline]
    fn next(&mut self) -> Option<f32> {
        loop {
            if let Some((a, rest)) = self.at.split_first_chunk::<4>() {
                self.at = rest;
                return Some(f32::from_le_bytes(*a));
            }
            self.at = self.rest.next()?;
        }
    }
}

impl RawQuota {
    /// Checks `bytes` (the encoding of a [`v1::Quota`]) from end to end:
    /// structure, UTF-8 of every name, every quota a double.
    ///
    /// # Errors
    ///
    /// [`RawQuotaError::Malformed`] where prost would fail to decode it too;
    /// [`RawQuotaError::Repeated`] where prost would decode it but reading
    /// it in place would not give the same tables.
    pub fn parse(bytes: &[u8]) -> Result<Self, RawQuotaError> {
        if u32::try_from(bytes.len()).is_err() {
            return Err(RawQuotaError::Repeated);
        }
        let mut quota = Self {
            names: String::new(),
            report_slot: None,
            tables: Vec::new(),
            users: Vec::new(),
            // About 24 bytes per user's quota of one resource.
            quotas: Vec::with_capacity(bytes.len() / 24),
            refs: Vec::new(),
        };
        // The services of `services` entries and the (service, slot) of
        // packed tables seen. A service in two entries (prost keeps the
        // last), a (service, slot) packed twice, or a service in both forms
        // is left to prost, once the whole quota is known to decode; one
        // service packed for several slots is not (each is its own table).
        let mut services: Vec<&[u8]> = Vec::new();
        let mut packed: Vec<(&[u8], i64)> = Vec::new();
        let mut repeated = false;
        let mut names = Names::default();
        let mut f = Fields::new(bytes);
        while let Some((n, field)) = f.next_field()? {
            match (n, field) {
                (QUOTA_SERVICES, Field::Bytes(b)) => {
                    let (key, value) = entry_fields(b)?;
                    let service = string_key(key)?;
                    repeated |=
                        services.contains(&service) || packed.iter().any(|p| p.0 == service);
                    services.push(service);
                    let kept = names.keep(service);
                    let mut slots = Fields::new(message_value(value)?);
                    while let Some(entry) = map_entry(&mut slots, "slots field of the wrong type")?
                    {
                        let (key, value) = entry_fields(entry)?;
                        let slot = match key {
                            None => 0,
                            Some(Field::Varint(v)) => v as i64,
                            Some(_) => {
                                return Err(RawQuotaError::Malformed("slot is not a varint"));
                            }
                        };
                        let first = quota.users.len();
                        quota.check_users(message_value(value)?, &mut names)?;
                        quota.tables.push(RawTable {
                            service: kept,
                            slot,
                            users: first..quota.users.len(),
                        });
                    }
                }
                (QUOTA_PACKED, Field::Bytes(b)) => {
                    let table = quota.check_packed(b, &mut names)?;
                    repeated |= services.contains(&table.0) || packed.contains(&table);
                    packed.push(table);
                }
                (QUOTA_REPORT_SLOT, Field::Varint(v)) => quota.report_slot = Some(v as i64),
                (QUOTA_REF, Field::Bytes(b)) => {
                    let (service, slot, from) = check_ref(b)?;
                    quota.refs.push((names.keep(service), slot, from));
                }
                (QUOTA_SERVICES | QUOTA_REPORT_SLOT | QUOTA_PACKED | QUOTA_REF, _) => {
                    return Err(RawQuotaError::Malformed("quota field of the wrong type"));
                }
                _ => {}
            }
        }
        quota.names = names.into_string()?;
        if repeated {
            return Err(RawQuotaError::Repeated);
        }
        Ok(quota)
    }

    /// Checks a `PackedQuota` body, listing it as a table: its resources
    /// and amounts first, then its users (fields may come in any order).
    /// Returns its (service, slot).
    fn check_packed<'a>(
        &mut self,
        body: &'a [u8],
        names: &mut Names,
    ) -> Result<(&'a [u8], i64), RawQuotaError> {
        const WRONG: RawQuotaError = RawQuotaError::Malformed("packed field of the wrong type");
        let (mut service, mut slot) = (&[][..], 0);
        let mut resources: Vec<(u32, u32)> = Vec::new();
        let mut amounts: Vec<&[u8]> = Vec::new();
        let mut f = Fields::new(body);
        while let Some((n, field)) = f.next_field()? {
            match (n, field) {
                (PACKED_SERVICE, Field::Bytes(b)) => service = utf8(b)?,
                (PACKED_SLOT, Field::Varint(v)) => slot = v as i64,
                (PACKED_RESOURCES, Field::Bytes(b)) => resources.push(names.keep(utf8(b)?)),
                // Packed, or one at a time: protobuf allows both.
                (PACKED_AMOUNTS, Field::Bytes(b)) if b.len() % 4 == 0 => amounts.push(b),
                (PACKED_AMOUNTS, Field::Fixed(b)) if b.len() == 4 => amounts.push(b),
                (PACKED_USERS, Field::Bytes(_)) => {}
                (PACKED_SERVICE | PACKED_SLOT | PACKED_RESOURCES | PACKED_AMOUNTS, _) => {
                    return Err(WRONG);
                }
                (PACKED_USERS, _) => return Err(WRONG),
                _ => {}
            }
        }
        let mut amounts = Floats {
            at: &[],
            rest: amounts.iter(),
        };
        let first = self.users.len();
        let mut f = Fields::new(body);
        while let Some((name, bits)) = f.next_packed_user()? {
            let start = self.quotas.len();
            for bit in crate::Bits::new(bits) {
                let resource = *resources.get(bit).ok_or(RawQuotaError::Malformed(
                    "a packed user names a resource its table does not list",
                ))?;
                let quota = amounts
                    .next()
                    .ok_or(RawQuotaError::Malformed("fewer packed amounts than quotas"))?;
                self.quotas.push(RawQuotaEntry {
                    resource,
                    quota: f64::from(quota),
                });
            }
            self.users.push(RawUser {
                name: names.keep(name),
                entries: start as u32..self.quotas.len() as u32,
            });
        }
        if amounts.next().is_some() {
            return Err(RawQuotaError::Malformed("more packed amounts than quotas"));
        }
        self.tables.push(RawTable {
            service: names.keep(service),
            slot,
            users: first..self.users.len(),
        });
        Ok((service, slot))
    }

    /// Checks a `UserQuotas` body, listing its users and their quotas.
    fn check_users(&mut self, body: &[u8], names: &mut Names) -> Result<(), RawQuotaError> {
        // The previous user's quotas, whose names the next user's likely
        // repeat.
        let mut like = 0..0;
        let mut u = Fields::new(body);
        while let Some(b) = map_entry(&mut u, "users field of the wrong type")? {
            let (user, resources) = message_entry(b)?;
            let first = self.quotas.len();
            let mut r = Fields::new(resources);
            while let Some(b) = map_entry(&mut r, "resources field of the wrong type")? {
                let (resource, quota) = quota_entry(b)?;
                let at = like.start + (self.quotas.len() - first);
                let before = self.quotas.get(at).filter(|_| at < like.end);
                self.quotas.push(RawQuotaEntry {
                    resource: names.keep_like(before.map(|q| q.resource), resource),
                    quota,
                });
            }
            like = first..self.quotas.len();
            self.users.push(RawUser {
                name: names.keep(user),
                entries: first as u32..self.quotas.len() as u32,
            });
        }
        Ok(())
    }

    /// The slot of the report this quota answers, if it answers one.
    pub fn report_slot(&self) -> Option<i64> {
        self.report_slot
    }

    /// Every [`v1::QuotaRef`] as (service, slot, from slot), in the order
    /// sent.
    pub fn refs(&self) -> impl Iterator<Item = (&str, i64, i64)> {
        self.refs
            .iter()
            .map(|&(service, slot, from)| (name_at(&self.names, service), slot, from))
    }

    /// Every (service, slot, users) table, in the order sent.
    pub fn tables(&self) -> impl Iterator<Item = (&str, i64, QuotaUsers<'_>)> {
        self.tables.iter().map(|t| {
            let users = QuotaUsers {
                quota: self,
                users: self.users.get(t.users.clone()).unwrap_or_default().iter(),
            };
            (name_at(&self.names, t.service), t.slot, users)
        })
    }
}

/// The users of one table of a [`RawQuota`], each with its quotas.
#[derive(Clone)]
pub struct QuotaUsers<'a> {
    quota: &'a RawQuota,
    users: std::slice::Iter<'a, RawUser>,
}

impl std::fmt::Debug for QuotaUsers<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.clone()).finish()
    }
}

impl<'a> Iterator for QuotaUsers<'a> {
    type Item = (&'a str, QuotaResources<'a>);

    fn next(&mut self) -> Option<Self::Item> {
        let user = self.users.next()?;
        let (start, end) = (user.entries.start as usize, user.entries.end as usize);
        let quotas = self.quota.quotas.get(start..end).unwrap_or_default();
        Some((
            name_at(&self.quota.names, user.name),
            QuotaResources {
                names: &self.quota.names,
                quotas: quotas.iter(),
            },
        ))
    }
}

/// One user's (resource, quota) pairs in a [`RawQuota`].
#[derive(Clone)]
pub struct QuotaResources<'a> {
    names: &'a str,
    quotas: std::slice::Iter<'a, RawQuotaEntry>,
}

impl std::fmt::Debug for QuotaResources<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.clone()).finish()
    }
}

impl<'a> Iterator for QuotaResources<'a> {
    type Item = (&'a str, f64);

    fn next(&mut self) -> Option<Self::Item> {
        let q = self.quotas.next()?;
        Some((name_at(self.names, q.resource), q.quota))
    }
}

/// Writes the users of one [`v1::Usage`] (a service's consumption or
/// rejection in a report), user by user, as prost writes them: give users
/// in increasing name order, and each user's resources in increasing name
/// order, as the central's [`RawReport`](super::RawReport) reads them
/// fastest (out of order it decodes them with prost instead). Or, made
/// with [`UsageEncoder::packed`], as a [`v1::PackedUsage`].
#[derive(Debug, Default, Clone)]
pub struct UsageEncoder {
    users: Vec<u8>,
    packed: Option<PackedParts>,
}

/// A packed usage's resources, in the order of its bits, and its amounts
/// (varints); scratch for one user's (bit, amount) pairs.
#[derive(Debug, Default, Clone)]
struct PackedParts {
    resources: Vec<String>,
    amounts: Vec<u8>,
    user: Vec<(usize, i64)>,
}

/// A string map key, left out when empty, as prost leaves out defaults.
fn key_len_of(s: &str) -> usize {
    if s.is_empty() {
        0
    } else {
        delimited_len(ENTRY_KEY, s.len())
    }
}

fn put_key_str(buf: &mut Vec<u8>, s: &str) {
    if !s.is_empty() {
        put_str(buf, ENTRY_KEY, s);
    }
}

/// Length of one `Amounts.resources` entry (name -> int64), without its
/// header; a zero amount is left out, as prost leaves it out.
fn amount_entry_len(name: &str, amount: i64) -> usize {
    key_len_of(name)
        + if amount == 0 {
            0
        } else {
            key_len(ENTRY_VALUE) + encoded_len_varint(amount as u64)
        }
}

impl UsageEncoder {
    /// No users yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Every user of `usage`, [`packed`](UsageEncoder::packed) over the
    /// resources they name if `packed`.
    pub(crate) fn of(usage: &v1::Usage, packed: bool) -> Self {
        let mut e = if packed {
            let resources: std::collections::BTreeSet<&str> = usage
                .users
                .values()
                .flat_map(|a| a.resources.keys().map(String::as_str))
                .collect();
            Self::packed(resources)
        } else {
            Self::new()
        };
        for (user, amounts) in &usage.users {
            e.user(
                user,
                amounts.resources.iter().map(|(r, a)| (r.as_str(), *a)),
            );
        }
        e
    }

    /// No users yet, written as a [`v1::PackedUsage`] of `resources` (give
    /// them in increasing name order, as the central reads them fastest;
    /// a resource a user has that is not among them is added after them).
    pub fn packed<'a>(resources: impl IntoIterator<Item = &'a str>) -> Self {
        Self {
            users: Vec::new(),
            packed: Some(PackedParts {
                resources: resources.into_iter().map(str::to_owned).collect(),
                ..PackedParts::default()
            }),
        }
    }

    /// Whether no user was added.
    pub fn is_empty(&self) -> bool {
        self.users.is_empty()
    }

    /// Adds `user` with its (resource, amount) pairs.
    pub fn user<'a, I>(&mut self, user: &str, amounts: I)
    where
        I: IntoIterator<Item = (&'a str, i64)>,
        I::IntoIter: Clone,
    {
        if let Some(parts) = &mut self.packed {
            parts.user(&mut self.users, user, amounts);
            return;
        }
        let amounts = amounts.into_iter();
        let amounts_len: usize = amounts
            .clone()
            .map(|(name, amount)| delimited_len(MAP_FIELD, amount_entry_len(name, amount)))
            .sum();
        let value_len = if amounts_len == 0 {
            0
        } else {
            delimited_len(ENTRY_VALUE, amounts_len)
        };
        let entry_len = key_len_of(user) + value_len;
        let buf = &mut self.users;
        buf.reserve(delimited_len(MAP_FIELD, entry_len));
        put_delimited_header(buf, MAP_FIELD, entry_len);
        put_key_str(buf, user);
        if amounts_len != 0 {
            put_delimited_header(buf, ENTRY_VALUE, amounts_len);
        }
        for (name, amount) in amounts {
            put_delimited_header(buf, MAP_FIELD, amount_entry_len(name, amount));
            put_key_str(buf, name);
            if amount != 0 {
                put_key(buf, ENTRY_VALUE, WireType::Varint);
                encode_varint(amount as u64, buf);
            }
        }
    }
}

impl PackedParts {
    /// A `PackedUser` of `user` into `users`, its amounts in the order of
    /// its bits (a resource given twice keeps the last amount, as a map
    /// would).
    fn user<'a>(
        &mut self,
        users: &mut Vec<u8>,
        user: &str,
        amounts: impl IntoIterator<Item = (&'a str, i64)>,
    ) {
        super::put_packed_user(
            users,
            &mut self.resources,
            &mut self.user,
            user,
            amounts,
            None,
        );
        for &(_, amount) in &self.user {
            encode_varint(amount as u64, &mut self.amounts);
        }
    }
}

/// Writes a [`v1::Report`] from its services' [`UsageEncoder`]s: the bytes
/// prost writes for the same report, with no message built. Give services
/// in increasing name order. A service whose encoders are
/// [packed](UsageEncoder::packed) goes in [`v1::Report::packed`].
#[derive(Debug, Default)]
pub struct ReportEncoder {
    consumption: Vec<u8>,
    rejection: Vec<u8>,
    packed: Vec<u8>,
}

impl ReportEncoder {
    /// A report of no service yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `service`'s consumption and rejection.
    pub fn service(&mut self, service: &str, consumption: &UsageEncoder, rejection: &UsageEncoder) {
        for (usage, is_rejection) in [(consumption, false), (rejection, true)] {
            if let Some(parts) = &usage.packed {
                self.packed_usage(service, is_rejection, &usage.users, parts);
            }
        }
        for (buf, field, usage) in [
            (&mut self.consumption, REPORT_CONSUMPTION, consumption),
            (&mut self.rejection, REPORT_REJECTION, rejection),
        ] {
            let value_len = if usage.is_empty() {
                0
            } else {
                delimited_len(ENTRY_VALUE, usage.users.len())
            };
            if usage.packed.is_some() {
                continue;
            }
            put_delimited_header(buf, field, key_len_of(service) + value_len);
            put_key_str(buf, service);
            if !usage.is_empty() {
                put_delimited_header(buf, ENTRY_VALUE, usage.users.len());
                buf.extend_from_slice(&usage.users);
            }
        }
    }

    /// `PackedUsage { service, rejection, resources, users, amounts }`.
    fn packed_usage(&mut self, service: &str, rejection: bool, users: &[u8], parts: &PackedParts) {
        use super::{PACKED_AMOUNTS, PACKED_REJECTION, PACKED_RESOURCES, PACKED_SERVICE};
        let resources: usize = parts
            .resources
            .iter()
            .map(|r| delimited_len(PACKED_RESOURCES, r.len()))
            .sum();
        let body = delimited_len(PACKED_SERVICE, service.len())
            + if rejection {
                key_len(PACKED_REJECTION) + 1
            } else {
                0
            }
            + resources
            + users.len()
            + delimited_len(PACKED_AMOUNTS, parts.amounts.len());
        let buf = &mut self.packed;
        put_delimited_header(buf, super::REPORT_PACKED, body);
        put_str(buf, PACKED_SERVICE, service);
        if rejection {
            put_key(buf, PACKED_REJECTION, WireType::Varint);
            buf.push(1);
        }
        for r in &parts.resources {
            put_str(buf, PACKED_RESOURCES, r);
        }
        buf.extend_from_slice(users);
        put_delimited_header(buf, PACKED_AMOUNTS, parts.amounts.len());
        buf.extend_from_slice(&parts.amounts);
    }

    /// The encoded [`v1::Report`] of `node_id` for `slot_number`.
    pub fn finish(self, node_id: &str, slot_number: i64) -> Bytes {
        let mut out = Vec::with_capacity(
            delimited_len(REPORT_NODE_ID, node_id.len())
                + 11
                + self.consumption.len()
                + self.rejection.len()
                + self.packed.len(),
        );
        if !node_id.is_empty() {
            put_str(&mut out, REPORT_NODE_ID, node_id);
        }
        if slot_number != 0 {
            put_key(&mut out, REPORT_SLOT_NUMBER, WireType::Varint);
            encode_varint(slot_number as u64, &mut out);
        }
        out.extend_from_slice(&self.consumption);
        out.extend_from_slice(&self.rejection);
        out.extend_from_slice(&self.packed);
        out.into()
    }
}

/// Why [`unpacked_report`] could not rewrite a report.
#[derive(Debug, thiserror::Error)]
pub enum UnpackError {
    /// Not the encoding of a [`v1::Report`].
    #[error("not a report: {0}")]
    Decode(#[from] prost::DecodeError),
    /// A packed table whose bits and amounts do not match.
    #[error("packed usage: {0}")]
    Packed(#[from] crate::PackedError),
}

/// The encoded report `bytes` with its [`v1::PackedUsage`]s written as the
/// original maps, for a central node that does not read them: a report
/// encoded packed for one central node and sent again to another after a
/// reconnection.
///
/// # Errors
///
/// [`UnpackError`] if `bytes` is not a report or a packed table does not
/// decode.
pub fn unpacked_report(bytes: &[u8]) -> Result<Bytes, UnpackError> {
    let mut report = v1::Report::decode(bytes)?;
    report.unpack()?;
    Ok(report.encode_to_vec().into())
}

/// `report` as a reporter writes it for a central node that reads packed
/// reports: each service's consumption and rejection as a
/// [`v1::PackedUsage`], in about a third of the bytes (what
/// [`unpacked_report`] turns back).
///
/// # Errors
///
/// A [`v1::PackedUsage`] of `report` that does not decode.
pub fn packed_report(report: &v1::Report) -> Result<Bytes, crate::PackedError> {
    if !report.packed.is_empty() {
        let mut maps = report.clone();
        maps.unpack()?;
        return packed_report(&maps);
    }
    let encoder = |usage: Option<&v1::Usage>| {
        usage.map_or_else(UsageEncoder::new, |u| UsageEncoder::of(u, true))
    };
    let mut out = ReportEncoder::new();
    let services: std::collections::BTreeSet<&String> = report
        .consumption
        .keys()
        .chain(report.rejection.keys())
        .collect();
    for service in services {
        out.service(
            service,
            &encoder(report.consumption.get(service)),
            &encoder(report.rejection.get(service)),
        );
    }
    Ok(out.finish(&report.node_id, report.slot_number))
}

#[cfg(test)]
mod tests {

    use proptest::prelude::*;

    use super::*;
    use crate::v1::central_message::Kind;

    /// (service, slot, users with their (resource, quota bits)).
    type Table = (String, i64, Vec<(String, Vec<(String, u64)>)>);

    fn raw_tables(q: &RawQuota) -> Vec<Table> {
        q.tables()
            .map(|(service, slot, users)| {
                let users = users
                    .map(|(u, r)| {
                        (
                            u.to_owned(),
                            r.map(|(r, q)| (r.to_owned(), q.to_bits())).collect(),
                        )
                    })
                    .collect();
                (service.to_owned(), slot, users)
            })
            .collect()
    }

    fn prost_tables(q: &v1::Quota) -> Vec<Table> {
        let mut out = Vec::new();
        for (service, sq) in &q.services {
            for (slot, users) in &sq.slots {
                let users = users
                    .users
                    .iter()
                    .map(|(u, rq)| {
                        let r = rq
                            .resources
                            .iter()
                            .map(|(r, q)| (r.clone(), q.to_bits()))
                            .collect();
                        (u.clone(), r)
                    })
                    .collect();
                out.push((service.clone(), *slot, users));
            }
        }
        out
    }

    fn name() -> impl Strategy<Value = String> {
        // Long enough names need two-byte lengths.
        prop_oneof![".{0,12}", ".{120,300}"]
    }

    fn quota_value() -> impl Strategy<Value = f64> {
        prop_oneof![0.0..1e6f64, any::<f64>()]
    }

    fn quota() -> impl Strategy<Value = v1::Quota> {
        let resources = proptest::collection::btree_map(name(), quota_value(), 0..4)
            .prop_map(|resources| v1::ResourceQuotas { resources });
        let users = proptest::collection::btree_map(name(), resources, 0..6)
            .prop_map(|users| v1::UserQuotas { users });
        let slots = proptest::collection::btree_map(any::<i64>(), users, 0..3)
            .prop_map(|slots| v1::ServiceQuota { slots });
        let refs = proptest::collection::vec(
            (name(), any::<i64>(), any::<i64>()).prop_map(|(service, slot, from_slot)| {
                v1::QuotaRef {
                    service,
                    slot,
                    from_slot,
                }
            }),
            0..3,
        );
        (
            proptest::collection::btree_map(name(), slots, 0..3),
            any::<Option<i64>>(),
            refs,
        )
            .prop_map(|(services, report_slot, refs)| v1::Quota {
                services,
                report_slot,
                packed: Vec::new(),
                refs,
            })
    }

    /// A quota's refs as (service, slot, from slot).
    fn prost_refs(q: &v1::Quota) -> Vec<(String, i64, i64)> {
        q.refs
            .iter()
            .map(|r| (r.service.clone(), r.slot, r.from_slot))
            .collect()
    }

    fn raw_refs(q: &RawQuota) -> Vec<(String, i64, i64)> {
        q.refs().map(|(s, a, b)| (s.to_owned(), a, b)).collect()
    }

    proptest! {
        /// A quota prost wrote reads in place as prost reads it.
        #[test]
        fn reads_as_prost_decodes(q in quota()) {
            let bytes = q.encode_to_vec();
            let raw = RawQuota::parse(&bytes).expect("valid");
            // As prost reads it back: a quota of -0.0 is not written, and
            // reads as 0.0.
            let decoded = v1::Quota::decode(&bytes[..]).expect("valid");
            prop_assert_eq!(raw.report_slot(), decoded.report_slot);
            prop_assert_eq!(raw_tables(&raw), prost_tables(&decoded));
            prop_assert_eq!(raw_refs(&raw), prost_refs(&decoded));
        }

        /// A quota as the central writes it ([`QuotaEncoder`]) reads in
        /// place as prost reads it.
        #[test]
        fn reads_the_centrals_encoding_as_prost_decodes_it(q in quota()) {
            let bytes = super::super::encode_tables(&q, |_| false);
            let Ok(Answer::Quota(quota)) = Answer::decode(&bytes[..]) else {
                panic!("not a quota");
            };
            let raw = RawQuota::parse(&quota);
            let decoded = v1::Quota::decode(&quota[..]).expect("valid");
            match raw {
                Ok(raw) => {
                    prop_assert_eq!(raw.report_slot(), decoded.report_slot);
                    prop_assert_eq!(raw_tables(&raw), prost_tables(&decoded));
                    prop_assert_eq!(raw_refs(&raw), prost_refs(&decoded));
                    prop_assert_eq!(prost_refs(&decoded), prost_refs(&q));
                }
                // The encoder writes a service once per slot begun.
                Err(e) => prop_assert!(
                    e == RawQuotaError::Repeated && q.services.values().any(|s| s.slots.len() > 1),
                    "{e}"
                ),
            }
        }

        /// A quota the central writes with packed tables (some or all)
        /// reads in place as the quota it stands for, amounts as the
        /// `f32`s it keeps, and as prost reads it once unpacked.
        #[test]
        fn packed_tables_read_as_the_quota_they_stand_for(
            q in quota(),
            packed in proptest::collection::vec(any::<bool>(), 3),
        ) {
            let bytes = super::super::encode_tables(&q, |i| packed[i]);
            // The content, with the amounts of packed tables as the f32s
            // they keep.
            let mut kept = q.clone();
            for (sq, &pack) in kept.services.values_mut().zip(&packed) {
                let amounts = sq.slots.values_mut().flat_map(|u| u.users.values_mut());
                for a in amounts.flat_map(|rq| rq.resources.values_mut()).filter(|_| pack) {
                    *a = f64::from(crate::f32_at_most(*a));
                }
            }
            let expected = prost_tables(&kept);
            let Ok(Answer::Quota(quota)) = Answer::decode(&bytes[..]) else {
                panic!("not a quota");
            };
            let mut decoded = v1::Quota::decode(&quota[..]).expect("valid");
            prop_assert_eq!(decoded.unpack(), Ok(()));
            match RawQuota::parse(&quota) {
                Ok(raw) => {
                    prop_assert_eq!(raw.report_slot(), q.report_slot);
                    let mut tables = raw_tables(&raw);
                    tables.sort_by(|a, b| (&a.0, a.1).cmp(&(&b.0, b.1)));
                    prop_assert_eq!(&tables, &expected);
                    prop_assert_eq!(prost_tables(&decoded), expected);
                }
                Err(e) => prop_assert!(
                    e == RawQuotaError::Repeated && q.services.values().any(|s| s.slots.len() > 1),
                    "{e}"
                ),
            }
        }

        /// Whatever the bytes of a packed quota: read in place only where
        /// prost decodes and unpacks them too, and then to the same tables;
        /// refused as malformed only where one of those fails.
        #[test]
        fn any_packed_bytes_read_as_prost_reads_them_or_not_at_all(
            q in quota(),
            cut in any::<prop::sample::Index>(),
            flip in any::<prop::sample::Index>(),
            byte in any::<u8>(),
        ) {
            let bytes = super::super::encode_tables(&q, |_| true);
            let Ok(Answer::Quota(quota)) = Answer::decode(&bytes[..]) else {
                panic!("not a quota");
            };
            let mut bytes = quota.to_vec();
            if !bytes.is_empty() {
                let at = flip.index(bytes.len());
                bytes[at] = byte;
                bytes.truncate(cut.index(bytes.len() + 1).max(at));
            }
            let decoded = v1::Quota::decode(&bytes[..]).map_err(|_| ()).and_then(|mut d| {
                d.unpack().map_err(|_| ())?;
                Ok(d)
            });
            match RawQuota::parse(&bytes) {
                Ok(raw) => {
                    let decoded = decoded.expect("read in place, so prost reads it");
                    prop_assert_eq!(raw.report_slot(), decoded.report_slot);
                    let mut tables = raw_tables(&raw);
                    tables.sort_by(|a, b| (&a.0, a.1).cmp(&(&b.0, b.1)));
                    prop_assert_eq!(tables, prost_tables(&decoded));
                }
                Err(RawQuotaError::Malformed(_)) => prop_assert!(decoded.is_err()),
                Err(RawQuotaError::Repeated) => {
                    prop_assert!(v1::Quota::decode(&bytes[..]).is_ok());
                }
            }
        }

        /// Whatever the bytes: read in place only where prost decodes them
        /// too, and then to the same tables; refused as malformed only
        /// where prost fails.
        #[test]
        fn any_bytes_read_as_prost_reads_them_or_not_at_all(
            q in quota(),
            cut in any::<prop::sample::Index>(),
            flip in any::<prop::sample::Index>(),
            byte in any::<u8>(),
        ) {
            let mut bytes = q.encode_to_vec();
            if !bytes.is_empty() {
                let at = flip.index(bytes.len());
                bytes[at] = byte;
                bytes.truncate(cut.index(bytes.len() + 1).max(at));
            }
            let decoded = v1::Quota::decode(&bytes[..]);
            match RawQuota::parse(&bytes) {
                Ok(raw) => {
                    let decoded = decoded.expect("read in place, so prost decodes it");
                    prop_assert_eq!(raw.report_slot(), decoded.report_slot);
                    prop_assert_eq!(raw_tables(&raw), prost_tables(&decoded));
                }
                Err(RawQuotaError::Malformed(_)) => prop_assert!(decoded.is_err()),
                Err(RawQuotaError::Repeated) => prop_assert!(decoded.is_ok()),
            }
        }

        /// The message kinds a node receives decode as prost decodes them,
        /// the quota kept as its bytes.
        #[test]
        fn answers_decode_as_central_messages(q in quota(), epoch in any::<u64>(), leader in name()) {
            for kind in [
                Kind::Quota(q.clone()),
                Kind::Welcome(v1::Welcome { slot_ms: 1000, epoch, accepts: vec![crate::PACKED_REPORTS.into()] }),
                Kind::NotLeader(v1::NotLeader { leader: leader.clone() }),
            ] {
                let bytes = v1::CentralMessage { kind: Some(kind.clone()) }.encode_to_vec();
                let answer = Answer::decode(&bytes[..]).expect("valid");
                match (kind, &answer) {
                    (Kind::Quota(q), Answer::Quota(b)) => prop_assert_eq!(&b[..], &q.encode_to_vec()[..]),
                    (Kind::Welcome(w), Answer::Welcome(a)) => prop_assert_eq!(&w, a),
                    (Kind::NotLeader(n), Answer::NotLeader(a)) => prop_assert_eq!(&n, a),
                    (kind, answer) => prop_assert!(false, "{kind:?} read as {answer:?}"),
                }
                prop_assert_eq!(answer.encode_to_vec(), bytes);
            }
        }
    }

    fn usage() -> impl Strategy<Value = v1::Usage> {
        let amount = prop_oneof![0i64..300, any::<i64>()];
        let amounts = proptest::collection::btree_map(name(), amount, 0..4)
            .prop_map(|resources| v1::Amounts { resources });
        proptest::collection::btree_map(name(), amounts, 0..5).prop_map(|users| v1::Usage { users })
    }

    proptest! {
        /// The encoders write a report byte for byte as prost writes it.
        #[test]
        fn reports_encode_as_prost_encodes_them(
            node_id in name(),
            slot_number in prop_oneof![Just(0i64), any::<i64>()],
            services in proptest::collection::btree_map(name(), (usage(), usage()), 0..3),
        ) {
            let mut report = ReportEncoder::new();
            for (service, (consumption, rejection)) in &services {
                let encode = |usage: &v1::Usage| {
                    let mut e = UsageEncoder::new();
                    for (user, amounts) in &usage.users {
                        e.user(user, amounts.resources.iter().map(|(r, a)| (r.as_str(), *a)));
                    }
                    e
                };
                report.service(service, &encode(consumption), &encode(rejection));
            }
            let built = v1::Report {
                node_id: node_id.clone(),
                slot_number,
                consumption: services.iter().map(|(s, (c, _))| (s.clone(), c.clone())).collect(),
                rejection: services.iter().map(|(s, (_, r))| (s.clone(), r.clone())).collect(),
                packed: Vec::new(),
            };
            prop_assert_eq!(&report.finish(&node_id, slot_number)[..], &built.encode_to_vec()[..]);
        }
    }

    fn entry(key: &[u8], value: &[u8]) -> Vec<u8> {
        [key, value].concat()
    }

    fn delimited(field: u32, body: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        prost::encoding::bytes::encode(field, &body.to_vec(), &mut out);
        out
    }

    #[test]
    fn a_service_given_twice_is_left_to_prost() {
        let one = |slot: i64| v1::Quota {
            services: [(
                "front".to_string(),
                v1::ServiceQuota {
                    slots: [(slot, v1::UserQuotas::default())].into(),
                },
            )]
            .into(),
            report_slot: None,
            packed: Vec::new(),
            refs: Vec::new(),
        };
        let bytes = [one(1).encode_to_vec(), one(2).encode_to_vec()].concat();
        assert_eq!(
            RawQuota::parse(&bytes).unwrap_err(),
            RawQuotaError::Repeated
        );
        // prost keeps the last table only.
        let decoded = v1::Quota::decode(&bytes[..]).unwrap();
        assert_eq!(
            decoded.services["front"].slots.keys().collect::<Vec<_>>(),
            [&2]
        );
    }

    #[test]
    fn one_service_packed_for_two_slots_reads_in_place_and_one_table_twice_does_not() {
        let packed = |slots: &[i64]| {
            let mut q = super::super::QuotaEncoder::new();
            for &slot in slots {
                q.begin_packed("front", slot);
                q.user("bob", [("requests", 3.0)]);
            }
            match Answer::decode(&q.finish(None)[..]) {
                Ok(Answer::Quota(b)) => b,
                other => panic!("{other:?}"),
            }
        };
        let raw = RawQuota::parse(&packed(&[7, 8])).unwrap();
        let slots: Vec<i64> = raw.tables().map(|(_, slot, _)| slot).collect();
        assert_eq!(slots, [7, 8]);
        assert_eq!(
            RawQuota::parse(&packed(&[7, 7])).unwrap_err(),
            RawQuotaError::Repeated
        );
        // And a service in both forms.
        let mut q = super::super::QuotaEncoder::new();
        q.begin("front", 6);
        let Ok(Answer::Quota(classic)) = Answer::decode(&q.finish(None)[..]) else {
            panic!("not a quota");
        };
        let both = [&classic[..], &packed(&[7])[..]].concat();
        assert_eq!(RawQuota::parse(&both).unwrap_err(), RawQuotaError::Repeated);
    }

    #[test]
    fn entries_in_any_layout_read_as_prost_reads_them() {
        // A resource's quota before its name, and a user with no name.
        let resource = entry(
            &[0x11, 0, 0, 0, 0, 0, 0, 0x24, 0x40],
            &delimited(1, b"requests"),
        );
        let resources = delimited(1, &resource);
        let user = delimited(2, &resources);
        let users = delimited(1, &user);
        let slot = entry(&delimited(2, &users), &[0x08, 7]);
        let service = entry(&delimited(1, b"front"), &delimited(2, &delimited(1, &slot)));
        let bytes = delimited(1, &service);
        let raw = RawQuota::parse(&bytes).unwrap();
        let decoded = v1::Quota::decode(&bytes[..]).unwrap();
        assert_eq!(raw_tables(&raw), prost_tables(&decoded));
        assert_eq!(
            raw_tables(&raw),
            [(
                "front".to_string(),
                7,
                vec![(
                    String::new(),
                    vec![("requests".to_string(), 10f64.to_bits())]
                )]
            )]
        );
    }
}
