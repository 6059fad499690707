//! Shared limits end to end: three example nodes (each its own slot
//! store, Redis connection and HTTP server on 127.0.0.1) with no central,
//! one `--shared-limit` over a real `redis-server` (or Redis Cluster)
//! started for the test, and one user's load spread over the three.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Empty;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use throttle_examples::app::{self, Limits};
use throttle_layer::bucket::RedisStore;
use throttle_layer::{Fallback, SlotStore};
use throttle_tests::servers::{Redis, RedisCluster};
use tokio::time::Instant;

/// How long a decision waits for Redis here: more than the default 5 ms,
/// which a loaded test machine sometimes misses, so the admitted count
/// measures the limit and not the fallback.
const TIMEOUT: Duration = Duration::from_millis(50);

async fn start_node(redis: &str, limit: &str) -> anyhow::Result<SocketAddr> {
    start_node_on(RedisStore::builder(redis).timeout(TIMEOUT).build()?, limit).await
}

async fn start_node_on(redis: RedisStore, limit: &str) -> anyhow::Result<SocketAddr> {
    let limits = Limits {
        local: Vec::new(),
        shared: vec![limit.parse()?],
        redis: Some(redis),
    };
    let router = app::router_with(&SlotStore::default(), Fallback::Allow, &limits)?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, router).await });
    Ok(addr)
}

/// One answer: when the request left (ms after the start), its status,
/// and how long it took.
#[derive(Debug, Clone, Copy)]
struct Answer {
    at_ms: u64,
    status: u16,
    took: Duration,
}

/// Offers `per_node` requests a second of user alice to each node for
/// `secs`, paced every 10 ms, each request on its own task; calls
/// `during(ms)` between ticks.
async fn offer(
    nodes: &[SocketAddr],
    per_node: u64,
    secs: u64,
    mut during: impl FnMut(u64),
) -> Vec<Answer> {
    let client: Client<HttpConnector, Empty<Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    let ticks = secs * 100;
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    let mut calls = Vec::new();
    for t in 0..ticks {
        tick.tick().await;
        during(t * 10);
        for (i, addr) in nodes.iter().enumerate() {
            // `per_node` a second: on the ticks where the count moves.
            if (t + 1) * per_node / 100 == t * per_node / 100 {
                continue;
            }
            let client = client.clone();
            let uri = format!("http://{addr}/");
            let at_ms = t * 10 + i as u64;
            calls.push(tokio::spawn(async move {
                let req = http::Request::get(uri)
                    .header("x-user", "alice")
                    .body(Empty::new())
                    .expect("request");
                let sent = Instant::now();
                let status = client.request(req).await.map_or(0, |r| r.status().as_u16());
                Answer {
                    at_ms,
                    status,
                    took: sent.elapsed(),
                }
            }));
        }
    }
    let mut answers = Vec::new();
    for c in calls {
        answers.push(c.await.expect("request task"));
    }
    answers
}

