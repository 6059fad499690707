//! `throttle-central`: the central node as a program.
//!
//! Run with: `cargo run -p throttle-central -- --limits examples/limits.toml`

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use clap::builder::TypedValueParser;
use throttle_central::ha::election::{ElectionConfig, Running};
use throttle_central::ha::state::{EtcdState, FileState, StateStore};
use throttle_central::keys::NodeKeys;
use throttle_central::limits::{DEFAULT_POLICY_NAMES, EtcdLimits, FileLimits, UnknownPolicy};
use throttle_central::net::{ConnectionLimits, ServerTls};
use throttle_central::usage::{DEFAULT_BUFFER, Retention, UsageConfig};
use throttle_central::{Central, CentralBuilder};
use throttle_clock::SlotLength;

/// jemalloc, which gives freed pages back to the system within seconds,
/// where glibc's malloc kept most of the memory of users once forgotten
/// (`central-churn` in `docs/performance.md`).
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Has jemalloc give freed pages back to the system on time, from a
/// thread of its own, rather than only when the arena that freed them
/// allocates again (a central whose users left allocates little).
fn return_memory_on_time() {
    #[cfg(not(target_env = "msvc"))]
    if let Err(e) = tikv_jemalloc_ctl::background_thread::write(true) {
        tracing::warn!(error = %e, "jemalloc's background thread did not start; freed memory goes back more slowly");
    }
}

