//! The central node's own work per slot, without sockets: what its ledger
//! thread must finish within each slot to keep every slot.
//!
//! Run with: `cargo run --release -p throttle-tests --bin ledger-slot -- --nodes 1000 --users 1000 --slots 80`
//!
//! The same fleet as `central-scale` (each node reporting `--users` users x
//! 4 resources, each user on 3 nodes) runs through the same calls the gRPC
//! server makes, on this one thread, with slot times set rather than waited
//! for:
//!
//! - at each boundary (+50 ms), every node's report is filed, read in place
//!   from its bytes, as when its answer went out ahead (`Assigner::file`);
//! - once all are in, the slot is re-assigned and a push rendered for
//!   every node (`Assigner::reassign_each`);
//! - at mid-slot, the assign of the next slot, a push rendered for every
//!   node with its answer to the next report rendered ahead, and the
//!   retention (`Assigner::tick_each`).
//!
//! Each push is counted and dropped as soon as it is rendered (the server
//! queues it on the node's stream, whose task writes it out); each answer
//! rendered ahead is kept until a re-assign clears it or the next assign
//! replaces it, as the server keeps it for the node's next report.
//!
//! The nodes accept packed quotas ([`throttle_proto::v1::PackedQuota`])
//! and answers that refer to the push before them
//! ([`throttle_proto::v1::QuotaRef`]), as the reporter's do; `--refs 0`
//! renders every answer whole, `--classic 1` the legacy form.
//!
//! `--nr-slot N` keeps `N` slots of history instead of the legacy system's 60.
//! `--scale N` makes every amount but the requests `N` times larger (the
//! fleet reports 1 to 5 of each resource per user and node). `--vary 1`
//! draws each user's amounts anew every slot, rather than the same every
//! slot: quotas then change from slot to slot, and the history kept for
//! the monitor takes more room.
//!
//! Encoding the reports (the nodes' work) is not timed. Slots until the
//! history is full (`nr_slot`, 60) and a few more, until the retention
//! hands assigns the memory of the slots it drops, are a warm-up: the
//! medians and maxima printed are of the slots after it, in the steady
//! state a long-running central node is in.

use std::sync::Arc;
use std::time::{Duration, Instant};

use prost::Message as _;
use throttle_central::limits::StaticLimits;
use throttle_core::assigner::{Accepts, Assigner, Encoded};
use throttle_core::ledger::{Ledger, LedgerConfig, NodeId};
use throttle_proto::v1;
use throttle_proto::wire::RawReport;
use throttle_tests::fleet;

const PHASES: [&str; 3] = [
    "file the reports",
    "re-assign and render pushes",
    "assign, render pushes and answers ahead, forget (mid-slot)",
];

