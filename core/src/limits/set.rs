//! [`LimitSet`]: a snapshot of every service's rules; [`StaticLimits`]:
//! one an embedder replaces at will.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use serde::Serialize;

use super::hierarchy::{HIERARCHICAL, Hierarchy};
use super::{Block, Blocks, Limit, LimitSource, LimitsError};
use crate::Published;

/// A snapshot of limits: service -> user (or `*`) -> rule.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct LimitSet {
    services: BTreeMap<String, BTreeMap<String, Limit>>,
    /// Service -> the quota policy it uses.
    policies: BTreeMap<String, String>,
    /// Service -> user -> block.
    blocks: Blocks,
    /// Service -> its capacity and applications.
    pub(super) hierarchies: BTreeMap<String, Hierarchy>,
    /// Service -> the Envoy bucket id entry that names the user.
    envoy_user_keys: BTreeMap<String, String>,
}

impl LimitSet {
    /// Parses the TOML form (see the [module docs](super)).
    ///
    /// # Errors
    ///
    /// [`LimitsError::Syntax`] or [`LimitsError::Entry`], naming the line:
    /// bad TOML, unknown keys, an empty or overlong name, a negative, NaN,
    /// non-numeric or absurd amount or burst, an unknown unit, a rule with
    /// no amounts or with both or neither of `user` and `users`. A user
    /// named by several rules of a service has them all: per resource and
    /// period, a rule naming the user alone outranks a list, and between
    /// rules of one rank the lower rate wins.
    pub fn from_toml(text: &str) -> Result<Self, LimitsError> {
        text.parse()
    }

    /// An empty set: nobody is limited.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds or replaces one rule.
    pub fn insert(&mut self, service: impl Into<String>, limit: Limit) {
        self.services
            .entry(service.into())
            .or_default()
            .insert(limit.user.clone(), limit);
    }

    /// Reads and parses a TOML file.
    ///
    /// # Errors
    ///
    /// As [`LimitSet::from_toml`], or [`LimitsError::Read`].
    pub fn from_file(path: &Path) -> Result<Self, LimitsError> {
        let text = std::fs::read_to_string(path).map_err(|e| LimitsError::Read {
            path: path.to_owned(),
            message: e.to_string(),
        })?;
        Self::from_toml(&text)
    }

    /// Makes the bucket id entry `key` name the user of `service`'s Envoy
    /// buckets (`user` otherwise).
    pub fn set_envoy_user_key(&mut self, service: impl Into<String>, key: impl Into<String>) {
        self.envoy_user_keys.insert(service.into(), key.into());
    }

    /// Gives `service` the quota policy `name` (see
    /// `policy::by_name`).
    pub fn set_policy(&mut self, service: impl Into<String>, name: impl Into<String>) {
        self.policies.insert(service.into(), name.into());
    }

    /// Gives `service` a capacity shared by applications, and the
    /// `hierarchical` policy that shares it.
    pub fn set_hierarchy(&mut self, service: impl Into<String>, hierarchy: Hierarchy) {
        let service = service.into();
        self.set_policy(service.clone(), HIERARCHICAL);
        self.hierarchies.insert(service, hierarchy);
    }

    /// The capacity and applications of `service`, if it has any.
    pub fn hierarchy(&self, service: &str) -> Option<&Hierarchy> {
        self.hierarchies.get(service)
    }

    /// Blocks `user` of `service`, replacing an earlier block of theirs.
    pub fn block(&mut self, service: impl Into<String>, user: impl Into<String>, block: Block) {
        self.blocks
            .entry(service.into())
            .or_default()
            .insert(user.into(), block);
    }

    /// The rule of one user (or of `*`), if any.
    pub fn get(&self, service: &str, user: &str) -> Option<&Limit> {
        self.services.get(service)?.get(user)
    }

    /// Number of (service, user) rules.
    pub fn len(&self) -> usize {
        self.services.values().map(BTreeMap::len).sum()
    }

    /// True when nobody is limited nor blocked.
    pub fn is_empty(&self) -> bool {
        self.len() == 0 && self.blocks.values().all(BTreeMap::is_empty)
    }
}

impl LimitSource for LimitSet {
    fn services(&self) -> Vec<String> {
        let with_policy = self
            .policies
            .keys()
            .filter(|s| !self.services.contains_key(*s));
        self.services.keys().chain(with_policy).cloned().collect()
    }

    fn list_limits(&self, service: &str) -> Vec<Limit> {
        self.services
            .get(service)
            .map(|users| users.values().cloned().collect())
            .unwrap_or_default()
    }

    fn policy(&self, service: &str) -> Option<String> {
        self.policies.get(service).cloned()
    }

    fn envoy_user_key(&self, service: &str) -> Option<String> {
        self.envoy_user_keys.get(service).cloned()
    }

    fn blocks(&self) -> Blocks {
        self.blocks.clone()
    }

    fn hierarchy(&self, service: &str) -> Option<Arc<Hierarchy>> {
        self.hierarchies.get(service).cloned().map(Arc::new)
    }

    /// A set shared as a source cannot change.
    fn version(&self) -> Option<u64> {
        Some(0)
    }
}

/// Limits that change only when the embedder says so.
#[derive(Debug, Clone)]
pub struct StaticLimits {
    /// Its version bumped after each replacement (see
    /// [`LimitSource::version`]).
    set: Arc<Published<LimitSet>>,
}

impl Default for StaticLimits {
    fn default() -> Self {
        Self::new(LimitSet::new())
    }
}

impl StaticLimits {
    /// Serves `set`.
    pub fn new(set: LimitSet) -> Self {
        Self {
            set: Arc::new(Published::new(set)),
        }
    }

    /// Replaces the limits; the central applies them at its next slot.
    pub fn replace(&self, set: LimitSet) {
        self.set.publish(set);
    }
}

impl Snapshots for StaticLimits {
    fn snapshot(&self) -> Arc<LimitSet> {
        self.set.current()
    }

    fn snapshot_version(&self) -> u64 {
        self.set.version()
    }
}

/// A source that holds a [`LimitSet`] and replaces it whole: it answers
/// every [`LimitSource`] question from the set in force
/// ([`StaticLimits`], the central's `FileLimits`).
pub trait Snapshots: Send + Sync + std::fmt::Debug + 'static {
    /// The limits in force.
    fn snapshot(&self) -> Arc<LimitSet>;
    /// Changes whenever the set in force does ([`LimitSource::version`]).
    fn snapshot_version(&self) -> u64;
    /// Why the last load failed, if it did ([`LimitSource::last_error`]).
    fn snapshot_error(&self) -> Option<String> {
        None
    }
}

impl<T: Snapshots> LimitSource for T {
    fn services(&self) -> Vec<String> {
        self.snapshot().services()
    }

    fn list_limits(&self, service: &str) -> Vec<Limit> {
        self.snapshot().list_limits(service)
    }

    fn last_error(&self) -> Option<String> {
        self.snapshot_error()
    }

    fn policy(&self, service: &str) -> Option<String> {
        self.snapshot().policy(service)
    }

    fn envoy_user_key(&self, service: &str) -> Option<String> {
        self.snapshot().envoy_user_key(service)
    }

    fn blocks(&self) -> Blocks {
        self.snapshot().blocks()
    }

    fn hierarchy(&self, service: &str) -> Option<Arc<Hierarchy>> {
        LimitSource::hierarchy(&*self.snapshot(), service)
    }

    fn version(&self) -> Option<u64> {
        Some(self.snapshot_version())
    }
}
