//! Rows the usage store writes per second, per backend: SQLite (a file in
//! a temporary directory) and PostgreSQL (started as the tests start it,
//! skipped when its binaries are missing).
//!
//! Each slot, `--nodes` (100) reports of `--users` (1,000) users x 2
//! resources are written as the writer writes them, in batches of at most
//! 50,000 entries, one transaction each; `--slots` (20) slots, each
//! within one minute. Prints the median and slowest slot and the rows
//! (minute, hour and day) and entries written per second.
//!
//! Run with: `cargo run --release -p throttle-tests --bin usage-write`

use std::time::Instant;

use throttle_central::usage::{FiledUsage, SqliteUsage, UsageEntry, UsageStore};
use throttle_test_servers::{Postgres, TempDir};

/// One slot's reports: every node reports every user (as many users per
/// node as `users`), each with requests and bytes.
fn slot_reports(slot: i64, nodes: usize, users: usize) -> Vec<FiledUsage> {
    (0..nodes)
        .map(|n| FiledUsage {
            node: format!("node-{n}"),
            slot,
            start_s: slot,
            entries: (0..users)
                .flat_map(|u| {
                    ["bytes", "requests"].map(|resource| UsageEntry {
                        service: "front".into(),
                        user: format!("user-{u}"),
                        resource: resource.into(),
                        admitted: 3,
                        refused: 1,
                    })
                })
                .collect(),
        })
        .collect()
}

/// Writes `slots` slots into `store`; prints what it took.
fn run(name: &str, store: &dyn UsageStore, nodes: usize, users: usize, slots: i64) {
    let mut took = Vec::new();
    let (mut rows, mut entries) = (0, 0);
    // Slots of one minute, an hour after the epoch's first day.
    let first = 90_000;
    for slot in first..first + slots {
        let reports = slot_reports(slot, nodes, users);
        let start = Instant::now();
        let mut batch = Vec::new();
        let mut in_batch = 0;
        for r in reports {
            in_batch += r.entries.len();
            entries += r.entries.len();
            batch.push(r);
            if in_batch >= 50_000 {
                rows += store.write(&batch).expect("written").rows;
                batch.clear();
                in_batch = 0;
            }
        }
        if !batch.is_empty() {
            rows += store.write(&batch).expect("written").rows;
        }
        took.push(start.elapsed().as_secs_f64());
    }
    let total: f64 = took.iter().sum();
    took.sort_by(f64::total_cmp);
    println!(
        "{name}: slot median {:.0} ms, slowest {:.0} ms; {:.0} rows/s, {:.2} M entries/s ({nodes} reports of {users} users x 2 a slot)",
        took[took.len() / 2] * 1e3,
        took[took.len() - 1] * 1e3,
        rows as f64 / total,
        entries as f64 / total / 1e6,
    );
}

fn main() {
    let nodes = throttle_tests::arg("--nodes", 100.0) as usize;
    let users = throttle_tests::arg("--users", 1_000.0) as usize;
    let slots = throttle_tests::arg("--slots", 20.0) as i64;
    let dir = TempDir::new("usage-write");
    let sqlite = SqliteUsage::open(&dir.path().join("usage.db")).expect("sqlite opens");
    run("sqlite", &sqlite, nodes, users, slots);
    if let Some(pg) = Postgres::start("usage-write") {
        let store = throttle_central::usage::PostgresUsage::open(&pg.url()).expect("postgres");
        run("postgres", &store, nodes, users, slots);
    }
}
