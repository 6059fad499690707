//! A file read again when it changes: the limits, the node keys. The last
//! good version stays in force while an edit is broken, and the error is
//! kept for the monitor ([`Published`], which limits kept in etcd use
//! too). Both are TOML, read by [`parse_toml`].

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use arc_swap::ArcSwap;

/// What a watched file holds, and how it is read.
pub(crate) trait FileFormat: Sized + Send + Sync + fmt::Debug + 'static {
    /// Why a file was refused.
    type Error: fmt::Display + fmt::Debug;

    /// Parses the text of `path`.
    ///
    /// # Errors
    ///
    /// Why the text is not usable.
    fn parse(path: &Path, text: &str) -> Result<Self, Self::Error>;

    /// The error for a file that could not be read.
    fn unreadable(path: &Path, error: &std::io::Error) -> Self::Error;
}

/// The version in force of something read again and again (a file, an
/// etcd key), a number that changes with it, and why the last read
/// failed: what a reader of the limits or node keys asks.
#[derive(Debug)]
pub(crate) struct Published<T> {
    current: ArcSwap<T>,
    /// Bumped after each new version.
    version: AtomicU64,
    error: ArcSwap<Option<String>>,
}

impl<T> Published<T> {
    /// `value` in force, as version 0.
    pub(crate) fn new(value: T) -> Self {
        Self {
            current: ArcSwap::from_pointee(value),
            version: AtomicU64::new(0),
            error: ArcSwap::from_pointee(None),
        }
    }

    /// Puts `value` in force, and forgets the last error.
    pub(crate) fn publish(&self, value: T) {
        self.current.store(Arc::new(value));
        // After the store: whoever sees the new version sees the value.
        self.version.fetch_add(1, Ordering::Release);
        self.error.store(Arc::new(None));
    }

    /// Records why the last read failed; the version in force stays.
    pub(crate) fn fail(&self, error: String) {
        self.error.store(Arc::new(Some(error)));
    }

    /// Forgets the last error: the version in force was read again as it
    /// is (a file put back unchanged).
    pub(crate) fn recover(&self) {
        if self.error.load().is_some() {
            self.error.store(Arc::new(None));
        }
    }

    /// The version in force.
    pub(crate) fn current(&self) -> Arc<T> {
        self.current.load_full()
    }

    /// A number that changes whenever the version in force does.
    pub(crate) fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    /// Why the last read failed, if it did.
    pub(crate) fn last_error(&self) -> Option<String> {
        (**self.error.load()).clone()
    }
}

/// A file of `T`, read again by [`Watched::reload`] or [`Watched::poll`].
#[derive(Debug)]
pub(crate) struct Watched<T> {
    path: PathBuf,
    published: Published<T>,
    /// The text last applied, good or broken.
    text: parking_lot::Mutex<Option<String>>,
    /// A changed text read once, applied when read the same again.
    pending: parking_lot::Mutex<Option<String>>,
    /// Whether the text last applied was good.
    good: AtomicBool,
}

impl<T: FileFormat> Watched<T> {
    /// Loads `path`.
    ///
    /// # Errors
    ///
    /// The error of the first load: nothing should start on a broken file.
    pub(crate) fn open(path: impl Into<PathBuf>, empty: T) -> Result<Self, T::Error> {
        let this = Self {
            path: path.into(),
            published: Published::new(empty),
            text: parking_lot::Mutex::new(None),
            pending: parking_lot::Mutex::new(None),
            good: AtomicBool::new(false),
        };
        this.reload()?;
        Ok(this)
    }

    /// The file this reads.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Reads the file again; returns whether its content changed. A file
    /// identical to the last one read (good or broken) is not parsed again.
    ///
    /// # Errors
    ///
    /// The error of a broken file, once per edit; the previous version
    /// stays.
    pub(crate) fn reload(&self) -> Result<bool, T::Error> {
        let text = self.read()?;
        self.apply(text)
    }

    /// [`Watched::reload`] for a watcher: a changed file is applied only
    /// once two consecutive polls read the same text, so a file caught while
    /// being written (truncated, half written) is never applied. The good
    /// text in force, read again after a failed read (a file removed, then
    /// put back unchanged), clears the error.
    ///
    /// # Errors
    ///
    /// As [`Watched::reload`].
    pub(crate) fn poll(&self) -> Result<bool, T::Error> {
        let text = self.read()?;
        if self.text.lock().as_deref() == Some(text.as_str()) {
            if self.good.load(Ordering::Relaxed) {
                self.published.recover();
            }
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

    fn read(&self) -> Result<String, T::Error> {
        std::fs::read_to_string(&self.path).map_err(|e| {
            let e = T::unreadable(&self.path, &e);
            self.published.fail(e.to_string());
            e
        })
    }

    /// Parses and installs `text` unless it is the text last applied (good
    /// or broken: a broken file is reported once per edit).
    fn apply(&self, text: String) -> Result<bool, T::Error> {
        let mut last = self.text.lock();
        if last.as_deref() == Some(text.as_str()) {
            return Ok(false);
        }
        let parsed = T::parse(&self.path, &text);
        *last = Some(text);
        self.good.store(parsed.is_ok(), Ordering::Relaxed);
        match parsed {
            Ok(value) => {
                self.published.publish(value);
                Ok(true)
            }
            Err(e) => {
                self.published.fail(e.to_string());
                Err(e)
            }
        }
    }

    /// The version in force.
    pub(crate) fn current(&self) -> Arc<T> {
        self.published.current()
    }

    /// A number that changes whenever the content does.
    pub(crate) fn version(&self) -> u64 {
        self.published.version()
    }

    /// Why the last read failed, if it did.
    pub(crate) fn last_error(&self) -> Option<String> {
        self.published.last_error()
    }
}

/// Parses `text` as TOML of shape `D`; on failure, the 1-based line of
/// the error and what is wrong.
///
/// # Errors
///
/// `(line, message)` for text that is not TOML of that shape.
pub(crate) fn parse_toml<D: serde::de::DeserializeOwned>(text: &str) -> Result<D, (usize, String)> {
    toml::from_str(text).map_err(|e| {
        let line = e.span().map_or(1, |s| line_of(text, s.start));
        (line, e.message().to_string())
    })
}

/// The 1-based line of byte `offset` of `text`.
pub(crate) fn line_of(text: &str, offset: usize) -> usize {
    text.as_bytes()[..offset.min(text.len())]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}
