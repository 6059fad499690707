//! The central's dashboard in a real headless Chromium: a central with a
//! bearer token and two real nodes on 127.0.0.1, alice offered six times
//! her limit and bob under his; the page, opened with the token, draws
//! both against their limits with alice's refusals, and lists the nodes and
//! the central's role. A screenshot goes to `target/tmp/dashboard.png`.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use throttle_central::Central;
use throttle_central::limits::{LimitSet, StaticLimits};
use throttle_central::usage::UsageConfig;
use throttle_clock::{Clock, SlotLength, SystemClock};
use throttle_examples::load::Load;
use throttle_layer::Fallback;
use throttle_test_servers::{Chromium, TempDir};
use throttle_tests::{CentralFactory, Cluster};

const TOKEN: &str = "dashboard-token";
const SLOT_MS: u32 = 100;

/// One test at a time: each runs its nodes, its load and Chromium on two
/// cores, and the first measures 100 ms slots.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const LIMITS: &str = r#"
[[limit]]
service = "front"
user = "alice"
per_second = { requests = 50 }
burst_seconds = 1

[[limit]]
service = "front"
user = "*"
per_second = { requests = 200 }
"#;

/// The opening tag of the first element with `marker` in it, and what
/// follows up to `end`.
fn element<'a>(dom: &'a str, marker: &str, end: &str) -> &'a str {
    let at = dom
        .find(marker)
        .unwrap_or_else(|| panic!("no {marker} in {dom}"));
    let start = dom[..at].rfind('<').unwrap_or(at);
    let stop = dom[at..].find(end).map_or(dom.len(), |e| at + e);
    &dom[start..stop]
}

/// The value of attribute `name` in the first tag of `html`.
fn attr<'a>(html: &'a str, name: &str) -> &'a str {
    let tag = &html[..html.find('>').unwrap_or(html.len())];
    let key = format!(" {name}=\"");
    let at = tag
        .find(&key)
        .unwrap_or_else(|| panic!("no {name} in {tag}"))
        + key.len();
    &tag[at..at + tag[at..].find('"').unwrap_or(0)]
}

fn number(html: &str, name: &str) -> f64 {
    attr(html, name)
        .parse()
        .unwrap_or_else(|_| panic!("{name} in {html}"))
}

