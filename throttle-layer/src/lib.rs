//! Distributed, per-user, multi-resource throttling for Tower services.
//!
//! Placeholder line replaced below.
pub mod store;
