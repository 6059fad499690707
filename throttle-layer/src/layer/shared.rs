//! The layer's shared limits: buckets in a [`Store`] (Redis, for a fleet
//! with no central node), asked before the inner service is first polled.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use super::config::Config;
use super::cost::{self, Costs};
use super::future::{Hold, Refusal};
use super::local::{log_refusal, with_limit_key};
use super::refusal::{LimitRefusal, Limiter, is_grpc, refuse_limit};
use super::refusal_body::accepts_json;
use crate::bucket::{Shape, Store, Wait};
use crate::every_second::EverySecond;
use crate::local::LocalLimit;
use crate::user::RequestHead;

type Decision = Pin<Box<dyn Future<Output = Result<(), Wait>> + Send>>;

/// A store behind a trait object, so a layer holds limits over any
/// store; each decision is boxed, which a round trip to Redis dwarfs.
trait Decide: Send + Sync + fmt::Debug {
    fn take(&self, service: Arc<str>, key: Box<str>, shape: Shape) -> Decision;
}

impl<S: Store + Clone + fmt::Debug> Decide for S {
    fn take(&self, service: Arc<str>, key: Box<str>, shape: Shape) -> Decision {
        let store = self.clone();
        Box::pin(async move { store.try_acquire(&service, &key, &shape, 1).await })
    }
}

/// One shared limit.
#[derive(Debug)]
struct SharedLimit {
    store: Arc<dyn Decide>,
    limit: LocalLimit,
    shape: Shape,
    /// nginx's form of the limit, for refusals and logs.
    text: Arc<str>,
    refused: metrics::Counter,
    /// Refusals are logged at most once a second.
    logged: EverySecond,
}

/// A limit as given to the builder, before the layer is built.
#[derive(Debug, Clone)]
pub(crate) struct SharedSpec {
    store: Arc<dyn Decide>,
    limit: LocalLimit,
}

impl SharedSpec {
    pub(crate) fn new<S: Store + Clone + fmt::Debug>(store: S, limit: LocalLimit) -> Self {
        Self {
            store: Arc::new(store),
            limit,
        }
    }
}

/// Every shared limit of a layer.
#[derive(Debug)]
pub(crate) struct SharedLimits {
    limits: Box<[SharedLimit]>,
    /// The buckets' service: the layer's.
    service: Arc<str>,
}

impl SharedLimits {
    pub(crate) fn new(specs: Vec<SharedSpec>, service: &str) -> Option<Self> {
        if specs.is_empty() {
            return None;
        }
        let limits = specs
            .into_iter()
            .map(|SharedSpec { store, limit }| {
                let text: Arc<str> = limit.to_string().into();
                SharedLimit {
                    refused: metrics::counter!("throttle_shared_decisions_total", "service" => service.to_owned(), "limit" => text.to_string(), "decision" => "refused"),
                    shape: limit.bucket_shape(),
                    logged: EverySecond::default(),
                    store,
                    limit,
                    text,
                }
            })
            .collect();
        Some(Self {
            limits,
            service: service.into(),
        })
    }
}

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
    fn apply(&self, cfg: &Config) {
        if let Some(user) = &self.user {
            for &(resource, cost) in &self.costs {
                cfg.service.consume(user, resource, -cost);
            }
        }
        if let Some(local) = &cfg.local {
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
    cfg: &Arc<Config>,
    shared: &Arc<SharedLimits>,
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
        costs: cost::computed(cfg, head),
        zone_keys: cfg
            .local
            .as_ref()
            .map(|l| l.owned_keys(head, user))
            .unwrap_or_default(),
    };
    let (grpc, json) = (is_grpc(head), accepts_json(head));
    let (cfg, shared) = (cfg.clone(), shared.clone());
    Hold::gate(async move {
        for (l, key) in shared.limits.iter().zip(keys) {
            let Some(key) = key else { continue };
            let Err(wait) = l.store.take(shared.service.clone(), key, l.shape).await else {
                continue;
            };
            l.refused.increment(1);
            if l.logged.due() {
                log_refusal(l.limit.log_level, Limiter::Shared, &l.text);
            }
            if cfg.shadow {
                continue;
            }
            refund.apply(&cfg);
            let retry = retry_secs(wait, &l.shape);
            return Some(refuse_limit(
                &cfg,
                LimitRefusal {
                    status: l.limit.status,
                    grpc,
                    json,
                    retry_secs: retry,
                    by: Limiter::Shared,
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
fn retry_secs(wait: Wait, shape: &Shape) -> u64 {
    let wait = match wait {
        Wait::For(d) => d,
        _ => shape.interval(),
    };
    wait.as_secs() + u64::from(wait.subsec_nanos() > 0)
}
