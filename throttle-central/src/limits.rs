//! Per-user limits, and where they come from.
//!
//! The original central node asked a callback `list_limits(service)` every
//! slot; [`LimitSource`] is that callback. [`LimitSet`] is a plain snapshot
//! (what [`StaticLimits`] serves), and [`FileLimits`] reads a TOML file and
//! keeps serving the last good version when an edit breaks it:
//!
//! ```toml
//! [[limit]]
//! service = "front"
//! user = "alice"
//! per_second = { requests = 100, traffic_down = 1048576 }
//! # burst_seconds = 10
//! ```
//!
//! # Examples
//!
//! ```
//! use throttle_central::limits::{LimitSet, LimitSource, StaticLimits};
//!
//! let set = LimitSet::from_toml(r#"
//! [[limit]]
//! service = "front"
//! user = "alice"
//! per_second = { requests = 100 }
//! "#)?;
//! let source = StaticLimits::new(set);
//! assert_eq!(source.services(), vec!["front".to_string()]);
//! assert_eq!(source.list_limits("front")[0].per_second["requests"], 100.0);
//! # Ok::<(), throttle_central::limits::LimitsError>(())
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arc_swap::ArcSwap;
use serde::{Deserialize, Serialize};
use throttle_proto::MAX_NAME_LEN;

/// Seconds' worth of rate a bucket holds when a limit does not say.
pub const DEFAULT_BURST_SECONDS: f64 = 10.0;

/// One user's limits in one service.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Limit {
    /// Who is limited.
    pub user: String,
    /// Resource -> amount per second.
    pub per_second: BTreeMap<String, f64>,
    /// Bucket capacity in seconds of rate.
    pub burst_seconds: f64,
}

/// Where the central node reads limits from, every slot.
pub trait LimitSource: Send + Sync + fmt::Debug + 'static {
    /// Services that have limits.
    fn services(&self) -> Vec<String>;
    /// The limits of `service`; a user not listed has none.
    fn list_limits(&self, service: &str) -> Vec<Limit>;
    /// Why the last reload failed, if it did (shown by the monitor API).
    fn last_error(&self) -> Option<String> {
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

/// A snapshot of limits: service -> user -> limit.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct LimitSet {
    services: BTreeMap<String, BTreeMap<String, Limit>>,
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

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    limit: Vec<toml::Spanned<Entry>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    service: String,
    user: String,
    per_second: BTreeMap<String, toml::Value>,
    burst_seconds: Option<toml::Value>,
}

