//! The running reporter.

use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::status::ReporterStatus;

/// The running reporter; dropping it stops the task.
#[derive(Debug)]
#[must_use = "dropping the handle stops the reporter: keep it as long as the app serves"]
pub struct ReporterHandle {
    task: JoinHandle<()>,
    status: watch::Receiver<ReporterStatus>,
}

impl ReporterHandle {
    /// Takes charge of the reporter's `task`, whose status is `status`.
    pub(super) fn new(task: JoinHandle<()>, status: watch::Receiver<ReporterStatus>) -> Self {
        Self { task, status }
    }

    /// The current status.
    pub fn status(&self) -> ReporterStatus {
        self.status.borrow().clone()
    }

    /// Waits until `f` holds for the status.
    pub async fn wait_for(&self, f: impl FnMut(&ReporterStatus) -> bool) {
        let mut rx = self.status.clone();
        let _ = rx.wait_for(f).await;
    }

    /// Stops the task (what is buffered is lost).
    pub fn shutdown(self) {
        self.task.abort();
    }
}

impl Drop for ReporterHandle {
    fn drop(&mut self) {
        self.task.abort();
    }
}
