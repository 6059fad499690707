//! The request path of the node, side by side with governor.
//!
//! Run with: `cargo bench -p throttle-layer --bench store`
//!
//! - `admit/allowed`, `admit/rejected`: one decision of the slot store for
//!   one of 10,000 users (clock read included: the default `CoarseClock`),
//!   against governor's
//!   keyed `check_key` on the same keys (allowed, and rejected once the
//!   key's burst is spent). `admit/allowed/counter-shared` is the floor
//!   under both: the user's count found in a papaya map and bumped with
//!   an atomic add, nothing else; `admit/allowed/slot-quota`, the least a
//!   decision costs (see `Floor::SlotQuota`).
//!   `admit/allowed/with-budgets` is `allowed/throttle` in a service
//!   where the central told one user in a hundred a budget
//!   ([`v1::Budget`]): every admission there is spent from them.
//! - `threads2/*`: the same (and the `slot-quota` floor) from 2 threads
//!   at once; the time is per decision per thread, so equal numbers mean
//!   perfect scaling.
//! - Memory, printed once before the timings: resident bytes per tracked
//!   user and per tracked key (user, resource) of a store holding 200,000
//!   users that each used 4 resources this slot and hold quota rows for the
//!   last, this and the next two slots (the steady state under a central).
//! - `service/*`: a whole `tower::Service` call with axum bodies: a bare
//!   `service_fn`, the same behind `Throttle` (user from a header) allowed
//!   and refused, and behind tower_governor's `GovernorLayer` keyed by the
//!   same header, allowed and refused. Floors beside them (see [`Floor`]):
//!   `through`, a layer that only passes the request on; `header`, one
//!   that also reads the user's header as `Throttle` does, what any
//!   per-user layer pays before it decides anything; `counter` and
//!   `counter-shared`, which also bump the user's count in a plain map and
//!   in one threads could share; `slot-quota`, the least a decision
//!   costs: that count kept per slot and checked against a quota in one
//!   compare-and-swap, lock-free. Refusals with the rate-limit headers
//!   (`throttle-rejected`, 7 headers) and without them
//!   (`throttle-rejected-2h`, `rate_limit_headers(false)`), each beside a
//!   `refusal-floor` that returns the same response without deciding and
//!   a `slot-quota-rejected` that returns it after `slot-quota`'s
//!   decision.
//! - `router/*`: bare, through (a layer that adds nothing), throttle, the
//!   `slot-quota` floor and tower_governor behind axum's `Router`, which
//!   clones the layered route for every request as it does over HTTP.
//! - `slot/*`: the node's work once per slot at 3,000 users: the report
//!   written, the central's answer installed, the latter beside the way it
//!   was done through prost's maps.
//! - `THROTTLE_BENCH_CLOCK=frozen` holds the stores' slot still, for
//!   instruction counts under valgrind (see `bench_clock`).

use std::collections::HashMap;
use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use axum::body::Body;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use governor::{Quota, RateLimiter};
use http_body_util::BodyExt;
use throttle_clock::{Clock, CoarseClock, ManualClock, SlotLength};
use throttle_layer::store::{Fallback, ResourceId, ServiceStore, SlotStore};
use throttle_layer::{ThrottleLayer, UserKey};
use throttle_proto::v1;
use throttle_proto::wire::RawQuota;
use tower::{Service, ServiceExt};

#[path = "shared/common.rs"]
mod common;
#[path = "shared/floor.rs"]
mod floor;
use common::{Governor, HeaderKey, request, two_threads};
use floor::{Count, Floored, Shared, SlotCount, SlotCounts, per_user, shared, user_of};

const USERS: usize = 10_000;

fn users() -> Vec<String> {
    (0..USERS).map(|i| format!("user-{i:05}")).collect()
}

