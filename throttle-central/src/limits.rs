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
//! # max_debt_seconds = 10   # how deep in debt; the burst if left out, or "unbounded"
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

use crate::watched::{FileFormat, Watched, line_of, parse_toml};

/// Seconds' worth of rate a bucket holds when a limit does not say.
pub const DEFAULT_BURST_SECONDS: f64 = 10.0;

/// The highest rate a limit may set, per second: a thousand times a
/// petabyte a second, far past any real limit, and low enough that a
/// bucket's arithmetic stays exact to the unit.
pub const MAX_RATE: f64 = 1e15;

/// The longest burst a limit may set, in seconds (about 31 years).
pub const MAX_BURST_SECONDS: f64 = 1e9;

/// One user's limits in one service.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Limit {
    /// Who is limited.
    pub user: String,
    /// Resource -> amount per second.
    pub per_second: BTreeMap<String, f64>,
    /// Bucket capacity in seconds of rate.
    pub burst_seconds: f64,
    /// How far below zero the bucket may go, in seconds of rate: `None`
    /// for as far as its capacity ([`Limit::burst_seconds`]), infinity for
    /// no bound (the original behaviour).
    #[serde(serialize_with = "debt_json", skip_serializing_if = "Option::is_none")]
    pub max_debt_seconds: Option<f64>,
}

