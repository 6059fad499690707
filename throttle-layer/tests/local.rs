//! Local limits (`LocalLimit`, nginx's `limit_req`) in the layer, in
//! tokio's paused time: what passes at once, what is held and how long,
//! what is refused, several limits together, and the central quota beside
//! them.

mod common;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use common::get_as;
use http::{Request, StatusCode};
use throttle_clock::ManualClock;
use throttle_layer::local::LocalLimit;
use throttle_layer::store::SlotStore;
use throttle_layer::{ThrottleLayer, TokioClock, UserKey};
use throttle_proto::legacy::quota_from_json;
use tokio::time::Instant;
use tower::ServiceExt;

/// `limit` reading tokio's clock, so it drains only as the paused time
/// advances.
fn paused(limit: LocalLimit) -> LocalLimit {
    limit.clock(Arc::new(TokioClock::new()))
}

fn app(limits: &[LocalLimit], store: &SlotStore) -> Router {
    let mut layer = ThrottleLayer::builder(store, "front").user(UserKey::header("x-user"));
    for l in limits {
        layer = layer.local_limit(paused(l.clone()));
    }
    Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer.build().unwrap())
}

/// Sends `n` requests of `user` at the same instant; each one's status
/// and how long after the start it was answered, in ms.
async fn burst(app: &Router, user: &str, n: usize) -> Vec<(u16, u128)> {
    let start = Instant::now();
    let calls = (0..n).map(|_| {
        let app = app.clone();
        async move {
            let res = app.oneshot(get_as(user, "/")).await.unwrap();
            (res.status().as_u16(), start.elapsed().as_millis())
        }
    });
    futures_util::future::join_all(calls).await
}

fn passed(out: &[(u16, u128)]) -> usize {
    out.iter().filter(|(s, _)| *s == 200).count()
}

/// When each request that passed was answered, in ms, earliest first.
fn held(out: &[(u16, u128)]) -> Vec<u128> {
    let mut ms: Vec<u128> = out
        .iter()
        .filter(|(s, _)| *s == 200)
        .map(|(_, ms)| *ms)
        .collect();
    ms.sort_unstable();
    ms
}

#[tokio::test(start_paused = true)]
async fn nodelay_passes_one_and_the_burst_at_once_and_refuses_the_rest() {
    let limit: LocalLimit = "10r/s burst=5 nodelay".parse().unwrap();
    let app = app(&[limit], &SlotStore::default());
    let out = burst(&app, "alice", 100).await;
    assert_eq!(passed(&out), 6, "{out:?}");
    assert!(out.iter().all(|(_, ms)| *ms == 0), "none held: {out:?}");
    let refused = app.clone().oneshot(get_as("alice", "/")).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    let by = refused.headers()["throttle-refused-by"].to_str().unwrap();
    assert_eq!(by, "local; limit=\"10r/s burst=5 nodelay\"");
    assert_eq!(refused.headers()["retry-after"], "1");
    // Others have their own keys.
    assert_eq!(passed(&burst(&app, "bob", 1).await), 1);
    // 100 ms drain one request.
    tokio::time::advance(Duration::from_millis(100)).await;
    assert_eq!(passed(&burst(&app, "alice", 3).await), 1);
}

#[tokio::test(start_paused = true)]
async fn delay_passes_some_holds_the_next_by_the_rate_and_refuses_the_rest() {
    let limit: LocalLimit = "10r/s burst=5 delay=2".parse().unwrap();
    let app = app(&[limit], &SlotStore::default());
    let out = burst(&app, "alice", 100).await;
    // The one within the rate plus 2 at once, then one every 100 ms.
    assert_eq!(held(&out), [0, 0, 0, 100, 200, 300], "{out:?}");
    assert_eq!(out.len() - held(&out).len(), 94);
}

#[tokio::test(start_paused = true)]
async fn several_limits_must_all_pass_and_the_longest_hold_wins() {
    // One holds everything past the rate (delay 0), the other passes its
    // burst at once: the first's holds decide.
    let slow: LocalLimit = "10r/s burst=3".parse().unwrap();
    let wide: LocalLimit = "100r/s burst=10 nodelay".parse().unwrap();
    let both = app(&[wide, slow], &SlotStore::default());
    let out = burst(&both, "alice", 10).await;
    assert_eq!(held(&out), [0, 100, 200, 300], "{out:?}");
    // A per-minute limit keyed on its own header refuses where the user's
    // limit would still pass.
    let tight = LocalLimit::per_minute(60).key(UserKey::header("x-team"));
    let teams = app(
        &[tight, "100r/s burst=100 nodelay".parse().unwrap()],
        &SlotStore::default(),
    );
    let team = |user: &str| {
        Request::builder()
            .uri("/")
            .header("x-user", user)
            .header("x-team", "red")
            .body(Body::empty())
            .unwrap()
    };
    assert_eq!(
        teams.clone().oneshot(team("a")).await.unwrap().status(),
        200
    );
    let res = teams.clone().oneshot(team("b")).await.unwrap();
    assert_eq!(res.status(), 429, "one a second for team red");
}