/// Quotas of `quota` requests for every user, for this slot and the two
/// after it, as the reporter installs them every slot.
fn quota_message(store: &SlotStore, quota: f64) -> v1::Quota {
    let users = users()
        .into_iter()
        .map(|u| {
            (
                u,
                v1::ResourceQuotas {
                    resources: [("requests".to_string(), quota)].into(),
                },
            )
        })
        .collect();
    let users = v1::UserQuotas { users };
    let current = store.current_slot();
    v1::Quota {
        services: [(
            "front".to_string(),
            v1::ServiceQuota {
                slots: (current..current + 3).map(|s| (s, users.clone())).collect(),
            },
        )]
        .into(),
        report_slot: None,
        packed: Vec::new(),
        refs: Vec::new(),
    }
}

/// Keeps a store's quotas current from a background thread, as the reporter
/// does, while the benchmark crosses slot boundaries; stops when dropped.
struct Refresher {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Refresher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A store with the default clock and 1 s slots, every user holding a quota
/// of `quota` requests, kept current.
/// The stores' clock: the default `CoarseClock`, or with
/// `THROTTLE_BENCH_CLOCK=frozen` a clock that never moves. Under valgrind a
/// call is some 50 times slower, so each of the 10,000 users would roll on
/// to a new slot every few calls instead of every few hundred, and the
/// per-slot roll (with nothing collecting the counts it sets aside) would
/// weigh on every call's instruction count as it never does at full speed.
fn bench_clock() -> Arc<dyn Clock> {
    if clock_frozen() {
        Arc::new(ManualClock::new(CoarseClock.now_ms()))
    } else {
        Arc::new(CoarseClock)
    }
}

fn clock_frozen() -> bool {
    std::env::var("THROTTLE_BENCH_CLOCK").as_deref() == Ok("frozen")
}

fn store(quota: f64) -> (SlotStore, Arc<ServiceStore>, ResourceId, Refresher) {
    let store = SlotStore::builder()
        .clock(bench_clock())
        .slot(SlotLength::SECOND)
        .build();
    let front = store.service("front");
    let requests = front.resource("requests").unwrap();
    store.apply_quota(&quota_message(&store, quota));
    let stop = Arc::new(AtomicBool::new(false));
    // A frozen clock never leaves the quotas' slots. Under valgrind the
    // refresher would also be the cache simulation's main event: its walk
    // of every user, some 50 times slower than at full speed, runs between
    // almost every pair of calls and evicts all the lines they share.
    let thread = (!clock_frozen()).then(|| {
        let (store, stop) = (store.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(200));
                store.apply_quota(&quota_message(&store, quota));
            }
        })
    });
    let refresher = Refresher { stop, thread };
    (store, front, requests, refresher)
}

fn governor(burst: u32) -> Governor {
    let quota = Quota::per_second(NonZeroU32::new(burst.max(1)).unwrap())
        .allow_burst(NonZeroU32::new(burst.max(1)).unwrap());
    RateLimiter::keyed(quota)
}

