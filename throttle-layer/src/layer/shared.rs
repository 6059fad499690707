//! The layer's shared limits: buckets in a [`Store`] (Redis, for a fleet
//! with no central node), asked before the inner service is first polled
//! (by the gate, `gate`).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::bucket::{Shape, Store, Wait};
use crate::every_second::EverySecond;
use crate::local::LocalLimit;

pub(super) type Decision = Pin<Box<dyn Future<Output = Result<(), Wait>> + Send>>;

/// A store behind a trait object, so a layer holds limits over any
/// store; each decision is boxed, which a round trip to Redis dwarfs.
pub(super) trait Decide: Send + Sync + fmt::Debug {
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
pub(super) struct SharedLimit {
    pub(super) store: Arc<dyn Decide>,
    pub(super) limit: LocalLimit,
    pub(super) shape: Shape,
    /// nginx's form of the limit, for refusals and logs.
    pub(super) text: Arc<str>,
    pub(super) refused: metrics::Counter,
    /// Refusals are logged at most once a second.
    pub(super) logged: EverySecond,
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
    pub(super) limits: Box<[SharedLimit]>,
    /// The buckets' service: the layer's.
    pub(super) service: Arc<str>,
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
