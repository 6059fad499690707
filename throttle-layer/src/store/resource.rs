//! The resources a service counts, interned.

/// Most resources one service can count.
pub const MAX_RESOURCES: usize = 16;

/// A resource of one service, interned; see [`ServiceStore::resource`](super::ServiceStore::resource).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ResourceId(pub(super) u8);

impl ResourceId {
    #[inline]
    pub(super) fn index(self) -> usize {
        usize::from(self.0)
    }
}

/// An amount as a counter holds it: an absurd one (past `i64::MAX`) is
/// held to the most a counter takes.
#[inline]
pub(crate) fn counted(amount: u64) -> i64 {
    i64::try_from(amount).unwrap_or(i64::MAX)
}