fn admit(c: &mut Criterion) {
    let names = users();
    let mut g = c.benchmark_group("admit");
    g.throughput(Throughput::Elements(1));
    let (_s, front, req, _r) = store(1e15);
    let mut i = 0;
    g.bench_function("allowed/throttle", |b| {
        b.iter(|| {
            i = (i + 1) % USERS;
            black_box(
                front
                    .admit(&names[i], &[(req, 1)], Fallback::Allow)
                    .decision,
            )
        })
    });
    // No quota at all (no central, or none yet): the default fallback
    // looks for the last known table, and finds none.
    let bare = SlotStore::builder().build().service("front");
    let bare_req = bare.resource("requests").unwrap();
    g.bench_function("no-quota/default-fallback", |b| {
        b.iter(|| {
            i = (i + 1) % USERS;
            black_box(
                bare.admit(&names[i], &[(bare_req, 1)], Fallback::default())
                    .decision,
            )
        })
    });
    // The floor of a shared per-user count (see `Floor::SharedCounter`).
    let counts = shared_counts(&names);
    g.bench_function("allowed/counter-shared", |b| {
        b.iter(|| {
            i = (i + 1) % USERS;
            black_box(bump(&counts, &names[i]))
        })
    });
    // The floor of a decision (see `Floor::SlotQuota`).
    let two = SlotCount::new(2);
    let decided = [7, 7, 7, 8].map(|slot| two.admit(slot));
    assert_eq!(
        decided,
        [true, true, false, true],
        "the floor decides and rolls"
    );
    let slotted = SlotCounts::new(&names, u32::MAX, bench_clock());
    g.bench_function("allowed/slot-quota", |b| {
        b.iter(|| {
            i = (i + 1) % USERS;
            black_box(slotted.admit(&names[i]))
        })
    });
    let gov = governor(u32::MAX / 2);
    g.bench_function("allowed/governor", |b| {
        b.iter(|| {
            i = (i + 1) % USERS;
            black_box(gov.check_key(&names[i]).is_ok())
        })
    });
    let (_s, front, req, _r) = store(0.0);
    g.bench_function("rejected/throttle", |b| {
        b.iter(|| {
            i = (i + 1) % USERS;
            black_box(
                front
                    .admit(&names[i], &[(req, 1)], Fallback::Allow)
                    .decision,
            )
        })
    });
    let gov = governor(1);
    for n in &names {
        let _ = gov.check_key(n);
    }
    g.bench_function("rejected/governor", |b| {
        b.iter(|| {
            i = (i + 1) % USERS;
            black_box(gov.check_key(&names[i]).is_err())
        })
    });
    // `allowed/throttle` with budgets told for one user in a hundred;
    // last, as its store's refresher thread runs to the group's end.
    let (_b, budgeted, breq, _rb) = store(1e15);
    budgeted.set_bound(v1::Bound {
        service: "front".into(),
        keys: Vec::new(),
        budgets: (names.iter().step_by(100))
            .map(|user| v1::Budget {
                user: user.clone(),
                resource: "requests".into(),
                window_seconds: 1,
                remaining: 1e15,
                nodes: 1,
                refill: 1e6,
            })
            .collect(),
    });
    g.bench_function("allowed/with-budgets", |b| {
        b.iter(|| {
            i = (i + 1) % USERS;
            black_box(
                budgeted
                    .admit(&names[i], &[(breq, 1)], Fallback::Allow)
                    .decision,
            )
        })
    });
    g.finish();
}

fn threads2(c: &mut Criterion) {
    let names = users();
    let mut g = c.benchmark_group("threads2");
    g.throughput(Throughput::Elements(1));
    // Each thread walks its own half of the users, as two cores serving
    // different connections would.
    let own = |t: usize, i: u64| &names[t * USERS / 2 + (i as usize % (USERS / 2))];
    // Both threads walk all the users, half the users apart, as two
    // workers serving any connection do: a user's lines were last written
    // by the other core about half the time.
    let shared = |t: usize, i: u64| &names[(t * USERS / 2 + i as usize) % USERS];
    let (_s, front, req, _r) = store(1e15);
    let gov = governor(u32::MAX / 2);
    let floor = SlotCounts::new(&names, u32::MAX, bench_clock());
    both_two_threads(&mut g, "allowed", &front, req, &gov, &floor, &own);
    both_two_threads(&mut g, "allowed-shared", &front, req, &gov, &floor, &shared);
    let (_s, front, req, _r) = store(0.0);
    let gov = governor(1);
    for n in &names {
        let _ = gov.check_key(n);
    }
    let floor = SlotCounts::new(&names, 0, bench_clock());
    both_two_threads(&mut g, "rejected", &front, req, &gov, &floor, &own);
    g.finish();
}

