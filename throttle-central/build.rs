//! Compiles `etcd/etcd.proto` (etcd's v3 API as the central uses it: a
//! client only) with `protox` (pure Rust), so no `protoc` is needed on the
//! build machine, and no app node compiles it.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let etcd = "etcd/etcd.proto";
    println!("cargo:rerun-if-changed={etcd}");
    tonic_prost_build::configure()
        .build_server(false)
        .compile_fds(protox::compile([etcd], ["."])?)?;
    Ok(())
}
