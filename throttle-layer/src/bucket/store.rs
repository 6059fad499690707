//! [`Store`]: where keyed buckets live, in memory or in Redis.

use std::future::Future;

use super::level::Wait;
use super::shape::Shape;

/// A block list change or question the store could not answer.
#[derive(Debug, thiserror::Error)]
#[error("bucket store unavailable: {0}")]
pub struct StoreError(pub String);

/// Where keyed buckets live. Every bucket is named by a service and a key
/// (a user, an IP); each service has a block list. A store answers for
/// any shape: the shape is given with every question, so one store holds
/// buckets of many limits.
///
/// [`MemoryStore`](super::MemoryStore) decides in this process;
/// `RedisStore` (feature `redis`) across every process that shares a
/// Redis.
pub trait Store: Send + Sync + 'static {
    /// Takes `n` tokens from the bucket of `key` in `service` if it holds
    /// them (a new bucket is full); else says why not, taking nothing.
    fn try_acquire(
        &self,
        service: &str,
        key: &str,
        shape: &Shape,
        n: u64,
    ) -> impl Future<Output = Result<(), Wait>> + Send;

    /// Tokens the bucket holds now (a blocked key's too).
    fn available(
        &self,
        service: &str,
        key: &str,
        shape: &Shape,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Puts `key` on `service`'s block list: every `try_acquire` answers
    /// [`Wait::Blocked`] until it is unblocked. A blocked key is never
    /// forgotten.
    fn block(
        &self,
        service: &str,
        key: &str,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Takes `key` off `service`'s block list; its bucket is as it was.
    fn unblock(
        &self,
        service: &str,
        key: &str,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Whether `key` is on `service`'s block list.
    fn is_blocked(
        &self,
        service: &str,
        key: &str,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;
}
