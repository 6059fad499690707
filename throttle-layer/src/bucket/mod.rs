//! Token buckets over a store: this process's memory, or Redis for a
//! whole fleet (feature `redis`).
//!
//! A bucket gets `quantum` tokens every fill interval, up to its capacity
//! ([`Shape`]); [`Buckets::try_acquire`] takes tokens or says how long
//! until they are there ([`Wait`]), [`Buckets::acquire`] waits for them.
//! Buckets are keyed by service and key; each service has a block list;
//! a bucket left alone until full is forgotten (a new one would be the
//! same), so a store holds only the keys in use.
//!
//! - `shape`: [`Shape`], how a bucket fills;
//! - `level`: [`Level`], the arithmetic, sans IO, and [`Wait`];
//! - `store`: the [`Store`] trait;
//! - `memory`: [`MemoryStore`], sharded maps in this process;
//! - `redis`: `RedisStore`, one Lua script per decision;
//! - `redis_link`: its connection, to one server or a Redis Cluster;
//! - `buckets`: [`Buckets`] and [`Bucket`], the API over a store;
//! - `levels`: [`Levels`], a user's, its service's and the cluster's
//!   buckets asked together.
//!
//! The layer's shared limits
//! ([`ThrottleLayerBuilder::shared_limit`](crate::ThrottleLayerBuilder::shared_limit))
//! are buckets in a store keyed by the request's user.

mod buckets;
mod level;
mod levels;
mod memory;
#[cfg(feature = "redis")]
mod redis;
#[cfg(feature = "redis")]
mod redis_link;
mod shape;
mod store;

pub use buckets::{Bucket, Buckets};
pub use level::{Level, Wait};
pub use levels::{LevelRefusal, Levels, Scope};
pub use memory::MemoryStore;
#[cfg(feature = "redis")]
pub use redis::{DEFAULT_TIMEOUT, RedisStore, RedisStoreBuilder, Unavailable};
pub use shape::{MAX_TOKENS, Shape};
pub use store::{Store, StoreError};
