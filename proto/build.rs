//! Compiles `throttle/v1/throttle.proto` with `protox` (pure Rust), so no
//! `protoc` is needed on the build machine.

/// The `Central` service with `input` as what a node sends and `output` as
/// what the central node sends back.
fn central(input: &str, output: &str) -> tonic_build::manual::Service {
    let exchange = tonic_build::manual::Method::builder()
        .name("exchange")
        .route_name("Exchange")
        .input_type(input)
        .output_type(output)
        .codec_path("tonic_prost::ProstCodec")
        .client_streaming()
        .server_streaming()
        .build();
    tonic_build::manual::Service::builder()
        .name("Central")
        .package("throttle.v1")
        .method(exchange)
        .build()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "throttle/v1/throttle.proto";
    println!("cargo:rerun-if-changed={proto}");
    let fds = protox::compile([proto], ["."])?;
    tonic_prost_build::configure()
        // Ordered maps: reports and quotas print and compare deterministically,
        // and the legacy JSON keeps a stable key order.
        .btree_map(".")
        .compile_fds(fds)?;
    // The same service once more for the central node's side, receiving
    // `wire::Inbound` (reports kept as bytes) and sending `wire::Outbound`
    // (built or already encoded messages): see `wire`.
    tonic_build::manual::Builder::new()
        .build_client(false)
        .compile(&[central("crate::wire::Inbound", "crate::wire::Outbound")]);
    // And for a node's side, sending `wire::Inbound` (reports already
    // encoded) and receiving `wire::Answer` (quotas kept as bytes).
    let node = std::path::PathBuf::from(std::env::var("OUT_DIR")?).join("node");
    std::fs::create_dir_all(&node)?;
    tonic_build::manual::Builder::new()
        .build_server(false)
        .out_dir(node)
        .compile(&[central("crate::wire::Inbound", "crate::wire::Answer")]);
    Ok(())
}