/// Central node of throttle: holds one token bucket per (service, user,
/// resource), takes the nodes' reports over gRPC and sends each node its
/// share of what is left.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// gRPC address nodes connect to.
    #[arg(
        long,
        env = "THROTTLE_CENTRAL_LISTEN",
        default_value = "127.0.0.1:7075"
    )]
    listen: SocketAddr,
    /// HTTP address of the monitor API, /metrics and /healthz.
    #[arg(long, env = "THROTTLE_CENTRAL_HTTP", default_value = "127.0.0.1:7076")]
    http: SocketAddr,
    /// Address of the legacy nodes' WebSocket (lua-resty-throttle in
    /// nginx: `wss://ADDR/throttle`, over TLS with --tls-cert, their URLs
    /// signed with --node-keys). Not served without it.
    #[arg(long, env = "THROTTLE_CENTRAL_LEGACY_LISTEN")]
    legacy_listen: Option<SocketAddr>,
    /// Seconds an Envoy proxy keeps an RLQS assignment not sent again:
    /// once the central is gone, its `no_assignment_behavior` applies
    /// this long after the last one (6 to 3600).
    #[arg(long, env = "THROTTLE_CENTRAL_RLQS_TTL_SECONDS", default_value_t = 15, value_parser = clap::value_parser!(u64).range(6..=3600))]
    rlqs_ttl_seconds: u64,
    /// TOML file of limits, reloaded when it changes; or `etcd:///KEY`
    /// (with `--etcd`): the same document kept in etcd at KEY, watched, so
    /// every central reads the same. Without it nobody is limited (every
    /// request is allowed) but consumption is still summed.
    #[arg(long, env = "THROTTLE_CENTRAL_LIMITS")]
    limits: Option<String>,
    /// Slot length in milliseconds; every node must use the same.
    #[arg(long, env = "THROTTLE_CENTRAL_SLOT_MS", default_value_t = 1000)]
    slot_ms: u32,
    /// Slots of history kept for sums, distribution and quotas.
    #[arg(long, env = "THROTTLE_CENTRAL_NR_SLOT", default_value_t = 60)]
    nr_slot: u32,
    /// Quota policy of every service the limits file sets none for
    /// (`[service.NAME] policy = ...`): `projected` (default; see
    /// docs/accuracy.md), `classic` (the legacy system's algorithm, exactly) or
    /// `static-split` (the rate divided evenly between the nodes). A
    /// service's `capacity` in the limits file selects `hierarchical`.
    #[arg(long, env = "THROTTLE_CENTRAL_POLICY", default_value = "projected", value_parser = policy_name)]
    policy: String,
    /// File holding the bearer token every HTTP route but /healthz then
    /// requires (`Authorization: Bearer <token>`).
    #[arg(long, env = "THROTTLE_CENTRAL_HTTP_TOKEN_FILE")]
    http_token_file: Option<PathBuf>,
    /// TOML file of node keys (`[[key]] access_key, secret_key, node_ids`),
    /// reloaded when it changes. With it a node must sign its stream with
    /// one of them; without it any process is accepted as a node.
    #[arg(long, env = "THROTTLE_CENTRAL_NODE_KEYS")]
    node_keys: Option<PathBuf>,
    /// Largest amount a node may report for one (user, resource) in one
    /// slot; an entry above it is dropped and the rest of the report filed.
    #[arg(long, env = "THROTTLE_CENTRAL_MAX_AMOUNT", default_value_t = throttle_central::MAX_AMOUNT, value_parser = clap::value_parser!(i64).range(1..))]
    max_amount: i64,
    /// Most (user, resource) keys the ledger holds over every service; a
    /// new one past it is dropped from its report and counted.
    #[arg(long, env = "THROTTLE_CENTRAL_MAX_KEYS", default_value_t = throttle_central::MAX_KEYS, value_parser = clap::value_parser!(u64).range(1..).map(|n| n as usize))]
    max_keys: usize,
    /// Most services the central tracks; a node's service past it gets no
    /// quotas (the node fails open there).
    #[arg(long, env = "THROTTLE_CENTRAL_MAX_SERVICES", default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..).map(|n| n as usize))]
    max_services: usize,
    /// Most users one report may carry; a larger report is refused whole.
    #[arg(long, env = "THROTTLE_CENTRAL_MAX_USERS_PER_REPORT", default_value_t = 1_000_000, value_parser = clap::value_parser!(u64).range(1..).map(|n| n as usize))]
    max_users_per_report: usize,
    /// PEM certificate chain: both servers then speak TLS only.
    #[arg(long, env = "THROTTLE_CENTRAL_TLS_CERT", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, env = "THROTTLE_CENTRAL_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// PEM CA certificate: nodes must then show a client certificate that
    /// chains to it (mutual TLS). Needs --tls-cert.
    #[arg(long, env = "THROTTLE_CENTRAL_TLS_CLIENT_CA", requires = "tls_cert")]
    tls_client_ca: Option<PathBuf>,
    /// Most node connections open at once; past it new ones wait in the
    /// listen queue.
    #[arg(long, env = "THROTTLE_CENTRAL_MAX_NODE_CONNECTIONS", default_value_t = 4096, value_parser = clap::value_parser!(u32).range(1..))]
    max_node_connections: u32,
    /// etcd's client URLs, comma-separated: elect one leader among the
    /// centrals of one `--election` (without it, this central leads alone).
    #[arg(
        long,
        env = "THROTTLE_CENTRAL_ETCD",
        value_delimiter = ',',
        requires = "advertise"
    )]
    etcd: Vec<String>,
    /// The gRPC address nodes dial to reach this central
    /// (`http://10.0.0.2:7075`), told by standbys to nodes.
    #[arg(long, env = "THROTTLE_CENTRAL_ADVERTISE")]
    advertise: Option<String>,
    /// The election's name: centrals of one name elect one leader.
    #[arg(long, env = "THROTTLE_CENTRAL_ELECTION", default_value = "default")]
    election: String,
    /// The leader's etcd lease TTL, in seconds: how long the centrals go
    /// without a leader after the leader dies.
    #[arg(long, env = "THROTTLE_CENTRAL_LEASE_TTL", default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=600))]
    lease_ttl: u64,
    /// Where the leader keeps its checkpoint (bucket levels, debts
    /// included), so that a restart or a failover hands nobody a fresh
    /// burst: a file path, or `etcd` (with `--etcd`) for centrals that take
    /// over from one another. Without it, buckets start anew.
    #[arg(long, env = "THROTTLE_CENTRAL_STATE")]
    state: Option<String>,
    /// Time between two checkpoints, in milliseconds.
    #[arg(long, env = "THROTTLE_CENTRAL_CHECKPOINT_MS", default_value_t = 1000, value_parser = clap::value_parser!(u64).range(10..=60_000))]
    checkpoint_ms: u64,
    /// Keep every user's usage per minute, hour and day: `sqlite:PATH`
    /// (a file, for a lone central) or `postgres://user@host:port/db` (for
    /// centrals that take over from one another: the leader writes).
    /// Queried at `GET /v1/usage` and `/v1/usage/top`.
    #[arg(long, env = "THROTTLE_CENTRAL_USAGE")]
    usage: Option<String>,
    /// How long usage rows are kept: minutes,hours,days (e.g. `7d,90d,730d`).
    #[arg(long, env = "THROTTLE_CENTRAL_USAGE_RETENTION", default_value = "7d,90d,730d", value_parser = retention)]
    usage_retention: Retention,
    /// Most usage entries kept in memory while the usage store cannot be
    /// written; past it, entries are counted as lost.
    #[arg(long, env = "THROTTLE_CENTRAL_USAGE_BUFFER", default_value_t = DEFAULT_BUFFER, value_parser = clap::value_parser!(u64).range(1..).map(|n| n as usize))]
    usage_buffer: usize,
    /// Log filter in tracing's syntax, e.g. `info` or `throttle_central=debug`.
    #[arg(long, env = "THROTTLE_CENTRAL_LOG", default_value = "info")]
    log: String,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let shutdown = shutdown_signal()?;
    // Logs go to stderr, coloured only on a terminal.
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_new(&args.log).context("invalid --log filter")?,
        )
        .init();
    return_memory_on_time();
    let metrics = metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .context("installing the Prometheus recorder")?;
    let slot = SlotLength::from_ms(args.slot_ms).context("invalid --slot-ms")?;
    tracing::info!(policy = %args.policy, "quota policy");
    let mut builder = Central::builder()
        .slot(slot)
        .nr_slot(args.nr_slot)
        .max_amount(args.max_amount)
        .max_keys(args.max_keys)
        .max_services(args.max_services)
        .max_users_per_report(args.max_users_per_report)
        .default_policy(&args.policy)?
        .metrics(metrics);
    if let Some(path) = &args.http_token_file {
        let token = std::fs::read_to_string(path)
            .with_context(|| format!("reading the HTTP token from {}", path.display()))?;
        let token = token.trim();
        anyhow::ensure!(
            !token.is_empty(),
            "the HTTP token file {} is empty",
            path.display()
        );
        builder = builder.http_token(token);
    }
    builder = builder.connection_limits(ConnectionLimits {
        max_node_connections: args.max_node_connections as usize,
        ..ConnectionLimits::default()
    });
    if let (Some(cert), Some(key)) = (&args.tls_cert, &args.tls_key) {
        let tls =
            ServerTls::read(cert, key, args.tls_client_ca.as_deref()).context("setting up TLS")?;
        let mtls = tls.requires_client_certificates();
        tracing::info!(cert = %cert.display(), mutual = mtls, "TLS on gRPC and HTTP");
        builder = builder.tls(tls);
    }
    if let Some(path) = &args.node_keys {
        let keys = NodeKeys::open(path)
            .with_context(|| format!("loading node keys from {}", path.display()))?;
        tracing::info!(path = %path.display(), keys = keys.current().len(), "node keys");
        builder = builder.node_keys(Arc::new(keys));
    }
    builder = limits(&args, builder).await?;
    let grpc = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding gRPC address {}", args.listen))?;
    let http = tokio::net::TcpListener::bind(args.http)
        .await
        .with_context(|| format!("binding HTTP address {}", args.http))?;
    builder = builder.rlqs_ttl(std::time::Duration::from_secs(args.rlqs_ttl_seconds));
    if let Some(addr) = args.legacy_listen {
        let legacy = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("binding the legacy address {addr}"))?;
        builder = builder.legacy_listener(legacy);
    }
    let election = election(&args)?;
    if let Some(running) = &election {
        builder = builder.leadership(running.elected.clone());
    }
    if let Some(store) = state(&args, election.as_ref())? {
        tracing::info!(
            store = store.describe(),
            every_ms = args.checkpoint_ms,
            "checkpoints"
        );
        builder = builder
            .state(store)
            .checkpoint_every(std::time::Duration::from_millis(args.checkpoint_ms));
    }
    if let Some(url) = args.usage.clone() {
        // The PostgreSQL client blocks: opened off the async tasks.
        let opened = tokio::task::spawn_blocking(move || UsageConfig::open(&url)).await?;
        let mut usage = opened.with_context(|| "opening the --usage store")?;
        usage.retention = args.usage_retention;
        usage.buffer = args.usage_buffer;
        tracing::info!(store = args.usage.as_deref(), retention = ?usage.retention, "usage kept");
        builder = builder.usage(usage);
    }
    let central = builder.spawn(grpc, Some(http))?;
    shutdown.await;
    tracing::info!("shutting down");
    // The last checkpoint is written while this central still leads.
    central.shutdown().await;
    if let Some(running) = election {
        running.resign().await;
    }
    Ok(())
}