fn admitted(answers: &[Answer], from_ms: u64, to_ms: u64) -> usize {
    answers
        .iter()
        .filter(|a| (from_ms..to_ms).contains(&a.at_ms) && a.status == 200)
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_share_one_limit_through_redis() -> anyhow::Result<()> {
    let Some(redis) = Redis::start("three_nodes_share_one_limit_through_redis") else {
        return Ok(());
    };
    let mut nodes = Vec::new();
    for _ in 0..3 {
        nodes.push(start_node(&redis.url(), "50r/s burst=50").await?);
    }
    let answers = offer(&nodes, 100, 10, |_| {}).await;
    let offered = answers.len();
    let ok = admitted(&answers, 0, u64::MAX);
    let unanswered = answers.iter().filter(|a| a.status == 0).count();
    println!("offered {offered}, admitted {ok} (limit: 51 at once, then 50/s: 551 in 10 s)");
    assert_eq!(unanswered, 0);
    assert!(offered >= 2900, "offered {offered}");
    assert!((523..=578).contains(&ok), "admitted {ok}, not 550 +- 5%");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_keep_answering_while_redis_is_down_and_limit_again_after() -> anyhow::Result<()> {
    let Some(mut redis) = Redis::start("nodes_keep_answering_while_redis_is_down") else {
        return Ok(());
    };
    let mut nodes = Vec::new();
    for _ in 0..3 {
        nodes.push(start_node(&redis.url(), "50r/s burst=50").await?);
    }
    // Killed at 2 s, back at 4 s, measured until 7 s.
    let (kill_ms, back_ms, end_ms) = (2000, 4000, 7000);
    let answers = offer(&nodes, 100, end_ms / 1000, |ms| {
        if ms == kill_ms {
            redis.kill();
        }
        if ms == back_ms {
            redis.restart();
        }
    })
    .await;
    let down: Vec<&Answer> = answers
        .iter()
        .filter(|a| (kill_ms + 100..back_ms).contains(&a.at_ms))
        .collect();
    let slowest = down.iter().map(|a| a.took).max().unwrap_or_default();
    let refused_down = down.iter().filter(|a| a.status != 200).count();
    let per_second: Vec<usize> = (0..end_ms / 1000)
        .map(|s| admitted(&answers, s * 1000, s * 1000 + 1000))
        .collect();
    println!(
        "admitted per second {per_second:?}; Redis down: {} requests, {refused_down} refused, slowest {slowest:?}",
        down.len()
    );
    // Down: every request answered, allowed (the fallback), none waiting
    // much past the timeout (the rest is the HTTP round trip on a busy
    // machine).
    assert_eq!(refused_down, 0);
    assert!(
        slowest < TIMEOUT + Duration::from_millis(200),
        "slowest {slowest:?}"
    );
    // Back: from 2 s after the restart, the limit holds again (an empty
    // Redis gives a full bucket of 51 first).
    let after = admitted(&answers, back_ms + 2000, end_ms);
    assert!(
        (40..=60).contains(&after),
        "admitted {after} in the second from 2 s after Redis came back"
    );
    Ok(())
}

/// The same three nodes on a Redis Cluster (three primaries, each with a
/// replica), `--redis-cluster`'s store: one limit across them, and the
/// primary holding alice's bucket killed at 2 s: every request answered,
/// none past the timeout, the limit holding again within 2 s of the
/// replica's takeover.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_share_one_limit_through_a_redis_cluster_that_fails_over() -> anyhow::Result<()>
{
    let test = "three_nodes_share_one_limit_through_a_redis_cluster_that_fails_over";
    let Some(mut cluster) = RedisCluster::start(test) else {
        return Ok(());
    };
    let mut nodes = Vec::new();
    for _ in 0..3 {
        let store = RedisStore::cluster(cluster.urls())
            .timeout(TIMEOUT)
            .build()?;
        nodes.push(start_node_on(store, "50r/s burst=50").await?);
    }
    let kill_ms = 2000;
    let mut taken_over_ms = None;
    let answers = offer(&nodes, 100, 8, |ms| {
        if ms == kill_ms {
            assert!(
                cluster.kill_a_primary_with_keys(),
                "alice's bucket is in the cluster"
            );
        }
        if ms > kill_ms && ms % 100 == 0 && taken_over_ms.is_none() && cluster.failed_over() {
            taken_over_ms = Some(ms);
        }
    })
    .await;
    let taken_over_ms = taken_over_ms.expect("the replica took over");
    let per_second: Vec<usize> = (0..8)
        .map(|s| admitted(&answers, s * 1000, s * 1000 + 1000))
        .collect();
    let failed = answers
        .iter()
        .filter(|a| ![200, 429].contains(&a.status))
        .count();
    let slowest = answers.iter().map(|a| a.took).max().unwrap_or_default();
    println!(
        "admitted per second {per_second:?}; killed at {kill_ms} ms, taken over at {taken_over_ms} ms; slowest {slowest:?}"
    );
    assert_eq!(failed, 0, "every request answered 200 or 429");
    assert!(
        slowest < TIMEOUT + Duration::from_millis(200),
        "slowest {slowest:?}"
    );
    assert!(
        (45..=56).contains(&per_second[1]),
        "before the kill: {per_second:?}"
    );
    // From 2 s after the takeover the limit holds (the new primary may
    // hold the bucket's copy, or none: a full bucket first).
    let from = taken_over_ms + 2000;
    let after = admitted(&answers, from, from + 1000);
    assert!(
        (40..=60).contains(&after),
        "admitted {after} in the second from 2 s after the takeover"
    );
    Ok(())
}
