//! The whole system in one process: a central node with demo limits, three
//! app nodes on ephemeral ports, and a load generator offering well over the
//! limit, skewed across the nodes and shifting midway. Prints a live table
//! per second and a summary.
//!
//! Run with: `cargo run --release -p throttle-examples --bin quickstart`

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use throttle_central::Central;
use throttle_central::limits::{LimitSet, StaticLimits};
use throttle_examples::app;
use throttle_examples::load::{Load, Tallies, Tally, unix_second};
use throttle_layer::{Fallback, Reporter, SlotStore};

/// Runs a central node, three app nodes and a load generator, and shows
/// what each user was admitted against their limit.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// How long to run the load, in seconds.
    #[arg(long, default_value_t = 20)]
    seconds: u64,
    /// Requests per second alice offers (her limit is 200/s).
    #[arg(long, default_value_t = 500.0)]
    offered: f64,
    /// Log filter. The reporters' complaints when the central node goes
    /// away at the end, and the central's warning that it checks no node
    /// keys, are expected here, hence quiet by default.
    #[arg(
        long,
        default_value = "warn,throttle_layer::reporter=error,throttle_central::central=error"
    )]
    log: String,
}

const NODES: usize = 3;
const HEAVY: &str = "alice";
const HEAVY_LIMIT: f64 = 200.0;
const LIGHT: &str = "bob";
const LIGHT_LIMIT: f64 = 50.0;
const LIGHT_OFFERED: f64 = 30.0;
/// Seconds left out of the summary while the first quotas arrive.
const WARM_UP: usize = 3;

fn demo_limits() -> anyhow::Result<LimitSet> {
    let toml = format!(
        "[[limit]]\nservice = \"{s}\"\nuser = \"{HEAVY}\"\nper_second = {{ requests = {HEAVY_LIMIT} }}\nburst_seconds = 2\n\n\
         [[limit]]\nservice = \"{s}\"\nuser = \"{LIGHT}\"\nper_second = {{ requests = {LIGHT_LIMIT} }}\n",
        s = app::SERVICE
    );
    Ok(LimitSet::from_toml(&toml)?)
}

async fn start_node(central: SocketAddr, i: usize) -> anyhow::Result<SocketAddr> {
    let store = SlotStore::default();
    let router = app::router(&store, Fallback::default())?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let reporter = Reporter::builder(&store, &format!("node-{}", i + 1))
        .central(format!("http://{central}"))
        .spawn()?;
    tokio::spawn(async move {
        let _reporter = reporter;
        if let Err(e) = axum::serve(listener, router).await {
            eprintln!("node {} failed: {e}", i + 1);
        }
    });
    Ok(addr)
}

fn sum(row: &std::collections::BTreeMap<(String, usize), Tally>, user: &str) -> Tally {
    row.iter()
        .filter(|((u, _), _)| u == user)
        .fold(Tally::default(), |mut a, (_, t)| {
            a.offered += t.offered;
            a.admitted += t.admitted;
            a.rejected += t.rejected;
            a.errors += t.errors;
            a
        })
}

/// Prints the row of `second` (seconds since the load started), marked if
/// the load shifted during it.
fn print_row(second: i64, row: &std::collections::BTreeMap<(String, usize), Tally>, shift: bool) {
    let heavy = sum(row, HEAVY);
    let light = sum(row, LIGHT);
    let per_node: Vec<String> = (0..NODES)
        .map(|n| {
            format!(
                "{:>6}",
                row.get(&(HEAVY.to_owned(), n)).map_or(0, |t| t.admitted)
            )
        })
        .collect();
    println!(
        "{second:>6} {:>8} {:>9} {:>6} {} {:>9} {:>9}{}",
        heavy.offered,
        heavy.admitted,
        HEAVY_LIMIT,
        per_node.join(" "),
        heavy.rejected,
        light.rejected,
        if shift { "   <- load shifts" } else { "" },
    );
}