/// `builder` with the limits of `--limits`: a file, or a key in etcd.
async fn limits(args: &Args, builder: CentralBuilder) -> anyhow::Result<CentralBuilder> {
    let Some(limits) = &args.limits else {
        tracing::warn!("no --limits given: nobody is limited, every request is allowed");
        return Ok(builder);
    };
    let Some(rest) = limits.strip_prefix("etcd://") else {
        let file =
            FileLimits::open(limits).with_context(|| format!("loading limits from {limits}"))?;
        tracing::info!(path = %limits, entries = file.current().len(), "limits loaded");
        return Ok(builder.limits_file(Arc::new(file)));
    };
    anyhow::ensure!(
        rest.starts_with('/') && rest.len() > 1,
        "--limits {limits:?}: write etcd:///KEY (three slashes: the endpoints come from --etcd)"
    );
    anyhow::ensure!(
        !args.etcd.is_empty(),
        "--limits {limits:?} needs --etcd: the endpoints of the etcd that keeps them"
    );
    let etcd = EtcdLimits::open(args.etcd.clone(), rest)
        .await
        .with_context(|| format!("loading limits from {limits}"))?;
    tracing::info!(key = %rest, entries = etcd.current().len(), "limits loaded from etcd");
    Ok(builder.limits_etcd(Arc::new(etcd)))
}

