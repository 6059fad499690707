//! Amounts only the handler knows, e.g. database rows read.
//!
//! A layer built with
//! [`handler_usage`](crate::ThrottleLayerBuilder::handler_usage) puts a
//! [`Usage`] in the request extensions; the handler adds to it, and the
//! amounts count for the slot in which they are added.
//!
//! # Examples
//!
//! ```
//! use throttle_layer::Usage;
//!
//! async fn search(usage: Usage) -> &'static str {
//!     // ... ran a query that read 3 rows
//!     usage.add("database_read", 3);
//!     "results"
//! }
//! ```
//!
//! [`Usage::try_take`] checks the user's quota of a resource before the
//! work it pays for, and takes the amount if it has room; refused, its
//! [`Exhausted`] is a 429 in axum:
//!
//! ```
//! use throttle_layer::{Exhausted, Usage};
//!
//! async fn export(usage: Usage) -> Result<&'static str, Exhausted> {
//!     usage.try_take("database_read", 500)?;
//!     // ... read the 500 rows
//!     Ok("export")
//! }
//! ```
//!
//! It also says how the layer decided the request ([`Usage::decision`]:
//! in shadow mode a handler may run for a request its quota refused) and
//! what is left of a resource ([`Usage::remaining`]):
//!
//! ```
//! use throttle_layer::Usage;
//!
//! async fn page(usage: Usage) -> String {
//!     match usage.remaining("requests") {
//!         Some(r) if r.left < 10.0 => format!("nearly out: {} left", r.left),
//!         _ => "ok".to_owned(),
//!     }
//! }
//! ```
//!
//! In a tonic handler: `request.extensions().get::<Usage>()`.

use crate::store::{Decision, UserHandle};

/// Adds handler-known amounts to the current user's consumption, and
/// tells how the request was decided and what is left; see the
/// [module docs](self).
#[derive(Debug, Clone)]
pub struct Usage {
    handle: Option<UserHandle>,
    decision: Option<Decision>,
}

/// What is left of a user's quota of one resource, from
/// [`Usage::remaining`].
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct Remaining {
    /// This node's quota of the resource for the slot.
    pub quota: f64,
    /// What the user used of it on this node in the slot.
    pub used: i64,
    /// The quota less what was used, at least 0.
    pub left: f64,
    /// The user's configured limit of the resource and its window in
    /// seconds, when the central's limits give one.
    pub limit: Option<(f64, u32)>,
}

impl Usage {
    pub(crate) fn new(handle: Option<UserHandle>, decision: Option<Decision>) -> Self {
        Self { handle, decision }
    }

    /// How the layer decided the request: allowed or (in shadow mode)
    /// refused, on what basis, and the resource with the least left.
    /// `None` for a request without a user.
    pub fn decision(&self) -> Option<Decision> {
        self.decision
    }

    /// What is left now of the user's quota of `resource` on this node
    /// for the slot, with the configured limit. `None` without a user, a
    /// quota for the slot, or a figure for the resource in it: nothing
    /// limits it here.
    pub fn remaining(&self, resource: &str) -> Option<Remaining> {
        let h = self.handle.as_ref()?;
        let service = h.service();
        let id = service.find_resource(resource)?;
        let standing = service.standing(h.user(), id)?;
        let limit = service
            .configured(h.user(), id)
            .map(|a| (a.amount, a.window_seconds));
        Some(Remaining {
            quota: standing.quota,
            used: standing.used,
            left: (standing.quota - standing.used as f64).max(0.0),
            limit,
        })
    }

    /// Adds `amount` of `resource` to this slot. Returns whether it was
    /// counted: not for a request without user, or a service already
    /// counting its maximum number of resources.
    pub fn add(&self, resource: &str, amount: u64) -> bool {
        let Some(h) = &self.handle else { return false };
        match h.service().resource(resource) {
            Some(id) => {
                h.consume(id, amount);
                true
            }
            None => false,
        }
    }

    /// Takes `amount` of `resource` now if the user's quota of it has
    /// room (as the layer admits a request: the quota at least 1 and not
    /// yet exceeded), for a handler to check before the work it pays for;
    /// refused, nothing is taken and one rejection of the resource is
    /// counted. Without a quota for the slot, a user, or room for one
    /// more resource in the service, the amount is taken (or nothing
    /// is): the layer decided the request itself.
    ///
    /// # Errors
    ///
    /// [`Exhausted`], which axum turns into a 429.
    pub fn try_take(&self, resource: &str, amount: u64) -> Result<(), Exhausted> {
        let Some(h) = &self.handle else { return Ok(()) };
        let Some(id) = h.service().resource(resource) else {
            return Ok(());
        };
        h.service()
            .try_take(h.user(), id, amount)
            .map_err(|t| Exhausted {
                resource: resource.to_owned(),
                quota: t.quota,
                used: t.used,
            })
    }

    /// The user the amounts count for, if the request had one.
    pub fn user(&self) -> Option<&str> {
        self.handle.as_ref().map(UserHandle::user)
    }
}

/// What [`Usage::try_take`] refused: the resource, and this node's quota
/// of it for the slot and what it has used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{resource} exhausted: {used} used of a quota of {quota} this slot")]
pub struct Exhausted {
    /// The resource.
    pub resource: String,
    /// This node's quota of it for the slot.
    pub quota: f64,
    /// What it used of it in the slot.
    pub used: i64,
}

#[cfg(feature = "axum")]
impl axum::response::IntoResponse for Exhausted {
    fn into_response(self) -> axum::response::Response {
        (
            http::StatusCode::TOO_MANY_REQUESTS,
            format!("Too Many Requests: {self}\n"),
        )
            .into_response()
    }
}

/// Missing [`Usage`]: the route has no layer built with `handler_usage()`.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error(
    "no throttle Usage on this request: add a ThrottleLayer built with handler_usage() to the route"
)]
pub struct MissingUsage;

#[cfg(feature = "axum")]
impl axum::response::IntoResponse for MissingUsage {
    fn into_response(self) -> axum::response::Response {
        (http::StatusCode::INTERNAL_SERVER_ERROR, self.to_string()).into_response()
    }
}

#[cfg(feature = "axum")]
impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Usage {
    type Rejection = MissingUsage;

    async fn from_request_parts(
        parts: &mut http::request::Parts,
        _: &S,
    ) -> Result<Self, MissingUsage> {
        parts.extensions.get::<Usage>().cloned().ok_or(MissingUsage)
    }
}
