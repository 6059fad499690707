//! The admin API against a real central on 127.0.0.1: a rule set with
//! `PUT` is enforced within two slots, written to the limits file, and
//! still there after the central is killed and started again on it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use throttle_central::limits::{FileLimits, LimitSet};
use throttle_central::{Central, RunningCentral, Subject};
use throttle_clock::SlotLength;

mod common;

const SLOT_MS: u32 = 100;
const TOKEN: &str = "s3cret-token";

async fn start(path: &std::path::Path) -> RunningCentral {
    let grpc = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let http = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    Central::builder()
        .slot(SlotLength::from_ms(SLOT_MS).unwrap())
        .limits_file(Arc::new(FileLimits::open(path).unwrap()))
        .http_token(TOKEN)
        .spawn(grpc, Some(http))
        .unwrap()
}

/// `method path` with `body`, the token if `token`; the status and body.
async fn call(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
    token: bool,
) -> (u16, String) {
    let answer = common::request(addr, method, path, body, token.then_some(TOKEN)).await;
    (answer.status, answer.body)
}

/// carol's bucket rate for requests, as the ledger holds it.
async fn carol_rate(central: &RunningCentral) -> Option<f64> {
    let d = central
        .monitor(Subject::Distribution, Default::default())
        .await
        .unwrap();
    d["front"]["carol"]["requests"]["bucket"]["rate"].as_f64()
}

#[tokio::test]
async fn a_rule_put_is_enforced_written_and_kept_across_a_restart() {
    let dir = std::env::temp_dir().join(format!("throttle-admin-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("limits.toml");
    std::fs::write(
        &path,
        "# operators' notes\n[[limit]]\nservice = \"front\"\nuser = \"carol\"\nper_second = { requests = 10 }\n",
    )
    .unwrap();
    let central = start(&path).await;
    let http = central.http_addr().unwrap();
    let body = r#"{"per_second": {"requests": 25}, "per_day": {"requests": 100000}}"#;
    let (status, _) = call(http, "PUT", "/v1/limits/front/carol", body, false).await;
    assert_eq!(status, 401, "no token, no change");
    assert_eq!(carol_rate(&central).await, Some(10.0));
    let (status, rule) = call(http, "PUT", "/v1/limits/front/carol", body, true).await;
    assert_eq!(status, 200, "{rule}");
    let rule: Value = serde_json::from_str(&rule).unwrap();
    assert_eq!(rule["per_second"]["requests"], 25.0);
    // Enforced within two slots.
    let mut rate = None;
    for _ in 0..20 {
        rate = carol_rate(&central).await;
        if rate == Some(25.0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(u64::from(SLOT_MS) / 2)).await;
    }
    assert_eq!(rate, Some(25.0), "applied");
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.starts_with("# operators' notes"), "{text}");
    let set = LimitSet::from_toml(&text).unwrap();
    assert_eq!(
        set.get("front", "carol").unwrap().per_second["requests"],
        25.0
    );
    // A bad rule is refused, naming the field; nothing changes.
    let bad = r#"{"per_minute": {"requests": -5}}"#;
    let (status, why) = call(http, "PUT", "/v1/limits/front/carol", bad, true).await;
    assert_eq!(status, 400);
    assert!(why.contains("per_minute"), "{why}");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), text);
    // Killed and started again on the same file: the rule is there.
    central.kill();
    let again = start(&path).await;
    let (status, rule) = call(
        again.http_addr().unwrap(),
        "GET",
        "/v1/limits/front/carol",
        "",
        true,
    )
    .await;
    assert_eq!(status, 200, "{rule}");
    assert!(rule.contains("\"per_day\""), "{rule}");
    // Deleted: carol is not limited any more.
    let http = again.http_addr().unwrap();
    let (status, _) = call(http, "DELETE", "/v1/limits/front/carol", "", true).await;
    assert_eq!(status, 204);
    let (status, _) = call(http, "DELETE", "/v1/limits/front/carol", "", true).await;
    assert_eq!(status, 404);
    assert!(
        LimitSet::from_toml(&std::fs::read_to_string(&path).unwrap())
            .unwrap()
            .get("front", "carol")
            .is_none()
    );
    again.shutdown().await;
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn users_are_blocked_and_unblocked_through_the_api() {
    let dir = std::env::temp_dir().join(format!("throttle-admin-block-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("limits.toml");
    std::fs::write(&path, "# no limits yet\n").unwrap();
    let central = start(&path).await;
    let http = central.http_addr().unwrap();
    let body = r#"{"until": "2030-01-01T00:00:00Z", "reason": "scraping"}"#;
    let (status, _) = call(http, "PUT", "/v1/blocks/front/mallory", body, false).await;
    assert_eq!(status, 401);
    let (status, block) = call(http, "PUT", "/v1/blocks/front/mallory", body, true).await;
    assert_eq!(status, 200, "{block}");
    let (status, all) = call(http, "GET", "/v1/blocks", "", true).await;
    assert_eq!(status, 200);
    let all: Value = serde_json::from_str(&all).unwrap();
    assert_eq!(all["blocks"]["front"]["mallory"]["active"], true, "{all}");
    assert_eq!(all["blocks"]["front"]["mallory"]["reason"], "scraping");
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(
        text.contains("[[block]]") && text.starts_with("# no limits yet"),
        "{text}"
    );
    let (status, why) = call(
        http,
        "PUT",
        "/v1/blocks/front/eve",
        r#"{"until": "soon"}"#,
        true,
    )
    .await;
    assert_eq!(status, 400, "{why}");
    let (status, _) = call(http, "DELETE", "/v1/blocks/front/mallory", "", true).await;
    assert_eq!(status, 204);
    let (status, _) = call(http, "DELETE", "/v1/blocks/front/mallory", "", true).await;
    assert_eq!(status, 404);
    central.shutdown().await;
    std::fs::remove_dir_all(&dir).unwrap();
}
