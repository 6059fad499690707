//! A service's limit rules as the ledger holds them: each user's own, and
//! the one for every other user (`*`), to limit a key the moment it is
//! created.

use std::collections::HashMap;

use crate::limits::{Limit, Resolved, resolve};

/// The rules of one service.
#[derive(Debug, Clone, Default)]
pub(crate) struct ServiceRules {
    own: HashMap<String, Limit, foldhash::fast::RandomState>,
    every: Option<Limit>,
}

impl ServiceRules {
    /// The rules of `limits` (later ones win for one user).
    pub(crate) fn new(limits: &[Limit]) -> Self {
        let mut rules = Self::default();
        for limit in limits {
            if limit.is_every_user() {
                rules.every = Some(limit.clone());
            } else {
                rules.own.insert(limit.user.clone(), limit.clone());
            }
        }
        rules
    }

    /// What limits (`user`, `resource`).
    pub(crate) fn resolve(&self, user: &str, resource: &str) -> Resolved {
        resolve(self.own.get(user), self.every.as_ref(), resource)
    }

    /// Whether `user` has a rule of their own: their keys are kept while
    /// it stands, idle or not.
    pub(crate) fn names(&self, user: &str) -> bool {
        self.own.contains_key(user)
    }

    /// The rule of every user without one of their own, if any.
    pub(crate) fn every(&self) -> Option<&Limit> {
        self.every.as_ref()
    }

    /// The users with a rule of their own, and their rules, in no order.
    pub(crate) fn own(&self) -> impl Iterator<Item = (&str, &Limit)> {
        self.own.iter().map(|(u, l)| (u.as_str(), l))
    }

    /// Whether any rule limits anyone.
    pub(crate) fn is_empty(&self) -> bool {
        self.own.is_empty() && self.every.is_none()
    }
}
