//! Reading protobuf field by field, checked once: fields, map entries,
//! varints, packed users.

use prost::encoding::{WireType, decode_varint};

use super::fields::*;

/// Why [`RawReport::parse`](super::RawReport::parse) did not read a report in place.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RawReportError {
    /// Not a valid encoding of a [`v1::Report`](crate::v1::Report).
    #[error("malformed report: {0}")]
    Malformed(&'static str),
    /// Valid, but written otherwise than prost writes it (map keys not in
    /// strictly increasing order, possibly repeated, or a value split in
    /// parts that prost would merge): decode it with prost instead.
    #[error("report maps are not in key order")]
    Unordered,
    /// More users than the reader was allowed
    /// ([`RawReport::parse_within`](super::RawReport::parse_within)).
    #[error("report carries more users than the limit of {max}")]
    TooManyUsers {
        /// The limit.
        max: usize,
    },
}

/// One field of a message, borrowed from its bytes.
pub(super) enum Field<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
    /// A fixed-width value: its 8 or 4 bytes, little-endian.
    Fixed(&'a [u8]),
}

/// Reads the fields of one message body.
#[derive(Clone)]
pub(super) struct Fields<'a> {
    pub(super) buf: &'a [u8],
}

impl<'a> Fields<'a> {
    #[inline]
    pub(super) fn new(buf: &'a [u8]) -> Self {
        Self { buf }
    }

    #[inline]
    pub(super) fn varint(&mut self) -> Result<u64, RawReportError> {
        // Keys, lengths and most amounts are one byte: read those here,
        // without prost's general loop.
        if let Some((&first, rest)) = self.buf.split_first()
            && first < 0x80
        {
            self.buf = rest;
            return Ok(u64::from(first));
        }
        let mut b = self.buf;
        let v = decode_varint(&mut b).map_err(|_| RawReportError::Malformed("bad varint"))?;
        self.buf = b;
        Ok(v)
    }

    #[inline]
    pub(super) fn take(&mut self, n: usize) -> Result<&'a [u8], RawReportError> {
        if n > self.buf.len() {
            return Err(RawReportError::Malformed("field extends past its message"));
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }

    /// The body of the next field when it is a length-delimited field
    /// `number` written as prost writes a short one: a one-byte key and a
    /// length of one or two bytes. `None` (and nothing read) otherwise, or
    /// when the length runs past the message: [`Fields::next_field`] then
    /// reads the field, or reports what is wrong with it.
    #[inline(always)]
    pub(super) fn short_delimited(&mut self, number: u32) -> Option<&'a [u8]> {
        let key = (number << 3 | WireType::LengthDelimited as u32) as u8;
        let (len, at) = match *self.buf {
            [k, l, ..] if k == key && l < 0x80 => (usize::from(l), 2),
            [k, l0, l1, ..] if k == key && l1 < 0x80 => {
                (usize::from(l0 & 0x7f) | usize::from(l1) << 7, 3)
            }
            _ => return None,
        };
        let body = self.buf.get(at..at + len)?;
        self.buf = &self.buf[at + len..];
        Some(body)
    }

    /// The next `users` field of a packed table (`PackedQuota` or
    /// `PackedUsage`), as its checked name and its bits, skipping the other
    /// fields; `None` at the end. Read without the general field loop
    /// where laid out as the encoders write it.
    #[inline]
    pub(super) fn next_packed_user(&mut self) -> Result<Option<PackedUser<'a>>, RawReportError> {
        loop {
            let user = match self.short_delimited(PACKED_USERS) {
                Some(user) => user,
                None => match self.next_field()? {
                    Some((PACKED_USERS, Field::Bytes(user))) => user,
                    Some(_) => continue,
                    None => return Ok(None),
                },
            };
            return packed_user(user).map(Some);
        }
    }

    /// The next field and its number, or `None` at the end.
    #[inline]
    pub(super) fn next_field(&mut self) -> Result<Option<(u32, Field<'a>)>, RawReportError> {
        if self.buf.is_empty() {
            return Ok(None);
        }
        // A key is a `u32` on the wire: prost refuses a wider one rather
        // than dropping its high bits, and so do we.
        let key = u32::try_from(self.varint()?)
            .map_err(|_| RawReportError::Malformed("field key too large"))?;
        let number = Some(key >> 3)
            .filter(|n| *n != 0)
            .ok_or(RawReportError::Malformed("bad field number"))?;
        let field = match key & 7 {
            0 => Field::Varint(self.varint()?),
            1 => Field::Fixed(self.take(8)?),
            2 => {
                let len = usize::try_from(self.varint()?)
                    .map_err(|_| RawReportError::Malformed("length too large"))?;
                Field::Bytes(self.take(len)?)
            }
            5 => Field::Fixed(self.take(4)?),
            _ => return Err(RawReportError::Malformed("unsupported wire type")),
        };
        Ok(Some((number, field)))
    }
}