/// A central with `LIMITS` and the token, two nodes connected to it, and
/// a load on them.
async fn central_and_two_nodes() -> (Cluster, Load) {
    let limits = Arc::new(StaticLimits::new(LimitSet::from_toml(LIMITS).unwrap()));
    let central: CentralFactory =
        Arc::new(move || Central::builder().limits(limits.clone()).http_token(TOKEN));
    let cluster = Cluster::start_with(2, SLOT_MS, central, Fallback::default())
        .await
        .unwrap();
    cluster.connected().await;
    let load = Load::new(cluster.nodes.iter().map(|n| n.addr).collect(), "/");
    (cluster, load)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_draws_users_against_their_limits_and_the_nodes() {
    let test = "the_dashboard_draws_users_against_their_limits_and_the_nodes";
    let _one = ONE_AT_A_TIME.lock().await;
    let (Some(browser), Some(stranger)) = (Chromium::start(test), Chromium::start(test)) else {
        return;
    };
    let (cluster, load) = central_and_two_nodes().await;
    load.flow("alice", 0, 150.0);
    load.flow("alice", 1, 150.0);
    load.flow("bob", 1, 40.0);
    let running = tokio::spawn(async move { load.run(Duration::from_secs(6)).await });
    cluster.slots(20).await;
    let http = cluster.central.as_ref().unwrap().http_addr().unwrap();
    let page = format!("http://{http}/dashboard");
    let settle = Duration::from_millis(2500);

    let (with_token, without) = (format!("{page}#token={TOKEN}"), page.clone());
    let dom = tokio::task::spawn_blocking(move || browser.dom(&with_token, settle));
    let refused = tokio::task::spawn_blocking(move || stranger.dom(&without, settle));
    let (dom, refused) = (dom.await.unwrap(), refused.await.unwrap());

    let status = element(&dom, "id=\"status\"", "</span>");
    assert_eq!(attr(status, "data-state"), "ok", "{status}");
    assert_eq!(
        attr(element(&dom, "id=\"role\"", ">"), "data-role"),
        "single"
    );
    assert!(dom.contains("data-service=\"front\""), "{dom}");
    // alice: limited to 5 a slot, offered 30, refused more than admitted.
    let alice = element(&dom, "data-user=\"alice\"", "</article>");
    assert_eq!(number(alice, "data-limit-per-slot"), 5.0, "{alice}");
    let (admitted, refusals) = (
        number(alice, "data-admitted"),
        number(alice, "data-refused"),
    );
    assert!(admitted > 0.0 && refusals > admitted, "{alice}");
    assert!(admitted <= 5.0 * 60.0 + 50.0, "over her limit: {alice}");
    let line = element(alice, "class=\"admitted\"", ">");
    assert_eq!(attr(line, "points").split(' ').count(), 60, "{line}");
    assert!(alice.contains("class=\"limit\""), "{alice}");
    // bob: under the `*` rule's 20 a slot, never refused.
    let bob = element(&dom, "data-user=\"bob\"", "</article>");
    assert_eq!(number(bob, "data-limit-per-slot"), 20.0, "{bob}");
    assert!(number(bob, "data-admitted") > 0.0, "{bob}");
    assert_eq!(number(bob, "data-refused"), 0.0, "{bob}");
    let refusals_table = element(&dom, "class=\"refusals\"", "</table>");
    assert!(
        refusals_table.contains("data-user=\"alice\""),
        "{refusals_table}"
    );
    assert!(
        !refusals_table.contains("data-user=\"bob\""),
        "{refusals_table}"
    );
    // Both nodes, each with a report of one of the last few slots.
    let slots = SlotLength::from_ms(SLOT_MS).unwrap();
    let now_slot = slots.slot_at(SystemClock.now_ms());
    for node in ["node-1", "node-2"] {
        let row = element(&dom, &format!("data-node=\"{node}\""), "</tr>");
        let last = number(element(row, "data-last-slot", "</td>"), "data-last-slot") as i64;
        assert!(now_slot - last <= 20, "{row}: now slot {now_slot}");
        assert!(row.contains("s ago"), "{row}");
    }
    // Without the token the page says what to do, and shows no data.
    let status = element(&refused, "id=\"status\"", "</span>");
    assert_eq!(attr(status, "data-state"), "error", "{status}");
    assert!(status.contains("needs its token"), "{status}");
    assert!(!refused.contains("data-user="), "{refused}");

    let shot = Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard.png");
    let browser = Chromium::start(test).unwrap();
    let url = format!("{page}#token={TOKEN}");
    let saved = shot.clone();
    tokio::task::spawn_blocking(move || browser.screenshot(&url, settle, (1280, 900), &saved))
        .await
        .unwrap();
    eprintln!("dashboard screenshot: {}", shot.display());
    running.await.unwrap();
}

/// 10,000 light users, each admitted one request a second through the
/// nodes' stores (as the layer admits them), beside six heavy users
/// offered 40 requests a second each over HTTP: the dashboard draws the
/// six heavy ones, with the central's latest slots.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_draws_the_heaviest_of_ten_thousand_users() {
    let test = "the_dashboard_draws_the_heaviest_of_ten_thousand_users";
    let _one = ONE_AT_A_TIME.lock().await;
    let Some(browser) = Chromium::start(test) else {
        return;
    };
    let (cluster, load) = central_and_two_nodes().await;
    let heavy: Vec<String> = (0..6).map(|i| format!("heavy-{i}")).collect();
    for (i, user) in heavy.iter().enumerate() {
        load.flow(user, i % 2, 40.0);
    }
    let running = tokio::spawn(async move { load.run(Duration::from_secs(18)).await });
    // A tenth of the light users each slot: every one of them once a
    // second, all 10,000 active in the window.
    let stores: Vec<_> = cluster
        .nodes
        .iter()
        .map(|n| n.store.service("front"))
        .collect();
    let light = tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(SLOT_MS.into()));
        for round in 0..180usize {
            tick.tick().await;
            for u in (round % 10..10_000).step_by(10) {
                let store = &stores[u % 2];
                let requests = store.resource("requests").unwrap();
                store.admit(&format!("light-{u:05}"), &[(requests, 1)], Fallback::Allow);
            }
        }
    });
    cluster.slots(65).await;
    let http = cluster.central.as_ref().unwrap().http_addr().unwrap();
    let url = format!("http://{http}/dashboard#token={TOKEN}");
    let page = url.clone();
    let dom = tokio::task::spawn_blocking(move || browser.dom(&page, Duration::from_millis(2500)))
        .await
        .unwrap();
    let status = element(&dom, "id=\"status\"", "</span>");
    assert_eq!(attr(status, "data-state"), "ok", "{status}");
    let drawn: Vec<&str> = dom
        .split("<article ")
        .skip(1)
        .map(|a| attr(&a[..a.find('>').unwrap_or(a.len())], "data-user"))
        .collect();
    let mut sorted = drawn.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, heavy, "the six heavy users, of 10,006: {drawn:?}");
    // Current: the slot drawn last is one of the last few.
    let legend = element(&dom, "class=\"legend\"", "</p>");
    let to: i64 = legend
        .split("to slot ")
        .nth(1)
        .and_then(|s| s.split(')').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("{legend}"));
    assert!(cluster.current_slot() - to <= 20, "{legend}");
    for user in &heavy {
        let card = element(&dom, &format!("data-user=\"{user}\""), "</article>");
        assert!(number(card, "data-admitted") >= 100.0, "{card}");
    }
    let shot = Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard-10k.png");
    let browser = Chromium::start(test).unwrap();
    let saved = shot.clone();
    let settle = Duration::from_millis(2500);
    tokio::task::spawn_blocking(move || browser.screenshot(&url, settle, (1280, 900), &saved))
        .await
        .unwrap();
    eprintln!("dashboard screenshot: {}", shot.display());
    light.await.unwrap();
    running.await.unwrap();
}

