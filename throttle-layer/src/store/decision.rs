//! The decision on the request path: a user's entry found and locked, its
//! quota row read, the request admitted or refused.

use super::fallback::Fallback;
use super::resource::ResourceId;

/// Why a request was allowed or refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Basis {
    /// The user's quota for the slot decided.
    Quota,
    /// A quota table exists for the slot but has no row for this user: the
    /// user is not limited.
    Unlimited,
    /// No quota for the slot: the [`Fallback`] decided.
    Fallback,
    /// The store is full and the user is new: the [`Fallback`] decided.
    AtCap,
}

/// The resource whose quota is the tightest, for rate-limit headers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tightest {
    /// The resource.
    pub resource: ResourceId,
    /// This node's quota for it in the slot.
    pub quota: f64,
    /// What this node admitted of it in the slot so far.
    pub used: i64,
}

/// The outcome of [`ServiceStore::admit`](super::ServiceStore::admit).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Decision {
    pub(super) allowed: bool,
    /// Why.
    pub basis: Basis,
    /// For a refusal by quota: the exhausted resource. For an allowed request
    /// with a quota: the resource with the least left.
    pub tightest: Option<Tightest>,
}

impl Decision {
    /// True when the request may proceed.
    pub fn is_allowed(&self) -> bool {
        self.allowed
    }

    #[inline]
    pub(super) fn fallback(fallback: Fallback, basis: Basis) -> Self {
        Self {
            allowed: matches!(fallback, Fallback::Allow | Fallback::LastKnownThenAllow(_)),
            basis,
            tightest: None,
        }
    }
}
