//! Compiles `throttle/v1/throttle.proto` with `protox` (pure Rust), so no
//! `protoc` is needed on the build machine.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "throttle/v1/throttle.proto";
    println!("cargo:rerun-if-changed={proto}");
    let fds = protox::compile([proto], ["."])?;
    tonic_prost_build::configure()
        // Ordered maps: reports and quotas print and compare deterministically,
        // and the legacy JSON keeps a stable key order.
        .btree_map(".")
        .compile_fds(fds)?;
    // The same service once more for the central node's side, sending
    // `wire::Outbound` (built or already encoded messages): see `wire`.
    let exchange = tonic_build::manual::Method::builder()
        .name("exchange")
        .route_name("Exchange")
        .input_type("crate::wire::Inbound")
        .output_type("crate::wire::Outbound")
        .codec_path("tonic_prost::ProstCodec")
        .client_streaming()
        .server_streaming()
        .build();
    let central = tonic_build::manual::Service::builder()
        .name("Central")
        .package("throttle.v1")
        .method(exchange)
        .build();
    tonic_build::manual::Builder::new()
        .build_client(false)
        .compile(&[central]);
    Ok(())
}
