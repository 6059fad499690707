//! Local limits (`LocalLimit`, nginx's `limit_req`) side by side with
//! governor: the decision against governor's keyed `check_key` on the same
//! 10,000 keys (one thread, and two), and the layer against
//! tower_governor's, both behind the same `x-user` key.
//!
//! Run with: `cargo bench -p throttle-layer --bench local`.

use std::hint::black_box;
use std::num::NonZeroU32;
use std::time::Duration;

use axum::body::Body;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use governor::{Quota, RateLimiter};
use throttle_layer::local::{Limiter, LocalLimit, Verdict};
use throttle_layer::{SlotStore, ThrottleLayer, UserKey};
use tower::{Service, ServiceExt};

#[path = "shared/common.rs"]
mod common;
use common::{Governor, HeaderKey, request, two_threads};

const KEYS: usize = 10_000;

fn keys() -> Vec<String> {
    (0..KEYS).map(|i| format!("user-{i:05}")).collect()
}

/// A limit that passes everything (a huge rate) or, after each key's
/// first request, refuses everything (1 a minute, no burst).
fn limits(allow: bool) -> (LocalLimit, Governor) {
    let (local, per) = match allow {
        true => (
            LocalLimit::per_second(1_000_000)
                .burst(1_000_000_000)
                .nodelay(),
            u32::MAX / 2,
        ),
        false => (LocalLimit::per_minute(1), 1),
    };
    let n = NonZeroU32::new(per).unwrap_or(NonZeroU32::MIN);
    let quota = match allow {
        true => Quota::per_second(n).allow_burst(n),
        false => Quota::per_minute(n),
    };
    (local.zone_size(2 * KEYS), RateLimiter::keyed(quota))
}

fn decision(c: &mut Criterion) {
    let names = keys();
    let mut g = c.benchmark_group("local");
    g.throughput(Throughput::Elements(1));
    for allow in [true, false] {
        let which = if allow { "allowed" } else { "rejected" };
        let (limit, gov) = limits(allow);
        let local = Limiter::new(&limit);
        for n in &names {
            let _ = (local.check(n), gov.check_key(n));
        }
        let expect = |v: Verdict| (v == Verdict::Pass) == allow;
        assert!(expect(local.check(&names[0])), "the limit decides as meant");
        let mut i = 0;
        g.bench_function(format!("{which}/local"), |b| {
            b.iter(|| {
                i = (i + 1) % KEYS;
                black_box(local.check(&names[i]))
            })
        });
        g.bench_function(format!("{which}/governor"), |b| {
            b.iter(|| {
                i = (i + 1) % KEYS;
                black_box(gov.check_key(&names[i]).is_ok())
            })
        });
        let own = |t: usize, i: u64| &names[t * KEYS / 2 + (i as usize % (KEYS / 2))];
        g.bench_function(format!("threads2-{which}/local"), |b| {
            b.iter_custom(|iters| {
                two_threads(iters, |t, i| {
                    black_box(local.check(own(t, i)));
                })
            })
        });
        g.bench_function(format!("threads2-{which}/governor"), |b| {
            b.iter_custom(|iters| {
                two_threads(iters, |t, i| {
                    black_box(gov.check_key(own(t, i)).is_ok());
                })
            })
        });
    }
    g.finish();
}

/// The layer with only a local limit (no central quota counted) against
/// tower_governor, each in front of the same handler.
fn layer(c: &mut Criterion) {
    let names = keys();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let mut g = c.benchmark_group("local-layer");
    g.throughput(Throughput::Elements(1));
    let handler = tower::service_fn(|_r: http::Request<Body>| async {
        Ok::<_, std::convert::Infallible>(http::Response::new(Body::from("ok")))
    });
    let store = SlotStore::default();
    for allow in [true, false] {
        let which = if allow { "allowed" } else { "rejected" };
        let (limit, _) = limits(allow);
        let layer = ThrottleLayer::builder(&store, "front")
            .user(UserKey::header("x-user"))
            .count_requests(false)
            .local_limit(limit)
            .build()
            .unwrap();
        let svc = tower::ServiceBuilder::new().layer(layer).service(handler);
        let mut builder = tower_governor::governor::GovernorConfigBuilder::default();
        match allow {
            true => builder.per_nanosecond(1).burst_size(u32::MAX / 2),
            false => builder.period(Duration::from_secs(3600)).burst_size(1),
        };
        let config = builder.key_extractor(HeaderKey).finish().unwrap();
        let gov = tower::ServiceBuilder::new()
            .layer(tower_governor::GovernorLayer::new(config))
            .service(handler);
        bench_calls(&mut g, &rt, &names, &format!("{which}/local"), svc);
        bench_calls(&mut g, &rt, &names, &format!("{which}/tower-governor"), gov);
    }
    g.finish();
}

fn bench_calls<S, B>(
    g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    rt: &tokio::runtime::Runtime,
    names: &[String],
    name: &str,
    mut svc: S,
) where
    S: Service<http::Request<Body>, Response = http::Response<B>> + Clone,
    S::Error: std::fmt::Debug,
{
    // Each key's first request made its state (and spent a refusing
    // limit's one request).
    for n in names {
        let _ = rt.block_on(svc.clone().oneshot(request(n)));
    }
    let mut i = 0;
    g.bench_function(name, |b| {
        b.iter(|| {
            i = (i + 1) % KEYS;
            let call = svc.call(request(&names[i]));
            black_box(rt.block_on(call).map(|r| r.status()).ok())
        })
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(3));
    targets = decision, layer
}
criterion_main!(benches);
