//! [`Buckets`] and [`Bucket`]: the token-bucket API over a [`Store`].

use std::sync::Arc;

use super::level::Wait;
use super::shape::Shape;
use super::store::{Store, StoreError};

/// The buckets of one service, one per key, all of one [`Shape`], in a
/// [`Store`]: memory for this process, Redis for a fleet.
///
/// ```
/// use throttle_layer::bucket::{Buckets, MemoryStore, Shape, Wait};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let api = Buckets::new(MemoryStore::new(), "api", Shape::per_second(10));
/// assert_eq!(api.capacity(), 10);
/// assert!(api.try_acquire("alice", 10).await.is_ok());
/// let Err(Wait::For(wait)) = api.try_acquire("alice", 1).await else { panic!() };
/// assert!(wait.as_millis() <= 100);
/// api.block("mallory").await.unwrap();
/// assert_eq!(api.try_acquire("mallory", 1).await, Err(Wait::Blocked));
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Buckets<S> {
    store: S,
    service: Arc<str>,
    shape: Shape,
}

impl<S: Store> Buckets<S> {
    /// The buckets of `service` in `store`, filling as `shape` says.
    pub fn new(store: S, service: &str, shape: Shape) -> Self {
        Self {
            store,
            service: service.into(),
            shape,
        }
    }

    /// Takes `n` tokens from `key`'s bucket if it holds them; else says
    /// how long until it will ([`Wait::For`]), or why it never will.
    pub async fn try_acquire(&self, key: &str, n: u64) -> Result<(), Wait> {
        self.store
            .try_acquire(&self.service, key, &self.shape, n)
            .await
    }

    /// Takes `n` tokens from `key`'s bucket, waiting until it holds them;
    /// fails at once if it never will (more than the capacity, blocked,
    /// store unavailable and denying).
    pub async fn acquire(&self, key: &str, n: u64) -> Result<(), Wait> {
        loop {
            match self.try_acquire(key, n).await {
                Err(Wait::For(wait)) => tokio::time::sleep(wait).await,
                done => return done,
            }
        }
    }

    /// Tokens in `key`'s bucket now.
    pub async fn available(&self, key: &str) -> Result<u64, StoreError> {
        self.store.available(&self.service, key, &self.shape).await
    }

    /// The most tokens a bucket holds.
    pub fn capacity(&self) -> u64 {
        self.shape.capacity_tokens()
    }

    /// How the buckets fill.
    pub fn shape(&self) -> &Shape {
        &self.shape
    }

    /// Puts `key` on the service's block list.
    pub async fn block(&self, key: &str) -> Result<(), StoreError> {
        self.store.block(&self.service, key).await
    }

    /// Takes `key` off the service's block list.
    pub async fn unblock(&self, key: &str) -> Result<(), StoreError> {
        self.store.unblock(&self.service, key).await
    }

    /// Whether `key` is on the service's block list.
    pub async fn is_blocked(&self, key: &str) -> Result<bool, StoreError> {
        self.store.is_blocked(&self.service, key).await
    }

    /// The bucket of `key`, as a value of its own.
    pub fn bucket(&self, key: &str) -> Bucket<S>
    where
        S: Clone,
    {
        Bucket {
            buckets: self.clone(),
            key: key.into(),
        }
    }
}

/// One bucket: a key of [`Buckets`].
///
/// ```
/// use std::time::Duration;
/// use throttle_layer::bucket::{Bucket, MemoryStore, Shape};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// // 5 tokens every 100 ms, at most 20: the legacy system's fill interval
/// // and quantum.
/// let shape = Shape::new(20, 5, Duration::from_millis(100)).unwrap();
/// let bucket = Bucket::new(MemoryStore::new(), "batch", "cluster", shape);
/// bucket.acquire(20).await.unwrap();
/// assert_eq!(bucket.available().await.unwrap(), 0);
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Bucket<S> {
    buckets: Buckets<S>,
    key: Box<str>,
}

impl<S: Store> Bucket<S> {
    /// The bucket of `key` in `service`, in `store`.
    pub fn new(store: S, service: &str, key: &str, shape: Shape) -> Self {
        Self {
            buckets: Buckets::new(store, service, shape),
            key: key.into(),
        }
    }

    /// [`Buckets::try_acquire`] on this bucket.
    pub async fn try_acquire(&self, n: u64) -> Result<(), Wait> {
        self.buckets.try_acquire(&self.key, n).await
    }

    /// [`Buckets::acquire`] on this bucket.
    pub async fn acquire(&self, n: u64) -> Result<(), Wait> {
        self.buckets.acquire(&self.key, n).await
    }

    /// Tokens in the bucket now.
    pub async fn available(&self) -> Result<u64, StoreError> {
        self.buckets.available(&self.key).await
    }

    /// The most tokens the bucket holds.
    pub fn capacity(&self) -> u64 {
        self.buckets.capacity()
    }
}
