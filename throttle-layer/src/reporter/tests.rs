use std::time::Duration;

use super::builder::*;
use super::error::ReporterError;

#[test]
fn a_node_reports_at_a_fixed_point_of_the_spread() {
    let spread = Duration::from_millis(300);
    assert_eq!(spread_offset("node-a", Duration::ZERO), Duration::ZERO);
    let a = spread_offset("node-a", spread);
    assert!(a < spread);
    assert_eq!(a, spread_offset("node-a", spread), "the same at every slot");
    assert_ne!(a, spread_offset("node-b", spread));
    let one_ns = Duration::from_nanos(1);
    assert_eq!(spread_offset("node-a", one_ns), Duration::ZERO);
}

#[test]
fn a_fleet_falls_evenly_over_the_spread() {
    let spread = Duration::from_millis(300);
    let mut tenths = [0u32; 10];
    for n in 0..1000 {
        let at = spread_offset(&format!("node-{n}"), spread);
        tenths[(at.as_nanos() * 10 / spread.as_nanos()) as usize] += 1;
    }
    // 100 expected in each; binomial spread about 9.5.
    assert!(
        tenths.iter().all(|&t| (60..=140).contains(&t)),
        "{tenths:?}"
    );
}

#[test]
fn an_endpoint_without_a_scheme_is_refused_with_what_to_write() {
    let e = super::dial::endpoint("127.0.0.1:7075", Duration::from_secs(1), None);
    let e = e.expect_err("no scheme");
    assert_eq!(e, ReporterError::NoScheme("127.0.0.1:7075".into()));
    assert!(e.to_string().contains("write http://127.0.0.1:7075"), "{e}");
    assert!(super::dial::endpoint("http://127.0.0.1:7075", Duration::from_secs(1), None).is_ok());
}

#[tokio::test]
async fn a_failed_connect_says_why() {
    // A port nobody listens on: bound, then let go.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}");
    let channel = super::dial::endpoint(&url, Duration::from_secs(1), None)
        .unwrap()
        .connect()
        .await;
    let e = super::stream::OpenError::from(channel.expect_err("nobody listens"));
    let text = e.to_string().to_lowercase();
    assert!(text.contains("connection refused"), "{text}");
}
