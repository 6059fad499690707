//! Shared pieces of the throttle examples: the demo node app, the demo
//! limits, and a small HTTP load generator.
//!
//! The binaries are `axum-node`, `tonic-node` and `quickstart`; the
//! end-to-end tests run the same node app.

pub mod app;
pub mod load;
pub mod logs;
pub mod metrics;
pub mod node;
pub mod serve;

/// The tonic example's generated code (`proto/hello/v1/hello.proto`).
#[allow(missing_docs, unreachable_pub, missing_debug_implementations)]
pub mod hello {
    tonic::include_proto!("hello.v1");
}

/// A default node id: the host name and the port.
pub fn default_node_id(port: u16) -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "node".to_owned());
    format!("{host}-{port}")
}

/// The README's code blocks, compiled as doctests so they stay true.
#[doc = include_str!("../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

/// The layer guide's code blocks, compiled as doctests.
#[doc = include_str!("../../docs/guides/layer.md")]
#[cfg(doctest)]
pub struct LayerGuideDoctests;

/// The central guide's code blocks, compiled as doctests.
#[doc = include_str!("../../docs/guides/central.md")]
#[cfg(doctest)]
pub struct CentralGuideDoctests;

/// The operations guide's code blocks, compiled as doctests.
#[doc = include_str!("../../docs/guides/operations.md")]
#[cfg(doctest)]
pub struct OperationsGuideDoctests;

/// The policies guide's code blocks, compiled as doctests.
#[doc = include_str!("../../docs/guides/policies.md")]
#[cfg(doctest)]
pub struct PoliciesGuideDoctests;

#[cfg(test)]
mod tests {
    /// The README is a front door, read whole: it stays under 10 KiB.
    #[test]
    fn the_readme_stays_under_ten_kib() {
        let len = include_str!("../../README.md").len();
        assert!(len < 10_240, "README.md is {len} bytes");
    }

    /// The figures' page is read whole: history belongs in the CHANGELOG.
    #[test]
    fn the_performance_page_stays_under_400_lines() {
        let lines = include_str!("../../docs/performance.md").lines().count();
        assert!(lines < 400, "docs/performance.md is {lines} lines");
    }
}
