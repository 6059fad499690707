//! What a layer was built with (its settings, read by every part of it),
//! and its body modes.

use std::sync::Arc;

use http::StatusCode;

use super::on_refusal::OnRefusal;
use crate::store::{Fallback, ResourceId, ServiceStore, SlotStore};
use crate::user::{MissingUser, UserKey};

/// Mode of a layer that leaves request and response bodies as they are:
/// the inner service sees the request unchanged and the response passes
/// through untouched, so an allowed request costs only the decision. A
/// refusal is built in the response body type, which must be a
/// [`RefusalBody`](super::RefusalBody).
#[derive(Debug, Clone, Copy, Default)]
pub struct Plain;

/// Mode of a layer that counts body bytes as they stream
/// ([`ThrottleLayerBuilder::traffic_up`](super::ThrottleLayerBuilder::traffic_up), [`ThrottleLayerBuilder::traffic_down`](super::ThrottleLayerBuilder::traffic_down)):
/// the inner service receives a [`RequestBody`](super::RequestBody) and the
/// response body becomes a [`ResponseBody`](super::ResponseBody).
#[derive(Debug, Clone, Copy, Default)]
pub struct Metered;

/// The settings a layer was built with.
#[derive(Debug)]
pub(crate) struct Config {
    pub(crate) store: SlotStore,
    pub(crate) service: Arc<ServiceStore>,
    pub(crate) user: UserKey,
    pub(crate) missing_user: MissingUser,
    pub(crate) costs: Vec<(ResourceId, i64)>,
    pub(crate) traffic_up: Option<ResourceId>,
    pub(crate) traffic_down: Option<ResourceId>,
    pub(crate) handler_usage: bool,
    pub(crate) fallback: Fallback,
    pub(crate) shadow: bool,
    pub(crate) reject_status: StatusCode,
    /// Status of a request of a blocked user.
    pub(crate) blocked_status: StatusCode,
    pub(crate) rate_limit_headers: bool,
    /// Whether allowed responses carry the rate-limit headers too.
    pub(crate) headers_on_success: bool,
    /// Builds the refusal responses, if set.
    pub(crate) on_refusal: Option<OnRefusal>,
    pub(crate) shadow_rejected: metrics::Counter,
    pub(crate) fallback_decisions: metrics::Counter,
    pub(crate) skipped: metrics::Counter,
    /// Requests refused for a user key longer than a name may be.
    pub(crate) long_users: metrics::Counter,
    /// Requests of users the central has blocked.
    pub(crate) blocked: metrics::Counter,
}
