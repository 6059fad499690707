//! The leader's checkpoint in a real etcd: written in pieces, read back
//! whole, the older generation gone, and refused to a central that does
//! not lead.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use throttle_central::ha::election::{Elected, ElectionConfig, Running};
use throttle_central::ha::leadership::Leadership;
use throttle_central::ha::state::{EtcdState, StateError, StateStore};
use throttle_test_servers::Etcd;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_in_etcd_is_read_back_whole_and_fenced_by_leadership() {
    let Some(etcd) =
        Etcd::start("a_checkpoint_in_etcd_is_read_back_whole_and_fenced_by_leadership")
    else {
        return;
    };
    let config = ElectionConfig {
        endpoints: vec![etcd.url()],
        name: "state".into(),
        ttl: Duration::from_secs(2),
    };
    let running = Running::start(config, "http://127.0.0.1:1");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !running.elected.is_leader() {
        assert!(tokio::time::Instant::now() < deadline, "never led");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let store = EtcdState::new(vec![etcd.url()], "state", running.elected.clone());
    assert!(store.load().await.unwrap().is_none());
    // Over two pieces of a mebibyte.
    let big: Bytes = (0..2_500_000u32).map(|i| (i % 251) as u8).collect();
    store.save(big.clone()).await.unwrap();
    assert_eq!(store.load().await.unwrap().unwrap(), big);
    let small = Bytes::from_static(b"a smaller checkpoint");
    store.save(small.clone()).await.unwrap();
    assert_eq!(store.load().await.unwrap().unwrap(), small);
    // A central that does not lead writes nothing.
    let standby = Arc::new(Elected::new(
        "http://127.0.0.1:2",
        Arc::new(throttle_clock::MonotonicClock),
    ));
    let stale = EtcdState::new(vec![etcd.url()], "state", standby);
    assert!(matches!(
        stale.save(Bytes::from_static(b"stale")).await,
        Err(StateError::Deposed)
    ));
    assert_eq!(stale.load().await.unwrap().unwrap(), small);
    running.resign().await;
}