#[tokio::test(start_paused = true)]
async fn the_central_quota_and_the_local_limit_both_decide_and_say_which_refused() {
    let clock = Arc::new(ManualClock::new(100_250));
    let store = SlotStore::builder().clock(clock).build();
    // The central allows alice 2 requests in slot 100 (a node refuses
    // once more than the quota's whole part was used: the third passes).
    let quota = r#"{"front": {"100": {"alice": {"requests": 2.0}}}}"#;
    store.apply_quota(&quota_from_json(quota).unwrap());
    let app = app(&["10r/s burst=5 nodelay".parse().unwrap()], &store);
    let mut by = Vec::new();
    for _ in 0..8 {
        let res = app.clone().oneshot(get_as("alice", "/")).await.unwrap();
        let who = match (
            res.status().as_u16(),
            res.headers().get("throttle-refused-by"),
        ) {
            (200, _) => None,
            (_, Some(_)) => Some("local".to_owned()),
            (status, None) => Some(format!("{status} quota")),
        };
        by.push(who);
    }
    let want: Vec<Option<String>> = [
        None,
        None,
        None,
        Some("429 quota"),
        Some("429 quota"),
        Some("429 quota"),
        Some("429 quota"),
        Some("429 quota"),
    ]
    .map(|s| s.map(str::to_owned))
    .into();
    // The quota's refusals (which name the quota's resource in their
    // RateLimit headers, not `throttle-refused-by`) are taken back from
    // the local limit, so it never refuses: only 3 of its 6 were spent.
    assert_eq!(by, want);
}

#[tokio::test(start_paused = true)]
async fn shadow_mode_counts_local_refusals_but_neither_refuses_nor_holds() {
    let store = SlotStore::default();
    let layer = ThrottleLayer::builder(&store, "front")
        .user(UserKey::header("x-user"))
        .local_limit(paused("1r/s".parse().unwrap()))
        .shadow(true)
        .build()
        .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    let out = burst(&app, "alice", 20).await;
    assert_eq!(passed(&out), 20);
    assert!(out.iter().all(|(_, ms)| *ms == 0), "{out:?}");
}

#[test]
fn the_nginx_syntax_is_read_and_bad_limits_are_refused_with_why() {
    let l: LocalLimit = "30r/m burst=5 delay=2 size=1000".parse().unwrap();
    assert_eq!(
        l,
        LocalLimit::per_minute(30).burst(5).delay(2).zone_size(1000)
    );
    assert_eq!("10r/s".parse::<LocalLimit>().unwrap().to_string(), "10r/s");
    for (bad, says) in [
        ("", "no rate"),
        ("10/s", "not a rate"),
        ("0r/s", "above 0"),
        ("10r/s burst=x", "whole number"),
        ("10r/s zone=one", "unknown parameter"),
    ] {
        let e = bad.parse::<LocalLimit>().unwrap_err().to_string();
        assert!(e.contains(says), "{bad}: {e}");
    }
}

#[tokio::test(start_paused = true)]
async fn clones_of_one_limit_share_its_zone_across_routes() {
    let store = SlotStore::default();
    let limit = paused("1r/s burst=1 nodelay".parse().unwrap());
    let layer = |l: &LocalLimit| {
        ThrottleLayer::builder(&store, "front")
            .user(UserKey::header("x-user"))
            .local_limit(l.clone())
            .build()
            .unwrap()
    };
    let app = Router::new()
        .route("/a", get(|| async { "a" }).layer(layer(&limit)))
        .route("/b", get(|| async { "b" }).layer(layer(&limit)));
    let on = |path: &str| {
        Request::builder()
            .uri(path)
            .header("x-user", "alice")
            .body(Body::empty())
            .unwrap()
    };
    let mut statuses = Vec::new();
    for path in ["/a", "/b", "/a", "/b"] {
        statuses.push(
            app.clone()
                .oneshot(on(path))
                .await
                .unwrap()
                .status()
                .as_u16(),
        );
    }
    assert_eq!(statuses, [200, 200, 429, 429], "one zone: 1 + a burst of 1");
}
