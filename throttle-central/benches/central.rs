//! The central node's decision logic at scale.
//!
//! Run with: `cargo bench -p throttle-central --bench central`
//!
//! - `ingest`: report entries filed per second on one core: reports of 1,000
//!   users x 4 resources (4,000 entries) from 100 nodes, charged to buckets.
//! - `assign`: one assign of every policy for 100,000 users x 4 resources
//!   spread over 100 nodes. Each user is active on 3 of the nodes (as with
//!   sticky load balancing), so the distribution holds 1.2 M
//!   (user, resource, node) entries.
//! - Memory: the process's resident memory before and after building that
//!   ledger, per (user, resource, node) entry, printed once.
//! - `wire`: the protobuf work of one round trip of a node with 1,000 users
//!   x 4 resources, step by step: decoding its report and freeing it (and,
//!   as the server does instead, reading it in place),
//!   building its answer (a grant per key), encoding and freeing it, against
//!   encoding the answer straight from the grants, as the server does.
//!   (Filing the report is the `ingest` bench.)

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use throttle_central::limits::Limit;
use throttle_core::assigner::render::{Rendering, Skeletons, quota_for};
use throttle_core::ledger::{Ledger, LedgerConfig, PolicyFactory};
use throttle_core::policy::{Classic, Projected, StaticSplit};
use throttle_core::usage_tap::UsageTap;
use throttle_proto::v1;
use throttle_proto::wire::RawReport;

const RESOURCES: [&str; 4] = ["requests", "traffic_up", "traffic_down", "database_read"];
const SLOT: i64 = 1_800_000_000;

fn report(node: usize, slot: i64, users: impl Iterator<Item = usize>) -> v1::Report {
    let users = users
        .map(|u| {
            let resources = RESOURCES
                .iter()
                .map(|r| (r.to_string(), 10 + u as i64 % 7))
                .collect();
            (format!("user-{u:06}"), v1::Amounts { resources })
        })
        .collect();
    v1::Report {
        node_id: format!("node-{node:03}"),
        slot_number: slot,
        consumption: [("front".to_string(), v1::Usage { users })].into(),
        rejection: [("front".to_string(), v1::Usage::default())].into(),
        packed: Vec::new(),
        answered: false,
    }
}

fn limits(users: usize) -> Vec<Limit> {
    (0..users)
        .map(|u| Limit {
            user: format!("user-{u:06}"),
            per_second: RESOURCES.iter().map(|r| (r.to_string(), 1000.0)).collect(),
            burst_seconds: 10.0,
            max_debt_seconds: None,
            per_period: Default::default(),
        })
        .collect()
}

fn ingest(c: &mut Criterion) {
    use prost::Message;
    let mut g = c.benchmark_group("ingest");
    let reports: Vec<v1::Report> = (0..100)
        .map(|n| report(n, SLOT, n * 1000..n * 1000 + 1000))
        .collect();
    let entries: u64 = reports
        .iter()
        .map(|r| r.consumption["front"].users.len() as u64 * 4)
        .sum();
    g.throughput(Throughput::Elements(entries));
    g.sample_size(20);
    // Warm: the keys exist, as they do after the first slot.
    let warm = || {
        let mut l = Ledger::new(LedgerConfig::default());
        l.apply_limits("front", &limits(100_000), SLOT * 1000);
        for r in &reports {
            let mut r = r.clone();
            r.slot_number -= 1;
            l.ingest(&r, SLOT * 1000).unwrap();
        }
        l
    };
    g.bench_function("100 nodes x 1000 users x 4 resources", |b| {
        b.iter_batched(
            warm,
            |mut l| {
                for r in &reports {
                    black_box(l.ingest(r, SLOT * 1000 + 50).unwrap());
                }
                l
            },
            criterion::BatchSize::PerIteration,
        )
    });
    // As the server files them: read in place from the received bytes,
    // checked beforehand (on each stream's task, not the ledger's).
    let raw: Vec<RawReport> = reports
        .iter()
        .map(|r| RawReport::parse(r.encode_to_vec().into()).unwrap())
        .collect();
    g.bench_function("100 nodes x 1000 users x 4 resources, read in place", |b| {
        b.iter_batched(
            warm,
            |mut l| {
                for r in &raw {
                    black_box(l.ingest_from(r, SLOT * 1000 + 50).unwrap());
                }
                l
            },
            criterion::BatchSize::PerIteration,
        )
    });
    // The same with usage kept (`--usage`): each report also handed to the
    // usage writer's queue, which a thread empties as the writer does.
    let (tx, rx) = std::sync::mpsc::sync_channel(throttle_core::usage_tap::QUEUE);
    std::thread::spawn(move || for _ in rx {});
    let tap = UsageTap::new(tx);
    g.bench_function(
        "100 nodes x 1000 users x 4 resources, read in place, usage kept",
        |b| {
            b.iter_batched(
                warm,
                |mut l| {
                    for r in &raw {
                        black_box(l.ingest_from(r, SLOT * 1000 + 50).unwrap());
                        tap.filed(r);
                    }
                    l
                },
                criterion::BatchSize::PerIteration,
            )
        },
    );
    g.finish();
}

/// One `*` rule limiting every user as `limits` limits each.
fn every_user() -> Vec<Limit> {
    let mut rule = limits(1).remove(0);
    rule.user = throttle_central::limits::EVERY_USER.into();
    vec![rule]
}

