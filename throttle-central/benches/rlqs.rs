//! The central's cost of an Envoy proxy's usage report entry against a
//! node's, from the received bytes to the ledger.
//!
//! Run with: `cargo bench -p throttle-central --bench rlqs`
//!
//! - `node report`: a node's report of one slot, 1,000 users x `requests`
//!   (1,000 entries), read in place from its bytes and filed.
//! - `rlqs report`: a proxy's periodic report of 1,000 buckets, each a
//!   user's 5 s (1,000 entries), decoded, split over the 5 slots it covers
//!   and filed (5 node reports' worth of filing).
//!   Of that, the ledger's part: filing the five node reports built.
//! - `rlqs tell`: the assignments of those 1,000 buckets worked out and
//!   built, as each slot does when the shares move.
//!
//! Throughput is in entries: an RLQS entry stands for five slots of a
//! user, a node's for one.

use std::hint::black_box;

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{BucketId, RateLimitQuotaUsageReports};
use envoy_types::pb::google::protobuf::Duration;
use prost::Message;
use throttle_central::limits::Limit;
use throttle_central::nodes::rlqs::RlqsStream;
use throttle_clock::SlotLength;
use throttle_core::ledger::{Ledger, LedgerConfig};
use throttle_proto::v1;
use throttle_proto::wire::RawReport;

const USERS: usize = 1_000;
/// A whole second, in ms: slot 1,800,000,000's start.
const T: i64 = 1_800_000_000_000;

fn user(u: usize) -> String {
    format!("user-{u:06}")
}

fn ledger() -> Ledger {
    let mut l = Ledger::new(LedgerConfig::default());
    let limits: Vec<Limit> = (0..USERS)
        .map(|u| Limit {
            user: user(u),
            per_second: [("requests".to_owned(), 1000.0)].into(),
            burst_seconds: 10.0,
            ..Limit::default()
        })
        .collect();
    l.apply_limits("front", &limits, T);
    l
}

/// A node's report of data slot `slot - 1`.
fn node_report(slot: i64) -> v1::Report {
    let users = (0..USERS)
        .map(|u| {
            let resources = [("requests".to_owned(), 10 + u as i64 % 7)].into();
            (user(u), v1::Amounts { resources })
        })
        .collect();
    v1::Report {
        node_id: "node-1".to_owned(),
        slot_number: slot,
        consumption: [("front".to_owned(), v1::Usage { users })].into(),
        rejection: [("front".to_owned(), v1::Usage::default())].into(),
        packed: Vec::new(),
        answered: false,
    }
}

/// A proxy's report of its buckets over `seconds`.
fn rlqs_report(seconds: i64) -> RateLimitQuotaUsageReports {
    let usage = |u: usize| BucketQuotaUsage {
        bucket_id: Some(BucketId {
            bucket: [("user".to_owned(), user(u))].into(),
        }),
        time_elapsed: Some(Duration { seconds, nanos: 0 }),
        num_requests_allowed: 50 + u as u64 % 7,
        num_requests_denied: u as u64 % 3,
    };
    RateLimitQuotaUsageReports {
        domain: "front".to_owned(),
        bucket_quota_usages: (0..USERS).map(usage).collect(),
    }
}

/// A proxy's stream that has seen every bucket's first request at `T`,
/// and the ledger it files to.
fn opened() -> (Ledger, RlqsStream) {
    let mut l = ledger();
    let mut stream = RlqsStream::new("envoy-1".to_owned(), SlotLength::SECOND, i64::MAX, 15);
    stream.opened("front".to_owned(), None);
    for r in stream.take(rlqs_report(0).bucket_quota_usages, T).reports {
        l.ingest(&r, T).expect("filed");
    }
    (l, stream)
}

fn reports(c: &mut Criterion) {
    let mut g = c.benchmark_group("report");
    g.throughput(Throughput::Elements(USERS as u64));
    let node: prost::bytes::Bytes = node_report(T / 1000 + 1).encode_to_vec().into();
    let warm = || {
        let mut l = ledger();
        l.ingest(&node_report(T / 1000), T).expect("filed");
        l
    };
    g.bench_function("node report, 1000 entries", |b| {
        b.iter_batched(
            warm,
            |mut l| {
                let parsed = RawReport::parse(node.clone()).expect("valid");
                black_box(l.ingest_from(&parsed, T + 1_050).expect("filed"));
                l
            },
            BatchSize::PerIteration,
        )
    });
    let bytes = rlqs_report(5).encode_to_vec();
    g.bench_function("rlqs report, 1000 entries of 5 s", |b| {
        b.iter_batched(
            opened,
            |(mut l, mut stream)| {
                let r = RateLimitQuotaUsageReports::decode(bytes.as_slice()).expect("valid");
                let now = T + 5_050;
                for report in stream.take(r.bucket_quota_usages, now).reports {
                    black_box(l.ingest(&report, now).expect("filed"));
                }
                (l, stream)
            },
            BatchSize::PerIteration,
        )
    });
    // Of which the ledger's task: filing the five node reports the stream
    // built (the rest runs on the stream's task).
    let built = || {
        let (l, mut stream) = opened();
        let r = RateLimitQuotaUsageReports::decode(bytes.as_slice()).expect("valid");
        let reports = stream.take(r.bucket_quota_usages, T + 5_050).reports;
        (l, reports)
    };
    g.bench_function("rlqs report, 1000 entries of 5 s, the ledger's part", |b| {
        b.iter_batched(
            built,
            |(mut l, reports)| {
                for report in &reports {
                    black_box(l.ingest(report, T + 5_050).expect("filed"));
                }
                l
            },
            BatchSize::PerIteration,
        )
    });
    g.bench_function("rlqs tell, 1000 buckets", |b| {
        b.iter_batched(
            opened,
            |(l, mut stream)| {
                black_box(stream.due(T + 20).response);
                (l, stream)
            },
            BatchSize::PerIteration,
        )
    });
    g.finish();
}

criterion_group!(benches, reports);
criterion_main!(benches);