/// `threads2/{walk}/throttle`, `threads2/{walk}/governor` and
/// `threads2/{walk}/slot-quota` (the floor of a decision, see
/// `Floor::SlotQuota`): a decision for the user `pick(thread, i)` on each
/// of two threads.
fn both_two_threads<'n>(
    g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    walk: &str,
    front: &Arc<ServiceStore>,
    req: ResourceId,
    gov: &Governor,
    floor: &SlotCounts,
    pick: &(dyn Fn(usize, u64) -> &'n String + Sync),
) {
    g.bench_function(format!("{walk}/throttle"), |b| {
        b.iter_custom(|iters| {
            two_threads(iters, |t, i| {
                black_box(
                    front
                        .admit(pick(t, i), &[(req, 1)], Fallback::Allow)
                        .decision,
                );
            })
        })
    });
    g.bench_function(format!("{walk}/governor"), |b| {
        b.iter_custom(|iters| {
            two_threads(iters, |t, i| {
                black_box(gov.check_key(pick(t, i)).is_ok());
            })
        })
    });
    g.bench_function(format!("{walk}/slot-quota"), |b| {
        b.iter_custom(|iters| {
            two_threads(iters, |t, i| {
                black_box(floor.admit(pick(t, i)));
            })
        })
    });
}

/// The floors under `Throttle`: layers that do part of its work and
/// nothing more, each passing the request on to the bare service.
#[derive(Clone)]
enum Floor {
    /// `service/*/through`: passes the request on untouched.
    Through,
    /// `service/*/header`: reads the user's header first, what any
    /// per-user layer pays before it decides anything.
    Header,
    /// `service/*/counter`: also finds the user's counter in a plain
    /// `HashMap` and bumps it: no lock, no slot, no quota (the service is
    /// `&mut` and on one thread here). The least a per-user count costs.
    Counter(HashMap<Box<str>, u64, foldhash::fast::RandomState>),
    /// `service/*/counter-shared`: the same count in a map many threads
    /// share, as a node's must be: papaya's map (the store's) and an
    /// atomic add, no lock. The least a shared per-user count costs.
    SharedCounter(Shared<AtomicU64>),
    /// `service/*/slot-quota`: the least a *decision* costs: the user's
    /// count for the current slot (the store's clock), checked against its
    /// quota and bumped in one compare-and-swap, rolled to a new slot in
    /// the same swap. Lock-free, one resource, nothing kept for a report.
    SlotQuota(SlotCounts),
}

impl Count for Floor {
    /// This floor's part of `Throttle`'s work on `req`.
    fn count<B>(&mut self, req: &http::Request<B>) {
        match self {
            Floor::Through => {}
            Floor::Header => {
                black_box(user_of(req));
            }
            Floor::Counter(counts) => {
                if let Some(count) = user_of(req).and_then(|u| counts.get_mut(u)) {
                    *count += 1;
                    black_box(*count);
                }
            }
            Floor::SharedCounter(counts) => {
                black_box(user_of(req).and_then(|u| bump(counts, u)));
            }
            Floor::SlotQuota(counts) => counts.count(req),
        }
    }
}

/// A count for each of `names` in a map threads can share.
fn shared_counts(names: &[String]) -> Shared<AtomicU64> {
    shared(names, || AtomicU64::new(0))
}

/// Adds one to `user`'s shared count; `None` for a user it does not know.
#[inline]
fn bump(counts: &Shared<AtomicU64>, user: &str) -> Option<u64> {
    Some(counts.pin().get(user)?.fetch_add(1, Ordering::Relaxed))
}

/// A request as an HTTP client sends it: the headers hyper parses ahead
/// of the user's (`service/typical/*`).
fn typical_request(user: &str) -> http::Request<Body> {
    http::Request::builder()
        .header("host", "api.example.com")
        .header("user-agent", "example-client/1.4.2")
        .header("accept", "application/json")
        .header("accept-encoding", "gzip, br")
        .header("x-request-id", "4bf92f3577b34da6a3ce929d0e0e4736")
        .header("x-user", user)
        .body(Body::empty())
        .expect("valid request")
}