fn main() -> anyhow::Result<()> {
    let nodes = throttle_tests::arg("--nodes", 1000.0) as u64;
    let users = throttle_tests::arg("--users", 1000.0) as u64;
    let slots = throttle_tests::arg("--slots", 80.0) as i64;
    let total = fleet::total_users(nodes, users);
    // Amounts of every resource but requests this many times larger: the
    // fleet's 1 to 5 a node are small, and the sums kept for the monitor
    // take less room the smaller they are.
    let scale = throttle_tests::arg("--scale", 1.0) as i64;
    let vary = throttle_tests::arg("--vary", 0.0) != 0.0;
    // Quotas rendered packed, with refs, as for the reporter's nodes,
    // unless `--classic 1` (or `--refs 0`).
    let packed = throttle_tests::arg("--classic", 0.0) == 0.0;
    let accepts = Accepts {
        packed,
        refs: packed && throttle_tests::arg("--refs", 1.0) != 0.0,
    };
    let mut config = LedgerConfig::default();
    // Slots of history kept (the legacy system's 60): a shorter one shows what
    // the history costs beside the live state.
    config.nr_slot = throttle_tests::arg("--nr-slot", f64::from(config.nr_slot)) as u32;
    let warm_up = i64::from(config.nr_slot) + 5;
    let slot_ms = i64::from(config.slot.as_ms());
    let limits = Arc::new(StaticLimits::new(fleet::limits(total)));
    let mut assigner: Assigner<Encoded> = Assigner::new(Ledger::new(config), limits);
    let first = 1_800_000_000_i64;
    let services = ["front".to_string()];
    let ids: Vec<NodeId> = (0..nodes)
        .map(|n| {
            assigner
                .connect(&fleet::node_id(n), &services, accepts, first * slot_ms)
                .0
        })
        .collect();
    let mut reports: Vec<v1::Report> = (0..nodes)
        .map(|n| v1::Report {
            node_id: fleet::node_id(n),
            slot_number: 0,
            consumption: [(
                "front".to_string(),
                fleet::usage_in_slot(n, users, total, scale, None),
            )]
            .into(),
            rejection: [("front".to_string(), v1::Usage::default())].into(),
            packed: Vec::new(),
            answered: false,
        })
        .collect();
    let rss_before = throttle_tests::rss_mib();
    let mut times: Vec<[Duration; 3]> = Vec::new();
    let mut pushed_bytes = 0usize;
    let mut answered_bytes = 0usize;
    let mut answers: Vec<Option<_>> =
        vec![None; ids.iter().map(|n| n.index() + 1).max().unwrap_or(0)];
    for slot in first + 1..=first + slots {
        let boundary = slot * slot_ms;
        let raw: Vec<RawReport> = reports
            .iter_mut()
            .zip(0..)
            .map(|(r, n)| {
                r.slot_number = slot;
                if vary {
                    let usage = fleet::usage_in_slot(n, users, total, scale, Some(slot));
                    r.consumption.insert("front".to_string(), usage);
                }
                RawReport::parse(r.encode_to_vec().into())
            })
            .collect::<Result<_, _>>()?;
        let mut t = [Duration::ZERO; 3];
        let started = Instant::now();
        let mut complete = Vec::new();
        for (node, report) in ids.iter().zip(&raw) {
            let filed = assigner.file(*node, report, boundary + 50)?;
            complete.extend(filed.complete);
        }
        drop(raw);
        t[0] = started.elapsed();
        let started = Instant::now();
        for service in &complete {
            // The server lets go of every answer ahead before re-assigning.
            answers.fill(None);
            assigner.reassign_each(service, boundary + 60, |_, push| {
                pushed_bytes += push.len();
            });
        }
        t[1] = started.elapsed();
        let started = Instant::now();
        assigner.tick_each(boundary + slot_ms / 2, |node, push, answer| {
            pushed_bytes += push.len();
            // Kept until the next assign replaces it, as the server keeps
            // each stream's answer ahead.
            answered_bytes += answer.as_ref().map_or(0, |a| a.quota.len());
            answers[node.index()] = answer;
        });
        t[2] = started.elapsed();
        let total: Duration = t.iter().sum();
        eprintln!(
            "slot {:>3}: {:>6.1} ms ({})",
            slot - first,
            total.as_secs_f64() * 1e3,
            t.iter()
                .map(|d| format!("{:.1}", d.as_secs_f64() * 1e3))
                .collect::<Vec<_>>()
                .join(" + ")
        );
        if slot - first > warm_up {
            times.push(t);
        }
    }
    println!(
        "{nodes} nodes x {users} users x 4 resources per report ({} entries per slot), {total} limited users; {} steady slots after {warm_up} of warm-up",
        nodes * users * 4,
        times.len()
    );
    println!("| the ledger's work per slot | median | max |\n|---|---:|---:|");
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    for (i, phase) in PHASES.iter().enumerate() {
        let mut v: Vec<Duration> = times.iter().map(|t| t[i]).collect();
        v.sort_unstable();
        println!(
            "| {phase} | {:.1} ms | {:.1} ms |",
            ms(median(&v)),
            ms(v.last().copied().unwrap_or_default())
        );
    }
    let mut all: Vec<Duration> = times.iter().map(|t| t.iter().sum()).collect();
    all.sort_unstable();
    println!(
        "| **all, of a {slot_ms} ms slot** | **{:.1} ms** | **{:.1} ms** |",
        ms(median(&all)),
        ms(all.last().copied().unwrap_or_default())
    );
    println!(
        "| pushes rendered ({}) | {:.1} MB per slot | |",
        if packed { "packed" } else { "classic" },
        pushed_bytes as f64 / 1e6 / slots as f64
    );
    println!(
        "| answers rendered ahead ({}) | {:.1} MB per slot | |",
        if accepts.refs {
            "refs to the push"
        } else {
            "whole"
        },
        answered_bytes as f64 / 1e6 / slots as f64
    );
    println!(
        "| resident memory, whole process | {:.0} MiB (+{:.0} MiB) | |",
        throttle_tests::rss_mib(),
        throttle_tests::rss_mib() - rss_before
    );
    println!(
        "| grown, per (user, resource, node) entry | {:.0} B | |",
        (throttle_tests::rss_mib() - rss_before) * f64::from(1 << 20) / (nodes * users * 4) as f64
    );
    Ok(())
}

fn median(sorted: &[Duration]) -> Duration {
    sorted.get(sorted.len() / 2).copied().unwrap_or_default()
}
