//! The rate-limit headers of an allowed response, for a layer built with
//! [`headers_on_success`](super::ThrottleLayerBuilder::headers_on_success).

use http::HeaderMap;

use super::config::Config;
use super::future::Headers;
use super::headers::{self, Stated, reset_seconds, wait_ms};
use super::refusal::is_grpc;
use crate::store::{Decision, ResourceId};
use crate::user::RequestHead;

/// The headers for a request of `user` the quota let through: those of
/// the resource with the least left after this request's `costs`. None for a
/// gRPC call, or where no quota decided (no table for the slot, a user
/// without a row): then there is no limit to state. Out of line, as the
/// refusal: most layers never come here.
#[cold]
#[inline(never)]
pub(crate) fn success_headers(
    cfg: &Config,
    head: RequestHead<'_>,
    user: &str,
    decision: &Decision,
    costs: &[(ResourceId, i64)],
) -> Headers {
    let tightest = decision.tightest.filter(|_| !is_grpc(head))?;
    let name = cfg.service.resource_name(tightest.resource)?;
    let spent = costs
        .iter()
        .find(|(r, _)| *r == tightest.resource)
        .map_or(0, |&(_, cost)| cost);
    let stated = Stated::of(cfg, user, &tightest, spent, reset_seconds(wait_ms(cfg)));
    let mut h = HeaderMap::with_capacity(5);
    headers::write(cfg, &mut h, tightest.resource, &name, &stated);
    Some(Box::new(h))
}