/// Benches one service value (never cloned per call), cycling through the
/// users: `service/call/*` with requests that carry only the user's
/// header, `service/typical/*` with [`typical_request`]s.
fn call<S, B>(
    g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    rt: &tokio::runtime::Runtime,
    names: &[String],
    name: &str,
    svc: &mut S,
) where
    S: Service<http::Request<Body>, Response = http::Response<B>>,
    S::Error: std::fmt::Debug,
{
    for (group, make) in [
        ("call", request as fn(&str) -> http::Request<Body>),
        ("typical", typical_request),
    ] {
        if group == "typical" && name.contains("rejected") {
            continue;
        }
        call_with(g, rt, names, group, name, make, svc);
    }
}

fn call_with<S, B>(
    g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    rt: &tokio::runtime::Runtime,
    names: &[String],
    group: &str,
    name: &str,
    make: fn(&str) -> http::Request<Body>,
    svc: &mut S,
) where
    S: Service<http::Request<Body>, Response = http::Response<B>>,
    S::Error: std::fmt::Debug,
{
    let mut i = 0;
    g.bench_function(BenchmarkId::new(group, name), |b| {
        b.iter(|| {
            i = (i + 1) % USERS;
            let req = make(&names[i]);
            rt.block_on(async { black_box(svc.ready().await.unwrap().call(req).await.unwrap()) })
        })
    });
}

fn service(c: &mut Criterion) {
    let names = users();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let mut g = c.benchmark_group("service");
    g.throughput(Throughput::Elements(1));
    let bare = tower::service_fn(|_r: http::Request<Body>| async {
        Ok::<_, std::convert::Infallible>(http::Response::new(Body::from("ok")))
    });
    call(&mut g, &rt, &names, "bare", &mut bare.clone());
    for (name, floor) in [
        ("through", Floor::Through),
        ("header", Floor::Header),
        ("counter", Floor::Counter(per_user(&names, || 0))),
        (
            "counter-shared",
            Floor::SharedCounter(shared_counts(&names)),
        ),
        (
            "slot-quota",
            Floor::SlotQuota(SlotCounts::new(&names, u32::MAX, bench_clock())),
        ),
    ] {
        call(&mut g, &rt, &names, name, &mut Floored(floor, bare));
    }
    let handler = |_r: http::Request<Body>| async {
        Ok::<_, std::convert::Infallible>(http::Response::new(Body::from("ok")))
    };
    // Refused with the rate-limit headers (7 headers) and without them
    // (`rate_limit_headers(false)`: `Retry-After` and `Content-Type`), each
    // beside its floor: the same response (status, headers cloned, body)
    // from a service that decides nothing.
    let mut refusal_heads = Vec::new();
    for (name, quota, headers) in [
        ("throttle-allowed", 1e15, true),
        ("throttle-rejected", 0.0, true),
        ("throttle-rejected-2h", 0.0, false),
    ] {
        let (store, _f, _r, _refresh) = store(quota);
        let layer = ThrottleLayer::builder(&store, "front")
            .user(UserKey::header("x-user"))
            .rate_limit_headers(headers)
            .build()
            .unwrap();
        let mut svc = tower::ServiceBuilder::new()
            .layer(layer)
            .service_fn(handler);
        if quota == 0.0 {
            let res = rt.block_on(async {
                let r = request(&names[0]);
                svc.ready().await.unwrap().call(r).await.unwrap()
            });
            let floor = name.replace("throttle-rejected", "refusal-floor");
            let (head, body) = res.into_parts();
            // The refusal's own body: shared, as the layer keeps it.
            let body = rt.block_on(body.collect()).unwrap().to_bytes();
            refusal_heads.push((floor, head.status, head.headers, body));
        }
        call(&mut g, &rt, &names, name, &mut svc);
    }
    for (name, status, headers, body) in refusal_heads {
        let refusal = tower::service_fn(move |_r: http::Request<Body>| {
            let mut res = http::Response::new(Body::from(body.clone()));
            *res.status_mut() = status;
            *res.headers_mut() = headers.clone();
            std::future::ready(Ok::<_, std::convert::Infallible>(res))
        });
        // The response alone, and the same behind the floor of a decision
        // (`Floor::SlotQuota` with no quota: every call is refused).
        let decided = name.replace("refusal-floor", "slot-quota-rejected");
        for (name, floor) in [
            (name, Floor::Through),
            (
                decided,
                Floor::SlotQuota(SlotCounts::new(&names, 0, bench_clock())),
            ),
        ] {
            let mut svc = Floored(floor, refusal.clone());
            call_with(&mut g, &rt, &names, "call", &name, request, &mut svc);
        }
    }
    // The same, counting response bytes: the body types change.
    let metered_handler = |_r: http::Request<throttle_layer::layer::RequestBody<Body>>| async {
        Ok::<_, std::convert::Infallible>(http::Response::new(Body::from("ok")))
    };
    {
        let (store, _f, _r, _refresh) = store(1e15);
        let layer = ThrottleLayer::builder(&store, "front")
            .user(UserKey::header("x-user"))
            .traffic_down()
            .build()
            .unwrap();
        let mut svc = tower::ServiceBuilder::new()
            .layer(layer)
            .service_fn(metered_handler);
        call(&mut g, &rt, &names, "throttle-metered-allowed", &mut svc);
    }
    for (name, burst) in [("governor-allowed", u32::MAX / 2), ("governor-rejected", 1)] {
        let mut builder = tower_governor::governor::GovernorConfigBuilder::default();
        builder.period(Duration::from_secs(3600)).burst_size(burst);
        let config = builder.key_extractor(HeaderKey).finish().unwrap();
        let mut svc = tower::ServiceBuilder::new()
            .layer(tower_governor::GovernorLayer::new(config))
            .service(bare);
        // Spend each key's burst of 1 first, so every measured call is refused.
        if burst == 1 {
            for n in &names {
                let mut s = svc.clone();
                let _ = rt.block_on(async { s.ready().await.unwrap().call(request(n)).await });
            }
        }
        call(&mut g, &rt, &names, name, &mut svc);
    }
    g.finish();
}