/// Checks that a `string` field is UTF-8, as prost does, and keeps it as
/// bytes: names are ordered and located as bytes (the order of `str` is
/// their bytes' order) and read back as `str` by [`name_at`]. Most names are
/// ASCII, which is checked a word at a time.
#[inline]
pub(super) fn utf8(b: &[u8]) -> Result<&[u8], RawReportError> {
    if b.is_ascii() || std::str::from_utf8(b).is_ok() {
        Ok(b)
    } else {
        Err(RawReportError::Malformed("string is not UTF-8"))
    }
}

/// What a map's values are.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Value {
    Message,
    Integer,
}

/// A map entry: its key (a string) and its value (a message body or an
/// integer, as `value` says), defaults where absent.
#[inline]
pub(super) fn entry(body: &[u8], value: Value) -> Result<(&[u8], &[u8], u64), RawReportError> {
    match written_by_prost(body, value) {
        Some((key, message, number)) => Ok((utf8(key)?, message, number)),
        None => any_entry(body, value),
    }
}

/// [`entry`] for an entry laid out as prost writes one with a key and a
/// value: the key's field, then the value's, each once. Most entries of a
/// report are, and this reads them without [`Fields::next_field`]'s loop: a
/// 1,000-user report is checked in half the instructions. `None` for any
/// other layout, which [`any_entry`] then reads: a default key or value
/// left out, fields repeated or in another order, or anything malformed.
#[inline(always)]
pub(super) fn written_by_prost(body: &[u8], value: Value) -> Option<(&[u8], &[u8], u64)> {
    const AMOUNT: u8 = (ENTRY_VALUE << 3 | WireType::Varint as u32) as u8;
    let mut f = Fields::new(body);
    let key = f.short_delimited(ENTRY_KEY)?;
    match value {
        Value::Message => {
            let message = f.short_delimited(ENTRY_VALUE)?;
            f.buf.is_empty().then_some((key, message, 0))
        }
        Value::Integer => {
            let (&AMOUNT, mut amount) = f.buf.split_first()? else {
                return None;
            };
            // The amount is the entry's last byte: matched whole here, which
            // reads a report faster than `Fields::varint` would.
            let number = match *amount {
                [one] if one < 0x80 => u64::from(one),
                _ => {
                    let number = decode_varint(&mut amount).ok()?;
                    // Nothing may follow the amount.
                    amount.is_empty().then_some(number)?
                }
            };
            Some((key, &[][..], number))
        }
    }
}

/// [`entry`] for an entry in any layout protobuf allows.
#[cold]
#[inline(never)]
pub(super) fn any_entry(body: &[u8], value: Value) -> Result<(&[u8], &[u8], u64), RawReportError> {
    let (mut key, mut message, mut number) = (&[][..], &[][..], 0);
    let mut f = Fields::new(body);
    while let Some((n, field)) = f.next_field()? {
        match (n, field) {
            (ENTRY_KEY, Field::Bytes(b)) => key = utf8(b)?,
            // A message value given twice is merged by prost, field by
            // field: leave such an entry to prost.
            (ENTRY_VALUE, Field::Bytes(_)) if value == Value::Message && !message.is_empty() => {
                return Err(RawReportError::Unordered);
            }
            (ENTRY_VALUE, Field::Bytes(b)) if value == Value::Message => message = b,
            (ENTRY_VALUE, Field::Varint(v)) if value == Value::Integer => number = v,
            (ENTRY_KEY | ENTRY_VALUE, _) => {
                return Err(RawReportError::Malformed("map entry of the wrong type"));
            }
            _ => {}
        }
    }
    Ok((key, message, number))
}

