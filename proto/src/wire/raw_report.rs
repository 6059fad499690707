//! [`RawReport`]: a report checked once and read where it arrived.
//!
//! Against prost on the same bytes, filing included: 23.8 M entries/s per
//! core against 6.1 M (`cargo bench -p throttle-central --bench central`).

use std::ops::Range;

use bytes::Bytes;

use super::fields::*;
use super::read::*;

/// A service's usage in a [`RawReport`].
#[derive(Debug, Clone)]
pub(super) struct RawUsage {
    pub(super) rejection: bool,
    pub(super) service: (u32, u32),
    /// Its users in [`RawReport::users`].
    pub(super) users: Range<usize>,
}

/// One user of a usage: its name and its entries in [`RawReport::entries`].
#[derive(Debug, Clone)]
pub(super) struct RawUser {
    pub(super) name: (u32, u32),
    pub(super) entries: Range<u32>,
}

/// One (resource, amount) of a user.
#[derive(Debug, Clone, Copy)]
pub(super) struct RawEntry {
    pub(super) resource: (u32, u32),
    pub(super) amount: i64,
}

/// The names of a report as [`RawReport::parse`] checks them: each checked
/// as UTF-8 in place, then copied after the others into one buffer, which
/// becomes a `String` in one more check, fast over ASCII. Names are then
/// sliced from it as `str`, where reading each from the received bytes
/// would check its UTF-8 again: that was a third of filing a report.
#[derive(Default)]
pub(super) struct Names(pub(super) Vec<u8>);

impl Names {
    /// Keeps `name`, returning where it is: (start, length), (0, 0) for
    /// an empty name. `parse` refuses messages of 4 GiB or more, and the
    /// names are within one, so both fit.
    pub(super) fn keep(&mut self, name: &[u8]) -> (u32, u32) {
        if name.is_empty() {
            return (0, 0);
        }
        let start = self.0.len();
        self.0.extend_from_slice(name);
        (start as u32, name.len() as u32)
    }

    /// Keeps `name`, or reuses `like` if that is the same name: a user's
    /// resources are usually named as the user's before.
    #[inline]
    pub(super) fn keep_like(&mut self, like: Option<(u32, u32)>, name: &[u8]) -> (u32, u32) {
        match like {
            Some(at) if self.0.get(at.0 as usize..at.0 as usize + at.1 as usize) == Some(name) => {
                at
            }
            _ => self.keep(name),
        }
    }

    pub(super) fn into_string(self) -> Result<String, RawReportError> {
        String::from_utf8(self.0).map_err(|_| RawReportError::Malformed("string is not UTF-8"))
    }
}

/// `Err` once `users` holds more than `max`.
fn within(users: &[RawUser], max: usize) -> Result<(), RawReportError> {
    if users.len() > max {
        return Err(RawReportError::TooManyUsers { max });
    }
    Ok(())
}

/// The name at `at` in a report's names ("" if there is none there).
pub(super) fn name_at(names: &str, at: (u32, u32)) -> &str {
    let (start, len) = (at.0 as usize, at.1 as usize);
    names.get(start..start + len).unwrap_or_default()
}

/// A [`v1::Report`](crate::v1::Report) read from its bytes: checked once by
/// [`RawReport::parse`], which lists its users and amounts, and keeps its
/// names, so that filing it reads neither the framing nor UTF-8 again.
#[derive(Debug, Clone)]
pub struct RawReport {
    /// Every name, one after the other.
    pub(super) names: String,
    pub(super) node_id: (u32, u32),
    pub(super) slot_number: i64,
    /// `Report.answered`.
    pub(super) answered: bool,
    pub(super) usages: Vec<RawUsage>,
    /// Every usage's users, then every user's entries, found while
    /// checking: filing reads these flat lists, not the framing again.
    pub(super) users: Vec<RawUser>,
    pub(super) entries: Vec<RawEntry>,
}

impl RawReport {
    /// Checks `bytes` (the encoding of a [`v1::Report`](crate::v1::Report)) from end to end:
    /// structure, UTF-8 of every name, and that every map is in key order,
    /// as prost writes them.
    ///
    /// # Errors
    ///
    /// [`RawReportError::Malformed`] where prost would fail to decode it too;
    /// [`RawReportError::Unordered`] where prost would decode it but this
    /// reader might not read it the same way.
    pub fn parse(bytes: Bytes) -> Result<Self, RawReportError> {
        Self::parse_within(bytes, usize::MAX)
    }

