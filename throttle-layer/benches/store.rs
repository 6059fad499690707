//! Store benchmarks.
fn main() {}
