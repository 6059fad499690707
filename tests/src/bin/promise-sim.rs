//! Runs random promise cases in the simulator and prints every miss.
//!
//! Run with: `cargo run --release -p throttle-tests --bin promise-sim -- [FIRST_SEED] [CASES]`
//! (defaults 0 and 1,000; `--print SEED` prints one case and its misses).

use std::collections::BTreeMap;
use std::time::Instant;

use throttle_tests::promise::{self, simulate};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--print") {
        let seed = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(0);
        let case = promise::generate(seed);
        let (trace, verdict) = simulate::run(&case);
        println!("{case}");
        for (u, name) in case.users().iter().enumerate() {
            println!("{name:>8} admitted {:?}", trace.admitted[u]);
            println!("{name:>8} offered  {:?}", trace.offered[u]);
        }
        for m in &verdict.misses {
            println!("MISS {m}");
        }
        return;
    }
    let first: u64 = args.first().and_then(|s| s.parse().ok()).unwrap_or(0);
    let cases: u64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(1_000);
    let started = Instant::now();
    let mut worst: BTreeMap<&'static str, f64> = BTreeMap::new();
    let mut missed = 0;
    let mut kinds: BTreeMap<&'static str, u64> = BTreeMap::new();
    for seed in first..first + cases {
        let case = promise::generate(seed);
        for f in &case.faults {
            *kinds.entry(f.kind()).or_default() += 1;
        }
        let (_, verdict) = simulate::run(&case);
        for (kind, w) in &verdict.worst_by_fault {
            let e = worst.entry(kind).or_insert(0.0);
            *e = e.max(*w);
        }
        let e = worst.entry("no fault").or_insert(0.0);
        *e = e.max(verdict.worst_clear);
        if !verdict.held() {
            missed += 1;
            for m in &verdict.misses {
                println!("seed {seed}: {m}");
            }
        }
    }
    println!(
        "{cases} cases in {:.1} s, {missed} with a miss",
        started.elapsed().as_secs_f64()
    );
    for (kind, w) in worst {
        let of = kinds.get(kind).copied().unwrap_or(cases);
        println!("  worst admitted / bound, {kind} ({of} cases): {w:.3}");
    }
}
