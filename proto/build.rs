//! Compiles `throttle/v1/throttle.proto` and `throttle/v1/checkpoint.proto`
//! with `protox` (pure Rust), so no `protoc` is needed on the build
//! machine.

/// The `Central` service with `input` as what a node sends and `output` as
/// what the central node sends back.
#[cfg(feature = "grpc")]
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

/// `SCREAMING_SNAKE` of a `CamelCase` or `snake_case` name.
fn screaming(name: &str) -> String {
    let mut out = String::new();
    for (i, c) in name.chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 && !out.ends_with('_') {
            out.push('_');
        }
        out.push(c.to_ascii_uppercase());
    }
    out
}

/// One constant per field of every message (map entries aside), named
/// `MESSAGE_FIELD`, for the code that reads and writes messages field by
/// field: a field added to the proto is numbered in one place.
fn field_numbers(fds: &prost_types::FileDescriptorSet) -> String {
    let mut out = String::new();
    for file in &fds.file {
        for message in &file.message_type {
            let name = message.name();
            for field in &message.field {
                out.push_str(&format!(
                    "/// `{name}.{field}`.\npub const {}_{}: u32 = {};\n",
                    screaming(name),
                    screaming(field.name()),
                    field.number(),
                    field = field.name(),
                ));
            }
        }
    }
    out
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "throttle/v1/throttle.proto";
    let checkpoint = "throttle/v1/checkpoint.proto";
    println!("cargo:rerun-if-changed={proto}");
    println!("cargo:rerun-if-changed={checkpoint}");
    let fds = protox::compile([proto, checkpoint], ["."])?;
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out.join("fields.rs"), field_numbers(&fds))?;
    // The messages alone with prost; the services too, with tonic, only
    // under the `grpc` feature.
    #[cfg(not(feature = "grpc"))]
    {
        prost_build::Config::new()
            // Ordered maps: reports and quotas print and compare
            // deterministically, and the legacy JSON keeps a stable key order.
            .btree_map(["."])
            .compile_fds(fds)?;
        Ok(())
    }
    #[cfg(feature = "grpc")]
    {
        tonic_prost_build::configure()
            .btree_map(".")
            .compile_fds(fds)?;
        services(&out)
    }
}

/// The same service once more for the central node's side, and for a
/// node's: see `wire`.
#[cfg(feature = "grpc")]
fn services(out: &std::path::Path) -> Result<(), Box<dyn std::error::Error>> {
    // The same service once more for the central node's side, receiving
    // `wire::Inbound` (reports kept as bytes) and sending `wire::Outbound`
    // (built or already encoded messages): see `wire`.
    tonic_build::manual::Builder::new()
        .build_client(false)
        .compile(&[central("crate::wire::Inbound", "crate::wire::Outbound")]);
    // And for a node's side, sending `wire::Inbound` (reports already
    // encoded) and receiving `wire::Answer` (quotas kept as bytes).
    let node = out.join("node");
    std::fs::create_dir_all(&node)?;
    tonic_build::manual::Builder::new()
        .build_server(false)
        .out_dir(node)
        .compile(&[central("crate::wire::Inbound", "crate::wire::Answer")]);
    Ok(())
}
