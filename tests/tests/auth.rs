//! A real reporter signing its stream for a real central that requires node
//! keys, on 127.0.0.1.

use std::sync::Arc;
use std::time::Duration;

use throttle_central::Central;
use throttle_central::keys::NodeKeys;
use throttle_clock::{Clock, SlotLength, SystemClock};
use throttle_layer::reporter::{ReporterBuilder, ReporterHandle};
use throttle_layer::{Reporter, SlotStore};

const SLOT_MS: u32 = 100;

fn reporter(store: &SlotStore, central: std::net::SocketAddr, node_id: &str) -> ReporterBuilder {
    Reporter::builder(store, node_id)
        .central(format!("http://{central}"))
        .report_delay(Duration::from_millis(5))
        .backoff(Duration::from_millis(20), Duration::from_millis(100))
}

/// Whether the reporter gets more than `seen` quotas within `within`.
async fn served_more(handle: &ReporterHandle, seen: u64, within: Duration) -> bool {
    tokio::time::timeout(within, handle.wait_for(|s| s.quotas_received > seen))
        .await
        .is_ok()
}

/// Whether the reporter gets a quota within `within`.
async fn served(handle: &ReporterHandle, within: Duration) -> bool {
    tokio::time::timeout(within, handle.wait_for(|s| s.quotas_received > 0))
        .await
        .is_ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reporter_with_the_right_key_is_served_and_others_are_not() {
    let dir = std::env::temp_dir().join(format!(
        "throttle-e2e-keys-{}-{}",
        std::process::id(),
        SystemClock.now_ms()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("keys.toml");
    std::fs::write(
        &path,
        "[[key]]\naccess_key = \"web\"\nsecret_key = \"a secret of 24 bytes....\"\nnode_ids = [\"web-*\"]\n",
    )
    .unwrap();
    let slot = SlotLength::from_ms(SLOT_MS).unwrap();
    let grpc = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let central = Central::builder()
        .slot(slot)
        .node_keys(Arc::new(NodeKeys::open(&path).unwrap()))
        .spawn(grpc, None)
        .unwrap();
    let addr = central.grpc_addr();
    let store = || SlotStore::builder().slot(slot).build();
    let (good, bad, none) = (store(), store(), store());
    for s in [&good, &bad, &none] {
        s.service("front").resource("requests");
    }
    let good = reporter(&good, addr, "web-1")
        .credentials("web", "a secret of 24 bytes....")
        .spawn()
        .unwrap();
    let bad = reporter(&bad, addr, "web-2")
        .credentials("web", "not the right secret....")
        .spawn()
        .unwrap();
    let none = reporter(&none, addr, "web-3").spawn().unwrap();
    // The refused ones retry every 20-100 ms meanwhile.
    assert!(
        served(&good, Duration::from_secs(3)).await,
        "{:?}",
        good.status()
    );
    assert!(
        !served(&bad, Duration::from_millis(700)).await,
        "{:?}",
        bad.status()
    );
    assert!(
        !served(&none, Duration::from_millis(300)).await,
        "{:?}",
        none.status()
    );
    assert!(bad.status().connections == 0 && none.status().connections == 0);
    // The one served goes on being served.
    let pushes = good.status().quotas_received;
    assert!(
        served_more(&good, pushes, Duration::from_secs(3)).await,
        "{:?}",
        good.status()
    );

    // A key the file no longer lists is refused from the next stream on.
    std::fs::write(
        &path,
        "[[key]]\naccess_key = \"api\"\nsecret_key = \"another secret of 24 b..\"\n",
    )
    .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let later_store = store();
    later_store.service("front").resource("requests");
    let later = reporter(&later_store, addr, "web-4")
        .credentials("web", "a secret of 24 bytes....")
        .spawn()
        .unwrap();
    assert!(
        !served(&later, Duration::from_millis(700)).await,
        "{:?}",
        later.status()
    );
    central.shutdown().await;
    std::fs::remove_dir_all(&dir).unwrap();
}