    /// As [`RawReport::parse`], refusing a report of more than `max_users`
    /// users (over all its usages) at the first past it, before listing
    /// the rest: a report too large is measured, not read whole.
    ///
    /// # Errors
    ///
    /// As [`RawReport::parse`], and [`RawReportError::TooManyUsers`].
    pub fn parse_within(bytes: Bytes, max_users: usize) -> Result<Self, RawReportError> {
        let whole = &bytes[..];
        if u32::try_from(whole.len()).is_err() {
            return Err(RawReportError::Unordered);
        }
        let mut node_id = (0, 0);
        let mut slot_number = 0;
        let mut answered = false;
        let mut usages = Vec::new();
        let mut users = Vec::new();
        // About 20 bytes per entry in reports of short names.
        let mut entries = Vec::with_capacity(whole.len() / 20);
        let mut prev_service: [Option<&[u8]>; 2] = [None, None];
        // The (service, rejection) of the packed tables: one also in the
        // maps, or packed twice, is left to prost once the whole report is
        // known to decode.
        let mut packed: Vec<(&[u8], bool)> = Vec::new();
        let mut mapped: [Vec<&[u8]>; 2] = [Vec::new(), Vec::new()];
        let mut repeated = false;
        let mut names = Names::default();
        let mut f = Fields::new(whole);
        while let Some((n, field)) = f.next_field()? {
            match (n, field) {
                (1, Field::Bytes(b)) => node_id = names.keep(utf8(b)?),
                (2, Field::Varint(v)) => slot_number = v as i64,
                (REPORT_PACKED, Field::Bytes(b)) => {
                    let first = users.len();
                    let (service, rejection) =
                        Self::check_packed(b, &mut names, &mut users, &mut entries)?;
                    within(&users, max_users)?;
                    repeated |= packed.contains(&(service, rejection));
                    packed.push((service, rejection));
                    usages.push(RawUsage {
                        rejection,
                        service: names.keep(service),
                        users: first..users.len(),
                    });
                }
                (3 | 4, Field::Bytes(b)) => {
                    let rejection = n == 4;
                    let (service, usage, _) = entry(b, Value::Message)?;
                    in_order(&mut prev_service[usize::from(rejection)], service)?;
                    mapped[usize::from(rejection)].push(service);
                    let first = users.len();
                    Self::check_usage(usage, &mut names, &mut users, &mut entries, max_users)?;
                    usages.push(RawUsage {
                        rejection,
                        service: names.keep(service),
                        users: first..users.len(),
                    });
                }
                (REPORT_ANSWERED, Field::Varint(v)) => answered = v != 0,
                (1..=REPORT_ANSWERED, _) => {
                    return Err(RawReportError::Malformed("report field of the wrong type"));
                }
                _ => {}
            }
        }
        // A packed table's (service, kind) also in the maps.
        repeated |= packed
            .iter()
            .any(|(service, rejection)| mapped[usize::from(*rejection)].contains(service));
        if repeated {
            return Err(RawReportError::Unordered);
        }
        Ok(Self {
            names: names.into_string()?,
            node_id,
            slot_number,
            answered,
            usages,
            users,
            entries,
        })
    }

