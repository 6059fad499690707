use std::marker::PhantomData;
use std::sync::Arc;

use http::StatusCode;
use tower_layer::Layer;

use super::built::Built;
use super::config::{Config, Metered, Plain};
use super::cost::CostFn;
use super::local::LocalZones;
use super::on_refusal::{OnRefusal, Refused};
use super::refusal_cache::RefusalCache;
use super::shared::{SharedLimits, SharedSpec};
use super::throttle::Throttle;
use crate::bucket::Store;
use crate::local::LocalLimit;
use crate::store::{Fallback, SlotStore, counted};
use crate::user::{MissingUser, RequestHead, UserKey};

/// Applies [`Throttle`] to a service; see the [module docs](crate::layer).
///
/// Clones share the same store: build one layer per route configuration and
/// clone it freely. `M` is [`Plain`] (bodies pass through untouched) unless
/// the layer counts body bytes, which makes it [`Metered`].
#[derive(Debug, Clone)]
pub struct ThrottleLayer<M = Plain> {
    pub(crate) built: Arc<Built>,
    mode: PhantomData<M>,
}

/// Why a [`ThrottleLayerBuilder`] could not build.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayerError {
    /// No [`UserKey`] was given.
    #[error("no user key: call .user(UserKey::...) on the builder")]
    NoUserKey,
    /// A resource name is empty, too long, or one too many for the service.
    #[error(
        "cannot count resource {resource:?} in service {service:?}: empty, over 256 bytes, or more than 16 resources"
    )]
    Resource {
        /// The service.
        service: String,
        /// The resource.
        resource: String,
    },
}

/// Configures a [`ThrottleLayer`]; from [`ThrottleLayer::builder`].
#[derive(Debug)]
pub struct ThrottleLayerBuilder<M = Plain> {
    settings: Settings,
    mode: PhantomData<M>,
}

#[derive(Debug)]
struct Settings {
    store: SlotStore,
    service: String,
    user: Option<UserKey>,
    missing_user: MissingUser,
    requests: bool,
    traffic_up: bool,
    traffic_down: bool,
    local: Vec<LocalLimit>,
    shared: Vec<SharedSpec>,
    costs: Vec<(String, u64)>,
    cost_fns: Vec<CostFn<String>>,
    resources: Vec<String>,
    handler_usage: bool,
    fallback: Fallback,
    shadow: bool,
    reject_status: StatusCode,
    blocked_status: StatusCode,
    rate_limit_headers: bool,
    headers_on_success: bool,
    on_refusal: Option<OnRefusal>,
}

impl ThrottleLayer {
    /// Starts a layer for `service` over `store`. By default each request
    /// costs 1 `requests`, refusals are `429 Too Many Requests` with rate
    /// limit headers, and while no quota is known requests are allowed.
    pub fn builder(store: &SlotStore, service: &str) -> ThrottleLayerBuilder {
        ThrottleLayerBuilder::new(Settings {
            store: store.clone(),
            service: service.to_owned(),
            user: None,
            missing_user: MissingUser::Skip,
            requests: true,
            traffic_up: false,
            traffic_down: false,
            costs: Vec::new(),
            cost_fns: Vec::new(),
            resources: Vec::new(),
            handler_usage: false,
            fallback: Fallback::default(),
            shadow: false,
            reject_status: StatusCode::TOO_MANY_REQUESTS,
            blocked_status: StatusCode::FORBIDDEN,
            rate_limit_headers: true,
            headers_on_success: false,
            on_refusal: None,
            local: Vec::new(),
            shared: Vec::new(),
        })
    }
}

impl<M> ThrottleLayerBuilder<M> {
    fn new(settings: Settings) -> Self {
        Self {
            settings,
            mode: PhantomData,
        }
    }

    /// How to find the user (required).
    pub fn user(mut self, key: UserKey) -> Self {
        self.settings.user = Some(key);
        self
    }

    /// What to do when the user cannot be found (default: skip throttling).
    pub fn missing_user(mut self, missing: MissingUser) -> Self {
        self.settings.missing_user = missing;
        self
    }

    /// Whether each request costs 1 `requests` (default: true).
    pub fn count_requests(mut self, on: bool) -> Self {
        self.settings.requests = on;
        self
    }

    /// Counts request body bytes as `traffic_up`, as the body streams.
    pub fn traffic_up(mut self) -> ThrottleLayerBuilder<Metered> {
        self.settings.traffic_up = true;
        ThrottleLayerBuilder::new(self.settings)
    }

    /// Counts response body bytes as `traffic_down`, as the body streams
    /// (also when the client goes away before the end).
    pub fn traffic_down(mut self) -> ThrottleLayerBuilder<Metered> {
        self.settings.traffic_down = true;
        ThrottleLayerBuilder::new(self.settings)
    }