fn rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Runs first, before other benches leave freed memory in the allocator.
fn memory(_: &mut Criterion) {
    const N: usize = 200_000;
    const RESOURCES: [&str; 4] = ["requests", "traffic_up", "traffic_down", "database_read"];
    let names: Vec<String> = (0..N).map(|i| format!("user-{i:06}")).collect();
    let row = v1::UserQuotas {
        users: names
            .iter()
            .map(|u| {
                let resources = RESOURCES.iter().map(|r| (r.to_string(), 1e6)).collect();
                (u.clone(), v1::ResourceQuotas { resources })
            })
            .collect(),
    };
    // Built first: only the store may grow between the two readings.
    let quotas: Vec<v1::Quota> = (99..=102)
        .map(|slot| v1::Quota {
            services: [(
                "front".to_string(),
                v1::ServiceQuota {
                    slots: [(slot, row.clone())].into(),
                },
            )]
            .into(),
            report_slot: None,
            packed: Vec::new(),
            refs: Vec::new(),
        })
        .collect();
    let clock = Arc::new(throttle_clock::ManualClock::new(100_000));
    let before = rss_bytes();
    let store = SlotStore::builder().clock(clock).build();
    let front = store.service("front");
    let ids: Vec<ResourceId> = RESOURCES.iter().filter_map(|r| front.resource(r)).collect();
    for u in &names {
        let handle = front
            .admit_with_handle(u, &[(ids[0], 1)], Fallback::Allow, true)
            .handle;
        for &r in &ids[1..] {
            if let Some(h) = &handle {
                h.consume(r, 100);
            }
        }
    }
    for quota in &quotas {
        store.apply_quota(quota);
    }
    if let (Some(b), Some(a)) = (before, rss_bytes()) {
        let bytes = (a - b) as f64;
        println!(
            "memory: {:.1} MiB for {} users x {} resources with quotas for 4 slots: {:.0} bytes per user, {:.0} bytes per (user, resource) key",
            bytes / (1 << 20) as f64,
            store.keys(),
            ids.len(),
            bytes / N as f64,
            bytes / (N * ids.len()) as f64,
        );
    }
    black_box(&store);
}

