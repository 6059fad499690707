//! [`FileState`]: the checkpoint in a file.

use std::path::{Path, PathBuf};

use bytes::Bytes;
use futures_util::future::BoxFuture;

use super::{StateError, StateStore};

/// The checkpoint in one file, replaced whole: written beside it, flushed
/// to the disk and renamed over it, so that a crash mid-write leaves the
/// previous checkpoint.
#[derive(Debug, Clone)]
pub struct FileState {
    path: PathBuf,
}

impl FileState {
    /// The checkpoint at `path` (created on the first save).
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self { path: path.into() }
    }

    fn error(&self, error: std::io::Error) -> StateError {
        StateError::Io {
            path: self.path.display().to_string(),
            error,
        }
    }
}

/// Runs file work `f` on `path` off the runtime's workers.
async fn blocking<T: Send + 'static>(
    path: &Path,
    f: impl FnOnce(&Path) -> std::io::Result<T> + Send + 'static,
) -> std::io::Result<T> {
    let path = path.to_owned();
    let done = tokio::task::spawn_blocking(move || f(&path)).await;
    done.unwrap_or_else(|e| Err(std::io::Error::other(e)))
}

impl StateStore for FileState {
    fn load(&self) -> BoxFuture<'_, Result<Option<Bytes>, StateError>> {
        Box::pin(async move {
            match blocking(&self.path, |path| std::fs::read(path)).await {
                Ok(bytes) => Ok(Some(Bytes::from(bytes))),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(self.error(e)),
            }
        })
    }

    fn save(&self, checkpoint: Bytes) -> BoxFuture<'_, Result<(), StateError>> {
        Box::pin(async move {
            let written = blocking(&self.path, move |path| {
                crate::atomic_file::replace(path, &checkpoint)
            })
            .await;
            written.map_err(|e| self.error(e))
        })
    }

    fn describe(&self) -> String {
        self.path.display().to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_saved_checkpoint_is_loaded_and_replaced_whole() {
        let temp = throttle_test_servers::TempDir::new("state");
        let dir = temp.path();
        let state = FileState::new(dir.join("checkpoint"));
        assert!(state.load().await.unwrap().is_none());
        state
            .save(Bytes::from_static(b"first, longer"))
            .await
            .unwrap();
        state.save(Bytes::from_static(b"second")).await.unwrap();
        assert_eq!(state.load().await.unwrap().unwrap(), "second");
        let unreadable = FileState::new(dir.join("missing-dir").join("checkpoint"));
        assert!(matches!(
            unreadable.save(Bytes::new()).await,
            Err(StateError::Io { .. })
        ));
    }
}