fn line_of(text: &str, offset: usize) -> usize {
    text.as_bytes()[..offset.min(text.len())]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

fn number(v: &toml::Value) -> Option<f64> {
    match v {
        toml::Value::Integer(i) => Some(*i as f64),
        toml::Value::Float(f) => Some(*f),
        _ => None,
    }
}

fn valid_name(name: &str) -> bool {
    !name.is_empty() && name.len() <= MAX_NAME_LEN
}

impl LimitSet {
    /// An empty set: nobody is limited.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds or replaces one limit.
    pub fn insert(&mut self, service: impl Into<String>, limit: Limit) {
        self.services
            .entry(service.into())
            .or_default()
            .insert(limit.user.clone(), limit);
    }

    /// Parses the TOML form (see the [module docs](self)).
    ///
    /// # Errors
    ///
    /// [`LimitsError::Syntax`] or [`LimitsError::Entry`], naming the line:
    /// bad TOML, unknown keys, an empty or overlong name, a negative, NaN or
    /// non-numeric rate or burst, a duplicate (service, user).
    pub fn from_toml(text: &str) -> Result<Self, LimitsError> {
        let file: File = toml::from_str(text).map_err(|e| LimitsError::Syntax {
            line: e.span().map_or(1, |s| line_of(text, s.start)),
            message: e.message().to_string(),
        })?;
        let mut set = Self::new();
        for spanned in file.limit {
            let line = line_of(text, spanned.span().start);
            let e = spanned.into_inner();
            let bad = |message: String| LimitsError::Entry {
                line,
                service: e.service.clone(),
                user: e.user.clone(),
                message,
            };
            if !valid_name(&e.service) || !valid_name(&e.user) {
                return Err(bad(format!("names must be 1 to {MAX_NAME_LEN} bytes")));
            }
            let mut per_second = BTreeMap::new();
            for (resource, v) in &e.per_second {
                if !valid_name(resource) {
                    return Err(bad(format!(
                        "resource names must be 1 to {MAX_NAME_LEN} bytes"
                    )));
                }
                match number(v) {
                    Some(x) if x.is_finite() && x >= 0.0 => per_second.insert(resource.clone(), x),
                    _ => {
                        return Err(bad(format!(
                            "rate of {resource:?} must be a number >= 0, not {v}"
                        )));
                    }
                };
            }
            let burst_seconds = match &e.burst_seconds {
                None => DEFAULT_BURST_SECONDS,
                Some(v) => match number(v) {
                    Some(x) if x.is_finite() && x > 0.0 => x,
                    _ => return Err(bad(format!("burst_seconds must be a number > 0, not {v}"))),
                },
            };
            if set.get(&e.service, &e.user).is_some() {
                return Err(bad("duplicate entry for this service and user".into()));
            }
            set.insert(
                e.service.clone(),
                Limit {
                    user: e.user.clone(),
                    per_second,
                    burst_seconds,
                },
            );
        }
        Ok(set)
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

    /// The limit of one user, if any.
    pub fn get(&self, service: &str, user: &str) -> Option<&Limit> {
        self.services.get(service)?.get(user)
    }

    /// Number of (service, user) entries.
    pub fn len(&self) -> usize {
        self.services.values().map(BTreeMap::len).sum()
    }

    /// True when nobody is limited.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl LimitSource for LimitSet {
    fn services(&self) -> Vec<String> {
        self.services.keys().cloned().collect()
    }

    fn list_limits(&self, service: &str) -> Vec<Limit> {
        self.services
            .get(service)
            .map(|users| users.values().cloned().collect())
            .unwrap_or_default()
    }

    /// A set shared as a source cannot change.
    fn version(&self) -> Option<u64> {
        Some(0)
    }
}

/// Limits that change only when the embedder says so.
#[derive(Debug, Clone, Default)]
pub struct StaticLimits {
    set: Arc<ArcSwap<LimitSet>>,
    /// Bumped after each replacement (see [`LimitSource::version`]).
    version: Arc<AtomicU64>,
}

impl StaticLimits {
    /// Serves `set`.
    pub fn new(set: LimitSet) -> Self {
        Self {
            set: Arc::new(ArcSwap::from_pointee(set)),
            version: Arc::default(),
        }
    }

    /// Replaces the limits; the central applies them at its next slot.
    pub fn replace(&self, set: LimitSet) {
        self.set.store(Arc::new(set));
        // After the store: whoever sees the new version sees the new set.
        self.version.fetch_add(1, Ordering::Release);
    }
}

impl LimitSource for StaticLimits {
    fn services(&self) -> Vec<String> {
        self.set.load().services()
    }

    fn list_limits(&self, service: &str) -> Vec<Limit> {
        self.set.load().list_limits(service)
    }

    fn version(&self) -> Option<u64> {
        Some(self.version.load(Ordering::Acquire))
    }
}

/// Limits read from a TOML file, reloaded by [`FileLimits::reload`].
///
/// A file that fails to load keeps the previous limits in force and records
/// the error, which [`LimitSource::last_error`] reports.
#[derive(Debug)]
pub struct FileLimits {
    path: PathBuf,
    set: ArcSwap<LimitSet>,
    /// Bumped after each new set (see [`LimitSource::version`]).
    version: AtomicU64,
    text: parking_lot::Mutex<Option<String>>,
    pending: parking_lot::Mutex<Option<String>>,
    error: ArcSwap<Option<String>>,
}

impl FileLimits {
    /// Loads `path`.
    ///
    /// # Errors
    ///
    /// The [`LimitsError`] of the first load: a central should not start on
    /// a broken file.
    pub fn open(path: impl Into<PathBuf>) -> Result<Self, LimitsError> {
        let this = Self {
            path: path.into(),
            set: ArcSwap::from_pointee(LimitSet::new()),
            version: AtomicU64::new(0),
            text: parking_lot::Mutex::new(None),
            pending: parking_lot::Mutex::new(None),
            error: ArcSwap::from_pointee(None),
        };
        this.reload()?;
        Ok(this)
    }

    /// The file this reads.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reads the file again; returns whether the limits changed. A file
    /// identical to the last one read (good or broken) is not parsed again.
    ///
    /// # Errors
    ///
    /// The [`LimitsError`] of a broken file, once per edit; the previous
    /// limits stay.
    pub fn reload(&self) -> Result<bool, LimitsError> {
        let text = self.read()?;
        self.apply(text)
    }

    /// [`FileLimits::reload`] for a watcher: a changed file is applied only
    /// once two consecutive polls read the same text, so a file caught while
    /// being written (truncated, half written) is never applied.
    ///
    /// # Errors
    ///
    /// As [`FileLimits::reload`].
    pub fn poll(&self) -> Result<bool, LimitsError> {
        let text = self.read()?;
        if self.text.lock().as_deref() == Some(text.as_str()) {
            return Ok(false);
        }
        let mut pending = self.pending.lock();
        if pending.as_deref() != Some(text.as_str()) {
            *pending = Some(text);
            return Ok(false);
        }
        *pending = None;
        drop(pending);
        // Apply the text read twice, not a third read that could catch the
        // next edit half written.
        self.apply(text)
    }

    fn read(&self) -> Result<String, LimitsError> {
        std::fs::read_to_string(&self.path).map_err(|e| {
            let e = LimitsError::Read {
                path: self.path.clone(),
                message: e.to_string(),
            };
            self.error.store(Arc::new(Some(e.to_string())));
            e
        })
    }

    /// Parses and installs `text` unless it is the text last applied (good
    /// or broken: a broken file is reported once per edit).
    fn apply(&self, text: String) -> Result<bool, LimitsError> {
        let mut last = self.text.lock();
        if last.as_deref() == Some(text.as_str()) {
            return Ok(false);
        }
        let parsed = LimitSet::from_toml(&text);
        *last = Some(text);
        match parsed {
            Ok(set) => {
                self.set.store(Arc::new(set));
                self.version.fetch_add(1, Ordering::Release);
                self.error.store(Arc::new(None));
                Ok(true)
            }
            Err(e) => {
                self.error.store(Arc::new(Some(e.to_string())));
                Err(e)
            }
        }
    }

    /// The limits in force.
    pub fn current(&self) -> Arc<LimitSet> {
        self.set.load_full()
    }
}

impl LimitSource for FileLimits {
    fn services(&self) -> Vec<String> {
        self.set.load().services()
    }

    fn list_limits(&self, service: &str) -> Vec<Limit> {
        self.set.load().list_limits(service)
    }

    fn last_error(&self) -> Option<String> {
        (**self.error.load()).clone()
    }

    fn version(&self) -> Option<u64> {
        Some(self.version.load(Ordering::Acquire))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
# demo
[[limit]]
service = "front"
user = "alice"
per_second = { requests = 100, traffic_down = 1048576 }

[[limit]]
service = "front"
user = "bob"
per_second = { requests = 2.5 }
burst_seconds = 3
"#;

    #[test]
    fn parses_entries_with_defaults() {
        let set = LimitSet::from_toml(GOOD).unwrap();
        assert_eq!(set.len(), 2);
        let alice = set.get("front", "alice").unwrap();
        assert_eq!(alice.per_second["traffic_down"], 1_048_576.0);
        assert_eq!(alice.burst_seconds, DEFAULT_BURST_SECONDS);
        assert_eq!(set.get("front", "bob").unwrap().burst_seconds, 3.0);
        assert!(LimitSet::from_toml("").unwrap().is_empty());
    }

    fn entry_error(body: &str) -> LimitsError {
        LimitSet::from_toml(&format!(
            "\n\n[[limit]]\nservice = \"front\"\nuser = \"u\"\n{body}\n"
        ))
        .unwrap_err()
    }

    #[test]
    fn negative_nan_and_non_numeric_rates_name_the_line() {
        for body in [
            "per_second = { requests = -1 }",
            "per_second = { requests = nan }",
            "per_second = { requests = \"ten\" }",
            "per_second = { requests = 1 }\nburst_seconds = 0",
        ] {
            match entry_error(body) {
                LimitsError::Entry { line, .. } => assert_eq!(line, 3, "{body}"),
                e => panic!("{body}: {e}"),
            }
        }
    }

    #[test]
    fn duplicates_and_bad_names_are_refused() {
        let dup = format!(
            "{GOOD}\n[[limit]]\nservice = \"front\"\nuser = \"alice\"\nper_second = {{}}\n"
        );
        let e = LimitSet::from_toml(&dup).unwrap_err();
        assert!(e.to_string().contains("duplicate"), "{e}");
        assert!(e.to_string().contains("line 14"), "{e}");
        let e = LimitSet::from_toml("[[limit]]\nservice = \"\"\nuser = \"u\"\nper_second = {}\n")
            .unwrap_err();
        assert!(matches!(e, LimitsError::Entry { line: 1, .. }), "{e}");
    }

    #[test]
    fn bad_toml_names_the_line() {
        let e = LimitSet::from_toml("[[limit]]\nservice = \"front\"\nuser = \n").unwrap_err();
        assert!(matches!(e, LimitsError::Syntax { line: 3, .. }), "{e}");
        let e = LimitSet::from_toml(
            "[[limit]]\nservice = \"f\"\nuser = \"u\"\nper_second = {}\ncolour = 1\n",
        )
        .unwrap_err();
        assert!(e.to_string().contains("colour"), "{e}");
    }

    #[test]
    fn file_reload_keeps_last_good_limits() {
        let dir = std::env::temp_dir().join(format!("throttle-limits-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("limits.toml");
        std::fs::write(&path, GOOD).unwrap();
        let file = FileLimits::open(&path).unwrap();
        assert_eq!(file.list_limits("front").len(), 2);
        assert!(!file.reload().unwrap(), "unchanged file is not a change");

        std::fs::write(&path, "[[limit]]\nbroken").unwrap();
        assert!(file.reload().is_err());
        assert!(
            !file.reload().unwrap(),
            "the same broken file is reported once"
        );
        assert_eq!(file.list_limits("front").len(), 2);
        assert!(file.last_error().unwrap().contains("line"));

        std::fs::write(&path, "").unwrap();
        assert!(
            !file.poll().unwrap(),
            "a changed file waits for a second read"
        );
        std::fs::write(
            &path,
            "[[limit]]\nservice = \"s\"\nuser = \"u\"\nper_second = { r = 1 }\n",
        )
        .unwrap();
        assert!(
            !file.poll().unwrap(),
            "the truncated version was never applied"
        );
        assert_eq!(file.list_limits("front").len(), 2);
        assert!(file.poll().unwrap());
        assert!(!file.poll().unwrap());
        assert_eq!(file.services(), vec!["s".to_string()]);
        assert_eq!(file.last_error(), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
