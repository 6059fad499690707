//! [`QuotaEncoder`]: a quota written straight from borrowed names.
//!
//! It builds no message: against prost building, encoding and freeing the
//! same quota, see `cargo bench -p throttle-central --bench central --
//! wire/` and `docs/performance.md`.

use std::ops::Range;

use bytes::{BufMut, Bytes};
use prost::encoding::{WireType, encode_varint, encoded_len_varint};

use super::fields::*;
use super::read::*;
use super::write::*;

/// Writes a [`v1::CentralMessage`](crate::v1::CentralMessage) holding a [`v1::Quota`](crate::v1::Quota), entry by entry.
///
/// Call [`begin`](Self::begin) (or [`begin_packed`](Self::begin_packed),
/// for a node that accepts [`v1::PackedQuota`](crate::v1::PackedQuota)s) for each (service, slot),
/// then [`user`](Self::user) once per user of it, then
/// [`finish`](Self::finish). A service begun twice, or a user given twice
/// within one slot, decodes as the last one written, as with any protobuf
/// map.
#[derive(Debug, Default)]
pub struct QuotaEncoder {
    /// Encoded `services` entries of the classic tables already ended.
    pub(super) services: Vec<u8>,
    /// Encoded `packed` entries of the packed tables already ended.
    pub(super) packed: Vec<u8>,
    /// Where each table ended put its users block, in `packed` (`true`) or
    /// `services`, in the order begun.
    pub(super) blocks: Vec<(bool, Range<usize>)>,
    /// The (service, slot) under way, and whether it is packed.
    pub(super) open: Option<(String, i64, bool)>,
    /// Its encoded users: `UserQuotas.users` entries, or `PackedQuota.users`
    /// entries.
    pub(super) users: Vec<u8>,
    /// A packed table's resources, in the order of its bits, and its
    /// amounts (`f32`, little-endian).
    pub(super) resources: Vec<String>,
    pub(super) amounts: Vec<u8>,
    /// Scratch for one packed user: (bit, amount) and the bit of each
    /// resource given, in the order given.
    pub(super) user_bits: Vec<(usize, f32)>,
    pub(super) given: Vec<usize>,
    /// Encoded `refs` entries.
    pub(super) refs: Vec<u8>,
}

impl QuotaEncoder {
    /// An empty quota.
    pub fn new() -> Self {
        Self::default()
    }

    /// Starts the quotas of `service` for `slot` (ending the one under way).
    pub fn begin(&mut self, service: &str, slot: i64) {
        self.end();
        self.open = Some((service.to_owned(), slot, false));
    }

    /// [`begin`](Self::begin), as a [`v1::PackedQuota`](crate::v1::PackedQuota): about a third of
    /// the bytes, and amounts kept as `f32`s ([`f32_at_most`] of those
    /// given).
    ///
    /// [`f32_at_most`]: crate::f32_at_most
    pub fn begin_packed(&mut self, service: &str, slot: i64) {
        self.end();
        self.open = Some((service.to_owned(), slot, true));
    }

    /// Refers the node to quotas its stream already delivered: `service`'s
    /// quotas for `slot` are those it holds for `from_slot`
    /// ([`v1::QuotaRef`](crate::v1::QuotaRef); only for a node that accepts them,
    /// [`QUOTA_REFS`](crate::QUOTA_REFS)).
    pub fn refer(&mut self, service: &str, slot: i64, from_slot: i64) {
        let len = delimited_len(QUOTA_REF_SERVICE, service.len())
            + key_len(QUOTA_REF_SLOT)
            + encoded_len_varint(slot as u64)
            + key_len(QUOTA_REF_FROM_SLOT)
            + encoded_len_varint(from_slot as u64);
        put_delimited_header(&mut self.refs, QUOTA_REFS, len);
        put_str(&mut self.refs, QUOTA_REF_SERVICE, service);
        put_key(&mut self.refs, QUOTA_REF_SLOT, WireType::Varint);
        encode_varint(slot as u64, &mut self.refs);
        put_key(&mut self.refs, QUOTA_REF_FROM_SLOT, WireType::Varint);
        encode_varint(from_slot as u64, &mut self.refs);
    }

