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
    Ok(())
}
