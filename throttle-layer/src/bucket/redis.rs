//! [`RedisStore`]: keyed buckets in Redis, shared by every process that
//! uses the same server: one Lua script per decision, atomic across them.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use redis::{Script, Value};
use throttle_clock::Clock;

use super::level::Wait;
use super::redis_link::RedisLink;
use super::shape::Shape;
use super::store::{Store, StoreError};
use crate::every_second::EverySecond;

/// How long a decision waits for Redis unless told otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(5);

/// What a decision is when Redis cannot answer in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Unavailable {
    /// Let the request pass, as the legacy design did.
    #[default]
    Allow,
    /// Refuse it ([`Wait::Unavailable`]).
    Deny,
}

/// Keyed buckets in Redis (feature `redis`). Every decision is one
/// `EVALSHA` of a script that reads the bucket, fills it, and takes from
/// it atomically, so processes sharing the server share the bucket. The
/// server's clock is the time (`TIME`), so the processes' clocks need not
/// agree. A bucket's key expires when the bucket would be full again: idle
/// keys vanish. Blocked keys carry a mark in the same hash and never
/// expire. On an injected clock ([`RedisStoreBuilder::clock`]) keys do not
/// expire: that clock's time says nothing of the server's.
///
/// The connection is made lazily and remade by redis-rs after a failure.
/// [`RedisStore::cluster`] speaks to a Redis Cluster instead: each
/// script has one key, so it runs on the primary of that key's hash slot,
/// and redirections and failovers are followed. A decision waits at most the
/// store's timeout ([`DEFAULT_TIMEOUT`]); past it, or with Redis down, it
/// falls back ([`Unavailable`], allow by default), counted in
/// `throttle_bucket_unavailable_total` and logged at most once a second.
///
/// Keys are `{prefix}{len(service)}:{service}:{key}`, so no two
/// (service, key) pairs share one.
#[derive(Clone)]
pub struct RedisStore {
    conn: RedisLink,
    inner: Arc<Inner>,
}

struct Inner {
    take: Script,
    block: Script,
    timeout: Duration,
    unavailable: Unavailable,
    prefix: String,
    /// `None`: the server's clock.
    clock: Option<Arc<dyn Clock>>,
    fell_back: metrics::Counter,
    /// Fallbacks are logged at most once a second.
    logged: EverySecond,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("prefix", &self.inner.prefix)
            .field("timeout", &self.inner.timeout)
            .field("unavailable", &self.inner.unavailable)
            .finish_non_exhaustive()
    }
}

/// Builds a [`RedisStore`]; see [`RedisStore::builder`].
#[derive(Debug)]
pub struct RedisStoreBuilder {
    /// One server's URL, or (`cluster`) some nodes' of a cluster.
    urls: Vec<String>,
    cluster: bool,
    timeout: Duration,
    unavailable: Unavailable,
    prefix: String,
    clock: Option<Arc<dyn Clock>>,
}

impl RedisStoreBuilder {
    /// How long a decision waits for Redis before falling back (default
    /// [`DEFAULT_TIMEOUT`]).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// What a decision is when Redis cannot answer (default: allow).
    pub fn unavailable(mut self, unavailable: Unavailable) -> Self {
        self.unavailable = unavailable;
        self
    }

    /// The start of every key (default `throttle:bucket:`).
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Decides on `clock`'s time instead of the server's (tests); keys
    /// then do not expire, since the server's time would decide that.
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = Some(clock);
        self
    }

    /// The store; no connection is made yet (the first decision makes
    /// it). Fails only for a URL redis-rs does not read. Call within a
    /// Tokio runtime.
    pub fn build(self) -> Result<RedisStore, StoreError> {
        let conn = match (self.cluster, self.urls.as_slice()) {
            (true, nodes) if !nodes.is_empty() => RedisLink::cluster(nodes),
            (false, [url]) => RedisLink::one(url),
            _ => {
                return Err(StoreError(format!(
                    "redis urls {:?}: one server, or a cluster's nodes",
                    self.urls
                )));
            }
        }
        .map_err(|e| StoreError(format!("redis {:?}: {e}", self.urls)))?;
        let label = if self.unavailable == Unavailable::Allow {
            "allowed"
        } else {
            "denied"
        };
        Ok(RedisStore {
            conn,
            inner: Arc::new(Inner {
                take: Script::new(include_str!("take.lua")),
                block: Script::new(include_str!("block.lua")),
                timeout: self.timeout,
                unavailable: self.unavailable,
                prefix: self.prefix,
                clock: self.clock,
                fell_back: metrics::counter!("throttle_bucket_unavailable_total", "store" => "redis", "decision" => label),
                logged: EverySecond::default(),
            }),
        })
    }
}

impl RedisStore {
    /// A store on the Redis at `url` (`redis://127.0.0.1:6379`).
    pub fn builder(url: impl Into<String>) -> RedisStoreBuilder {
        Self::builder_of(vec![url.into()], false)
    }

