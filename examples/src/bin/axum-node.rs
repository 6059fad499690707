//! An axum app with `ThrottleLayer` on service `front`, reporting to one or
//! more central nodes.
//!
//! Run with: `cargo run -p throttle-examples --bin axum-node -- --central http://127.0.0.1:7075`
//!
//! Then: `curl -H 'x-user: alice' http://127.0.0.1:8080/`, `/download?bytes=N`,
//! `/db?reads=N`, or `curl -H 'x-user: bob' --data-binary @file http://127.0.0.1:8080/upload`.

use std::net::SocketAddr;

use anyhow::Context;
use clap::Parser;
use throttle_examples::{app, default_node_id};
use throttle_layer::{Fallback, Reporter, SlotStore};

/// A demo app node throttled by throttle.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// Address to serve HTTP on.
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// Central node gRPC endpoint; repeat for several (the leader is found).
    #[arg(long = "central", default_value = "http://127.0.0.1:7075")]
    centrals: Vec<String>,
    /// Node id reported to the central node [default: host name and port].
    #[arg(long)]
    node_id: Option<String>,
    /// Spread a fleet's reports over this many milliseconds after the
    /// report delay, each node at its own point (0: all at once).
    #[arg(long, default_value_t = 0)]
    report_spread_ms: u64,
    /// Log filter, e.g. `info` or `throttle_layer=debug`.
    #[arg(long, default_value = "info")]
    log: String,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_new(&args.log).context("invalid --log")?,
        )
        .init();
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    let addr = listener.local_addr()?;
    let node_id = args.node_id.unwrap_or_else(|| default_node_id(addr.port()));
    let store = SlotStore::default();
    let router = app::router(&store, Fallback::Allow)?;
    let mut reporter = Reporter::builder(&store, &node_id)
        .report_spread(std::time::Duration::from_millis(args.report_spread_ms));
    for c in &args.centrals {
        reporter = reporter.central(c.clone());
    }
    let _reporter = reporter.spawn()?;
    println!(
        "axum-node {node_id} listening on http://{addr} (central: {})",
        args.centrals.join(", ")
    );
    axum::serve(
        listener,
        router.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await?;
    Ok(())
}
