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
//! In a tonic handler: `request.extensions().get::<Usage>()`.

use crate::store::UserHandle;

/// Adds handler-known amounts to the current user's consumption; see the
/// [module docs](self).
#[derive(Debug, Clone)]
pub struct Usage {
    handle: Option<UserHandle>,
}

impl Usage {
    pub(crate) fn new(handle: Option<UserHandle>) -> Self {
        Self { handle }
    }

    /// Adds `amount` of `resource` to this slot. Returns whether it was
    /// counted: not for a request without user, an amount below zero, or a
    /// service already counting its maximum number of resources.
    pub fn add(&self, resource: &str, amount: i64) -> bool {
        let Some(h) = &self.handle else { return false };
        if amount < 0 {
            tracing::warn!(resource, amount, "negative usage ignored");
            return false;
        }
        match h.service().resource(resource) {
            Some(id) => {
                h.consume(id, amount);
                true
            }
            None => false,
        }
    }

    /// The user the amounts count for, if the request had one.
    pub fn user(&self) -> Option<&str> {
        self.handle.as_ref().map(UserHandle::user)
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