/// The next entry of a message whose only field read is the map
/// [`MAP_FIELD`] (`Usage.users`, `Amounts.resources`), skipping any other
/// field; `None` at the end. `wrong` is the error for a map field that is
/// not length-delimited.
#[inline(always)]
pub(super) fn map_entry<'a>(
    f: &mut Fields<'a>,
    wrong: &'static str,
) -> Result<Option<&'a [u8]>, RawReportError> {
    if let Some(b) = f.short_delimited(MAP_FIELD) {
        return Ok(Some(b));
    }
    while let Some((n, field)) = f.next_field()? {
        match (n, field) {
            (MAP_FIELD, Field::Bytes(b)) => return Ok(Some(b)),
            (MAP_FIELD, _) => return Err(RawReportError::Malformed(wrong)),
            _ => {}
        }
    }
    Ok(None)
}

/// Checks that `prev < key`, remembering `key`.
#[inline]
pub(super) fn in_order<'a>(
    prev: &mut Option<&'a [u8]>,
    key: &'a [u8],
) -> Result<(), RawReportError> {
    if prev.is_some_and(|p| p >= key) {
        return Err(RawReportError::Unordered);
    }
    *prev = Some(key);
    Ok(())
}

/// A packed table's user: its name and its bits.
pub(super) type PackedUser<'a> = (&'a [u8], &'a [u8]);

/// `body`'s length-delimited fields `first` and `second` when it holds just
/// those, in that order, each once, as the encoders write them: read
/// without [`Fields::next_field`]'s loop.
#[inline]
pub(super) fn two_delimited(body: &[u8], first: u32, second: u32) -> Option<(&[u8], &[u8])> {
    let mut f = Fields::new(body);
    let a = f.short_delimited(first)?;
    let b = f.short_delimited(second)?;
    f.buf.is_empty().then_some((a, b))
}

/// A `PackedUser`: its checked name and its bits; read without
/// [`Fields::next_field`]'s loop when laid out as the encoders write it
/// (the name, then the bits, each once).
#[inline]
pub(super) fn packed_user(body: &[u8]) -> Result<(&[u8], &[u8]), RawReportError> {
    if let Some((name, bits)) = two_delimited(body, PACKED_USER_USER, PACKED_USER_RESOURCES) {
        return Ok((utf8(name)?, bits));
    }
    let (mut name, mut bits) = (&[][..], &[][..]);
    let mut f = Fields::new(body);
    while let Some((n, field)) = f.next_field()? {
        match (n, field) {
            (PACKED_USER_USER, Field::Bytes(b)) => name = utf8(b)?,
            (PACKED_USER_RESOURCES, Field::Bytes(b)) => bits = b,
            (PACKED_USER_USER | PACKED_USER_RESOURCES, _) => {
                return Err(RawReportError::Malformed(
                    "packed user field of the wrong type",
                ));
            }
            _ => {}
        }
    }
    Ok((name, bits))
}

/// The varints of a packed table's amounts, given packed (in one or more
/// fields) or one at a time.
pub(super) struct Varints<'a> {
    pub(super) at: Fields<'a>,
    pub(super) one: Option<u64>,
    pub(super) rest: std::vec::IntoIter<Field<'a>>,
}

impl Iterator for Varints<'_> {
    type Item = Result<u64, RawReportError>;

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some(v) = self.one.take() {
                return Some(Ok(v));
            }
            if !self.at.buf.is_empty() {
                return Some(self.at.varint());
            }
            match self.rest.next()? {
                Field::Bytes(b) => self.at = Fields::new(b),
                Field::Varint(v) => self.one = Some(v),
                Field::Fixed(_) => {}
            }
        }
    }
}
