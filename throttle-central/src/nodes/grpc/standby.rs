//! [`Standby`]: what a central that does not lead does with a node's new
//! stream.
//!
//! Where it knows a leader the node can reach, it sends the node there at
//! once ([`NotLeader`](throttle_proto::v1::NotLeader)). Where it knows none
//! (the election is under way, or etcd is away), or its leader is one the
//! node says it could not reach ([`UNREACHABLE_METADATA`]: a leader killed
//! before its lease ran out), it keeps the stream until it leads, and then
//! welcomes the node, or until it knows another leader: nodes are on the
//! new leader within a beat of its takeover, instead of going back and
//! forth to a dead one.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use throttle_proto::UNREACHABLE_METADATA;
use tokio::time::Instant;

use crate::ha::leadership::Leadership;

/// The longest a stream is kept: below the node's wait for its first
/// answer (5 s), so that it hears a redirect rather than a timeout.
pub(crate) const HOLD: Duration = Duration::from_secs(4);

/// How often a kept stream looks at the leadership again.
const LOOK: Duration = Duration::from_millis(20);

/// Most streams kept at once; beyond, a node is sent to the leader known,
/// if any, at once.
const MAX_HELD: usize = 20_000;

/// Streams kept now, across the process.
static HELD: AtomicUsize = AtomicUsize::new(0);

/// How a kept stream ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Settled {
    /// This central leads: welcome the node.
    Lead,
    /// Send the node to this leader (empty: none known).
    Redirect(String),
}

/// A node's new stream at a central that does not lead.
#[derive(Debug, Clone, Default)]
pub(crate) struct Standby {
    /// The centrals the node could not reach.
    unreachable: Vec<String>,
}

impl Standby {
    /// Reads what the node could not reach from its stream's metadata.
    pub(crate) fn of(metadata: &tonic::metadata::MetadataMap) -> Self {
        let listed = metadata
            .get(UNREACHABLE_METADATA)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        let unreachable = listed
            .split(',')
            .filter(|s| !s.is_empty())
            .take(16)
            .map(str::to_owned)
            .collect();
        Self { unreachable }
    }

    /// Where the node should go now: to a leader it can reach, or, if
    /// there is none, `None` (keep the stream).
    pub(crate) fn now(&self, leadership: &dyn Leadership) -> Option<Settled> {
        if leadership.is_leader() {
            return Some(Settled::Lead);
        }
        let leader = leadership.leader()?;
        (!self.unreachable.contains(&leader)).then_some(Settled::Redirect(leader))
    }

    /// Whether the stream is to be kept, taking a place among the kept
    /// ones: false when it can be settled at once, or too many are kept.
    pub(crate) fn keep(&self, leadership: &dyn Leadership) -> bool {
        if self.now(leadership).is_some() {
            return false;
        }
        let held = HELD.fetch_add(1, Ordering::Relaxed);
        if held >= MAX_HELD {
            HELD.fetch_sub(1, Ordering::Relaxed);
            metrics::counter!("throttle_central_streams_not_held_total").increment(1);
            return false;
        }
        metrics::gauge!("throttle_central_streams_held").increment(1.0);
        true
    }

    /// Waits, for a stream [`Standby::keep`] kept, until this central
    /// leads or knows a leader the node can reach, at most [`HOLD`]; then
    /// gives its place back.
    pub(crate) async fn settle(&self, leadership: &dyn Leadership) -> Settled {
        let until = Instant::now() + HOLD;
        let settled = loop {
            if let Some(s) = self.now(leadership) {
                break s;
            }
            if Instant::now() >= until {
                break Settled::Redirect(leadership.leader().unwrap_or_default());
            }
            tokio::time::sleep(LOOK).await;
        };
        HELD.fetch_sub(1, Ordering::Relaxed);
        metrics::gauge!("throttle_central_streams_held").decrement(1.0);
        settled
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ha::leadership::Follower;

    fn standby(unreachable: &str) -> Standby {
        let mut metadata = tonic::metadata::MetadataMap::new();
        metadata.insert(UNREACHABLE_METADATA, unreachable.parse().unwrap());
        Standby::of(&metadata)
    }

    #[test]
    fn a_node_is_sent_at_once_only_to_a_leader_it_can_reach() {
        let leader = Follower {
            leader: Some("http://a:1".into()),
        };
        let sent = Some(Settled::Redirect("http://a:1".into()));
        assert_eq!(Standby::default().now(&leader), sent);
        assert_eq!(standby("http://b:2").now(&leader), sent);
        assert_eq!(standby("http://b:2,http://a:1").now(&leader), None);
        assert_eq!(Standby::default().now(&Follower { leader: None }), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_kept_stream_is_sent_on_after_the_hold() {
        let dead = Follower {
            leader: Some("http://a:1".into()),
        };
        let s = standby("http://a:1");
        assert!(s.keep(&dead));
        let started = Instant::now();
        let settled = s.settle(&dead).await;
        assert_eq!(settled, Settled::Redirect("http://a:1".into()));
        assert!(started.elapsed() >= HOLD);
        assert_eq!(HELD.load(Ordering::Relaxed), 0, "its place given back");
    }
}