    /// Checks a `PackedUsage` body, listing its users and their entries as
    /// [`RawReport::check_usage`] lists a map's: its resources and amounts
    /// first, then its users (fields may come in any order). Returns its
    /// (service, rejection). Users and resources out of order are left to
    /// prost, as in the maps.
    pub(super) fn check_packed<'a>(
        body: &'a [u8],
        names: &mut Names,
        users: &mut Vec<RawUser>,
        entries: &mut Vec<RawEntry>,
    ) -> Result<(&'a [u8], bool), RawReportError> {
        const WRONG: RawReportError = RawReportError::Malformed("packed field of the wrong type");
        let (mut service, mut rejection) = (&[][..], false);
        let mut resources: Vec<(u32, u32)> = Vec::new();
        let mut prev_resource = None;
        let mut amounts: Vec<Field<'_>> = Vec::new();
        let mut f = Fields::new(body);
        while let Some((n, field)) = f.next_field()? {
            match (n, field) {
                (PACKED_SERVICE, Field::Bytes(b)) => service = utf8(b)?,
                (PACKED_USAGE_REJECTION, Field::Varint(v)) => rejection = v != 0,
                (PACKED_RESOURCES, Field::Bytes(b)) => {
                    let name = utf8(b)?;
                    in_order(&mut prev_resource, name)?;
                    resources.push(names.keep(name));
                }
                // Packed, or one at a time: protobuf allows both.
                (PACKED_AMOUNTS, field @ (Field::Bytes(_) | Field::Varint(_))) => {
                    amounts.push(field);
                }
                (PACKED_USERS, Field::Bytes(_)) => {}
                (PACKED_SERVICE..=PACKED_AMOUNTS, _) => return Err(WRONG),
                _ => {}
            }
        }
        let mut amounts = Varints {
            at: Fields::new(&[]),
            one: None,
            rest: amounts.into_iter(),
        };
        let mut prev_user = None;
        let mut f = Fields::new(body);
        while let Some((name, bits)) = f.next_packed_user()? {
            in_order(&mut prev_user, name)?;
            let first = entries.len();
            for bit in crate::Bits::new(bits) {
                let resource = *resources.get(bit).ok_or(RawReportError::Malformed(
                    "a packed user names a resource its table does not list",
                ))?;
                let amount = amounts.next().ok_or(RawReportError::Malformed(
                    "fewer packed amounts than entries",
                ))??;
                entries.push(RawEntry {
                    resource,
                    amount: amount as i64,
                });
            }
            users.push(RawUser {
                name: names.keep(name),
                entries: first as u32..entries.len() as u32,
            });
        }
        if amounts.next().is_some() {
            return Err(RawReportError::Malformed(
                "more packed amounts than entries",
            ));
        }
        Ok((service, rejection))
    }

    /// Checks a `Usage` body, listing its users and their entries.
    pub(super) fn check_usage(
        usage: &[u8],
        names: &mut Names,
        users: &mut Vec<RawUser>,
        entries: &mut Vec<RawEntry>,
        max_users: usize,
    ) -> Result<(), RawReportError> {
        let mut prev_user = None;
        // The previous user's entries, whose names the next user's likely
        // repeat.
        let mut like = 0..0;
        let mut f = Fields::new(usage);
        while let Some(b) = map_entry(&mut f, "usage field of the wrong type")? {
            let (user, amounts, _) = entry(b, Value::Message)?;
            in_order(&mut prev_user, user)?;
            let first = entries.len();
            let mut prev_resource = None;
            let mut a = Fields::new(amounts);
            while let Some(b) = map_entry(&mut a, "amounts field of the wrong type")? {
                let (resource, _, amount) = entry(b, Value::Integer)?;
                in_order(&mut prev_resource, resource)?;
                // The previous user's resource in the same place.
                let at = like.start + (entries.len() - first);
                let before = entries.get(at).filter(|_| at < like.end);
                entries.push(RawEntry {
                    resource: names.keep_like(before.map(|e| e.resource), resource),
                    amount: amount as i64,
                });
            }
            like = first..entries.len();
            users.push(RawUser {
                name: names.keep(user),
                entries: first as u32..entries.len() as u32,
            });
            within(users, max_users)?;
        }
        Ok(())
    }

    /// How many users the report encoded in `bytes` names over all its
    /// usages: a walk over its framing that keeps nothing, to measure a
    /// report [`RawReport::parse`] leaves to prost before prost decodes it.
    ///
    /// # Errors
    ///
    /// [`RawReportError::Malformed`] where the framing is broken.
    pub fn count_users(bytes: &[u8]) -> Result<usize, RawReportError> {
        let mut count = 0;
        let mut f = Fields::new(bytes);
        while let Some((n, field)) = f.next_field()? {
            match (n, field) {
                (REPORT_PACKED, Field::Bytes(b)) => {
                    let mut p = Fields::new(b);
                    while let Some((m, _)) = p.next_field()? {
                        count += usize::from(m == PACKED_USERS);
                    }
                }
                (3 | 4, Field::Bytes(b)) => {
                    let (_, usage, _) = entry(b, Value::Message)?;
                    let mut u = Fields::new(usage);
                    while map_entry(&mut u, "usage field of the wrong type")?.is_some() {
                        count += 1;
                    }
                }
                _ => {}
            }
        }
        Ok(count)
    }

    /// The node's id as it wrote it (may be empty).
    pub fn node_id(&self) -> &str {
        name_at(&self.names, self.node_id)
    }

    /// The slot the report was sent in.
    pub fn slot_number(&self) -> i64 {
        self.slot_number
    }

    /// `Report.answered`: sent again after another central answered it.
    pub fn answered(&self) -> bool {
        self.answered
    }

    /// Users over all services, consumption and rejection.
    pub fn user_count(&self) -> usize {
        self.users.len()
    }

    /// Every (service, consumption or rejection) usage, in the order sent.
    pub fn usages(&self) -> impl Iterator<Item = (&str, bool, RawUsers<'_>)> {
        self.usages.iter().map(|u| {
            let service = name_at(&self.names, u.service);
            let users = RawUsers {
                names: &self.names,
                users: self.users[u.users.clone()].iter(),
                entries: &self.entries,
            };
            (service, u.rejection, users)
        })
    }
}

/// The users of one usage of a [`RawReport`], with their amounts.
pub struct RawUsers<'a> {
    pub(super) names: &'a str,
    pub(super) users: std::slice::Iter<'a, RawUser>,
    pub(super) entries: &'a [RawEntry],
}

impl std::fmt::Debug for RawUsers<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawUsers")
            .field("users", &self.users.len())
            .finish()
    }
}

impl<'a> Iterator for RawUsers<'a> {
    type Item = (&'a str, RawAmounts<'a>);

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        let user = self.users.next()?;
        let (start, end) = (user.entries.start as usize, user.entries.end as usize);
        let amounts = RawAmounts {
            names: self.names,
            entries: self.entries.get(start..end).unwrap_or_default().iter(),
        };
        Some((name_at(self.names, user.name), amounts))
    }
}

/// One user's amounts per resource in a [`RawReport`].
pub struct RawAmounts<'a> {
    pub(super) names: &'a str,
    pub(super) entries: std::slice::Iter<'a, RawEntry>,
}

impl std::fmt::Debug for RawAmounts<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawAmounts")
            .field("entries", &self.entries.len())
            .finish()
    }
}

impl<'a> Iterator for RawAmounts<'a> {
    type Item = (&'a str, i64);

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        let e = self.entries.next()?;
        Some((name_at(self.names, e.resource), e.amount))
    }
}