/// Prints the rows of `tallies` after `printed` up to the last complete
/// second (`upto`, not included), the first (partial) second left out.
fn print_rows(tallies: &Tallies, start: i64, shift: Option<i64>, printed: &mut i64, upto: i64) {
    for (&second, row) in tallies.range(*printed + 1..upto) {
        if second > start {
            print_row(second - start, row, Some(second) == shift);
        }
        *printed = second;
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    // Reporters warn when the central node goes away at the end: expected here.
    throttle_examples::logs::init(&args.log)?;
    let grpc = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let http = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let central = Central::builder()
        .limits(Arc::new(StaticLimits::new(demo_limits()?)))
        .spawn(grpc, Some(http))
        .context("starting the central node")?;
    let mut nodes = Vec::new();
    for i in 0..NODES {
        nodes.push(start_node(central.grpc_addr(), i).await?);
    }
    let http = central
        .http_addr()
        .map_or_else(String::new, |a| a.to_string());
    println!(
        "central node: grpc {}  dashboard http://{http}/dashboard",
        central.grpc_addr()
    );
    for (i, n) in nodes.iter().enumerate() {
        println!("node-{}: http://{n}/", i + 1);
    }
    println!(
        "{HEAVY} offers {} req/s (limit {HEAVY_LIMIT}) split 60/30/10 over the nodes, 10/30/60 after {} s; \
         {LIGHT} offers {LIGHT_OFFERED} req/s (limit {LIGHT_LIMIT}).\n\
         t is seconds since the load started (the partial first and last seconds left out); \
         {HEAVY}'s bucket holds 2 s of her rate, so her first second may pass her limit.\n",
        args.offered,
        args.seconds / 2
    );
    println!(
        "{:>6} {:>8} {:>9} {:>6} {:>6} {:>6} {:>6} {:>9} {:>9}",
        "t (s)",
        "offered",
        "admitted",
        "limit",
        "node-1",
        "node-2",
        "node-3",
        "rejected",
        "bob-rej"
    );

    let load = Load::new(nodes, "/");
    let skew = [0.6, 0.3, 0.1];
    let heavy: Vec<_> = (0..NODES)
        .map(|n| load.flow(HEAVY, n, args.offered * skew[n]))
        .collect();
    for n in 0..NODES {
        load.flow(LIGHT, n, LIGHT_OFFERED / NODES as f64);
    }
    let start = unix_second();
    let runner = {
        let load = load.clone();
        let seconds = args.seconds;
        tokio::spawn(async move { load.run(Duration::from_secs(seconds)).await })
    };
    let (mut printed, mut shift) = (start - 1, None);
    for s in 0..args.seconds {
        tokio::time::sleep(Duration::from_secs(1)).await;
        if s + 1 == args.seconds / 2 {
            for (n, f) in heavy.iter().enumerate() {
                f.set_rate(args.offered * skew[NODES - 1 - n]);
            }
            // The row that shows it: the second most of the change falls in.
            let ms = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as i64);
            shift = Some((ms + 500) / 1000);
        }
        // A second is complete once the next one has started.
        print_rows(&load.tallies(), start, shift, &mut printed, unix_second());
    }
    runner.await?;
    // The second the load ended in is partial: left out.
    let tallies: Tallies = load.tallies();
    let last = tallies.keys().next_back().copied().unwrap_or(start);
    print_rows(&tallies, start, shift, &mut printed, last);
    summary(&tallies);
    central.shutdown().await;
    println!(
        "\nThe dashboard at http://{http}/dashboard drew this while it ran (--seconds 120 \
         to look longer). Next: docs/guides/central.md runs the central \
         and a node as programs, with your own limits."
    );
    Ok(())
}

fn summary(tallies: &Tallies) {
    // Full seconds only: drop the partial first and last ones and the warm-up.
    let rows: Vec<_> = tallies.values().collect();
    let steady = rows
        .get(WARM_UP + 1..rows.len().saturating_sub(1))
        .unwrap_or(&[]);
    let admitted: u64 = steady.iter().map(|r| sum(r, HEAVY).admitted).sum();
    let errors: u64 = rows
        .iter()
        .map(|r| sum(r, HEAVY).errors + sum(r, LIGHT).errors)
        .sum();
    let light_rejected: u64 = rows.iter().map(|r| sum(r, LIGHT).rejected).sum();
    let limit = HEAVY_LIMIT * steady.len() as f64;
    println!();
    println!(
        "summary over {} full seconds after a {WARM_UP} s warm-up:",
        steady.len()
    );
    if limit > 0.0 {
        println!(
            "  {HEAVY}: admitted {admitted} against a limit of {limit:.0}: {:.1}% of the limit",
            100.0 * admitted as f64 / limit
        );
    }
    println!("  {LIGHT} (under its limit): {light_rejected} requests refused (expected 0)");
    if errors > 0 {
        println!("  transport errors: {errors}");
    }
}
