//! The accuracy benchmark: every simulator scenario under every policy,
//! side by side.
//!
//! Run with: `cargo run --release -p throttle-tests --bin accuracy` (add
//! `-- --only 13` for the scenarios whose name starts so; `--only A` for
//! the hierarchical ones; `--trace` to print the outage runs' slots).

use std::time::Instant;

use throttle_core::ledger::PolicyFactory;
use throttle_core::policy::{Classic, Projected, StaticSplit};
use throttle_layer::Fallback;
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
        outages(&only);
        newcomers(&only);
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
        "refused: requests of users under their limit refused after the warm-up; reconverge: slots after a shift until"
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

/// Users new to every node, with and without the default quota.
fn newcomers(only: &str) {
    const NAME: &str = "18 newcomers at 3x over 10 nodes";
    if !NAME.starts_with(only) {
        return;
    }
    println!(
        "\n{} users arrive one after the other, each at 3x the `*` rate (1,000/s) over all 10 nodes at",
        sim::NEWCOMERS
    );
    println!(
        "once, 300 ms into a slot; policy projected. First slots: the more of a newcomer's first two"
    );
    println!("slots / rate, worst and mean over them; a resident user's windows as above.\n");
    println!(
        "| {:<34} | {:<28} | {:>11} | {:>10} | {:>10} | {:>10} |",
        "scenario", "nodes", "first worst", "first mean", "window min", "window max"
    );
    println!(
        "|{:-<36}|{:-<30}|{:->13}|{:->12}|{:->12}|{:->12}|",
        "", "", "", "", "", ""
    );
    for (told, nodes) in [
        (true, "told the default quota"),
        (false, "unlimited until their row"),
    ] {
        let scenario = sim::newcomers(NAME, told);
        let trace = sim::run_traced(&scenario, Box::new(|_| Box::new(Projected::new())));
        let first = sim::FirstSlots::of(&scenario, &trace);
        let o = trace.outcome;
        println!(
            "| {:<34} | {:<28} | {:>10.1}% | {:>9.1}% | {:>9.1}% | {:>9.1}% |",
            NAME,
            nodes,
            first.worst * 100.0,
            first.mean * 100.0,
            o.window_min * 100.0,
            o.window_max * 100.0
        );
    }
}

/// The outage scenarios under the default policy, with every fallback.
fn outages(only: &str) {
    let chosen: Vec<_> = sim::outages()
        .into_iter()
        .filter(|s| s.name.starts_with(only))
        .collect();
    if chosen.is_empty() {
        return;
    }
    println!(
        "\nThe central away from 30.4 s on; one user at 3x its limit over 3 nodes; policy projected."
    );
    println!(
        "30 s around: admitted / limit over the 30 slots centred on the outage, and its least and"
    );
    println!("largest slot; windows: 10-slot windows after the warm-up; debt as above.\n");
    println!(
        "| {:<44} | {:<24} | {:>11} | {:>11} | {:>12} | {:>10} | {:>10} | {:>6} |",
        "scenario",
        "fallback",
        "30 s around",
        "least slot",
        "largest slot",
        "window min",
        "window max",
        "debt"
    );
    println!(
        "|{:-<46}|{:-<26}|{:->13}|{:->13}|{:->14}|{:->12}|{:->12}|{:->8}|",
        "", "", "", "", "", "", "", ""
    );
    // `--trace`: each run's slots around the outage, on stderr.
    let trace_slots = std::env::args().any(|a| a == "--trace");
    let fallbacks = [
        Fallback::Allow,
        Fallback::Deny,
        Fallback::LastKnownThenAllow(3),
        Fallback::LastKnownThenAllow(60),
        Fallback::LastKnownThenDeny(60),
    ];
    for mut scenario in chosen {
        for fallback in fallbacks {
            scenario.fallback = fallback;
            let trace = sim::run_traced(&scenario, Box::new(|_| Box::new(Projected::new())));
            let o = trace.outcome;
            let around = o.outage.unwrap_or_default();
            if trace_slots {
                let window = scenario.outage.map(|o| o.window()).unwrap_or_default();
                eprintln!(
                    "{} {fallback:?}: {:?}",
                    scenario.name, &trace.admitted[0][window]
                );
            }
            println!(
                "| {:<44} | {:<24} | {:>10.1}% | {:>10.1}% | {:>11.1}% | {:>9.1}% | {:>9.1}% | {:>6.1} |",
                scenario.name,
                format!("{fallback:?}"),
                100.0 * around.window,
                100.0 * around.lowest_slot,
                100.0 * around.highest_slot,
                100.0 * o.window_min,
                100.0 * o.window_max,
                o.deepest_debt,
            );
        }
    }
}
