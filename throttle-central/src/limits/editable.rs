//! [`Editable`]: where the admin API writes a change of the limits.

use std::sync::Arc;

use super::{EditError, EtcdLimits, FileLimits};

/// A text edit of the limits document ([`super::edit_rule`] and the like
/// with their arguments bound); called again if etcd's copy changed under
/// it.
pub(crate) type Change = Box<dyn Fn(&str) -> Result<String, EditError> + Send + Sync>;

/// The limits the admin API edits: a file, or a key in etcd.
#[derive(Debug, Clone)]
pub(crate) enum Editable {
    /// `--limits FILE`.
    File(Arc<FileLimits>),
    /// `--limits etcd:///KEY`.
    Etcd(Arc<EtcdLimits>),
}

impl Editable {
    /// Applies `change` to the document, writes it, and applies it.
    ///
    /// # Errors
    ///
    /// [`EditError`]; the document is then as it was.
    pub(crate) async fn edit(&self, change: Change) -> Result<(), EditError> {
        match self {
            // Off the runtime's workers: it reads, writes and syncs files.
            Self::File(file) => {
                let file = file.clone();
                let done = tokio::task::spawn_blocking(move || file.edit(change)).await;
                done.map_err(|e| EditError::Io(e.to_string()))?
            }
            Self::Etcd(etcd) => etcd.edit(change).await,
        }
    }
}
