//! Rows the usage store writes per second, per backend: SQLite (a file in
//! a temporary directory) and PostgreSQL (started as the tests start it,
//! skipped when its binaries are missing).
//!
//! Each slot, `--nodes` (100) reports of `--users` (1,000) users x
//! `--resources` (2) resources are written as the writer writes them, in
//! batches of at most [`BATCH_ENTRIES`] entries, one transaction each;
//! `--slots` (20) slots, each within one minute. Prints the median and slowest slot and the rows
//! (minute, hour and day) and entries written per second.
//!
//! Run with: `cargo run --release -p throttle-tests --bin usage-write`

use std::time::Instant;

use throttle_central::usage::{BATCH_ENTRIES, FiledUsage, SqliteUsage, UsageEntry, UsageStore};
use throttle_test_servers::{Postgres, TempDir};

/// The size of a run: reports a slot, users in each, resources of each.
#[derive(Clone, Copy)]
struct Fleet {
    nodes: usize,
    users: usize,
    resources: usize,
}

/// One slot's reports: every node reports every user, each with
/// `resources` resources (`requests`, `bytes`, then `r2`, `r3`...).
fn slot_reports(slot: i64, fleet: Fleet) -> Vec<FiledUsage> {
    let names: Vec<String> = (0..fleet.resources)
        .map(|r| match r {
            0 => "requests".to_owned(),
            1 => "bytes".to_owned(),
            r => format!("r{r}"),
        })
        .collect();
    (0..fleet.nodes)
        .map(|n| FiledUsage {
            node: format!("node-{n}"),
            slot,
            start_s: slot,
            entries: (0..fleet.users)
                .flat_map(|u| {
                    names.iter().map(move |resource| UsageEntry {
                        service: "front".into(),
                        user: format!("user-{u}"),
                        resource: resource.clone(),
                        admitted: 3,
                        refused: 1,
                    })
                })
                .collect(),
        })
        .collect()
}

/// Writes `slots` slots into `store`; prints what it took.
fn run(name: &str, store: &dyn UsageStore, fleet: Fleet, slots: i64) {
    let mut took = Vec::new();
    let (mut rows, mut entries) = (0, 0);
    // Slots of one minute, an hour after the epoch's first day.
    let first = 90_000;
    for slot in first..first + slots {
        let reports = slot_reports(slot, fleet);
        let start = Instant::now();
        let mut batch = Vec::new();
        let mut in_batch = 0;
        for r in reports {
            in_batch += r.entries.len();
            entries += r.entries.len();
            batch.push(r);
            if in_batch >= BATCH_ENTRIES {
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
        "{name}: slot median {:.0} ms, slowest {:.0} ms; {:.0} rows/s, {:.2} M entries/s ({} reports of {} users x {} a slot)",
        took[took.len() / 2] * 1e3,
        took[took.len() - 1] * 1e3,
        rows as f64 / total,
        entries as f64 / total / 1e6,
        fleet.nodes,
        fleet.users,
        fleet.resources,
    );
}

fn main() {
    let fleet = Fleet {
        nodes: throttle_tests::arg("--nodes", 100.0) as usize,
        users: throttle_tests::arg("--users", 1_000.0) as usize,
        resources: throttle_tests::arg("--resources", 2.0) as usize,
    };
    let slots = throttle_tests::arg("--slots", 20.0) as i64;
    let dir = TempDir::new("usage-write");
    let sqlite = SqliteUsage::open(&dir.path().join("usage.db")).expect("sqlite opens");
    run("sqlite", &sqlite, fleet, slots);
    if let Some(pg) = Postgres::start("usage-write") {
        let store = throttle_central::usage::PostgresUsage::open(&pg.url()).expect("postgres");
        run("postgres", &store, fleet, slots);
    }
}