/// `--usage-retention`: three durations, minutes,hours,days.
fn retention(text: &str) -> Result<Retention, String> {
    let parts: Vec<&str> = text.split(',').map(str::trim).collect();
    let [minutes, hours, days] = parts[..] else {
        return Err(format!(
            "{text:?}: expected minutes,hours,days such as 7d,90d,730d"
        ));
    };
    let parse = |p: &str| humantime::parse_duration(p).map_err(|e| format!("{p:?}: {e}"));
    Ok(Retention {
        minutes: parse(minutes)?,
        hours: parse(hours)?,
        days: parse(days)?,
        ..Retention::default()
    })
}

/// The checkpoint's store, with `--state`.
fn state(args: &Args, election: Option<&Running>) -> anyhow::Result<Option<Arc<dyn StateStore>>> {
    let Some(state) = &args.state else {
        return Ok(None);
    };
    if state != "etcd" {
        return Ok(Some(Arc::new(FileState::new(state))));
    }
    let Some(running) = election else {
        anyhow::bail!("--state etcd needs --etcd: the checkpoint lives beside the election");
    };
    let store = EtcdState::new(args.etcd.clone(), &args.election, running.elected.clone());
    Ok(Some(Arc::new(store)))
}

/// The campaign for leadership, with `--etcd`.
fn election(args: &Args) -> anyhow::Result<Option<Running>> {
    if args.etcd.is_empty() {
        return Ok(None);
    }
    let advertise = args.advertise.as_deref().unwrap_or_default();
    anyhow::ensure!(
        advertise.starts_with("http://") || advertise.starts_with("https://"),
        "--advertise must be a URL nodes can dial, such as http://10.0.0.2:7075, not {advertise:?}"
    );
    let config = ElectionConfig {
        endpoints: args.etcd.clone(),
        name: args.election.clone(),
        ttl: std::time::Duration::from_secs(args.lease_ttl),
    };
    tracing::info!(etcd = ?args.etcd, election = %args.election, %advertise, "leader election on etcd");
    Ok(Some(Running::start(config, advertise)))
}

/// Resolves on SIGINT or SIGTERM. The handlers are registered when this is
/// created, not when first polled, so a signal that arrives while the central
/// is starting is not lost to the default action.
fn shutdown_signal() -> anyhow::Result<impl std::future::Future<Output = ()>> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
        let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
        Ok(async move {
            tokio::select! {
                _ = int.recv() => {}
                _ = term.recv() => {}
            }
        })
    }
    #[cfg(not(unix))]
    Ok(async {
        let _ = tokio::signal::ctrl_c().await;
    })
}

/// A `--policy` name: one that can apply to every service.
fn policy_name(name: &str) -> Result<String, String> {
    if DEFAULT_POLICY_NAMES.contains(&name) {
        Ok(name.to_owned())
    } else {
        Err(UnknownPolicy(name.to_owned()).to_string())
    }
}
