//! Central benchmarks.
fn main() {}
