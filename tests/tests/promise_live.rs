//! The promise of a limit with the real binaries at their default flags:
//! random cases of the simulator's kinds ([`promise::live::live_case`]:
//! up to three `axum-node`s and one `throttle-central` on 127.0.0.1, or
//! two on etcd for a leader failover or an etcd fault; an open-loop HTTP
//! load; the central stopped and continued, or killed and started again
//! with or without `--state`; etcd stopped and continued, or killed and
//! started again on its data; a node killed and started again, or cut off
//! by a relay),
//! read by the same oracle. `THROTTLE_PROMISE_SEED`
//! runs one case instead; `promise-soak` runs cases until stopped.
//!
//! The binaries are those `cargo test --workspace` builds; where they are
//! missing the test says so and skips (fails under
//! `THROTTLE_REQUIRE_SERVERS=1`).

use throttle_tests::promise::live::{self, Binaries};
use throttle_tests::promise::{Miss, Side};

/// Cases a run takes: 16 of 12 s, about four minutes.
const CASES: u64 = 16;

/// The worst admitted / bound a live case may show: the simulator's, and
/// a tenth for what a live run adds (an HTTP load's own jitter, a second
/// read from the load's clock, not the nodes').
fn allowed(m: &Miss) -> f64 {
    let sim = match (m.side, m.fault) {
        (Side::Lower, _) => 12.9,
        (Side::Upper, None) => 1.15,
        (Side::Upper, Some("central restarted without state")) => 2.9,
        (Side::Upper, Some(_)) => 2.1,
    };
    sim * 1.1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_promise_holds_over_random_cases_with_the_real_binaries() {
    let test = "the_promise_holds_over_random_cases_with_the_real_binaries";
    let Some(bins) = Binaries::of_this_build() else {
        let why = "throttle-central or axum-node not built: run `cargo test --workspace`";
        assert!(
            std::env::var_os("THROTTLE_REQUIRE_SERVERS").is_none(),
            "{test}: {why}"
        );
        eprintln!("SKIPPED {test}: {why}");
        return;
    };
    let seeds: Vec<u64> = match std::env::var("THROTTLE_PROMISE_SEED") {
        Ok(s) => vec![s.parse().expect("THROTTLE_PROMISE_SEED is a number")],
        Err(_) => (0..CASES).collect(),
    };
    let mut failed = Vec::new();
    for seed in seeds {
        let case = live::live_case(seed);
        let run = live::run(&case, &bins).await;
        let worst = run
            .verdict
            .misses
            .iter()
            .map(Miss::ratio)
            .fold(0.0, f64::max);
        println!(
            "seed {seed}: {} users, {} nodes, {:?}: {} misses, worst {worst:.2}",
            case.users().len(),
            case.nodes,
            case.faults.iter().map(|f| f.kind()).collect::<Vec<_>>(),
            run.verdict.misses.len()
        );
        for m in run.verdict.misses.iter().filter(|m| m.ratio() > allowed(m)) {
            failed.push(format!("{m}\n{case}"));
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}