    /// A store on a Redis Cluster, found from `nodes` (URLs of any of its
    /// nodes, such as `redis://10.0.0.1:7000`).
    pub fn cluster<S: Into<String>>(nodes: impl IntoIterator<Item = S>) -> RedisStoreBuilder {
        Self::builder_of(nodes.into_iter().map(Into::into).collect(), true)
    }

    fn builder_of(urls: Vec<String>, cluster: bool) -> RedisStoreBuilder {
        RedisStoreBuilder {
            urls,
            cluster,
            timeout: DEFAULT_TIMEOUT,
            unavailable: Unavailable::Allow,
            prefix: "throttle:bucket:".into(),
            clock: None,
        }
    }

    fn key(&self, service: &str, key: &str) -> String {
        format!("{}{}:{service}:{key}", self.inner.prefix, service.len())
    }

    /// The injected clock's time in µs, or "" for the server's.
    fn now_arg(&self) -> String {
        match &self.inner.clock {
            Some(c) => (u64::try_from(c.now_ms()).unwrap_or(0) * 1000).to_string(),
            None => String::new(),
        }
    }

    /// Runs `script` on `key` within the timeout.
    async fn run(
        &self,
        script: &Script,
        key: String,
        args: &[String],
    ) -> Result<Vec<i64>, StoreError> {
        let mut invocation = script.key(key);
        for a in args {
            invocation.arg(a);
        }
        numbers(self.within(self.conn.invoke::<Value>(&invocation)).await?)
    }

    /// `call`'s answer, or an error if it fails or takes longer than the
    /// timeout.
    async fn within<T>(
        &self,
        call: impl Future<Output = redis::RedisResult<T>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(self.inner.timeout, call).await {
            Ok(answer) => answer.map_err(|e| StoreError(e.to_string())),
            Err(_) => Err(StoreError(format!(
                "no answer within {:?}",
                self.inner.timeout
            ))),
        }
    }

    /// The fallback decision, counted and logged (once a second).
    fn fall_back(&self, error: &StoreError) -> Result<(), Wait> {
        self.inner.fell_back.increment(1);
        if self.inner.logged.due() {
            let decision = self.inner.unavailable;
            tracing::warn!(%error, ?decision, "redis bucket store unavailable; falling back");
        }
        match self.inner.unavailable {
            Unavailable::Allow => Ok(()),
            Unavailable::Deny => Err(Wait::Unavailable),
        }
    }

    fn shape_args(&self, shape: &Shape, n: u64, op: &str) -> [String; 6] {
        [
            shape.capacity_tokens().to_string(),
            shape.quantum().to_string(),
            shape.interval_us().to_string(),
            n.to_string(),
            self.now_arg(),
            op.to_owned(),
        ]
    }
}

/// The script's answer: a list of integers.
fn numbers(value: Value) -> Result<Vec<i64>, StoreError> {
    let bad = || StoreError(format!("unexpected answer from the script: {value:?}"));
    let Value::Array(items) = &value else {
        return Err(bad());
    };
    items
        .iter()
        .map(|v| match v {
            Value::Int(i) => Ok(*i),
            _ => Err(bad()),
        })
        .collect()
}

impl Store for RedisStore {
    fn try_acquire(
        &self,
        service: &str,
        key: &str,
        shape: &Shape,
        n: u64,
    ) -> impl Future<Output = Result<(), Wait>> + Send {
        let (key, args) = (self.key(service, key), self.shape_args(shape, n, "take"));
        async move {
            match self.run(&self.inner.take, key, &args).await.as_deref() {
                Ok([0, _]) => Ok(()),
                Ok([1, us]) => Err(Wait::For(Duration::from_micros(
                    u64::try_from(*us).unwrap_or(0),
                ))),
                Ok([2, _]) => Err(Wait::Blocked),
                Ok([3, _]) => Err(Wait::TooMany),
                Ok(other) => self.fall_back(&StoreError(format!("unexpected answer {other:?}"))),
                Err(e) => self.fall_back(e),
            }
        }
    }

    fn available(
        &self,
        service: &str,
        key: &str,
        shape: &Shape,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send {
        let (key, args) = (self.key(service, key), self.shape_args(shape, 0, "peek"));
        async move {
            match self.run(&self.inner.take, key, &args).await?.as_slice() {
                [0, tokens] => Ok(u64::try_from(*tokens).unwrap_or(0)),
                other => Err(StoreError(format!("unexpected answer {other:?}"))),
            }
        }
    }

    fn block(
        &self,
        service: &str,
        key: &str,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let (key, args) = (self.key(service, key), ["1".to_owned(), self.now_arg()]);
        async move { self.run(&self.inner.block, key, &args).await.map(drop) }
    }

    fn unblock(
        &self,
        service: &str,
        key: &str,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let (key, args) = (self.key(service, key), ["0".to_owned(), self.now_arg()]);
        async move { self.run(&self.inner.block, key, &args).await.map(drop) }
    }

    fn is_blocked(
        &self,
        service: &str,
        key: &str,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        let key = self.key(service, key);
        async move {
            let mut cmd = redis::cmd("HEXISTS");
            cmd.arg(key).arg("b");
            self.within(self.conn.query::<bool>(&cmd)).await
        }
    }
}
