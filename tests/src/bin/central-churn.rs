//! The central's memory through a churn of users, with the central's own
//! allocator (jemalloc, which gives freed pages back to the system within
//! seconds). Its ledger files reports of `--active` (20,000) users at a
//! time, one slot a second:
//!
//! - 80 slots of the same users (the steady state), then a full read of
//!   the monitor's pages (distribution, sums and quotas, 1,000 rows a
//!   page) and 15 slots more;
//! - `--slots` (120) slots of churn: `--step` (2,000) new users each slot
//!   and as many leaving (258,000 users in all by default);
//! - `--after` (70) slots with no report, in real time.
//!
//! Prints the process's resident memory at each step and the keys held.
//! A key is forgotten 60 slots after its last report (the data kept); a
//! key at the arena's end is cut at once, so that memory goes back when
//! the users are forgotten. The time the ledger took per slot of churn
//! is printed too. The first 65 slots and the churn run as fast as the
//! ledger goes; the other slots take one second each, since the
//! allocator gives memory back over time.
//!
//! Run with: `cargo run --release -p throttle-tests --bin central-churn`

use std::collections::BTreeMap;
use std::sync::Arc;

use throttle_central::limits::{LimitSet, StaticLimits};
use throttle_core::assigner::{Accepts, Assigner};
use throttle_core::ledger::{Ledger, LedgerConfig, Monitor, Page, Paged, SlotRange};
use throttle_proto::v1;

#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// A report of `node` for data slot `slot - 1`: users `from..from+n`, one
/// request each.
fn report(node: &str, slot: i64, from: u64, n: u64) -> v1::Report {
    let users: BTreeMap<String, v1::Amounts> = (from..from + n)
        .map(|u| {
            let amounts = v1::Amounts {
                resources: [("requests".to_owned(), 1)].into(),
            };
            (format!("user-{u}"), amounts)
        })
        .collect();
    v1::Report {
        node_id: node.into(),
        slot_number: slot,
        consumption: [("front".to_owned(), v1::Usage { users })].into(),
        ..v1::Report::default()
    }
}

/// Reads every page of the monitor's distribution, sums and quotas, as the
/// HTTP API does (1,000 rows a page); returns the rows read.
fn read_pages(ledger: &Ledger, now_ms: i64) -> usize {
    let all = SlotRange::default();
    let monitor = Monitor::of(ledger);
    rows_of(|page| monitor.distribution(all, now_ms, page))
        + rows_of(|page| monitor.sums(all, false, page))
        + rows_of(|page| monitor.quota(all, page))
}

/// The rows of every page `read` answers, 1,000 at a time.
fn rows_of<T>(read: impl Fn(&Page) -> Paged<T>) -> usize {
    let (mut rows, mut page) = (0, Page::first(1_000));
    loop {
        let p = read(&page);
        rows += p.rows.iter().map(|(_, r)| r.len()).sum::<usize>();
        let Some(next) = p.next else { return rows };
        page.after = Some(next);
    }
}

/// Prints the resident memory, against `steady` when given, and what is
/// allocated (live) of it.
fn show(what: &str, a: &Assigner, steady: Option<f64>) -> f64 {
    let rss = throttle_tests::rss_mib();
    let keys = a.ledger().key_count();
    let _ = tikv_jemalloc_ctl::epoch::advance();
    let live = tikv_jemalloc_ctl::stats::allocated::read().unwrap_or(0) as f64 / 1048576.0;
    let ratio = steady.map_or(String::new(), |s| {
        format!(" ({:.2}x the steady state)", rss / s)
    });
    println!("{what}: {rss:.0} MiB{ratio}, {live:.0} MiB allocated, {keys} keys");
    rss
}

fn main() {
    // As the central does: freed pages go back on time, not only when an
    // arena is next used.
    if let Err(e) = tikv_jemalloc_ctl::background_thread::write(true) {
        eprintln!("jemalloc's background thread: {e}");
    }
    let active = throttle_tests::arg("--active", 20_000.0) as u64;
    let step = throttle_tests::arg("--step", 2_000.0) as u64;
    let slots = throttle_tests::arg("--slots", 120.0) as i64;
    let after = throttle_tests::arg("--after", 70.0) as i64;
    let limits = LimitSet::from_toml(
        "[[limit]]\nservice = \"front\"\nuser = \"*\"\nper_second = { requests = 100 }\n",
    )
    .expect("limits");
    let config = LedgerConfig::default();
    let mut a = Assigner::new(Ledger::new(config), Arc::new(StaticLimits::new(limits)));
    let start = 1_000_000;
    let node = a
        .connect("n1", &["front".to_owned()], Accepts::NONE, start * 1000)
        .0;
    let mut slot = start;
    let run = |a: &mut Assigner, from: u64, n: u64, slot: i64| {
        let now = slot * 1000;
        let _ = a.report(node, &report("n1", slot, from, n), now + 50);
        let _ = a.tick(now + 500);
    };
    let second = || std::thread::sleep(std::time::Duration::from_secs(1));
    for _ in 0..65 {
        run(&mut a, 0, active, slot);
        slot += 1;
    }
    let mut samples = Vec::new();
    for _ in 0..15 {
        run(&mut a, 0, active, slot);
        slot += 1;
        second();
        samples.push(throttle_tests::rss_mib());
    }
    // The allocator gives freed pages back over seconds: the steady state
    // is the median of a second's samples.
    samples.sort_by(f64::total_cmp);
    let steady = samples[samples.len() / 2];
    show(
        &format!("steady state ({active} users), median {steady:.0} MiB"),
        &a,
        None,
    );
    let rows = read_pages(a.ledger(), slot * 1000);
    let read = format!("after a full read of the pages ({rows} rows)");
    show(&read, &a, Some(steady));
    for _ in 0..15 {
        run(&mut a, 0, active, slot);
        slot += 1;
        second();
    }
    show("15 s after it", &a, Some(steady));
    let started = std::time::Instant::now();
    for i in 0..slots {
        run(&mut a, i as u64 * step, active, slot);
        slot += 1;
    }
    let per_slot = started.elapsed().as_secs_f64() * 1000.0 / slots as f64;
    let seen = (slots as u64 - 1) * step + active;
    let churned = format!("after {seen} users churned ({per_slot:.1} ms a slot)");
    show(&churned, &a, Some(steady));
    for i in 1..=after {
        run(&mut a, 0, 0, slot);
        slot += 1;
        second();
        if [30, 60, 62, 65, 70, after].contains(&i) {
            show(&format!("{i} s after the last report"), &a, Some(steady));
        }
    }
}
