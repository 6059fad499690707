//! Compiles the tonic example's proto with `protox`: no `protoc` needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/hello/v1/hello.proto";
    println!("cargo:rerun-if-changed={proto}");
    let fds = protox::compile([proto], ["proto"])?;
    tonic_prost_build::configure().compile_fds(fds)?;
    Ok(())
}
