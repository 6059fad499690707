//! [`RedisLink`]: the connection a [`RedisStore`](super::RedisStore) runs
//! its scripts on, to one server or to a Redis Cluster.

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::{ClusterClient, ClusterConfig};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, FromRedisValue, RedisResult, ScriptInvocation};

/// One server through redis-rs's `ConnectionManager`, or a cluster
/// through its cluster connection, which routes each command to the
/// primary of its key's hash slot and follows `MOVED` and `ASK`
/// redirections and failovers. Both are made lazily, reconnect on their
/// own, and are cheap to clone.
#[derive(Clone)]
pub(super) enum RedisLink {
    One(ConnectionManager),
    Cluster(ClusterConnection),
}

impl RedisLink {
    /// A link to the server at `url`; nothing is connected yet.
    pub(super) fn one(url: &str) -> RedisResult<Self> {
        let client = redis::Client::open(url)?;
        // Reconnecting is the manager's: quick retries, capped so that a
        // Redis back after an outage is used again within a second.
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_millis(500)))
            .set_min_delay(Duration::from_millis(20))
            .set_max_delay(Duration::from_millis(500))
            .set_number_of_retries(6);
        ConnectionManager::new_lazy_with_config(client, config).map(Self::One)
    }

    /// A link to the cluster that `nodes` (URLs of some of its nodes)
    /// belong to; it learns the rest from them in the background.
    pub(super) fn cluster(nodes: &[String]) -> RedisResult<Self> {
        // Retries that fit a failover (the cluster's node timeout, then
        // the replica's election) without holding a decision past its own
        // timeout, which the store enforces.
        let client = ClusterClient::builder(nodes.iter().map(String::as_str))
            .connection_timeout(Duration::from_millis(500))
            .response_timeout(Duration::from_millis(500))
            .min_retry_wait(10)
            .max_retry_wait(200)
            .retries(8)
            .build()?;
        let config = ClusterConfig::default();
        Ok(Self::Cluster(
            client.get_pending_async_connection_with_config(config),
        ))
    }

    /// Runs `script` (by `EVALSHA`, loading it where it is missing).
    pub(super) async fn invoke<T: FromRedisValue>(
        &self,
        script: &ScriptInvocation<'_>,
    ) -> RedisResult<T> {
        match self.clone() {
            Self::One(mut c) => script.invoke_async(&mut c).await,
            Self::Cluster(mut c) => script.invoke_async(&mut c).await,
        }
    }

    /// Runs `cmd`.
    pub(super) async fn query<T: FromRedisValue>(&self, cmd: &Cmd) -> RedisResult<T> {
        match self.clone() {
            Self::One(mut c) => cmd.query_async(&mut c).await,
            Self::Cluster(mut c) => cmd.query_async(&mut c).await,
        }
    }
}
