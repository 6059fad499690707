//! The accuracy benchmark: every simulator scenario under every policy,
//! side by side.
//!
//! Run with: `cargo run --release -p throttle-tests --bin accuracy` (add
//! `-- --only 13` for the scenarios whose name starts so; `--only A` for
//! the hierarchical ones).

use std::time::Instant;

use throttle_central::ledger::PolicyFactory;
use throttle_central::policy::{Classic, Projected, StaticSplit};
use throttle_tests::{hierarchy, sim};

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
    let only = throttle_tests::arg_text("--only").unwrap_or_default();
    if !only.starts_with('A') {
        limits(&only);
    }
    if only.is_empty() || only.starts_with('A') {
        apps(&only);
    }
}

/// The hierarchical scenarios under the hierarchical policy.
fn apps(only: &str) {
    println!(
        "\nApplications sharing a capacity of 1,000 requests/s (gold, silver, bronze: priorities 0, 1, 2,"
    );
    println!(
        "each guaranteed 300/s, burst ceiling 600/s); 60 virtual seconds, 1 s slots, 4 nodes, windows of"
    );
    println!(
        "10 slots after 10 s: total / capacity; per application: least window / its guarantee, and mean/s.\n"
    );
    println!(
        "| {:<32} | {:>9} | {:>9} | {:>16} | {:>16} | {:>16} | {:>5} | {:>5} | {:>5} |",
        "scenario",
        "total min",
        "total max",
        "gold min (mean)",
        "silver min (mean)",
        "bronze min (mean)",
        "lend",
        "burst",
        "run"
    );
    println!(
        "|{:-<34}|{:->11}|{:->11}|{:->18}|{:->18}|{:->18}|{:->7}|{:->7}|{:->7}|",
        "", "", "", "", "", "", "", "", ""
    );
    let chosen = hierarchy::scenarios()
        .into_iter()
        .filter(|s| s.scenario.name.starts_with(only));
    for s in chosen {
        let started = Instant::now();
        let o = hierarchy::run(&s);
        let app = |i: usize| format!("{:.1}% ({:.0})", 100.0 * o.app_min[i], o.app_mean[i]);
        let lend = o.lend_slots.map_or("-".into(), |n| n.to_string());
        println!(
            "| {:<32} | {:>8.1}% | {:>8.1}% | {:>16} | {:>17} | {:>17} | {:>5} | {:>5} | {:>3}ms |",
            s.scenario.name,
            100.0 * o.total_min,
            100.0 * o.total_max,
            app(0),
            app(1),
            app(2),
            lend,
            o.burst_slots,
            started.elapsed().as_millis(),
        );
    }
}

/// The per-user scenarios under every policy.
fn limits(only: &str) {
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
    let chosen = sim::scenarios()
        .into_iter()
        .filter(|s| s.name.starts_with(only));
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
