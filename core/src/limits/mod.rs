//! Per-user limits, and where they come from.
//!
//! The original central node asked a callback `list_limits(service)` every
//! slot; [`LimitSource`] is that callback. [`LimitSet`] is a plain snapshot
//! (what [`StaticLimits`] serves); the central's sources (a TOML file that
//! keeps serving its last good version when an edit breaks it, an etcd
//! key) read this form:
//!
//! ```toml
//! [[limit]]
//! service = "front"
//! user = "*"                     # every user without a rule of their own
//! per_second = { requests = 100, traffic_down = "50MiB" }
//!
//! [[limit]]
//! service = "front"
//! users = ["alice", "bob"]       # one rule, several users
//! per_second = { requests = 1000 }
//! per_minute = { requests = 6000 }
//! per_day = { requests = 1000000 }
//! # burst_seconds = 10           # the per-second capacity in seconds of
//! #                              # rate; a longer period holds its whole
//! #                              # amount, unless { minute = 30, ... } says
//! # max_debt_seconds = 10        # how deep in debt; the capacity if left
//! #                              # out, or "unbounded"
//! ```
//!
//! A service may also be given settings of its own:
//!
//! ```toml
//! [service.front]
//! policy = "classic"             # its quota policy; others keep the default
//! ```
//!
//! Each period is a token bucket of rate amount / period. A user's own
//! rule and the `*` rule both apply, period by period (the user's own
//! setting wins in a period both set): every bucket that results must
//! have room ([`resolve`]).
//!
//! - `period`: [`Period`], [`Allowance`], [`resolve`];
//! - `amount`: amounts with byte units;
//! - `parse`: the TOML form, and per-service settings
//!   (`[service.front] policy = "classic"`);
//! - `set`: [`LimitSet`], [`StaticLimits`];
//! - `edit`: one user's rule edited in a file's text ([`edit_rule`]);
//! - `block`: block lists (`[[block]]`), [`Block`];
//! - `hierarchy`: a capacity shared by applications ([`Hierarchy`]);
//!   `parse_hierarchy`: its TOML form.
//!
//! # Examples
//!
//! ```
//! use throttle_core::limits::{LimitSet, LimitSource, Period, StaticLimits};
//!
//! let set = LimitSet::from_toml(r#"
//! [[limit]]
//! service = "front"
//! user = "alice"
//! per_second = { requests = 100 }
//! per_day = { requests = 1000000 }
//! "#)?;
//! let source = StaticLimits::new(set);
//! assert_eq!(source.services(), vec!["front".to_string()]);
//! let alice = &source.list_limits("front")[0];
//! assert_eq!(alice.per_second["requests"], 100.0);
//! assert_eq!(alice.allowance("requests", Period::Day).unwrap().amount(), 1e6);
//! # Ok::<(), throttle_core::limits::LimitsError>(())
//! ```

mod amount;
mod block;
mod edit;
mod hierarchy;
mod parse;
mod parse_hierarchy;
mod period;
mod set;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

use serde::Serialize;

pub use block::{Block, Blocks, blocked_at};
pub use edit::{EditError, edit_block, edit_rule};
pub use hierarchy::{
    App, DEFAULT_APP_BURST_SECONDS, HIERARCHICAL, Hierarchy, MAX_PRIORITY, NO_APP_PRIORITY,
};
pub use period::{Allowance, Period, Resolved, limited_resources, resolve};
pub use set::{LimitSet, Snapshots, StaticLimits};

/// Seconds' worth of rate a bucket holds when a limit does not say.
pub const DEFAULT_BURST_SECONDS: f64 = 10.0;

/// The highest rate a limit may set, per second: a thousand times a
/// petabyte a second, far past any real limit, and low enough that a
/// bucket's arithmetic stays exact to the unit.
pub const MAX_RATE: f64 = 1e15;

/// The longest burst a limit may set, in seconds (about 31 years).
pub const MAX_BURST_SECONDS: f64 = 1e9;

/// One rule's limits of one user (or of every user: [`EVERY_USER`]) in one
/// service.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Limit {
    /// Who is limited: a user, or [`EVERY_USER`].
    pub user: String,
    /// Resource -> amount per second.
    pub per_second: BTreeMap<String, f64>,
    /// Capacity of the per-second buckets, in seconds of rate.
    pub burst_seconds: f64,
    /// How far below zero a bucket may go, in seconds of rate: `None`
    /// for as far as its capacity, infinity for no bound (the legacy system
    /// behaviour).
    pub max_debt_seconds: Option<f64>,
    /// Resource -> its allowances over periods longer than a second.
    pub per_period: BTreeMap<String, Vec<Allowance>>,
}

/// The user of a rule for every user without a rule of their own.
pub const EVERY_USER: &str = "*";

/// The quota policies a service may name (`[service.NAME] policy`);
/// the central makes each (`policy::by_name`).
pub const POLICY_NAMES: [&str; 4] = ["projected", "classic", "static-split", "hierarchical"];

/// The policies of [`POLICY_NAMES`] that may apply to every service the
/// limits name none for: all but `hierarchical`, which a service's
/// `capacity` chooses.
pub const DEFAULT_POLICY_NAMES: [&str; 3] = ["projected", "classic", "static-split"];

/// A default policy name that is none of [`DEFAULT_POLICY_NAMES`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{0:?} cannot be the default quota policy: expected one of {DEFAULT_POLICY_NAMES:?} (hierarchical is chosen per service by its `capacity` in the limits file)"
)]
pub struct UnknownPolicy(pub String);