/// `router/*`: the same three ways behind axum's `Router`, called in
/// process as `axum::serve` calls it: the router clones the route's layered
/// service for every request, as over HTTP.
fn router(c: &mut Criterion) {
    let names = users();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let mut g = c.benchmark_group("router");
    g.throughput(Throughput::Elements(1));
    let app = || axum::Router::new().route("/", axum::routing::get(|| async { "hello" }));
    let (store, _f, _r, _refresh) = store(1e15);
    let layer = ThrottleLayer::builder(&store, "front")
        .user(UserKey::header("x-user"))
        .build()
        .unwrap();
    let mut builder = tower_governor::governor::GovernorConfigBuilder::default();
    builder
        .period(Duration::from_secs(3600))
        .burst_size(u32::MAX / 2);
    let config = builder.key_extractor(HeaderKey).finish().unwrap();
    let floor = SlotCounts::new(&names, u32::MAX, bench_clock());
    for (name, mut router) in [
        ("bare", app()),
        // A layer that adds nothing: what axum's plumbing for a layer costs.
        ("through", app().layer(tower::layer::layer_fn(|s| s))),
        ("throttle-allowed", app().layer(layer)),
        (
            "slot-quota",
            app().layer(tower::layer::layer_fn(move |s| {
                Floored(Floor::SlotQuota(floor.clone()), s)
            })),
        ),
        (
            "governor-allowed",
            app().layer(tower_governor::GovernorLayer::new(config)),
        ),
    ] {
        call_with(
            &mut g,
            &rt,
            &names,
            "call",
            name,
            typical_request,
            &mut router,
        );
    }
    g.finish();
}

/// One slot's work in `slot/*`, given the slot and the answer's bytes.
type SlotWork<'a> = &'a dyn Fn((i64, Vec<u8>));

/// Users active in every slot of `slot/*`: as many as `http-bench` sends.
const SLOT_USERS: usize = 3_000;

/// The table the central answers a node's report with: each of `names`
/// gets `quota` requests in each of the two slots after `slot`.
fn answer(names: &[String], slot: i64, quota: f64) -> Vec<u8> {
    use prost::Message;
    let users = v1::UserQuotas {
        users: names
            .iter()
            .map(|u| {
                let resources = [("requests".to_string(), quota)].into();
                (u.clone(), v1::ResourceQuotas { resources })
            })
            .collect(),
    };
    v1::Quota {
        services: [(
            "front".to_string(),
            v1::ServiceQuota {
                slots: [(slot + 1, users.clone()), (slot + 2, users)].into(),
            },
        )]
        .into(),
        report_slot: Some(slot + 1),
        packed: Vec::new(),
        refs: Vec::new(),
    }
    .encode_to_vec()
}

/// [`answer`] as the central writes it for a node that accepts packed
/// quotas: one [`v1::PackedQuota`] per slot.
fn packed_answer(names: &[String], slot: i64, quota: f64) -> Vec<u8> {
    packed_tables(names, &[slot + 1, slot + 2], &[], Some(slot + 1), quota)
}

/// A quota as the central writes it: a packed table of `names` for each of
/// `slots`, then `refs` as (slot, from slot) of service front.
fn packed_tables(
    names: &[String],
    slots: &[i64],
    refs: &[(i64, i64)],
    report_slot: Option<i64>,
    quota: f64,
) -> Vec<u8> {
    use prost::Message;
    let mut q = throttle_proto::wire::QuotaEncoder::new();
    for &s in slots {
        q.begin_packed("front", s);
        for u in names {
            q.user(u, [("requests", quota)]);
        }
    }
    for &(slot, from) in refs {
        q.refer("front", slot, from);
    }
    match throttle_proto::wire::Answer::decode(&q.finish(report_slot)[..]) {
        Ok(throttle_proto::wire::Answer::Quota(b)) => b.to_vec(),
        _ => Vec::new(),
    }
}