    /// Adds `user`'s quota per resource to the (service, slot) under way; a
    /// call before any [`begin`](Self::begin) is ignored.
    pub fn user<'a, I>(&mut self, user: &str, resources: I)
    where
        I: IntoIterator<Item = (&'a str, f64)>,
        I::IntoIter: Clone,
    {
        self.user_inner(user, resources, None);
    }

    /// [`user`](Self::user), noting in `amounts_at`, for each resource in
    /// the order given, where its amount is in the table under way: a copy
    /// of those users with other amounts can then be
    /// [appended](Self::append_users). In a classic table that is the
    /// offset of its 8 bytes in the users written
    /// ([`table_len`](Self::table_len) counts them); in a packed one, its
    /// index among the amounts.
    pub fn user_noting<'a, I>(&mut self, user: &str, resources: I, amounts_at: &mut Vec<usize>)
    where
        I: IntoIterator<Item = (&'a str, f64)>,
        I::IntoIter: Clone,
    {
        self.user_inner(user, resources, Some(amounts_at));
    }

    pub(super) fn user_inner<'a, I>(
        &mut self,
        user: &str,
        resources: I,
        noting: Option<&mut Vec<usize>>,
    ) where
        I: IntoIterator<Item = (&'a str, f64)>,
        I::IntoIter: Clone,
    {
        match self.open {
            None => {}
            Some((_, _, false)) => self.classic_user(user, resources.into_iter(), noting),
            Some((_, _, true)) => self.packed_user(user, resources, noting),
        }
    }

    pub(super) fn classic_user<'a, I>(
        &mut self,
        user: &str,
        resources: I,
        mut noting: Option<&mut Vec<usize>>,
    ) where
        I: Iterator<Item = (&'a str, f64)> + Clone,
    {
        let quotas_len: usize = resources
            .clone()
            .map(|(name, _)| delimited_len(MAP_FIELD, resource_entry_len(name)))
            .sum();
        let buf = &mut self.users;
        put_string_entry_head(buf, MAP_FIELD, user, quotas_len);
        for (name, amount) in resources {
            put_delimited_header(buf, MAP_FIELD, resource_entry_len(name));
            put_str(buf, ENTRY_KEY, name);
            put_key(buf, ENTRY_VALUE, WireType::SixtyFourBit);
            if let Some(at) = noting.as_deref_mut() {
                at.push(buf.len());
            }
            buf.put_f64_le(amount);
        }
    }

    /// A packed user: its name and bits, its amounts in the order of its
    /// bits (a resource given twice keeps the last amount, as a map would).
    pub(super) fn packed_user<'a, I>(
        &mut self,
        user: &str,
        resources: I,
        noting: Option<&mut Vec<usize>>,
    ) where
        I: IntoIterator<Item = (&'a str, f64)>,
    {
        self.given.clear();
        put_packed_user(
            &mut self.users,
            &mut self.resources,
            &mut self.user_bits,
            user,
            resources
                .into_iter()
                .map(|(name, amount)| (name, crate::f32_at_most(amount))),
            Some(&mut self.given),
        );
        let first = self.amounts.len() / 4;
        if let Some(at) = noting {
            for bit in &self.given {
                let i = self.user_bits.iter().position(|(b, _)| b == bit);
                at.push(first + i.unwrap_or(0));
            }
        }
        for &(_, amount) in &self.user_bits {
            self.amounts.put_f32_le(amount);
        }
    }

    /// The users of the table under way so far, as encoded: a classic
    /// table's users block; a packed table's users, without its resources
    /// and amounts.
    pub fn users_so_far(&self) -> &[u8] {
        &self.users
    }

    /// How many bytes the users of the table under way take so far.
    pub fn table_len(&self) -> usize {
        self.users.len() + self.amounts.len()
    }

    /// Appends the users block of a table encoded before (one of the
    /// ranges [`finish_with_users`](Self::finish_with_users) gives, of the
    /// same kind as the table under way) to the (service, slot) under way,
    /// with its amounts changed: each `(at, amount)` writes `amount` where
    /// [`user_noting`](Self::user_noting) noted `at`. Ignored before any
    /// [`begin`](Self::begin). Returns false, appending nothing, if an
    /// offset does not fit in `block`, or, in a packed table, if the table
    /// has users already, the block is not a packed one, or the amounts
    /// do not fill it.
    pub fn append_users(
        &mut self,
        block: &[u8],
        amounts: impl IntoIterator<Item = (usize, f64)>,
    ) -> bool {
        match self.open {
            None => true,
            Some((_, _, false)) => self.append_classic(block, amounts),
            Some((_, _, true)) => self.append_packed(block, amounts),
        }
    }

    pub(super) fn append_classic(
        &mut self,
        block: &[u8],
        amounts: impl IntoIterator<Item = (usize, f64)>,
    ) -> bool {
        let start = self.users.len();
        self.users.extend_from_slice(block);
        for (at, amount) in amounts {
            let slot = at
                .checked_add(8)
                .and_then(|end| self.users.get_mut(start + at..start + end));
            match slot {
                Some(slot) => slot.copy_from_slice(&amount.to_le_bytes()),
                None => {
                    self.users.truncate(start);
                    return false;
                }
            }
        }
        true
    }

    /// A packed block is the table's `resources` then its `users`: the
    /// names are read back (a few), the users copied, the amounts written.
    pub(super) fn append_packed(
        &mut self,
        block: &[u8],
        amounts: impl IntoIterator<Item = (usize, f64)>,
    ) -> bool {
        if !self.users.is_empty() || !self.resources.is_empty() || !self.amounts.is_empty() {
            return false;
        }
        let mut f = Fields::new(block);
        let users = loop {
            let rest = f.buf;
            match f.next_field() {
                Ok(Some((PACKED_RESOURCES, Field::Bytes(name)))) => {
                    match std::str::from_utf8(name) {
                        Ok(name) => self.resources.push(name.to_owned()),
                        Err(_) => break None,
                    }
                }
                Ok(Some((PACKED_USERS, _))) | Ok(None) => break Some(rest),
                _ => break None,
            }
        };
        let Some(users) = users else {
            self.resources.clear();
            return false;
        };
        // A block's users have at most 8 quotas a byte of it.
        let most = users.len().saturating_mul(8 * 4);
        let (mut count, mut end) = (0, 0);
        for (at, amount) in amounts {
            let after = at.saturating_add(1).saturating_mul(4);
            if after > most {
                break;
            }
            if after > self.amounts.len() {
                self.amounts.resize(after, 0);
            }
            self.amounts[after - 4..after]
                .copy_from_slice(&crate::f32_at_most(amount).to_le_bytes());
            count += 1;
            end = end.max(after);
        }
        if end != count * 4 || end != self.amounts.len() {
            self.resources.clear();
            self.amounts.clear();
            return false;
        }
        self.users.extend_from_slice(users);
        true
    }

    /// Ends the (service, slot) under way: `services[service] = {slots:
    /// {slot: {users}}}`, or a `packed` entry.
    pub(super) fn end(&mut self) {
        match self.open.take() {
            None => {}
            Some((service, slot, false)) => self.end_classic(&service, slot),
            Some((service, slot, true)) => self.end_packed(&service, slot),
        }
    }

    pub(super) fn end_classic(&mut self, service: &str, slot: i64) {
        // ServiceQuota { slots: { slot: UserQuotas { users } } }
        let slot_entry_len = key_len(ENTRY_KEY)
            + encoded_len_varint(slot as u64)
            + delimited_len(ENTRY_VALUE, self.users.len());
        let service_quota_len = delimited_len(MAP_FIELD, slot_entry_len);
        let buf = &mut self.services;
        put_string_entry_head(buf, QUOTA_SERVICES, service, service_quota_len);
        put_delimited_header(buf, MAP_FIELD, slot_entry_len);
        put_key(buf, ENTRY_KEY, WireType::Varint);
        encode_varint(slot as u64, buf);
        put_delimited_header(buf, ENTRY_VALUE, self.users.len());
        let start = buf.len();
        buf.extend_from_slice(&self.users);
        self.blocks.push((false, start..buf.len()));
        self.users.clear();
    }

    /// `PackedQuota { service, slot, resources, users, amounts }`: the
    /// resources and users, one after the other, are the block.
    pub(super) fn end_packed(&mut self, service: &str, slot: i64) {
        let resources_len: usize = self
            .resources
            .iter()
            .map(|r| delimited_len(PACKED_RESOURCES, r.len()))
            .sum();
        let body_len = delimited_len(PACKED_SERVICE, service.len())
            + key_len(PACKED_SLOT)
            + encoded_len_varint(slot as u64)
            + resources_len
            + self.users.len()
            + delimited_len(PACKED_AMOUNTS, self.amounts.len());
        let buf = &mut self.packed;
        buf.reserve(delimited_len(QUOTA_PACKED, body_len));
        put_delimited_header(buf, QUOTA_PACKED, body_len);
        put_str(buf, PACKED_SERVICE, service);
        put_key(buf, PACKED_SLOT, WireType::Varint);
        encode_varint(slot as u64, buf);
        let start = buf.len();
        for r in &self.resources {
            put_str(buf, PACKED_RESOURCES, r);
        }
        buf.extend_from_slice(&self.users);
        let end = buf.len();
        put_delimited_header(buf, PACKED_AMOUNTS, self.amounts.len());
        buf.extend_from_slice(&self.amounts);
        self.blocks.push((true, start..end));
        self.users.clear();
        self.resources.clear();
        self.amounts.clear();
    }

    /// The encoded [`v1::CentralMessage`](crate::v1::CentralMessage), answering the report of
    /// `report_slot` if given.
    pub fn finish(self, report_slot: Option<i64>) -> Bytes {
        self.finish_with_users(report_slot).0
    }

    /// [`finish`](Self::finish), and where each (service, slot) begun put
    /// its users in the message, in the order begun: a slice of the
    /// message there is that block, with no copy (what
    /// [`append_users`](Self::append_users) may append again).
    pub fn finish_with_users(mut self, report_slot: Option<i64>) -> (Bytes, Vec<Range<usize>>) {
        self.end();
        let report_len = report_slot.map_or(0, |s| {
            key_len(QUOTA_REPORT_SLOT) + encoded_len_varint(s as u64)
        });
        let quota_len = self.services.len() + self.packed.len() + self.refs.len() + report_len;
        let mut out = Vec::with_capacity(delimited_len(CENTRAL_MESSAGE_QUOTA, quota_len));
        put_delimited_header(&mut out, CENTRAL_MESSAGE_QUOTA, quota_len);
        let shift = out.len();
        out.extend_from_slice(&self.services);
        out.extend_from_slice(&self.packed);
        out.extend_from_slice(&self.refs);
        if let Some(s) = report_slot {
            put_key(&mut out, QUOTA_REPORT_SLOT, WireType::Varint);
            encode_varint(s as u64, &mut out);
        }
        let packed_shift = shift + self.services.len();
        let blocks = self
            .blocks
            .into_iter()
            .map(|(packed, b)| {
                let shift = if packed { packed_shift } else { shift };
                b.start + shift..b.end + shift
            })
            .collect();
        (out.into(), blocks)
    }
}

/// `q` as the central writes it, table by table: the tables of the `i`th
/// service packed where `packed(i)`. A service with several slots is
/// begun once per slot.
#[cfg(test)]
pub(crate) fn encode_tables(q: &crate::v1::Quota, packed: impl Fn(usize) -> bool) -> Bytes {
    let mut encoder = QuotaEncoder::new();
    for (i, (service, sq)) in q.services.iter().enumerate() {
        for (slot, users) in &sq.slots {
            if packed(i) {
                encoder.begin_packed(service, *slot);
            } else {
                encoder.begin(service, *slot);
            }
            for (user, rq) in &users.users {
                encoder.user(user, rq.resources.iter().map(|(r, a)| (r.as_str(), *a)));
            }
        }
    }
    for r in &q.refs {
        encoder.refer(&r.service, r.slot, r.from_slot);
    }
    encoder.finish(q.report_slot)
}
