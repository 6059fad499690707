//! The bucket stores against one suite: memory, and a real `redis-server`
//! started for the test (skipped, saying so, where it is not installed).

use std::sync::Arc;
use std::time::Duration;

use redis::AsyncCommands;
use throttle_clock::ManualClock;
use throttle_layer::bucket::{
    Buckets, Levels, MemoryStore, RedisStore, RedisStoreBuilder, Scope, Shape, Store, Unavailable,
    Wait,
};
use throttle_tests::buckets;
use throttle_tests::servers::{Redis, RedisCluster};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

#[test]
fn the_memory_store_passes_the_suite() {
    let clock = Arc::new(ManualClock::new(0));
    let store = MemoryStore::with_clock(clock.clone());
    buckets::run(&runtime(), &store, &clock, 256);
}

/// The suite against `builder`'s store, on an injected clock, deciding
/// rather than falling back (a loaded machine may be slow).
fn redis_suite(builder: RedisStoreBuilder) {
    let rt = runtime();
    let clock = Arc::new(ManualClock::new(0));
    let store = rt.block_on(async {
        builder
            .clock(clock.clone())
            .timeout(Duration::from_secs(5))
            .unavailable(Unavailable::Deny)
            .build()
            .expect("store")
    });
    buckets::run(&rt, &store, &clock, 128);
}

#[test]
fn the_redis_store_passes_the_suite() {
    let Some(redis) = Redis::start("the_redis_store_passes_the_suite") else {
        return;
    };
    redis_suite(RedisStore::builder(redis.url()));
}

#[test]
fn idle_redis_buckets_expire_when_full_again() {
    let Some(redis) = Redis::start("idle_redis_buckets_expire_when_full_again") else {
        return;
    };
    runtime().block_on(async {
        let store = RedisStore::builder(redis.url())
            .timeout(Duration::from_secs(5))
            .build()
            .expect("store");
        // 10 a second, capacity 10: 4 taken, full again within 400 ms.
        let shape = Shape::per_second(10);
        store
            .try_acquire("api", "alice", &shape, 4)
            .await
            .expect("taken");
        let client = redis::Client::open(redis.url()).expect("client");
        let mut conn = client
            .get_multiplexed_async_connection()
            .await
            .expect("connection");
        let ttl: i64 = conn
            .pttl("throttle:bucket:3:api:alice")
            .await
            .expect("pttl");
        assert!((1..=401).contains(&ttl), "ttl {ttl} ms");
        // Blocked, it stays; unblocked, it expires again.
        store.block("api", "alice").await.expect("blocked");
        let ttl: i64 = conn
            .pttl("throttle:bucket:3:api:alice")
            .await
            .expect("pttl");
        assert_eq!(ttl, -1, "a blocked key never expires");
        store.unblock("api", "alice").await.expect("unblocked");
        tokio::time::sleep(Duration::from_millis(450)).await;
        let exists: bool = conn
            .exists("throttle:bucket:3:api:alice")
            .await
            .expect("exists");
        assert!(!exists, "full again, the key is gone");
    });
}

#[test]
fn full_memory_buckets_are_forgotten() {
    let clock = Arc::new(ManualClock::new(1_000_000));
    let store = MemoryStore::with_clock(clock.clone());
    let shape = Shape::per_second(10);
    for i in 0..100_000 {
        store
            .take("api", &format!("user-{i}"), &shape, 1)
            .expect("taken");
    }
    store.set_blocked("api", "mallory", true);
    clock.advance(Duration::from_millis(99));
    store.take("api", "late-0", &shape, 1).expect("taken");
    assert_eq!(store.len(), 100_002, "not full yet: kept");
    clock.advance(Duration::from_millis(1));
    // A shard that doubles sweeps on its own: new keys push the old out.
    for i in 0..100_000 {
        store
            .take("api", &format!("late-{i}"), &shape, 1)
            .expect("taken");
    }
    assert!(store.len() < 150_000, "{} keys", store.len());
    store.purge();
    assert_eq!(store.len(), 100_001, "the late ones and the blocked one");
    clock.advance(Duration::from_millis(100));
    store.purge();
    assert_eq!(store.len(), 1, "only the blocked key");
    assert_eq!(store.take("api", "mallory", &shape, 1), Err(Wait::Blocked));
}

#[test]
fn an_unreachable_redis_falls_back_within_the_timeout() {
    runtime().block_on(async {
        // Nothing listens on this port.
        let port = throttle_tests::servers::free_port();
        let shape = Shape::per_second(10);
        for (unavailable, expected) in [
            (Unavailable::Allow, Ok(())),
            (Unavailable::Deny, Err(Wait::Unavailable)),
        ] {
            let store = RedisStore::builder(format!("redis://127.0.0.1:{port}"))
                .timeout(Duration::from_millis(20))
                .unavailable(unavailable)
                .build()
                .expect("store");
            for _ in 0..3 {
                let start = std::time::Instant::now();
                assert_eq!(store.try_acquire("api", "alice", &shape, 1).await, expected);
                assert!(start.elapsed() < Duration::from_millis(500));
            }
            assert!(store.is_blocked("api", "alice").await.is_err());
        }
    });
}

