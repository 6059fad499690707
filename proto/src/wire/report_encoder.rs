//! [`ReportEncoder`]: a node's report written as prost writes it, without
//! building a message; packed usages ([`UsageEncoder::packed`]).
//!
//! Against prost building and encoding the same report from the store:
//! `docs/performance.md`.

use bytes::Bytes;
use prost::Message;
use prost::encoding::{WireType, encode_varint, encoded_len_varint};

use super::fields::*;
use super::write::*;
use crate::v1;

/// Writes the users of one [`v1::Usage`] (a service's consumption or
/// rejection in a report), user by user, as prost writes them: give users
/// in increasing name order, and each user's resources in increasing name
/// order, as the central's [`RawReport`](super::RawReport) reads them
/// fastest (out of order it decodes them with prost instead). Or, made
/// with [`UsageEncoder::packed`], as a [`v1::PackedUsage`].
#[derive(Debug, Default, Clone)]
pub struct UsageEncoder {
    pub(super) users: Vec<u8>,
    pub(super) packed: Option<PackedParts>,
}

/// A packed usage's resources, in the order of its bits, and its amounts
/// (varints); scratch for one user's (bit, amount) pairs.
#[derive(Debug, Default, Clone)]
pub(super) struct PackedParts {
    pub(super) resources: Vec<String>,
    pub(super) amounts: Vec<u8>,
    pub(super) user: Vec<(usize, i64)>,
}

/// A string map key, left out when empty, as prost leaves out defaults.
pub(super) fn key_len_of(s: &str) -> usize {
    if s.is_empty() {
        0
    } else {
        delimited_len(ENTRY_KEY, s.len())
    }
}

pub(super) fn put_key_str(buf: &mut Vec<u8>, s: &str) {
    if !s.is_empty() {
        put_str(buf, ENTRY_KEY, s);
    }
}

/// Length of one `Amounts.resources` entry (name -> int64), without its
/// header; a zero amount is left out, as prost leaves it out.
pub(super) fn amount_entry_len(name: &str, amount: i64) -> usize {
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
    pub(super) fn user<'a>(
        &mut self,
        users: &mut Vec<u8>,
        user: &str,
        amounts: impl IntoIterator<Item = (&'a str, i64)>,
    ) {
        put_packed_user(
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
    pub(super) consumption: Vec<u8>,
    pub(super) rejection: Vec<u8>,
    pub(super) packed: Vec<u8>,
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
    pub(super) fn packed_usage(
        &mut self,
        service: &str,
        rejection: bool,
        users: &[u8],
        parts: &PackedParts,
    ) {
        let resources: usize = parts
            .resources
            .iter()
            .map(|r| delimited_len(PACKED_RESOURCES, r.len()))
            .sum();
        let body = delimited_len(PACKED_SERVICE, service.len())
            + if rejection {
                key_len(PACKED_USAGE_REJECTION) + 1
            } else {
                0
            }
            + resources
            + users.len()
            + delimited_len(PACKED_AMOUNTS, parts.amounts.len());
        let buf = &mut self.packed;
        put_delimited_header(buf, REPORT_PACKED, body);
        put_str(buf, PACKED_SERVICE, service);
        if rejection {
            put_key(buf, PACKED_USAGE_REJECTION, WireType::Varint);
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
