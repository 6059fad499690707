//! The users of a service the central has blocked: refused on every
//! request whatever their quota. Read on every request, so an empty list
//! (the usual case) costs one relaxed load; a list is replaced whole when
//! the central sends a new one.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use arc_swap::ArcSwap;

type Users = HashSet<Box<str>, foldhash::fast::RandomState>;

/// One service's blocked users.
#[derive(Debug, Default)]
pub(crate) struct Blocked {
    /// Whether `users` is not empty: checked first.
    any: AtomicBool,
    users: ArcSwap<Users>,
}

impl Blocked {
    /// Makes `users` the blocked users.
    pub(crate) fn set(&self, users: Vec<String>) {
        let users: Users = users.into_iter().map(String::into_boxed_str).collect();
        let any = !users.is_empty();
        self.users.store(Arc::new(users));
        self.any.store(any, Ordering::Release);
    }

    /// Whether `user` is blocked.
    #[inline]
    pub(crate) fn contains(&self, user: &str) -> bool {
        self.any.load(Ordering::Relaxed) && self.users.load().contains(user)
    }

    /// How many users are blocked.
    #[cfg(any(test, feature = "sim"))]
    pub(crate) fn len(&self) -> usize {
        self.users.load().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_replaces_the_last() {
        let b = Blocked::default();
        assert!(!b.contains("mallory"));
        b.set(vec!["mallory".into(), "trudy".into()]);
        assert!(b.contains("mallory") && b.contains("trudy"));
        assert!(!b.contains("alice"));
        b.set(vec!["trudy".into()]);
        assert!(!b.contains("mallory"));
        b.set(Vec::new());
        assert!(!b.contains("trudy"));
        assert_eq!(b.len(), 0);
    }
}
