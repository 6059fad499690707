//! Hierarchical quotas end to end: a real central node and three real app
//! nodes at 100 ms slots, three applications sharing one capacity.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use throttle_central::Subject;
use throttle_central::limits::StaticLimits;
use throttle_examples::load::Load;
use throttle_layer::Fallback;
use throttle_tests::hierarchy::{APP_NAMES, three_apps};
use throttle_tests::{CentralFactory, Cluster, get_json, sum};

const SLOT_MS: u32 = 100;

/// What `app`'s two users were admitted in data slots `from..=to`.
fn app_sum(sums: &Value, app: &str, from: i64, to: i64) -> i64 {
    (1..=2)
        .map(|u| sum(sums, "front", &format!("{app}-{u}"), "requests", from, to))
        .sum()
}

/// Each application offers twice its guarantee (600/s) over three nodes,
/// its two users skewed differently: the central's sums hold the total
/// within 95%..105% of the capacity in every 10 s window, gold (priority
/// 0) at or above 95% of its guarantee in every second of it, and the
/// monitor shows who was cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_applications_share_a_capacity_at_100_ms_slots() {
    // gold, silver and bronze (priorities 0, 1, 2), each guaranteed 300/s
    // of 1,000/s with a ceiling of 600/s, bursting longer than the test.
    let limits = Arc::new(StaticLimits::new(three_apps(1000.0, 60.0)));
    // 10 s of 100 ms slots and the warm-up: keep 150 slots of sums.
    let central: CentralFactory = Arc::new(move || {
        throttle_central::Central::builder()
            .limits(limits.clone())
            .nr_slot(150)
    });
    let cluster = Cluster::start_with(3, SLOT_MS, central, Fallback::Allow)
        .await
        .unwrap();
    cluster.connected().await;
    let load = Load::new(cluster.nodes.iter().map(|n| n.addr).collect(), "/");
    for app in APP_NAMES {
        for (node, share) in [(0, 0.5), (1, 0.3), (2, 0.2)] {
            load.flow(&format!("{app}-1"), node, 400.0 * share);
            load.flow(&format!("{app}-2"), 2 - node, 200.0 * share);
        }
    }
    let start = cluster.current_slot();
    let http = cluster
        .central
        .as_ref()
        .and_then(|c| c.http_addr())
        .unwrap();
    // The monitor asked while the load runs.
    let asked = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(8)).await;
        get_json(http, "/v1/monitor/apps").await.unwrap()
    });
    load.run(Duration::from_millis(11_500)).await;
    let (status, apps) = asked.await.unwrap();
    cluster.slots(3).await;
    let sums = cluster.monitor(Subject::ConsumptionSum).await;
    assert_eq!(status, 200, "{apps}");
    let (_, limits) = get_json(http, "/v1/limits").await.unwrap();
    assert_eq!(limits["policies"]["front"], "hierarchical", "{limits}");
    assert_eq!(
        limits["capacities"]["front"]["apps"][0]["name"], "gold",
        "{limits}"
    );
    let (from, to) = (start + 10, start + 109);
    let totals: Vec<i64> = APP_NAMES
        .iter()
        .map(|a| app_sum(&sums, a, from, to))
        .collect();
    let total: i64 = totals.iter().sum();
    let ratio = total as f64 / 10_000.0;
    let gold_seconds: Vec<i64> = (0..10)
        .map(|s| app_sum(&sums, "gold", from + 10 * s, from + 10 * s + 9))
        .collect();
    println!(
        "10 s admitted: {totals:?} (total {total}, {ratio:.3} of capacity); gold per second {gold_seconds:?}"
    );
    assert!((0.95..=1.05).contains(&ratio), "{totals:?}");
    assert!(gold_seconds.iter().all(|g| *g >= 285), "{gold_seconds:?}");
    assert!(
        totals[2] < totals[0],
        "bronze is cut before gold: {totals:?}"
    );
    let shown = &apps["front"]["resources"][0];
    assert_eq!(shown["capacity"], 1000.0, "{apps}");
    let names: Vec<&str> = shown["apps"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|a| a["name"].as_str())
        .collect();
    assert_eq!(names, APP_NAMES, "{apps}");
    let bronze = &shown["apps"][2];
    assert!(
        bronze["demand"].as_f64() > bronze["granted"].as_f64(),
        "bronze is cut: {bronze}"
    );
}
