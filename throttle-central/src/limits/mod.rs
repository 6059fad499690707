//! Per-user limits, and where the central reads them from.
//!
//! The model (rules per user and period, blocks, hierarchies, the TOML
//! form, [`LimitSource`]) is the core's ([`throttle_core::limits`], all of
//! it here too); this module adds its sources: [`FileLimits`] reads a TOML
//! file and keeps serving the last good version when an edit breaks it,
//! [`EtcdLimits`] the same document kept in an etcd key, and `editable`
//! says which of the two the admin API writes.
//!
//! # Examples
//!
//! ```
//! use throttle_central::limits::{FileLimits, LimitSource};
//!
//! let dir = std::env::temp_dir().join(format!("limits-doc-{}", std::process::id()));
//! std::fs::create_dir_all(&dir).unwrap();
//! let path = dir.join("limits.toml");
//! std::fs::write(&path, "[[limit]]\nservice = \"front\"\nuser = \"alice\"\nper_second = { requests = 100 }\n").unwrap();
//! let limits = FileLimits::open(&path)?;
//! assert_eq!(limits.list_limits("front")[0].per_second["requests"], 100.0);
//! # std::fs::remove_dir_all(&dir).unwrap();
//! # Ok::<(), throttle_central::limits::LimitsError>(())
//! ```

mod editable;
mod etcd;
mod file;
#[cfg(test)]
mod tests;

pub(crate) use editable::Editable;
pub use etcd::{EtcdLimits, MAX_DOCUMENT_BYTES};
pub use file::FileLimits;
pub use throttle_core::limits::*;