/// The node's work once per slot, off the request path but on the app's
/// runtime (the reporter runs there): the slot's counts collected and
/// encoded into a report, and the central's answer decoded and installed.
/// Each iteration is a new slot in which every one of [`SLOT_USERS`] users
/// made a request (set up outside the timing).
fn slot(c: &mut Criterion) {
    use prost::Message;
    let names: Vec<String> = (0..SLOT_USERS).map(|i| format!("user-{i:04}")).collect();
    let base = 1_000_000;
    let clock = Arc::new(ManualClock::new(base * 1000));
    let store = SlotStore::builder()
        .clock(clock.clone())
        .slot(SlotLength::SECOND)
        .build();
    let front = store.service("front");
    let requests = front.resource("requests").unwrap();
    let mut now = base;
    // A new slot in which every user made one request; the answer to its
    // report, encoded.
    let mut next_slot = || {
        now += 1;
        clock.set(now * 1000);
        for u in &names {
            black_box(front.admit(u, &[(requests, 1)], Fallback::Allow));
        }
        (now, answer(&names, now, 1e6))
    };
    let mut g = c.benchmark_group("slot");
    g.throughput(Throughput::Elements(SLOT_USERS as u64));
    // As the reporter writes a report; as it installs an answer, and as it
    // would with prost (still its way with a quota it cannot read in
    // place).
    let collect = |(slot, _): (i64, Vec<u8>)| {
        black_box(store.collect_encoded(slot, "bench-node"));
    };
    // For a central that reads packed reports.
    let collect_packed = |(slot, _): (i64, Vec<u8>)| {
        black_box(store.collect_encoded_as(slot, "bench-node", true));
    };
    let apply = |(_, bytes): (i64, Vec<u8>)| {
        let quota = RawQuota::parse(&bytes).expect("the bench's own encoding");
        store.apply_raw_quota(&quota);
    };
    let apply_decoded = |(_, bytes): (i64, Vec<u8>)| {
        let quota = v1::Quota::decode(&bytes[..]).expect("the bench's own encoding");
        store.apply_quota(&quota);
    };
    let routines: [(&str, SlotWork<'_>); 4] = [
        ("report/3000 users", &collect),
        ("report/3000 users, packed", &collect_packed),
        ("answer/3000 users", &apply),
        ("answer/3000 users, decoded by prost", &apply_decoded),
    ];
    for (name, routine) in routines {
        g.bench_function(name, |b| {
            b.iter_batched(&mut next_slot, routine, criterion::BatchSize::PerIteration)
        });
    }
    // The same slots, answered packed.
    let mut next_packed_slot = || {
        let (now, _) = next_slot();
        (now, packed_answer(&names, now, 1e6))
    };
    g.bench_function("answer/3000 users, packed", |b| {
        b.iter_batched(
            &mut next_packed_slot,
            apply,
            criterion::BatchSize::PerIteration,
        )
    });
    // The answer to a report as the central renders it ahead, after the
    // push of the slot before (installed outside the timing): the next
    // slot's table again, or, for a node that accepts refs, a ref to that
    // push (`v1::QuotaRef`), which the node installs by copying rows.
    let mut after_push = |refs: bool| {
        let (now, _) = next_slot();
        let push = packed_tables(&names, &[now + 1], &[], None, 1e6);
        apply((now, push));
        let answer = if refs {
            packed_tables(&names, &[], &[(now + 2, now + 1)], Some(now + 1), 1e6)
        } else {
            packed_tables(&names, &[now + 2], &[], Some(now + 1), 1e6)
        };
        (now, answer)
    };
    for (name, refs) in [
        ("answer/3000 users, one table packed", false),
        ("answer/3000 users, a ref to the push", true),
    ] {
        g.bench_function(name, |b| {
            b.iter_batched(
                || after_push(refs),
                apply,
                criterion::BatchSize::PerIteration,
            )
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(3));
    targets = memory, admit, threads2, service, router, slot
}
criterion_main!(benches);
