//! The central's memory through a churn of users: its ledger filing, for
//! `--slots` (120) slots, reports of `--active` (20,000) users at a time,
//! `--step` (2,000) new ones each slot and as many leaving (200,000
//! users in all by default), then reports of no one for `--after` (130)
//! slots. Prints the process's resident memory before the churn (the same
//! `--active` users for 65 slots, the ledger's steady state), at its end,
//! 60 slots after it (every user just forgotten) and at the end; and the
//! keys held. A forgotten key's id, and its names, are kept for the
//! quota history of the slots kept (60, and 4 for the assignments ahead):
//! the ledger gives back the memory of the keys at the end of its arena
//! once their ids could be given again.
//!
//! Run with: `cargo run --release -p throttle-tests --bin central-churn`

use std::collections::BTreeMap;
use std::sync::Arc;

use throttle_central::assigner::{Accepts, Assigner};
use throttle_central::ledger::{Ledger, LedgerConfig};
use throttle_central::limits::{LimitSet, StaticLimits};
use throttle_proto::v1;

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

fn main() {
    let active = throttle_tests::arg("--active", 20_000.0) as u64;
    let step = throttle_tests::arg("--step", 2_000.0) as u64;
    let slots = throttle_tests::arg("--slots", 120.0) as i64;
    let after = throttle_tests::arg("--after", 130.0) as i64;
    let limits = LimitSet::from_toml(
        "[[limit]]\nservice = \"front\"\nuser = \"*\"\nper_second = { requests = 100 }\n",
    )
    .expect("limits");
    let config = LedgerConfig::default();
    let nr_slot = i64::from(config.nr_slot);
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
    for _ in 0..65 {
        run(&mut a, 0, active, slot);
        slot += 1;
    }
    let steady = throttle_tests::rss_mib();
    let keys = a.ledger().key_count();
    println!("steady state ({active} users): {steady:.0} MiB, {keys} keys");
    for i in 0..slots {
        run(&mut a, i as u64 * step, active, slot);
        slot += 1;
    }
    let churned = throttle_tests::rss_mib();
    let seen = (slots as u64 - 1) * step + active;
    let keys = a.ledger().key_count();
    println!("after {seen} users churned: {churned:.0} MiB, {keys} keys");
    for i in 1..=after {
        run(&mut a, 0, 0, slot);
        slot += 1;
        if i == nr_slot || i == after {
            let rss = throttle_tests::rss_mib();
            let keys = a.ledger().key_count();
            println!(
                "{i} slots after the last report: {rss:.0} MiB ({:.2}x the steady state), {keys} keys",
                rss / steady
            );
        }
    }
}
