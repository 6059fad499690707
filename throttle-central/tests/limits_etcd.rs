//! Limits kept in a real etcd (`--limits etcd:///KEY`): two centrals on
//! 127.0.0.1 read the same key, apply what is put there within two slots,
//! keep the last good limits when it breaks, and edit it through the admin
//! API with a compare-and-swap that loses no concurrent change; a central
//! started again finds the edits there.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use throttle_central::etcd_api::kv_client::KvClient;
use throttle_central::etcd_api::{PutRequest, RangeRequest};
use throttle_central::limits::{EtcdLimits, LimitSet};
use throttle_central::{Central, RunningCentral, Subject};
use throttle_clock::SlotLength;
use throttle_test_servers::Etcd;

mod common;

const SLOT_MS: u32 = 100;
const KEY: &str = "/throttle/limits";

async fn start(etcd: &Etcd) -> RunningCentral {
    let limits = EtcdLimits::open(vec![etcd.url()], KEY).await.unwrap();
    let grpc = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let http = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    Central::builder()
        .slot(SlotLength::from_ms(SLOT_MS).unwrap())
        .limits_etcd(Arc::new(limits))
        .spawn(grpc, Some(http))
        .unwrap()
}

async fn kv(etcd: &Etcd) -> KvClient<tonic::transport::Channel> {
    KvClient::connect(etcd.url()).await.unwrap()
}

/// What an operator's `etcdctl put KEY "$(cat limits.toml)"` does.
async fn put(etcd: &Etcd, text: &str) {
    let put = PutRequest {
        key: KEY.into(),
        value: text.into(),
        ..PutRequest::default()
    };
    kv(etcd).await.put(put).await.unwrap();
}

async fn get(etcd: &Etcd) -> String {
    let range = RangeRequest {
        key: KEY.into(),
        ..RangeRequest::default()
    };
    let answer = kv(etcd).await.range(range).await.unwrap().into_inner();
    String::from_utf8(answer.kvs[0].value.clone()).unwrap()
}

/// `method path` with `body`; the status and body.
async fn call(addr: SocketAddr, method: &str, path: &str, body: &str) -> (u16, String) {
    let answer = common::request(addr, method, path, body, None).await;
    (answer.status, answer.body)
}

/// `user`'s bucket rate for requests in `front`, as the ledger holds it.
async fn rate(central: &RunningCentral, user: &str) -> Option<f64> {
    let d = central
        .monitor(Subject::Distribution, Default::default())
        .await
        .unwrap();
    d["front"][user]["requests"]["bucket"]["rate"].as_f64()
}

/// Waits up to two slots (and more on a busy machine) for
/// every central's rate of `user` to be `want`.
async fn until_rate(centrals: &[&RunningCentral], user: &str, want: Option<f64>) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    for central in centrals {
        loop {
            let now = rate(central, user).await;
            if now == want {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{user}: {now:?}, not {want:?}"
            );
            tokio::time::sleep(Duration::from_millis(u64::from(SLOT_MS) / 4)).await;
        }
    }
}

/// Waits up to two slots (and more on a busy machine) until no central
/// has a rule of `user`'s own.
async fn until_no_rule(centrals: &[&RunningCentral], user: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    for central in centrals {
        let path = format!("/v1/limits/front/{user}");
        while call(central.http_addr().unwrap(), "GET", &path, "").await.0 != 404 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{user} still has a rule"
            );
            tokio::time::sleep(Duration::from_millis(u64::from(SLOT_MS) / 4)).await;
        }
    }
}

async fn last_error(central: &RunningCentral) -> Value {
    let (_, body) = call(central.http_addr().unwrap(), "GET", "/v1/limits", "").await;
    serde_json::from_str::<Value>(&body).unwrap()["last_error"].clone()
}

