//! Shared limits (`ThrottleLayerBuilder::shared_limit`) over a bucket
//! store: one bucket per key for every layer on the store, refusals that
//! say so, and nothing counted for a request they refuse. The store here
//! is memory on a manual clock; `throttle-tests` runs the same over a real
//! Redis and real nodes.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use common::{amount, get_as};
use http::{Request, StatusCode};
use throttle_clock::ManualClock;
use throttle_layer::bucket::MemoryStore;
use throttle_layer::local::LocalLimit;
use throttle_layer::store::SlotStore;
use throttle_layer::{ThrottleLayer, UserKey};
use tower::ServiceExt;

const T: i64 = 100_250;

struct Fleet {
    clock: Arc<ManualClock>,
    buckets: MemoryStore,
    /// Each node's slot store.
    stores: Vec<SlotStore>,
    /// Requests that reached a handler.
    served: Arc<AtomicUsize>,
}

impl Fleet {
    fn new(nodes: usize) -> Self {
        let clock = Arc::new(ManualClock::new(T));
        let stores = (0..nodes)
            .map(|_| SlotStore::builder().clock(clock.clone()).build())
            .collect();
        Self {
            buckets: MemoryStore::with_clock(clock.clone()),
            clock,
            stores,
            served: Arc::default(),
        }
    }

    /// Node `i`'s app with `limit` shared and `local` limits of its own.
    fn app(&self, i: usize, limit: &str, local: &[&str], shadow: bool) -> Router {
        let mut layer = ThrottleLayer::builder(&self.stores[i], "front")
            .user(UserKey::header("x-user"))
            .shadow(shadow)
            .shared_limit(self.buckets.clone(), limit.parse().unwrap());
        for l in local {
            layer = layer.local_limit(l.parse::<LocalLimit>().unwrap());
        }
        let served = self.served.clone();
        let handler = move || {
            served.fetch_add(1, Ordering::Relaxed);
            async { "ok" }
        };
        Router::new()
            .route("/", get(handler))
            .layer(layer.build().unwrap())
    }
}

/// The statuses of `n` requests as `user`, sent to `apps` in turn.
async fn round_robin(apps: &[Router], user: &str, n: usize) -> Vec<StatusCode> {
    let mut statuses = Vec::with_capacity(n);
    for i in 0..n {
        let app = apps[i % apps.len()].clone();
        statuses.push(app.oneshot(get_as(user, "/")).await.unwrap().status());
    }
    statuses
}

#[tokio::test]
async fn nodes_on_one_store_share_one_bucket_per_key() {
    let fleet = Fleet::new(3);
    let apps: Vec<Router> = (0..3)
        .map(|i| fleet.app(i, "10r/s burst=5", &[], false))
        .collect();
    let statuses = round_robin(&apps, "alice", 30).await;
    // The burst and one, across the three nodes together.
    assert_eq!(
        statuses.iter().filter(|s| **s == StatusCode::OK).count(),
        6,
        "{statuses:?}"
    );
    assert_eq!(
        fleet.served.load(Ordering::Relaxed),
        6,
        "refused ones never reach the handler"
    );
    let refused = apps[1].clone().oneshot(get_as("alice", "/")).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    let by = refused.headers()["throttle-refused-by"].to_str().unwrap();
    assert_eq!(by, "shared; limit=\"10r/s burst=5\"");
    assert_eq!(refused.headers()["retry-after"], "1");
    // Another key has its own bucket; a second later, 10 more for alice.
    let bob = apps[2].clone().oneshot(get_as("bob", "/")).await.unwrap();
    assert_eq!(bob.status(), StatusCode::OK);
    fleet.clock.advance(Duration::from_secs(1));
    let later = round_robin(&apps, "alice", 30).await;
    let later = later.iter().filter(|s| **s == StatusCode::OK).count();
    assert_eq!(later, 6, "10 a second refill a bucket of 6");
}

#[tokio::test]
async fn a_request_the_shared_limit_refuses_counts_nowhere() {
    let fleet = Fleet::new(2);
    let apps = [
        fleet.app(0, "2r/s", &["100r/s burst=1 nodelay"], false),
        fleet.app(1, "2r/s", &["100r/s burst=1 nodelay"], false),
    ];
    round_robin(&apps, "alice", 6).await;
    fleet.clock.set(T + 1000);
    // One passed on each node (the bucket holds 1: no burst); the two
    // nodes' slot stores count only those, not the four refused.
    let counted: i64 = fleet
        .stores
        .iter()
        .map(|s| amount(&s.collect(100).consumption, "alice", "requests"))
        .sum();
    assert_eq!(counted, 1);
    assert_eq!(fleet.served.load(Ordering::Relaxed), 1);
    // The local zone was given the refused requests back: at 100r/s
    // burst=1 it passes two at an instant, so had they stayed in it, the
    // third of these would be the local limit's refusal, not the shared.
    for _ in 0..3 {
        let res = apps[0].clone().oneshot(get_as("carol", "/")).await.unwrap();
        let by = res.headers().get("throttle-refused-by");
        assert!(
            by.is_none_or(|v| v.to_str().unwrap().starts_with("shared")),
            "{by:?}"
        );
    }
}

#[tokio::test]
async fn shadow_mode_counts_shared_refusals_but_refuses_nothing() {
    let fleet = Fleet::new(1);
    let app = fleet.app(0, "1r/s", &[], true);
    for _ in 0..5 {
        let res = app.clone().oneshot(get_as("alice", "/")).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
    }
    assert_eq!(fleet.served.load(Ordering::Relaxed), 5);
}

#[tokio::test]
async fn a_limit_keyed_on_its_own_applies_to_requests_without_a_user() {
    let fleet = Fleet::new(1);
    let limit = LocalLimit::per_second(1).key(UserKey::header("x-ip"));
    let layer = ThrottleLayer::builder(&fleet.stores[0], "front")
        .user(UserKey::header("x-user"))
        .shared_limit(fleet.buckets.clone(), limit)
        .build()
        .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    let anonymous = || {
        Request::builder()
            .uri("/")
            .header("x-ip", "10.0.0.1")
            .body(Body::empty())
            .unwrap()
    };
    let first = app.clone().oneshot(anonymous()).await.unwrap();
    let second = app.clone().oneshot(anonymous()).await.unwrap();
    assert_eq!(
        (first.status(), second.status()),
        (StatusCode::OK, StatusCode::TOO_MANY_REQUESTS)
    );
}
