//! A file read again when it changes: the limits, the node keys. The last
//! good version stays in force while an edit is broken, and the error is
//! kept for the monitor ([`Published`], which limits kept in etcd use
//! too). Both are TOML, read by [`parse_toml`].

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

pub(crate) use throttle_core::Published;
pub(crate) use throttle_core::toml_text::{line_of, parse_toml};

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
