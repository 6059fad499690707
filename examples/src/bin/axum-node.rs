//! An axum app with `ThrottleLayer` on service `front`, reporting to one or
//! more central nodes.
//!
//! Run with: `cargo run -p throttle-examples --bin axum-node -- --central http://127.0.0.1:7075`
//!
//! Then: `curl -H 'x-user: alice' http://127.0.0.1:8080/`, `/download?bytes=N`,
//! `/db?reads=N`, or `curl -H 'x-user: bob' --data-binary @file http://127.0.0.1:8080/upload`;
//! `/metrics` has the node's metrics in Prometheus' text format.
//!
//! `--local-limit "10r/s burst=20 nodelay"` (repeatable) adds an nginx-style
//! limit decided on this node alone, on every route; `--redis
//! redis://127.0.0.1:6379 --shared-limit "100r/s burst=100"` one shared by
//! every node on that Redis (with `--no-central` for a fleet without one;
//! `--redis-cluster` with `--redis` naming nodes of a Redis Cluster).

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use throttle_examples::app;
use throttle_examples::node::ReporterArgs;
use throttle_examples::serve::serve;
use throttle_layer::Fallback;
use throttle_layer::bucket::RedisStore;
use throttle_layer::local::LocalLimit;

/// A demo app node throttled by throttle.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// Address to serve HTTP on.
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    #[command(flatten)]
    reporter: ReporterArgs,
    /// A limit decided on this node alone, in nginx's `limit_req` syntax
    /// (`"10r/s burst=20 nodelay"`, `"30r/m burst=5 delay=2"`), on every
    /// route, keyed by the user. Repeatable: all must pass.
    #[arg(
        long = "local-limit",
        env = "THROTTLE_LOCAL_LIMIT",
        value_delimiter = ';'
    )]
    local_limits: Vec<LocalLimit>,
    /// The Redis that holds the shared limits' buckets; with
    /// `--redis-cluster`, some nodes of a Redis Cluster, comma-separated.
    #[arg(long, env = "THROTTLE_REDIS", requires = "shared_limits")]
    redis: Option<String>,
    /// `--redis` names nodes of a Redis Cluster.
    #[arg(long, env = "THROTTLE_REDIS_CLUSTER", requires = "redis")]
    redis_cluster: bool,
    /// A limit shared by every node on the same `--redis`, in the syntax of
    /// `--local-limit` (its burst passes at once), on every route, keyed by
    /// the user. Repeatable: all must pass.
    #[arg(
        long = "shared-limit",
        env = "THROTTLE_SHARED_LIMIT",
        value_delimiter = ';',
        requires = "redis"
    )]
    shared_limits: Vec<LocalLimit>,
    /// How long a decision waits for Redis before letting the request pass.
    #[arg(long, default_value_t = 5)]
    redis_timeout_ms: u64,
    /// What a request is decided by while there is no quota for the slot
    /// (the central away, a standby taking over): `allow`, `deny`,
    /// `last-known-then-allow:SLOTS`, `last-known-then-deny:SLOTS`.
    #[arg(long, env = "THROTTLE_FALLBACK", default_value_t = Fallback::default())]
    fallback: Fallback,
    /// Report to no central node: the layer decides by its local and
    /// shared limits alone.
    #[arg(long)]
    no_central: bool,
    /// Seconds a kept-alive connection waits for its next request before
    /// it is closed gracefully.
    #[arg(long, env = "THROTTLE_IDLE_TIMEOUT", default_value_t = 60)]
    idle_timeout: u64,
    /// Log filter, e.g. `info` or `throttle_layer=debug`.
    #[arg(long, default_value = "info")]
    log: String,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    throttle_examples::logs::init(&args.log)?;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    let addr = listener.local_addr()?;
    let node_id = args.reporter.node_id(addr.port());
    let store = args.reporter.store()?;
    let metrics = throttle_examples::metrics::install()?;
    let redis = args
        .redis
        .as_deref()
        .map(|url| {
            let builder = match args.redis_cluster {
                true => RedisStore::cluster(url.split(',').map(str::trim)),
                false => RedisStore::builder(url),
            };
            builder
                .timeout(Duration::from_millis(args.redis_timeout_ms))
                .build()
        })
        .transpose()?;
    let limits = app::Limits {
        local: args.local_limits,
        shared: args.shared_limits,
        redis,
    };
    let router = app::router_with(&store, args.fallback, &limits)?
        .merge(throttle_examples::metrics::router(metrics));
    let _reporter = match args.no_central {
        true => None,
        false => Some(args.reporter.builder(&store, &node_id)?.spawn()?),
    };
    let central = match args.no_central {
        true => "none".to_owned(),
        false => args.reporter.centrals.join(", "),
    };
    println!("axum-node {node_id} listening on http://{addr} (central: {central})");
    let idle = Duration::from_secs(args.idle_timeout);
    serve(listener, router, idle, async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await?;
    Ok(())
}
