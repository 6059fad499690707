//! The accuracy benchmark: every simulator scenario under every policy,
//! side by side.
//!
//! Run with: `cargo run --release -p throttle-tests --bin accuracy` (add
//! `-- --only 13` for the scenarios whose name starts so).

use std::time::Instant;

use throttle_central::ledger::PolicyFactory;
use throttle_central::policy::{Classic, Projected, StaticSplit};
use throttle_tests::sim;

/// A policy's name and how to make it.
type Named = (&'static str, fn() -> PolicyFactory);

fn policies() -> Vec<Named> {
    vec![
        ("projected", || Box::new(|_| Box::new(Projected::new()))),
        ("classic", || Box::new(|_| Box::new(Classic::new()))),
        ("static-split", || {
            Box::new(|_| Box::new(StaticSplit::new()))
        }),
    ]
}

fn main() {
    println!("60 virtual seconds per scenario, 1 s slots; windows of 10 slots after the warm-up.");
    println!(
        "window min/max and worst slot: admitted / limit; utilization: admitted / min(offered, limit);"
    );
    println!(
        "refused: requests of users under their limit refused; reconverge: slots after a shift until"
    );
    println!("a slot is within 5% of the limit; debt: lowest bucket level in seconds of rate.\n");
    println!(
        "| {:<44} | {:<12} | {:>10} | {:>10} | {:>10} | {:>11} | {:>7} | {:>11} | {:>6} | {:>7} |",
        "scenario",
        "policy",
        "window min",
        "window max",
        "worst slot",
        "utilization",
        "refused",
        "reconverge",
        "debt",
        "run"
    );
    println!(
        "|{:-<46}|{:-<14}|{:->12}|{:->12}|{:->12}|{:->13}|{:->9}|{:->13}|{:->8}|{:->9}|",
        "", "", "", "", "", "", "", "", "", ""
    );
    // `--only 13` runs the scenarios whose name starts so.
    let only = throttle_tests::arg_text("--only").unwrap_or_default();
    let chosen = sim::scenarios()
        .into_iter()
        .filter(|s| s.name.starts_with(&only));
    for scenario in chosen {
        for (name, policy) in policies() {
            let started = Instant::now();
            let o = sim::run(&scenario, policy());
            let reconverge = match o.reconverge_slots {
                0 if scenario.shifts.is_empty() => "-".to_string(),
                i64::MAX => "never".to_string(),
                n => n.to_string(),
            };
            println!(
                "| {:<44} | {:<12} | {:>9.1}% | {:>9.1}% | {:>9.1}% | {:>10.1}% | {:>7} | {:>11} | {:>6.1} | {:>5}ms |",
                scenario.name,
                name,
                100.0 * o.window_min,
                100.0 * o.window_max,
                100.0 * o.worst_slot,
                100.0 * o.utilization,
                o.others_refused,
                reconverge,
                o.deepest_debt,
                started.elapsed().as_millis(),
            );
        }
    }
}
