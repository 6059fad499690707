//! The gate of a request the local limits and the central quota let
//! through: the layer's shared limits ([`SharedLimits`]) asked in turn
//! before the inner service is first polled.

use std::sync::Arc;
use std::time::Duration;

use super::built::Built;
use super::cost::{self, Costs};
use super::future::{Hold, Refusal};
use super::local::{log_refusal, with_limit_key};
use super::refusal::{LimitRefusal, OwnLimit, is_grpc, refuse_limit};
use super::refusal_body::accepts_json;
use super::shared::SharedLimits;
use crate::bucket::{Shape, Wait};
use crate::user::RequestHead;

/// What a refused request gives back, and to whom: its costs to the
/// central quota's count, its place in the local zones.
struct Refund {
    user: Option<Box<str>>,
    /// What the request cost: the layer's fixed costs and those computed
    /// from its head.
    costs: Costs,
    zone_keys: Vec<Option<Box<str>>>,
}

impl Refund {
    fn apply(&self, built: &Built) {
        if let Some(user) = &self.user {
            for &(resource, cost) in &self.costs {
                built.config.service.count(user, resource, -cost);
            }
        }
        if let Some(local) = &built.local {
            local.refund_keys(&self.zone_keys);
        }
    }
}

/// The gate of a request the local limits and the central quota passed
/// (`user` charged, unless `None`): every shared limit asked in turn;
/// refused by one, the request is given back and refused; passed, it is
/// held `delay_ms` as the local limits said.
#[inline(never)]
pub(crate) fn gate(
    built: &Arc<Built>,
    shared: &SharedLimits,
    head: RequestHead<'_>,
    user: Option<&str>,
    delay_ms: u64,
) -> Hold {
    let keys: Vec<Option<Box<str>>> = shared
        .limits
        .iter()
        .map(|l| with_limit_key(&l.limit, head, user, |k: &str| Box::from(k)))
        .collect();
    let refund = Refund {
        user: user.map(Box::from),
        costs: cost::computed(&built.config, &built.cost_fns, head),
        zone_keys: built
            .local
            .as_ref()
            .map(|l| l.owned_keys(head, user))
            .unwrap_or_default(),
    };
    let (grpc, json) = (is_grpc(head), accepts_json(head));
    let built = built.clone();
    Hold::gate(async move {
        // The limits `shared` is, held by the layer the future keeps.
        let shared = built.shared.as_ref()?;
        for (l, key) in shared.limits.iter().zip(keys) {
            let Some(key) = key else { continue };
            let Err(wait) = l.store.take(shared.service.clone(), key, l.shape).await else {
                continue;
            };
            l.refused.increment(1);
            if l.logged.due() {
                log_refusal(l.limit.log_level, OwnLimit::Shared, &l.text);
            }
            if built.config.shadow {
                continue;
            }
            refund.apply(&built);
            let retry = retry_seconds(wait, &l.shape);
            return Some(refuse_limit(
                &built.config,
                LimitRefusal {
                    status: l.limit.status,
                    grpc,
                    json,
                    retry_seconds: retry,
                    by: OwnLimit::Shared,
                    limit: &l.text,
                    user: refund.user.as_deref(),
                },
            ));
        }
        if delay_ms > 0 {
            tokio::time::sleep(Duration::from_millis(delay_ms)).await;
        }
        None::<Refusal>
    })
}

/// Seconds to tell the client to wait: the bucket's answer, else one
/// fill interval.
fn retry_seconds(wait: Wait, shape: &Shape) -> u64 {
    let wait = match wait {
        Wait::For(d) => d,
        _ => shape.interval(),
    };
    wait.as_secs() + u64::from(wait.subsec_nanos() > 0)
}