impl Limit {
    /// The bucket this rule sets for `resource` over `period`, if any.
    pub fn allowance(&self, resource: &str, period: Period) -> Option<Allowance> {
        if period == Period::Second {
            let rate = *self.per_second.get(resource)?;
            return Some(Allowance {
                period,
                rate,
                burst_seconds: self.burst_seconds,
            });
        }
        let longer = self.per_period.get(resource)?;
        longer.iter().find(|a| a.period == period).copied()
    }

    /// Every resource the rule limits, each once.
    pub fn resources(&self) -> impl Iterator<Item = &str> {
        let longer = self
            .per_period
            .keys()
            .filter(|r| !self.per_second.contains_key(*r));
        self.per_second.keys().chain(longer).map(String::as_str)
    }

    /// Whether this is the rule of every user.
    pub fn is_every_user(&self) -> bool {
        self.user == EVERY_USER
    }
}

/// The JSON of a limit, as the TOML writes it: amounts per period.
impl Serialize for Limit {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = s.serialize_map(None)?;
        map.serialize_entry("user", &self.user)?;
        map.serialize_entry("per_second", &self.per_second)?;
        for period in &Period::ALL[1..] {
            let amounts: BTreeMap<&str, f64> = self
                .per_period
                .iter()
                .filter_map(|(r, list)| {
                    let a = list.iter().find(|a| a.period == *period)?;
                    Some((r.as_str(), a.amount()))
                })
                .collect();
            if !amounts.is_empty() {
                map.serialize_entry(&format!("per_{}", period.as_str()), &amounts)?;
            }
        }
        // A longer period's capacity other than its whole amount makes the
        // burst a table, as the limits file writes it.
        let named: BTreeMap<&str, f64> = (self.per_period.values())
            .flatten()
            .filter(|a| a.burst_seconds != a.period.seconds())
            .map(|a| (a.period.as_str(), a.burst_seconds))
            .collect();
        if named.is_empty() {
            map.serialize_entry("burst_seconds", &self.burst_seconds)?;
        } else {
            let mut table = named;
            table.insert(Period::Second.as_str(), self.burst_seconds);
            map.serialize_entry("burst_seconds", &table)?;
        }
        match self.max_debt_seconds {
            Some(x) if x.is_infinite() => map.serialize_entry("max_debt_seconds", "unbounded")?,
            Some(x) => map.serialize_entry("max_debt_seconds", &x)?,
            None => {}
        }
        map.end()
    }
}

/// Where the central node reads limits from, every slot.
pub trait LimitSource: Send + Sync + fmt::Debug + 'static {
    /// Services that have limits.
    fn services(&self) -> Vec<String>;
    /// The rules of `service`; a user with no rule of their own has the
    /// [`EVERY_USER`] rule's, if there is one, else none.
    fn list_limits(&self, service: &str) -> Vec<Limit>;
    /// Why the last reload failed, if it did (shown by the monitor API).
    fn last_error(&self) -> Option<String> {
        None
    }

    /// Every block of every service, whether it holds now or not.
    fn blocks(&self) -> Blocks {
        Blocks::new()
    }

    /// The capacity and applications of `service`, if it shares a
    /// capacity ([`Hierarchy`]).
    fn hierarchy(&self, service: &str) -> Option<std::sync::Arc<Hierarchy>> {
        let _ = service;
        None
    }

    /// The quota policy `service` should use, if the source says
    /// (`policy::by_name`); `None`: the central's default.
    fn policy(&self, service: &str) -> Option<String> {
        let _ = service;
        None
    }

    /// The Envoy bucket id entry that names the user of `service`'s
    /// buckets, if the source says; `None`: `user`.
    fn envoy_user_key(&self, service: &str) -> Option<String> {
        let _ = service;
        None
    }

    /// A number that changes whenever the limits do, so a reader can skip
    /// limits it has applied already (every slot, at 333,000 users, that is
    /// most of a slot's work); `None` (the default): unknown, read them
    /// every time.
    fn version(&self) -> Option<u64> {
        None
    }
}

/// Why a limits document was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LimitsError {
    /// The file could not be read.
    #[error("cannot read limits file {path}: {message}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        message: String,
    },
    /// Not valid TOML of the expected shape.
    #[error("invalid limits at line {line}: {message}")]
    Syntax {
        /// 1-based line of the error.
        line: usize,
        /// What is wrong.
        message: String,
    },
    /// The file is empty (0 bytes): an edit caught half done, or a file
    /// truncated by mistake, rather than limits. A file with no entries
    /// (only comments, say) removes every limit instead.
    #[error("limits file {path} is empty; write at least a comment to mean no limits")]
    Empty {
        /// The file.
        path: PathBuf,
    },
    /// The limits kept in etcd could not be read, or its value is not a
    /// document (the central's `EtcdLimits`).
    #[error("limits in etcd key {key}: {message}")]
    Etcd {
        /// The key.
        key: String,
        /// What went wrong.
        message: String,
    },
    /// An entry is valid TOML but not a valid limit.
    #[error("invalid limit at line {line} ({service}/{user}): {message}")]
    Entry {
        /// 1-based line of the entry.
        line: usize,
        /// Its service.
        service: String,
        /// Its user.
        user: String,
        /// What is wrong.
        message: String,
    },
}
