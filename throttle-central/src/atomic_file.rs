//! A file replaced whole, never seen half written: the new content goes to
//! a file beside it, is flushed to the disk and renamed over it, and the
//! directory is synced so the rename lasts. Used by the limits file's
//! edits and by the checkpoint file.

use std::io::Write;
use std::path::Path;

/// Replaces `path` with `bytes`. On an error the file is as it was, and
/// the file beside it is removed.
///
/// # Errors
///
/// Creating, writing, syncing or renaming the file beside it.
pub(crate) fn replace(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.{}.tmp", std::process::id()));
    let written = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::File::open(dir)?.sync_all()?;
        }
        Ok(())
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}
