//! A node's side of the stream: quotas read where they arrived.
//!
//! Decoded by prost, the answer to a report of 3,000 users is two tables of
//! 3,000 users, each user a `String` and a `BTreeMap` of `String`s, all
//! allocated, installed once and freed: most of the node's work each slot.
//! [`Answer`] keeps a quota's bytes as received, and [`RawQuota`] checks
//! them once, listing its tables, users and quotas as the store installs
//! them.
//!
//! Against prost decoding the same answer: `cargo bench -p throttle-layer
//! --bench store -- slot/` and `docs/performance.md`.

use prost::encoding::WireType;

use super::fields::*;
use super::raw_report::*;
use super::read::*;

/// Why [`RawQuota::parse`] did not accept a quota.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RawQuotaError {
    /// Not a valid encoding of a [`v1::Quota`](crate::v1::Quota).
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
            // A quota is read with no limit on its users.
            RawReportError::TooManyUsers { .. } => Self::Malformed("too many users"),
        }
    }
}

/// A [`v1::Quota`](crate::v1::Quota) read from its bytes: checked once by
/// [`RawQuota::parse`], which lists its tables, users and quotas and keeps
/// their names in one checked string, so that installing it reads neither
/// the framing nor UTF-8 again.
#[derive(Debug, Clone)]
pub struct RawQuota {
    /// Every name, one after the other.
    pub(super) names: String,
    pub(super) report_slot: Option<i64>,
    pub(super) tables: Vec<RawTable>,
    /// Every table's users, then every user's quotas, in the order sent.
    pub(super) users: Vec<RawUser>,
    pub(super) quotas: Vec<RawQuotaEntry>,
    /// The quota's [`v1::QuotaRef`]s: (service, slot, from slot).
    pub(super) refs: Vec<((u32, u32), i64, i64)>,
}

/// One (service, slot) table of a [`RawQuota`].
#[derive(Debug, Clone)]
pub(super) struct RawTable {
    pub(super) service: (u32, u32),
    pub(super) slot: i64,
    /// Its users in [`RawQuota::users`].
    pub(super) users: std::ops::Range<usize>,
}

/// One (resource, quota) of a user.
#[derive(Debug, Clone, Copy)]
pub(super) struct RawQuotaEntry {
    pub(super) resource: (u32, u32),
    pub(super) quota: f64,
}

/// A map entry's key and value fields, each the last one given (prost's
/// rule for scalars); `None` where absent.
pub(super) type EntryFields<'a> = (Option<Field<'a>>, Option<Field<'a>>);

/// A map entry in any layout protobuf allows: the way every service and
/// slot entry is read, and a user's or quota's not laid out as prost
/// writes it.
pub(super) fn entry_fields(body: &[u8]) -> Result<EntryFields<'_>, RawQuotaError> {
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
pub(super) fn string_key(key: Option<Field<'_>>) -> Result<&[u8], RawQuotaError> {
    match key {
        None => Ok(&[]),
        Some(Field::Bytes(b)) => Ok(utf8(b)?),
        Some(_) => Err(RawQuotaError::Malformed("map key of the wrong type")),
    }
}

/// A message value (empty when absent).
pub(super) fn message_value(value: Option<Field<'_>>) -> Result<&[u8], RawQuotaError> {
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
pub(super) fn message_entry(body: &[u8]) -> Result<(&[u8], &[u8]), RawQuotaError> {
    if let Some((key, value)) = two_delimited(body, ENTRY_KEY, ENTRY_VALUE) {
        return Ok((utf8(key)?, value));
    }
    let (key, value) = entry_fields(body)?;
    Ok((string_key(key)?, message_value(value)?))
}

/// A (string, double) map entry: its checked key and the quota; as
/// [`message_entry`], without the general loop for the usual layout.
#[inline]
pub(super) fn quota_entry(body: &[u8]) -> Result<(&[u8], f64), RawQuotaError> {
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
pub(super) fn check_ref(body: &[u8]) -> Result<(&[u8], i64, i64), RawQuotaError> {
    let (mut service, mut slot, mut from) = (&[][..], 0, 0);
    let mut f = Fields::new(body);
    while let Some((n, field)) = f.next_field()? {
        match (n, field) {
            (QUOTA_REF_SERVICE, Field::Bytes(b)) => service = utf8(b)?,
            (QUOTA_REF_SLOT, Field::Varint(v)) => slot = v as i64,
            (QUOTA_REF_FROM_SLOT, Field::Varint(v)) => from = v as i64,
            (QUOTA_REF_SERVICE | QUOTA_REF_SLOT | QUOTA_REF_FROM_SLOT, _) => {
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
pub(super) struct Floats<'a> {
    pub(super) at: &'a [u8],
    pub(super) rest: std::slice::Iter<'a, &'a [u8]>,
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
    /// Checks `bytes` (the encoding of a [`v1::Quota`](crate::v1::Quota)) from end to end:
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
                (QUOTA_REFS, Field::Bytes(b)) => {
                    let (service, slot, from) = check_ref(b)?;
                    quota.refs.push((names.keep(service), slot, from));
                }
                (QUOTA_SERVICES | QUOTA_REPORT_SLOT | QUOTA_PACKED | QUOTA_REFS, _) => {
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
    pub(super) fn check_packed<'a>(
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
    pub(super) fn check_users(
        &mut self,
        body: &[u8],
        names: &mut Names,
    ) -> Result<(), RawQuotaError> {
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

    /// Every [`v1::QuotaRef`](crate::v1::QuotaRef) as (service, slot, from slot), in the order
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
    pub(super) quota: &'a RawQuota,
    pub(super) users: std::slice::Iter<'a, RawUser>,
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
    pub(super) names: &'a str,
    pub(super) quotas: std::slice::Iter<'a, RawQuotaEntry>,
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