const CAROL: &str = "# kept in etcd\n[[limit]]\nservice = \"front\"\nuser = \"carol\"\nper_second = { requests = 10 }\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn centrals_follow_and_edit_the_same_limits_in_etcd() {
    let Some(etcd) = Etcd::start("centrals_follow_and_edit_the_same_limits_in_etcd") else {
        return;
    };
    // No key yet: nobody is limited.
    let (a, b) = (start(&etcd).await, start(&etcd).await);
    assert_eq!(rate(&a, "carol").await, None);
    // Put by hand: both apply it.
    put(&etcd, CAROL).await;
    until_rate(&[&a, &b], "carol", Some(10.0)).await;
    // Edited through one central's admin API: both apply it, the rest of
    // the document kept.
    let http_a = a.http_addr().unwrap();
    let body = r#"{"per_second": {"requests": 25}, "per_day": {"requests": 100000}}"#;
    let (status, rule) = call(http_a, "PUT", "/v1/limits/front/carol", body).await;
    assert_eq!(status, 200, "{rule}");
    until_rate(&[&a, &b], "carol", Some(25.0)).await;
    let text = get(&etcd).await;
    assert!(text.starts_with("# kept in etcd"), "{text}");
    // A bad rule is refused, naming the field; the key is unchanged.
    let bad = r#"{"per_minute": {"requests": -5}}"#;
    let (status, why) = call(http_a, "PUT", "/v1/limits/front/carol", bad).await;
    assert_eq!(status, 400);
    assert!(why.contains("per_minute"), "{why}");
    assert_eq!(get(&etcd).await, text);
    // Two edits at once on two centrals: neither is lost.
    let http_b = b.http_addr().unwrap();
    let dave = r#"{"per_second": {"requests": 7}}"#;
    let erin = r#"{"per_second": {"requests": 8}}"#;
    let (da, er) = tokio::join!(
        call(http_a, "PUT", "/v1/limits/front/dave", dave),
        call(http_b, "PUT", "/v1/limits/front/erin", erin),
    );
    assert_eq!((da.0, er.0), (200, 200), "{da:?} {er:?}");
    let set = LimitSet::from_toml(&get(&etcd).await).unwrap();
    assert_eq!(
        set.get("front", "dave").unwrap().per_second["requests"],
        7.0
    );
    assert_eq!(
        set.get("front", "erin").unwrap().per_second["requests"],
        8.0
    );
    until_rate(&[&a, &b], "erin", Some(8.0)).await;
    // A broken document keeps the limits in force, and says why.
    put(&etcd, "[[limit]]\nservice = \"front\"\n").await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    while last_error(&b).await.is_null() {
        assert!(tokio::time::Instant::now() < deadline, "no error shown");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(last_error(&b).await.as_str().unwrap().contains("line 1"));
    assert_eq!(rate(&b, "carol").await, Some(25.0));
    put(&etcd, &text).await;
    until_no_rule(&[&a, &b], "erin").await;
    // A central killed and started again reads what the edits left.
    a.kill();
    let c = start(&etcd).await;
    assert_eq!(rate(&c, "carol").await, Some(25.0));
    let (status, _) = call(http_b, "DELETE", "/v1/limits/front/carol", "").await;
    assert_eq!(status, 204);
    until_no_rule(&[&b, &c], "carol").await;
    b.shutdown().await;
    c.shutdown().await;
}

/// The program: `--limits etcd:///KEY` with `--etcd` reads the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_reads_limits_from_etcd() {
    let Some(etcd) = Etcd::start("the_binary_reads_limits_from_etcd") else {
        return;
    };
    put(&etcd, CAROL).await;
    let grpc = throttle_test_servers::free_port();
    let args: Vec<String> = [
        "--slot-ms",
        "100",
        "--etcd",
        &etcd.url(),
        "--advertise",
        &format!("http://127.0.0.1:{grpc}"),
        "--limits",
        &format!("etcd://{KEY}"),
    ]
    .iter()
    .map(|a| a.to_string())
    .collect();
    let bin = env!("CARGO_BIN_EXE_throttle-central");
    let mut central = throttle_test_servers::CentralProcess::start_on(bin, grpc, &args);
    let rule = central.get("/v1/limits/front/carol", Duration::from_secs(2));
    let rule: Value = serde_json::from_str(&rule.unwrap()).unwrap();
    assert_eq!(rule["per_second"]["requests"], 10.0, "{rule}");
    central.kill();
}