/// `"unbounded"` for an infinite debt, which JSON has no number for.
fn debt_json<S: serde::Serializer>(debt: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
    match debt {
        Some(x) if x.is_infinite() => s.serialize_str("unbounded"),
        Some(x) => s.serialize_f64(*x),
        None => s.serialize_none(),
    }
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
    /// The file is empty (0 bytes): an edit caught half done, or a file
    /// truncated by mistake, rather than limits. A file with no entries
    /// (only comments, say) removes every limit instead.
    #[error("limits file {path} is empty; write at least a comment to mean no limits")]
    Empty {
        /// The file.
        path: PathBuf,
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
    max_debt_seconds: Option<toml::Value>,
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
        let file: File =
            parse_toml(text).map_err(|(line, message)| LimitsError::Syntax { line, message })?;
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
                    Some(x) if x.is_finite() && (0.0..=MAX_RATE).contains(&x) => {
                        per_second.insert(resource.clone(), x)
                    }
                    _ => {
                        return Err(bad(format!(
                            "rate of {resource:?} must be a number from 0 to {MAX_RATE:e}, not {v}"
                        )));
                    }
                };
            }
            let burst_seconds = match &e.burst_seconds {
                None => DEFAULT_BURST_SECONDS,
                Some(v) => match number(v) {
                    Some(x) if x > 0.0 && x <= MAX_BURST_SECONDS => x,
                    _ => {
                        return Err(bad(format!(
                            "burst_seconds must be a number > 0 and at most {MAX_BURST_SECONDS:e}, not {v}"
                        )));
                    }
                },
            };
            let max_debt_seconds = match &e.max_debt_seconds {
                None => None,
                Some(toml::Value::String(s)) if s == "unbounded" => Some(f64::INFINITY),
                Some(v) => match number(v) {
                    Some(x) if (0.0..=MAX_BURST_SECONDS).contains(&x) => Some(x),
                    _ => {
                        return Err(bad(format!(
                            "max_debt_seconds must be a number from 0 to {MAX_BURST_SECONDS:e} or \"unbounded\", not {v}"
                        )));
                    }
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
                    max_debt_seconds,
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
    file: Watched<LimitSet>,
}

impl FileFormat for LimitSet {
    type Error = LimitsError;

    /// A 0-byte file is an edit caught half done, not limits; a file that
    /// lists none applies, with a warning, since it lifts every limit.
    fn parse(path: &Path, text: &str) -> Result<Self, LimitsError> {
        if text.is_empty() {
            return Err(LimitsError::Empty {
                path: path.to_owned(),
            });
        }
        let set = LimitSet::from_toml(text)?;
        if set.is_empty() {
            tracing::warn!(path = %path.display(), "limits file has no limits: nobody is limited");
        }
        Ok(set)
    }

    fn unreadable(path: &Path, error: &std::io::Error) -> LimitsError {
        LimitsError::Read {
            path: path.to_owned(),
            message: error.to_string(),
        }
    }
}

impl FileLimits {
    /// Loads `path`.
    ///
    /// # Errors
    ///
    /// The [`LimitsError`] of the first load: a central should not start on
    /// a broken file.
    pub fn open(path: impl Into<PathBuf>) -> Result<Self, LimitsError> {
        Ok(Self {
            file: Watched::open(path, LimitSet::new())?,
        })
    }

    /// The file this reads.
    pub fn path(&self) -> &Path {
        self.file.path()
    }

    /// Reads the file again; returns whether the limits changed. A file
    /// identical to the last one read (good or broken) is not parsed again.
    ///
    /// # Errors
    ///
    /// The [`LimitsError`] of a broken file, once per edit; the previous
    /// limits stay.
    pub fn reload(&self) -> Result<bool, LimitsError> {
        self.file.reload()
    }

    /// [`FileLimits::reload`] for a watcher: a changed file is applied only
    /// once two consecutive polls read the same text, so a file caught while
    /// being written (truncated, half written) is never applied.
    ///
    /// # Errors
    ///
    /// As [`FileLimits::reload`].
    pub fn poll(&self) -> Result<bool, LimitsError> {
        self.file.poll()
    }

    /// The limits in force.
    pub fn current(&self) -> Arc<LimitSet> {
        self.file.current()
    }
}

impl LimitSource for FileLimits {
    fn services(&self) -> Vec<String> {
        self.file.current().services()
    }

    fn list_limits(&self, service: &str) -> Vec<Limit> {
        self.file.current().list_limits(service)
    }

    fn last_error(&self) -> Option<String> {
        self.file.last_error()
    }

    fn version(&self) -> Option<u64> {
        Some(self.file.version())
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

    #[test]
    fn an_empty_file_keeps_the_limits_and_one_without_entries_removes_them() {
        let dir =
            std::env::temp_dir().join(format!("throttle-limits-empty-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("limits.toml");
        std::fs::write(&path, GOOD).unwrap();
        let file = FileLimits::open(&path).unwrap();
        std::fs::write(&path, "").unwrap();
        assert!(matches!(file.reload(), Err(LimitsError::Empty { .. })));
        assert_eq!(file.list_limits("front").len(), 2);
        assert!(file.last_error().unwrap().contains("empty"));
        std::fs::write(&path, "# nobody is limited\n").unwrap();
        assert!(file.reload().unwrap());
        assert!(file.services().is_empty());
        assert_eq!(file.last_error(), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn absurd_rates_and_bursts_are_refused() {
        for body in [
            "per_second = { requests = 1e300 }",
            "per_second = { requests = 1.1e15 }",
            "per_second = { requests = inf }",
            "per_second = { requests = 1 }\nburst_seconds = 1e300",
            "per_second = { requests = 1 }\nburst_seconds = inf",
        ] {
            match entry_error(body) {
                LimitsError::Entry { line, .. } => assert_eq!(line, 3, "{body}"),
                e => panic!("{body}: {e}"),
            }
        }
        let most = "[[limit]]\nservice = \"s\"\nuser = \"u\"\nper_second = { r = 1e15 }\nburst_seconds = 1e9\n";
        assert!(LimitSet::from_toml(most).is_ok());
    }

    proptest::proptest! {
        /// Text from outside, whatever it is, parses or is refused with a
        /// message: never a panic.
        #[test]
        fn arbitrary_text_is_parsed_or_refused(text in "\\PC{0,300}") {
            if let Err(e) = LimitSet::from_toml(&text) {
                proptest::prop_assert!(!e.to_string().is_empty());
            }
        }

        /// The same for a real limits file cut short and carried on with
        /// arbitrary text, which gets past the first lines.
        #[test]
        fn damaged_files_are_parsed_or_refused(cut in 0usize..200, tail in "\\PC{0,80}") {
            let mut cut = cut.min(GOOD.len());
            while !GOOD.is_char_boundary(cut) {
                cut -= 1;
            }
            let text = format!("{}{tail}", &GOOD[..cut]);
            if let Err(e) = LimitSet::from_toml(&text) {
                proptest::prop_assert!(!e.to_string().is_empty());
            }
        }
    }
}