/// 100k users over 100 nodes, each user on 3 nodes, with recent reports,
/// limited by `rules`.
fn big_ledger(factory: PolicyFactory, rules: &[Limit]) -> Ledger {
    let mut l = Ledger::with_policies(LedgerConfig::default(), factory);
    l.apply_limits("front", rules, SLOT * 1000);
    for slot in [SLOT - 1, SLOT] {
        for n in 0..100 {
            // Users n*1000.. on this node and the two next to it.
            let users = (0..3).flat_map(move |k| {
                let base = ((n + 100 - k) % 100) * 1000;
                base..base + 1000
            });
            l.ingest(&report(n, slot, users), slot * 1000 + 50).unwrap();
        }
    }
    l
}

fn rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Runs first, before other benches leave freed memory in the allocator.
fn memory(_: &mut Criterion) {
    // One ledger per process: a second would reuse the first one's freed
    // memory, and RSS would not see it.
    let before = rss_bytes();
    let ledger = big_ledger(Box::new(|_| Box::new(Projected::new())), &limits(100_000));
    if let (Some(b), Some(a)) = (before, rss_bytes()) {
        let entries = 100_000 * 4 * 3;
        println!(
            "memory: {:.1} MiB for 100k users x 4 resources on 3 of 100 nodes: {:.0} bytes per (user, resource, node) entry, {} keys",
            (a - b) as f64 / (1 << 20) as f64,
            (a - b) as f64 / entries as f64,
            ledger.key_count()
        );
    }
}

/// How long `iters` assigns of `l` take.
fn assigns(l: &mut Ledger, iters: u64) -> Duration {
    let start = Instant::now();
    for i in 0..iters {
        black_box(l.assign(SLOT * 1000 + 500 + i as i64));
    }
    start.elapsed()
}

fn assign(c: &mut Criterion) {
    let mut g = c.benchmark_group("assign");
    g.sample_size(10);
    g.measurement_time(Duration::from_secs(8));
    type Named = (&'static str, fn() -> PolicyFactory);
    let policies: [Named; 3] = [
        ("projected", || Box::new(|_| Box::new(Projected::new()))),
        ("classic", || Box::new(|_| Box::new(Classic::new()))),
        ("static-split", || {
            Box::new(|_| Box::new(StaticSplit::new()))
        }),
    ];
    let rules = limits(100_000);
    for (name, factory) in policies {
        let mut l = big_ledger(factory(), &rules);
        g.bench_function(
            format!("100k users x 4 resources x 100 nodes/{name}"),
            |b| b.iter_custom(|iters| assigns(&mut l, iters)),
        );
    }
    let mut l = big_ledger(Box::new(|_| Box::new(Projected::new())), &every_user());
    g.bench_function(
        "100k users x 4 resources x 100 nodes/projected, one * rule",
        |b| b.iter_custom(|iters| assigns(&mut l, iters)),
    );
    g.finish();
}

fn wire(c: &mut Criterion) {
    use prost::Message;
    let mut g = c.benchmark_group("wire");
    g.throughput(Throughput::Elements(4_000));
    let mut l = Ledger::new(LedgerConfig::default());
    l.apply_limits("front", &limits(1000), SLOT * 1000);
    let node = l.node_id("node-000");
    l.connect(node, ["front"], SLOT * 1000);
    l.ingest(&report(0, SLOT, 0..1000), SLOT * 1000 + 50)
        .unwrap();
    l.assign(SLOT * 1000 + 500);
    let bytes = report(0, SLOT + 1, 0..1000).encode_to_vec();
    g.bench_function("decode report (1000 users x 4)", |b| {
        b.iter(|| v1::Report::decode(black_box(&bytes[..])).unwrap())
    });
    // What the server does instead: check the bytes, then read them in place.
    let shared = bytes::Bytes::from(bytes.clone());
    // Packed, as the reporter writes it for this central.
    let packed = throttle_proto::wire::packed_report(&report(0, SLOT + 1, 0..1000)).unwrap();
    for (name, bytes) in [
        ("read report in place (1000 users x 4)", &shared),
        ("read packed report in place (1000 users x 4)", &packed),
    ] {
        g.bench_function(name, |b| {
            b.iter(|| {
                let raw = RawReport::parse(bytes.clone()).unwrap();
                let mut total = 0i64;
                for (_, _, users) in raw.usages() {
                    for (_, amounts) in users {
                        total += amounts.map(|(_, a)| a).sum::<i64>();
                    }
                }
                black_box(total)
            })
        });
    }
    // What the stream does before it answers ahead: check the bytes.
    g.bench_function("check packed report (1000 users x 4)", |b| {
        b.iter(|| RawReport::parse(black_box(&packed).clone()).unwrap())
    });
    let decoded = v1::Report::decode(&bytes[..]).unwrap();
    g.bench_function("drop report", |b| {
        b.iter_batched(|| decoded.clone(), drop, criterion::BatchSize::SmallInput)
    });
    g.bench_function("build answer (4000 grants)", |b| {
        b.iter(|| quota_for(&l, node, [("front", SLOT + 1)]))
    });
    let answer = quota_for(&l, node, [("front", SLOT + 1)]);
    let grants: usize = answer.services["front"]
        .slots
        .values()
        .map(|u| u.users.len() * 4)
        .sum();
    assert_eq!(grants, 4000);
    g.bench_function("encode answer", |b| {
        b.iter(|| black_box(&answer).encode_to_vec())
    });
    g.bench_function("drop answer", |b| {
        b.iter_batched(|| answer.clone(), drop, criterion::BatchSize::SmallInput)
    });
    // What the server does instead of the three steps above.
    g.bench_function("encode answer from grants", |b| {
        let skeletons = Skeletons::default();
        let to = Rendering {
            ledger: &l,
            skeletons: &skeletons,
            node,
            packed: false,
        };
        b.iter(|| to.encode([("front", SLOT + 1)], &[], Some(SLOT)))
    });
    g.finish();
}

criterion_group!(benches, memory, ingest, assign, wire);
criterion_main!(benches);
