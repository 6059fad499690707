//! Leader election on etcd: several centrals, one leader, the others
//! standing by.
//!
//! - `role`: [`Elected`], the [`Leadership`](crate::ha::leadership::Leadership)
//!   the central reads, and the lease arithmetic that fences a leader;
//! - `campaign`: [`Campaign`], the task that runs for leadership on etcd
//!   and writes the role.
//!
//! A leader leads only while its etcd lease is surely alive: until a
//! margin before the lease's TTL counted from when its last renewal was
//! sent ([`lead_until`]). Past that it accepts no stream and closes the
//! ones it has, whether or not its campaign could run (a process stopped
//! with SIGSTOP reads the deadline first thing when resumed), so two
//! centrals never lead at once. The epoch sent to nodes in
//! `Welcome.epoch` is the creation revision of the leader's key in etcd,
//! which grows from one leader to the next.

mod campaign;
mod role;

pub use campaign::{Campaign, ElectionConfig};
pub(crate) use campaign::{connect, prefix_end};
pub use role::{Elected, Role, lead_until};

use std::sync::Arc;

use throttle_clock::MonotonicClock;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// A campaign running in its task.
#[derive(Debug)]
pub struct Running {
    /// The role it keeps, for the central to read.
    pub elected: Arc<Elected>,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Running {
    /// Starts campaigning as `advertise` (the address nodes dial).
    pub fn start(config: ElectionConfig, advertise: &str) -> Self {
        let clock = Arc::new(MonotonicClock);
        let elected = Arc::new(Elected::new(advertise, clock.clone()));
        let (stop, stopped) = watch::channel(false);
        let campaign = Campaign::new(config, elected.clone(), clock);
        let task = tokio::spawn(campaign.run(stopped));
        Self {
            elected,
            stop,
            task,
        }
    }

    /// Stops campaigning and resigns: a standby takes over at once.
    pub async fn resign(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}
