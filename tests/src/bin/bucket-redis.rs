//! The shared limit's cost: one decision over Redis (a `redis-server`
//! started here on 127.0.0.1, one connection) and over a Redis Cluster
//! (three primaries with a replica each, started here too), alternated:
//! the round trip p50/p99 one at a time and the rate with many in flight,
//! beside the same decision in memory.
//!
//! Run with: `cargo run --release -p throttle-tests --bin bucket-redis`
//! (`-- --decisions N`, default 20,000; `--in-flight N`, default 64).

use std::sync::Arc;
use std::time::{Duration, Instant};

use throttle_layer::bucket::{MemoryStore, RedisStore, Shape, Store};
use throttle_tests::servers::{Redis, RedisCluster};

fn main() -> anyhow::Result<()> {
    let decisions = throttle_tests::arg("--decisions", 20_000.0) as usize;
    let in_flight = throttle_tests::arg("--in-flight", 64.0) as usize;
    let Some(redis) = Redis::start("bucket-redis") else {
        anyhow::bail!("redis-server is not on PATH");
    };
    let Some(cluster) = RedisCluster::start("bucket-redis") else {
        anyhow::bail!("redis-server or redis-cli is not on PATH");
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let keys: Vec<String> = (0..1000).map(|i| format!("user-{i}")).collect();
    rt.block_on(async {
        let one = RedisStore::builder(redis.url())
            .timeout(Duration::from_secs(1))
            .build()?;
        let three = RedisStore::cluster(cluster.urls())
            .timeout(Duration::from_secs(1))
            .build()?;
        // Alternated, so that both see the same machine.
        for round in 1..=2 {
            for (name, store) in [
                ("one Redis", &one),
                ("a Redis Cluster of 3 primaries", &three),
            ] {
                println!("{name}, round {round}:");
                measure(store, &keys, decisions, in_flight).await?;
            }
        }
        anyhow::Ok(())
    })?;
    // Plenty of tokens: every decision takes one, none is refused.
    let shape = Shape::per_second(1_000_000);
    let memory = MemoryStore::new();
    let start = Instant::now();
    let n = decisions * 50;
    for i in 0..n {
        let _ = memory.take("bench", &keys[i % keys.len()], &shape, 1);
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "Memory, one thread: {:.0} ns a decision",
        secs * 1e9 / n as f64
    );
    Ok(())
}

/// One decision at a time (round trip p50/p99), then `in_flight` at once.
async fn measure(
    store: &RedisStore,
    keys: &[String],
    decisions: usize,
    in_flight: usize,
) -> anyhow::Result<()> {
    // Plenty of tokens: every decision takes one, none is refused.
    let shape = Shape::per_second(1_000_000);
    for key in keys {
        store.try_acquire("bench", key, &shape, 1).await.ok();
    }
    let mut took = Vec::with_capacity(decisions);
    for i in 0..decisions {
        let start = Instant::now();
        let decided = store
            .try_acquire("bench", &keys[i % keys.len()], &shape, 1)
            .await;
        took.push(start.elapsed());
        anyhow::ensure!(decided.is_ok(), "refused: {decided:?}");
    }
    took.sort_unstable();
    let at = |q: f64| took[((took.len() - 1) as f64 * q) as usize];
    println!(
        "  one at a time ({decisions} decisions): round trip p50 {:?}, p99 {:?}, max {:?}; {:.0} decisions/s",
        at(0.5),
        at(0.99),
        at(1.0),
        decisions as f64 / took.iter().sum::<Duration>().as_secs_f64()
    );
    let store = Arc::new(store.clone());
    let start = Instant::now();
    let tasks: Vec<_> = (0..in_flight)
        .map(|t| {
            let (store, keys) = (store.clone(), keys.to_vec());
            tokio::spawn(async move {
                for i in 0..decisions / in_flight {
                    let key = &keys[(t * 7919 + i) % keys.len()];
                    let _ = store.try_acquire("bench", key, &shape, 1).await;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await?;
    }
    let total = decisions / in_flight * in_flight;
    println!(
        "  {in_flight} in flight: {:.0} decisions/s",
        total as f64 / start.elapsed().as_secs_f64()
    );
    Ok(())
}
