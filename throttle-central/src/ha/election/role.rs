//! [`Elected`]: what the election decided, as the central reads it; the
//! lease arithmetic that fences a leader, sans IO.

use std::sync::Arc;

use futures_util::future::BoxFuture;
use throttle_clock::Clock;
use tokio::sync::watch;

use crate::ha::leadership::Leadership;

/// This central's part, as the campaign last saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    /// Not leading.
    Standby {
        /// The leader's advertised address, if there is one.
        leader: Option<String>,
    },
    /// Leading.
    Leader {
        /// The campaign key's creation revision.
        epoch: u64,
        /// When leading ends on the monotonic clock, unless the lease is
        /// renewed before.
        until_ms: u64,
    },
}

/// How long a leader may act on a lease renewed at `sent_ms` for
/// `ttl_ms`: etcd counts the lease from when it receives the renewal,
/// never earlier than it was sent, so until `sent_ms + ttl_ms` no other
/// central can hold the leader's key. The leader stops a margin before:
/// a fifth of the TTL, at least 200 ms, for its clock running slow and
/// its streams closing.
pub fn lead_until(sent_ms: u64, ttl_ms: u64) -> u64 {
    let margin = (ttl_ms / 5).max(200);
    sent_ms.saturating_add(ttl_ms.saturating_sub(margin))
}

/// The [`Leadership`] of a central elected on etcd: its campaign writes
/// the role, streams and `/healthz` read it. Leading ends at the lease's
/// deadline even when the campaign cannot run (a process stopped and
/// resumed reads the clock before anything else), so a central never
/// accepts a stream after another could have been elected.
#[derive(Debug)]
pub struct Elected {
    role: watch::Sender<Role>,
    /// Where nodes reach this central, sent by standbys to nodes.
    advertise: String,
    /// A monotonic clock, in ms.
    clock: Arc<dyn Clock>,
    /// The campaign key of the term under way (empty before the first),
    /// which fences what the leader writes to etcd.
    key: parking_lot::Mutex<Vec<u8>>,
}

impl Elected {
    /// A standby that knows no leader yet, advertising `advertise`.
    pub fn new(advertise: &str, clock: Arc<dyn Clock>) -> Self {
        Self {
            role: watch::Sender::new(Role::Standby { leader: None }),
            advertise: advertise.to_owned(),
            clock,
            key: parking_lot::Mutex::new(Vec::new()),
        }
    }

    /// The campaign key of the term under way; its creation revision is
    /// the epoch while this central leads.
    pub fn key(&self) -> Vec<u8> {
        self.key.lock().clone()
    }

    /// Records the campaign key of a new term.
    pub fn hold_key(&self, key: &[u8]) {
        key.clone_into(&mut self.key.lock());
    }

    /// This central's advertised address.
    pub fn advertise(&self) -> &str {
        &self.advertise
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.clock.now_ms()).unwrap_or(0)
    }

    /// The role as last set (a leader past its deadline included).
    pub fn role(&self) -> Role {
        self.role.borrow().clone()
    }

    /// Leads under `epoch` until `until_ms`.
    pub fn lead(&self, epoch: u64, until_ms: u64) {
        self.set(Role::Leader { epoch, until_ms });
    }

    /// Stands by, sending nodes to `leader`.
    pub fn follow(&self, leader: Option<String>) {
        self.set(Role::Standby { leader });
    }

    /// Stands by if the lease's deadline has passed; whether it had.
    pub fn expire(&self) -> bool {
        let due = matches!(self.role(), Role::Leader { until_ms, .. } if self.now_ms() >= until_ms);
        if due {
            tracing::warn!("leadership lease ran out before it was renewed; standing by");
            self.follow(None);
        }
        due
    }

    fn set(&self, role: Role) {
        let (was, now) = (self.role(), role.clone());
        let changed = match (&was, &now) {
            (Role::Leader { epoch: a, .. }, Role::Leader { epoch: b, .. }) => a != b,
            _ => was != now,
        };
        if changed {
            match &now {
                Role::Leader { epoch, .. } => tracing::info!(epoch, "leading"),
                Role::Standby { leader } => {
                    tracing::info!(
                        leader = leader.as_deref().unwrap_or("unknown"),
                        "standing by"
                    )
                }
            }
            metrics::gauge!("throttle_central_leader")
                .set(f64::from(u8::from(matches!(now, Role::Leader { .. }))));
        }
        self.role.send_replace(role);
    }
}

impl Leadership for Elected {
    fn is_leader(&self) -> bool {
        matches!(self.role(), Role::Leader { until_ms, .. } if self.now_ms() < until_ms)
    }

    fn leader(&self) -> Option<String> {
        match self.role() {
            Role::Leader { .. } if self.is_leader() => Some(self.advertise.clone()),
            Role::Leader { .. } => None,
            Role::Standby { leader } => leader,
        }
    }

    fn epoch(&self) -> u64 {
        match self.role() {
            Role::Leader { epoch, .. } => epoch,
            Role::Standby { .. } => 0,
        }
    }

    fn deposed(&self) -> BoxFuture<'static, ()> {
        let mut rx = self.role.subscribe();
        let held = self.epoch();
        Box::pin(async move {
            let _ = rx
                .wait_for(|r| !matches!(r, Role::Leader { epoch, .. } if *epoch == held))
                .await;
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use throttle_clock::ManualClock;

    use super::*;

    #[test]
    fn a_leader_stops_leading_before_its_lease_could_end() {
        assert_eq!(lead_until(10_000, 2_000), 11_600);
        assert_eq!(lead_until(10_000, 500), 10_300, "at least 200 ms early");
        let clock = Arc::new(ManualClock::new(10_000));
        let e = Elected::new("http://a:1", clock.clone());
        assert!(!e.is_leader(), "a standby until elected");
        e.lead(7, lead_until(10_000, 2_000));
        assert!(e.is_leader());
        assert_eq!((e.epoch(), e.leader().as_deref()), (7, Some("http://a:1")));
        // Stopped past the deadline: no longer leader on the first read,
        // before the campaign has run.
        clock.advance(Duration::from_millis(1_600));
        assert!(!e.is_leader());
        assert_eq!(e.leader(), None);
        assert!(e.expire());
        assert_eq!(e.role(), Role::Standby { leader: None });
    }

    #[tokio::test]
    async fn streams_learn_they_are_deposed_when_the_epoch_ends() {
        let clock = Arc::new(ManualClock::new(0));
        let e = Elected::new("http://a:1", clock);
        e.lead(3, 1_000);
        let mut deposed = e.deposed();
        e.lead(3, 2_000);
        assert!(
            futures_util::poll!(&mut deposed).is_pending(),
            "renewed, same epoch"
        );
        e.follow(Some("http://b:2".into()));
        deposed.await;
        assert_eq!(e.leader().as_deref(), Some("http://b:2"));
    }
}