    /// A fixed extra cost per admitted request, e.g. `("database_read", 3)`.
    pub fn cost(mut self, resource: &str, amount: u64) -> Self {
        self.settings.costs.push((resource.to_owned(), amount));
        self
    }

    /// A cost of `resource` computed from each request's head, added to
    /// the fixed ones before the decision: a batch endpoint's item count
    /// from a header, a weight per path, a declared upload size. Like
    /// Envoy's `hits_addend`, but per resource. Repeatable; the function
    /// runs on the request path, so keep it to reading the head.
    ///
    /// ```
    /// use throttle_layer::{SlotStore, ThrottleLayer, UserKey};
    ///
    /// let store = SlotStore::default();
    /// let layer = ThrottleLayer::builder(&store, "front")
    ///     .user(UserKey::header("x-user"))
    ///     .cost_fn("items", |head| {
    ///         head.headers
    ///             .get("x-batch-size")
    ///             .and_then(|v| v.to_str().ok()?.parse().ok())
    ///             .unwrap_or(1)
    ///     })
    ///     .build()
    ///     .unwrap();
    /// ```
    pub fn cost_fn<F>(mut self, resource: &str, f: F) -> Self
    where
        F: Fn(RequestHead<'_>) -> u64 + Send + Sync + 'static,
    {
        let f = CostFn::new(resource.to_owned(), Arc::new(f));
        self.settings.cost_fns.push(f);
        self
    }

    /// Puts a [`Usage`](crate::Usage) in each request's extensions for the
    /// handler to add amounts only it knows.
    pub fn handler_usage(mut self) -> Self {
        self.settings.handler_usage = true;
        self
    }

    /// Registers a resource the handlers count through
    /// [`Usage`](crate::Usage), e.g. `"database_read"`, when the layer is
    /// built. Optional: a resource is registered when first counted. But a
    /// user's counters are sized to the service's resources when the
    /// service sees its first user, and a resource first named after that
    /// costs each user that counts it a separate allocation.
    pub fn resource(mut self, name: &str) -> Self {
        self.settings.resources.push(name.to_owned());
        self
    }

    /// What to do while there is no quota for the current slot (default:
    /// [`Fallback::default`], the last quota for up to 60 slots, then allow).
    pub fn fallback(mut self, fallback: Fallback) -> Self {
        self.settings.fallback = fallback;
        self
    }

    /// Decide and count, but let every request through.
    pub fn shadow(mut self, on: bool) -> Self {
        self.settings.shadow = on;
        self
    }

    /// Status of a refused HTTP request (default 429; nginx uses 503).
    pub fn reject_status(mut self, status: StatusCode) -> Self {
        self.settings.reject_status = status;
        self
    }

    /// Status of a request of a user the central has blocked (default 403,
    /// with a body that says blocked, not throttled; gRPC:
    /// `PERMISSION_DENIED`). Shadow mode lets them through, counted.
    pub fn blocked_status(mut self, status: StatusCode) -> Self {
        self.settings.blocked_status = status;
        self
    }

    /// Whether refusals carry `RateLimit-Policy`/`RateLimit` and
    /// `X-RateLimit-*` headers (default: true). `Retry-After` is always sent.
    pub fn rate_limit_headers(mut self, on: bool) -> Self {
        self.settings.rate_limit_headers = on;
        self
    }

    /// Whether allowed HTTP responses carry the rate-limit headers too
    /// (default: false), as `tower_governor`'s `use_headers`: those of the
    /// resource with the least left after the request, where a quota
    /// decided it. Costs a few hundred ns and an allocation per allowed
    /// request.
    pub fn headers_on_success(mut self, on: bool) -> Self {
        self.settings.headers_on_success = on;
        self
    }

    /// Builds refusal responses with `hook`: it gets what refused
    /// ([`Refused`]) and the response the layer made (status, headers and
    /// body), and returns the one to send, as `tower_governor`'s
    /// `error_handler`. Called for every refusal (quota, blocked, local
    /// and shared limits, an overlong user key), HTTP and gRPC.
    ///
    /// ```
    /// use throttle_layer::{SlotStore, ThrottleLayer, UserKey};
    ///
    /// let store = SlotStore::default();
    /// let layer = ThrottleLayer::builder(&store, "front")
    ///     .user(UserKey::header("x-user"))
    ///     .on_refusal(|why, mut res| {
    ///         if let Some(resource) = why.resource {
    ///             *res.body_mut() = format!("slow down: {resource}\n").into();
    ///         }
    ///         res
    ///     })
    ///     .build()
    ///     .unwrap();
    /// ```
    pub fn on_refusal<F>(mut self, hook: F) -> Self
    where
        F: Fn(&Refused<'_>, http::Response<bytes::Bytes>) -> http::Response<bytes::Bytes>
            + Send
            + Sync
            + 'static,
    {
        self.settings.on_refusal = Some(OnRefusal::new(hook));
        self
    }

    /// Adds a limit decided on this node alone, as nginx's `limit_req`
    /// ([`LocalLimit`]): keyed by the user key (or the limit's own), with
    /// its own zone. Repeatable: every limit must pass and the longest
    /// hold wins; the central quota is asked only once they pass, and a
    /// request it refuses is taken back from them.
    pub fn local_limit(mut self, limit: LocalLimit) -> Self {
        self.settings.local.push(limit);
        self
    }

    /// Adds a limit shared by every process whose layer has it over the
    /// same `store`: one token bucket per key (the user key, or the
    /// limit's own) in the store, holding the burst and one (`"50r/s
    /// burst=50"` passes 51 at once, then 50 a second, as nginx's
    /// `nodelay`; a shared limit holds no request). With a
    /// [`RedisStore`](crate::bucket) this is a global limit for a fleet
    /// with no central node.
    ///
    /// The store is asked after the local limits and the central quota
    /// passed the request, before the inner service's future is first
    /// polled; a request it refuses is given back to them, and carries
    /// `throttle-refused-by: shared; limit="..."`. A store that cannot
    /// answer decides by its own fallback (Redis: allow, within its
    /// timeout). Repeatable: every limit must pass.
    pub fn shared_limit<S>(mut self, store: S, limit: LocalLimit) -> Self
    where
        S: Store + Clone + std::fmt::Debug,
    {
        self.settings.shared.push(SharedSpec::new(store, limit));
        self
    }

    /// The layer.
    ///
    /// # Errors
    ///
    /// [`LayerError`] for a missing user key, a negative cost, or a resource
    /// the service cannot count.
    pub fn build(self) -> Result<ThrottleLayer<M>, LayerError> {
        let settings = self.settings;
        let user = settings.user.ok_or(LayerError::NoUserKey)?;
        let service = settings.store.service(&settings.service);
        let resource = |name: &str| {
            service.resource(name).ok_or_else(|| LayerError::Resource {
                service: settings.service.clone(),
                resource: name.to_owned(),
            })
        };
        let mut costs: Vec<(crate::store::ResourceId, i64)> = Vec::new();
        if settings.requests {
            costs.push((resource("requests")?, 1));
        }
        for (name, amount) in &settings.costs {
            let (id, amount) = (resource(name)?, counted(*amount));
            match costs.iter_mut().find(|(r, _)| *r == id) {
                Some((_, a)) => *a = a.saturating_add(amount),
                None => costs.push((id, amount)),
            }
        }
        for name in &settings.resources {
            resource(name)?;
        }
        let cost_fns = settings
            .cost_fns
            .into_iter()
            .map(|f| {
                let id = resource(&f.resource)?;
                Ok(f.resolved(id))
            })
            .collect::<Result<Box<[_]>, LayerError>>()?;
        let traffic_up = settings
            .traffic_up
            .then(|| resource("traffic_up"))
            .transpose()?;
        let traffic_down = settings
            .traffic_down
            .then(|| resource("traffic_down"))
            .transpose()?;
        let label = settings.service.clone();
        let local = LocalZones::new(settings.local, &label);
        let shared = SharedLimits::new(settings.shared, &label);
        Ok(ThrottleLayer {
            mode: PhantomData,
            built: Arc::new(Built {
                config: Config {
                    store: settings.store,
                    service,
                    user,
                    missing_user: settings.missing_user,
                    costs,
                    traffic_up,
                    traffic_down,
                    handler_usage: settings.handler_usage,
                    fallback: settings.fallback,
                    shadow: settings.shadow,
                    reject_status: settings.reject_status,
                    blocked_status: settings.blocked_status,
                    rate_limit_headers: settings.rate_limit_headers,
                    headers_on_success: settings.headers_on_success,
                    on_refusal: settings.on_refusal,
                    // Handles registered once: the request path never builds a
                    // metric key.
                    shadow_rejected: metrics::counter!("throttle_decisions_total", "service" => label.clone(), "decision" => "shadow_rejected"),
                    fallback_decisions: metrics::counter!("throttle_decisions_total", "service" => label.clone(), "decision" => "fallback"),
                    skipped: metrics::counter!("throttle_decisions_total", "service" => label.clone(), "decision" => "no_user"),
                    long_users: metrics::counter!("throttle_decisions_total", "service" => label.clone(), "decision" => "user_too_long"),
                    blocked: metrics::counter!("throttle_decisions_total", "service" => label, "decision" => "blocked"),
                },
                cost_fns,
                local,
                shared,
                refusals: RefusalCache::default(),
            }),
        })
    }
}

impl<S, M> Layer<S> for ThrottleLayer<M> {
    type Service = Throttle<S, M>;

    fn layer(&self, inner: S) -> Throttle<S, M> {
        Throttle {
            inner,
            built: self.built.clone(),
            mode: PhantomData,
        }
    }
}