/// A central keeping usage in SQLite, two nodes, alice offered three
/// times her limit for 3 s: the dashboard opened on her
/// (`#service=front&user=alice`) draws her last day hour by hour, with as
/// many admitted as the load was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_draws_a_users_last_day_of_usage() {
    let test = "the_dashboard_draws_a_users_last_day_of_usage";
    let _one = ONE_AT_A_TIME.lock().await;
    let Some(browser) = Chromium::start(test) else {
        return;
    };
    let dir = TempDir::new("dashboard-usage");
    let db = format!("sqlite:{}", dir.path().join("usage.db").display());
    let limits = Arc::new(StaticLimits::new(LimitSet::from_toml(LIMITS).unwrap()));
    let central: CentralFactory = Arc::new(move || {
        let usage = UsageConfig::open(&db).expect("the usage store opens");
        Central::builder()
            .limits(limits.clone())
            .http_token(TOKEN)
            .usage(usage)
    });
    let cluster = Cluster::start_with(2, SLOT_MS, central, Fallback::default())
        .await
        .unwrap();
    cluster.connected().await;
    let load = Load::new(cluster.nodes.iter().map(|n| n.addr).collect(), "/");
    load.flow("alice", 0, 75.0);
    load.flow("alice", 1, 75.0);
    load.run(Duration::from_secs(3)).await;
    // The last reports, then the writer's quarter second.
    cluster.slots(10).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let tallies = load.tallies();
    let admitted: u64 = tallies
        .values()
        .flat_map(|r| r.values())
        .map(|t| t.admitted)
        .sum();
    let rejected: u64 = tallies
        .values()
        .flat_map(|r| r.values())
        .map(|t| t.rejected)
        .sum();
    assert!(
        admitted > 0 && rejected > 0,
        "admitted {admitted}, rejected {rejected}"
    );

    let http = cluster.central.as_ref().unwrap().http_addr().unwrap();
    let page = format!("http://{http}/dashboard#token={TOKEN}&service=front&user=alice");
    let settle = Duration::from_millis(2500);
    let dom = tokio::task::spawn_blocking(move || browser.dom(&page, settle))
        .await
        .unwrap();
    let usage = element(&dom, "class=\"usage\"", "</article>");
    assert_eq!(attr(usage, "data-resource"), "requests", "{usage}");
    assert_eq!(number(usage, "data-admitted"), admitted as f64, "{usage}");
    assert_eq!(number(usage, "data-refused"), rejected as f64, "{usage}");
    let hours = number(usage, "data-hours");
    assert_eq!(hours, 24.0, "{usage}");
    assert_eq!(
        usage.matches("class=\"admitted-bar\"").count(),
        24,
        "{usage}"
    );
    assert!(dom.contains("Usage of alice in front"), "{dom}");
}