#[test]
fn levels_hold_a_cluster_bucket_in_redis_across_processes() {
    let Some(redis) = Redis::start("levels_hold_a_cluster_bucket_in_redis_across_processes") else {
        return;
    };
    runtime().block_on(async {
        let clock = Arc::new(ManualClock::new(1_000_000));
        // Two processes: each its own memory for users and services, one
        // Redis for the cluster (12 a second for all). alice and bob fill
        // their users' buckets; carol meets her process's service (5 + 2
        // of 7); dave, in the other process, meets the cluster's (12).
        let process = || {
            let cluster = RedisStore::builder(redis.url())
                .clock(clock.clone())
                .timeout(Duration::from_secs(5))
                .unavailable(Unavailable::Deny)
                .build()
                .expect("store");
            Levels::new(MemoryStore::with_clock(clock.clone()))
                .user(Shape::per_second(5))
                .service(Shape::per_second(7))
                .cluster(Buckets::new(cluster, "cluster", Shape::per_second(12)))
        };
        let (a, b) = (process(), process());
        let mut by = std::collections::BTreeMap::new();
        for (levels, user) in [(&a, "alice"), (&b, "bob"), (&b, "carol"), (&a, "dave")] {
            for _ in 0..6 {
                let scope = match levels.try_acquire("api", user, 1).await {
                    Ok(()) => "admitted",
                    Err(r) if r.scope == Scope::User => "user",
                    Err(r) if r.scope == Scope::Service => "service",
                    Err(_) => "cluster",
                };
                *by.entry((user, scope)).or_insert(0) += 1;
            }
        }
        let got: Vec<_> = by.into_iter().collect();
        assert_eq!(
            got,
            [
                (("alice", "admitted"), 5),
                (("alice", "user"), 1),
                (("bob", "admitted"), 5),
                (("bob", "user"), 1),
                (("carol", "admitted"), 2),
                (("carol", "service"), 4),
                (("dave", "cluster"), 6),
            ],
            "users 5, services 7 a process, the cluster 12 for both"
        );
        assert_eq!(a.available("api", "dave").await.expect("available"), 0);
    });
}

#[test]
fn the_redis_cluster_store_passes_the_suite() {
    let Some(cluster) = RedisCluster::start("the_redis_cluster_store_passes_the_suite") else {
        return;
    };
    redis_suite(RedisStore::cluster(cluster.urls()));
}

/// A Redis Cluster's primary killed while a key is decided 200 times a
/// second: every decision returns within the timeout (falling back to
/// allow while the slot has no primary), and the bucket limits again
/// within 2 s of the replica's takeover.
#[test]
fn a_redis_cluster_primary_killed_mid_run_is_followed() {
    let test = "a_redis_cluster_primary_killed_mid_run_is_followed";
    let Some(mut cluster) = RedisCluster::start(test) else {
        return;
    };
    const TIMEOUT: Duration = Duration::from_millis(50);
    let key = "throttle:bucket:3:api:alice";
    runtime().block_on(async {
        let store = RedisStore::cluster(cluster.urls())
            .timeout(TIMEOUT)
            .build()
            .expect("store");
        // 10 a second, capacity 10: at 200 a second, most are refused.
        let shape = Shape::per_second(10);
        let decide = |store: RedisStore| async move {
            let start = std::time::Instant::now();
            let refused = store.try_acquire("api", "alice", &shape, 1).await.is_err();
            (refused, start.elapsed())
        };
        let mut slowest = Duration::ZERO;
        let mut refused = 0;
        for _ in 0..100 {
            let (r, took) = decide(store.clone()).await;
            refused += usize::from(r);
            slowest = slowest.max(took);
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(refused > 50, "limiting before the kill: {refused} of 100");
        cluster.kill_primary_of(key);
        let killed = std::time::Instant::now();
        let mut taken_over = None;
        let mut limiting_again = None;
        while limiting_again.is_none() && killed.elapsed() < Duration::from_secs(20) {
            let (r, took) = decide(store.clone()).await;
            slowest = slowest.max(took);
            if taken_over.is_none() && cluster.serves(key) {
                taken_over = Some(killed.elapsed());
            }
            // Two refusals in a row: the bucket decides again.
            let (again, took) = decide(store.clone()).await;
            slowest = slowest.max(took);
            if r && again && taken_over.is_some() {
                limiting_again = Some(killed.elapsed());
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let taken_over = taken_over.expect("the replica took over");
        let limiting_again = limiting_again.expect("limiting again");
        eprintln!(
            "replica took over {taken_over:?} after the kill; limiting again {:?} after that; slowest decision {slowest:?}",
            limiting_again.saturating_sub(taken_over)
        );
        assert!(
            limiting_again.saturating_sub(taken_over) <= Duration::from_secs(2),
            "took over at {taken_over:?}, limiting at {limiting_again:?}"
        );
        assert!(
            slowest <= TIMEOUT + Duration::from_millis(100),
            "a decision took {slowest:?} (timeout {TIMEOUT:?})"
        );
    });
}
