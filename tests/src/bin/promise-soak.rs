//! Runs random live promise cases ([`live_case`]) with the real binaries
//! until stopped, and prints every miss with its case.
//!
//! Run with: `cargo build -p throttle-examples --bins && cargo run -p
//! throttle-tests --bin promise-soak -- [FIRST_SEED]` (the binaries beside
//! it, of the same build).
//!
//! [`live_case`]: throttle_tests::promise::live::live_case

use throttle_tests::promise::live::{self, Binaries};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let Some(bins) = Binaries::of_this_build() else {
        eprintln!("throttle-central and axum-node are not beside this program: build them first");
        std::process::exit(2);
    };
    let first: u64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let mut missed = 0;
    for seed in first.. {
        let case = live::live_case(seed);
        let run = live::run(&case, &bins).await;
        missed += usize::from(!run.verdict.held());
        println!(
            "seed {seed}: {} misses ({missed} cases with one so far)",
            run.verdict.misses.len()
        );
        for m in &run.verdict.misses {
            println!("  {m}");
        }
        if !run.verdict.held() {
            println!("{case}");
        }
    }
}
