//! Writing protobuf field by field: keys, lengths, strings.

use prost::encoding::{WireType, encode_varint, encoded_len_varint};

use super::fields::*;

pub(super) fn key_len(field: u32) -> usize {
    encoded_len_varint(u64::from(field << 3))
}

pub(super) fn put_key(buf: &mut Vec<u8>, field: u32, wire_type: WireType) {
    encode_varint(u64::from(field << 3 | wire_type as u32), buf);
}

/// Length of a length-delimited field holding `len` bytes.
pub(super) fn delimited_len(field: u32, len: usize) -> usize {
    key_len(field) + encoded_len_varint(len as u64) + len
}

pub(super) fn put_delimited_header(buf: &mut Vec<u8>, field: u32, len: usize) {
    put_key(buf, field, WireType::LengthDelimited);
    encode_varint(len as u64, buf);
}

pub(super) fn put_str(buf: &mut Vec<u8>, field: u32, s: &str) {
    put_delimited_header(buf, field, s.len());
    buf.extend_from_slice(s.as_bytes());
}

/// Length of one `resources` map entry (name -> double), without its header.
pub(super) fn resource_entry_len(name: &str) -> usize {
    delimited_len(ENTRY_KEY, name.len()) + key_len(ENTRY_VALUE) + 8
}

/// Writes a `PackedUser` of `user` into `buf` from its (resource, amount)
/// pairs. A resource's bit is its place in `resources`, where a name not
/// listed yet is added. `user_bits` is left holding the user's (bit,
/// amount) pairs in the order of its bits, which is the order its amounts
/// go in: a resource given twice keeps its last amount, as a map would.
/// `given`, if any, gets each pair's bit in the order given.
pub(super) fn put_packed_user<'a, A: Copy>(
    buf: &mut Vec<u8>,
    resources: &mut Vec<String>,
    user_bits: &mut Vec<(usize, A)>,
    user: &str,
    pairs: impl IntoIterator<Item = (&'a str, A)>,
    mut given: Option<&mut Vec<usize>>,
) {
    user_bits.clear();
    for (name, amount) in pairs {
        let bit = match resources.iter().position(|r| r == name) {
            Some(bit) => bit,
            None => {
                resources.push(name.to_owned());
                resources.len() - 1
            }
        };
        match user_bits.iter_mut().find(|(b, _)| *b == bit) {
            Some(e) => e.1 = amount,
            None => user_bits.push((bit, amount)),
        }
        if let Some(given) = given.as_deref_mut() {
            given.push(bit);
        }
    }
    user_bits.sort_unstable_by_key(|&(bit, _)| bit);
    let bytes = user_bits.last().map_or(0, |&(bit, _)| bit / 8 + 1);
    let name_len = if user.is_empty() {
        0
    } else {
        delimited_len(PACKED_USER_USER, user.len())
    };
    let bits_len = if bytes > 0 {
        delimited_len(PACKED_USER_RESOURCES, bytes)
    } else {
        0
    };
    put_delimited_header(buf, PACKED_USERS, name_len + bits_len);
    if !user.is_empty() {
        put_str(buf, PACKED_USER_USER, user);
    }
    if bytes > 0 {
        put_delimited_header(buf, PACKED_USER_RESOURCES, bytes);
        let at = buf.len();
        buf.resize(at + bytes, 0);
        for &(bit, _) in user_bits.iter() {
            buf[at + bit / 8] |= 1 << (bit % 8);
        }
    }
}

/// Writes, as field `field`, the head of a map entry with a string key:
/// the entry's header, the key, and the header of a `value_len`-byte
/// value, which the caller writes next. Room for the whole entry is
/// reserved at once.
#[inline]
pub(super) fn put_string_entry_head(buf: &mut Vec<u8>, field: u32, key: &str, value_len: usize) {
    let entry_len = delimited_len(ENTRY_KEY, key.len()) + delimited_len(ENTRY_VALUE, value_len);
    buf.reserve(delimited_len(field, entry_len));
    put_delimited_header(buf, field, entry_len);
    put_str(buf, ENTRY_KEY, key);
    put_delimited_header(buf, ENTRY_VALUE, value_len);
}
