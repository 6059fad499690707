//! [`FileLimits`]: limits read from a TOML file, and read again when it
//! changes.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::{EditError, LimitSet, LimitsError, Snapshots};
use crate::watched::{FileFormat, Watched};

/// Limits read from a TOML file, reloaded by [`FileLimits::reload`].
///
/// A file that fails to load keeps the previous limits in force and records
/// the error, which [`LimitSource::last_error`](super::LimitSource::last_error) reports.
#[derive(Debug)]
pub struct FileLimits {
    file: Watched<LimitSet>,
    /// Held by an edit from its read to its write.
    editing: parking_lot::Mutex<()>,
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
            editing: parking_lot::Mutex::new(()),
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

    /// Edits the file: `change` gets its text and returns the new one,
    /// which is written atomically (a temporary file beside it, synced,
    /// then renamed over it, so a crash leaves the old file or the new,
    /// never half of one) and applied at once. Edits are one at a time.
    ///
    /// # Errors
    ///
    /// [`EditError`] from `change`, or the file's reading or writing;
    /// then the file is as it was.
    pub fn edit(
        &self,
        change: impl FnOnce(&str) -> Result<String, EditError>,
    ) -> Result<(), EditError> {
        let _one_at_a_time = self.editing.lock();
        let path = self.path();
        let io = |e: std::io::Error| EditError::Io(format!("{}: {e}", path.display()));
        let text = std::fs::read_to_string(path).map_err(io)?;
        let new = change(&text)?;
        crate::atomic_file::replace(path, new.as_bytes()).map_err(io)?;
        self.file.reload()?;
        Ok(())
    }

    /// The limits in force.
    pub fn current(&self) -> Arc<LimitSet> {
        self.file.current()
    }
}

impl Snapshots for FileLimits {
    fn snapshot(&self) -> Arc<LimitSet> {
        self.file.current()
    }

    fn snapshot_version(&self) -> u64 {
        self.file.version()
    }

    fn snapshot_error(&self) -> Option<String> {
        self.file.last_error()
    }
}
