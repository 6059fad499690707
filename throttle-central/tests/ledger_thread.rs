//! The ledger runs on a thread of its own, which ends with the central
//! node, by shutdown or by kill. A test binary of its own: it counts the
//! process's threads, which other tests' central nodes would disturb.

use std::time::{Duration, Instant};

use throttle_central::{Central, LEDGER_THREAD, Subject};

/// Threads of this process named [`LEDGER_THREAD`].
fn ledger_threads() -> usize {
    let tasks = std::fs::read_dir("/proc/self/task").expect("Linux /proc");
    tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|comm| comm.trim() == LEDGER_THREAD)
        .count()
}

/// Waits up to 5 s for `n` ledger threads.
async fn expect_ledger_threads(n: usize) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while ledger_threads() != n {
        assert!(
            Instant::now() < deadline,
            "expected {n} ledger threads, found {}",
            ledger_threads()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn the_ledger_thread_ends_with_the_central_by_shutdown_or_kill() {
    assert_eq!(ledger_threads(), 0);
    let spawn = || async {
        let grpc = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        Central::builder().spawn(grpc, None).unwrap()
    };

    let central = spawn().await;
    expect_ledger_threads(1).await;
    // The ledger answers from its thread.
    let connections = central
        .monitor(Subject::Connections, Default::default())
        .await;
    let connections = connections.expect("the ledger answers");
    assert_eq!(connections["connections"], serde_json::json!([]));
    central.shutdown().await;
    expect_ledger_threads(0).await;

    let central = spawn().await;
    expect_ledger_threads(1).await;
    central.kill();
    expect_ledger_threads(0).await;

    // Dropped without a word: the ledger stops as on shutdown.
    let central = spawn().await;
    expect_ledger_threads(1).await;
    drop(central);
    expect_ledger_threads(0).await;
}
