//! A tonic gRPC server (`hello.v1.Greeter`) behind `ThrottleLayer`, the user
//! taken from the `x-user` metadata key; with `--client` it calls such a
//! server instead and prints what it got.
//!
//! Run with: `cargo run -p throttle-examples --bin tonic-node -- --central http://127.0.0.1:7075`
//! and, in another shell,
//! `cargo run -p throttle-examples --bin tonic-node -- --client http://127.0.0.1:50051 --user carol --requests 30`

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use throttle_examples::hello::greeter_client::GreeterClient;
use throttle_examples::hello::greeter_server::{Greeter, GreeterServer};
use throttle_examples::hello::{HelloReply, HelloRequest};
use throttle_examples::node::ReporterArgs;
use throttle_layer::{ThrottleLayer, UserKey};
use tonic::{Request, Response, Status};

/// A gRPC greeter throttled by throttle, or a client for it.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// Address to serve gRPC on.
    #[arg(long, default_value = "127.0.0.1:50051")]
    listen: SocketAddr,
    #[command(flatten)]
    reporter: ReporterArgs,
    /// Act as a client of the greeter at this URL instead of serving.
    #[arg(long)]
    client: Option<String>,
    /// Client: the user to call as.
    #[arg(long, default_value = "alice")]
    user: String,
    /// Client: how many calls, 50 ms apart.
    #[arg(long, default_value_t = 10)]
    requests: u32,
    /// Serve the node's metrics, in Prometheus' text format, on
    /// `http://ADDR/metrics`.
    #[arg(long)]
    metrics: Option<SocketAddr>,
    /// Log filter, e.g. `info` or `throttle_layer=debug`.
    #[arg(long, default_value = "info")]
    log: String,
}

#[derive(Debug)]
struct Hello;

#[tonic::async_trait]
impl Greeter for Hello {
    async fn say_hello(
        &self,
        request: Request<HelloRequest>,
    ) -> Result<Response<HelloReply>, Status> {
        let message = format!("hello, {}", request.into_inner().name);
        Ok(Response::new(HelloReply { message }))
    }
}

async fn client(url: String, user: &str, requests: u32) -> anyhow::Result<()> {
    let mut client = GreeterClient::connect(url.clone())
        .await
        .with_context(|| format!("connecting to {url}"))?;
    let (mut ok, mut refused) = (0, 0);
    for i in 0..requests {
        let mut req = Request::new(HelloRequest {
            name: user.to_owned(),
        });
        req.metadata_mut().insert("x-user", user.parse()?);
        match client.say_hello(req).await {
            Ok(r) => {
                ok += 1;
                println!("{i:>4} ok       {}", r.into_inner().message);
            }
            Err(s) if s.code() == tonic::Code::ResourceExhausted => {
                refused += 1;
                let pushback = s
                    .metadata()
                    .get("grpc-retry-pushback-ms")
                    .and_then(|v| v.to_str().ok());
                println!(
                    "{i:>4} refused  {} (retry in {} ms)",
                    s.message(),
                    pushback.unwrap_or("?")
                );
            }
            Err(s) => println!("{i:>4} error    {s}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!("{ok} ok, {refused} refused");
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if let Some(url) = args.client {
        return client(url, &args.user, args.requests).await;
    }
    throttle_examples::logs::init(&args.log)?;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    let addr = listener.local_addr()?;
    let node_id = args.reporter.node_id(addr.port());
    let store = args.reporter.store()?;
    let metrics = throttle_examples::metrics::install()?;
    if let Some(at) = args.metrics {
        let listener = tokio::net::TcpListener::bind(at)
            .await
            .with_context(|| format!("binding --metrics {at}"))?;
        let router = throttle_examples::metrics::router(metrics);
        tokio::spawn(throttle_examples::serve::serve(
            listener,
            router,
            throttle_examples::serve::IDLE_TIMEOUT,
            std::future::pending(),
        ));
        println!("tonic-node metrics on http://{at}/metrics");
    }
    let layer = ThrottleLayer::builder(&store, "front")
        .user(UserKey::header("x-user"))
        .build()?;
    let _reporter = args.reporter.builder(&store, &node_id)?.spawn()?;
    println!("tonic-node {node_id} serving hello.v1.Greeter on http://{addr}");
    // What a hardened gRPC server sets: dead peers found by pings, a bound
    // on a request's time and on the streams one connection may hold.
    tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(Duration::from_secs(20)))
        .http2_keepalive_timeout(Some(Duration::from_secs(20)))
        .timeout(Duration::from_secs(30))
        .max_concurrent_streams(Some(256))
        .layer(layer)
        .add_service(GreeterServer::new(Hello))
        .serve_with_incoming_shutdown(
            tokio_stream::wrappers::TcpListenerStream::new(listener),
            async {
                let _ = tokio::signal::ctrl_c().await;
            },
        )
        .await?;
    Ok(())
}
