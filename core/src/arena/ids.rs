//! Interned identities: nodes, (user, resource) keys, resource names.

use std::collections::HashMap;
use std::sync::Arc;

use throttle_proto::MAX_NAME_LEN;

/// Hash map with a fast, seeded hasher: names come from the network, so the
/// seed matters, and ingest hashes several names per entry, so speed does too.
pub type Map<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// A node, interned: cheap to copy and compare.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(pub(crate) u32);

impl NodeId {
    /// The index of the node among all nodes seen (dense, from 0).
    pub fn index(self) -> usize {
        self.0 as usize
    }

    pub(crate) fn from_index(i: usize) -> Self {
        Self(i as u32)
    }

    #[cfg(test)]
    pub(crate) fn test(i: u32) -> Self {
        Self(i)
    }
}

/// The place of one (user, resource) key in its service's arena.
///
/// Ids are dense, so per-key tables (grants, a policy's history) are plain
/// vectors. A freed id is reused only once no assignment in the book or
/// the quota history can still name it, and an id cut from the arena's end
/// leaves the book with its key ([`Cuts`](super::Cuts));
/// [`Key::generation`](super::Key::generation) tells a reused id from its former key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KeyId(pub(crate) u32);

impl KeyId {
    #[cfg(test)]
    pub(crate) fn test(i: u32) -> Self {
        Self(i)
    }

    /// The index in the arena (and in any per-key table).
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// A resource's name, interned per service: every key of the resource
/// holds the one copy, through a pointer of 8 bytes (an `Arc<str>` is 16),
/// and reads it through a second pointer, to one of a few names that stay
/// in cache.
#[derive(Debug, Clone)]
pub(crate) struct Name(pub(crate) Arc<Box<str>>);

impl std::ops::Deref for Name {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl std::borrow::Borrow<str> for Name {
    fn borrow(&self) -> &str {
        self
    }
}

impl PartialEq for Name {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl Eq for Name {}

impl std::hash::Hash for Name {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        (**self).hash(state);
    }
}

/// Whether `name` may name a service, user, resource or node: 1 to
/// [`MAX_NAME_LEN`] bytes.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty() && name.len() <= MAX_NAME_LEN
}
