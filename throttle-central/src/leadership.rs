//! Which central node does the work.
//!
//! Several central nodes may run; only the one holding leadership accepts
//! node streams, the others answer [`NotLeader`](throttle_proto::v1::NotLeader)
//! with the leader's address so nodes can follow it. The election itself is
//! behind the [`Leadership`] trait: [`AlwaysLeader`] for a single central,
//! [`Follower`] for one that knows it is not the leader.

use std::fmt;

/// Answers whether this central node is the leader, and who is.
pub trait Leadership: Send + Sync + fmt::Debug + 'static {
    /// True while this node holds leadership.
    fn is_leader(&self) -> bool;
    /// The leader's gRPC address as nodes should dial it, when known.
    fn leader(&self) -> Option<String>;
}

/// A single central node: always the leader.
#[derive(Debug, Clone, Copy, Default)]
pub struct AlwaysLeader;

impl Leadership for AlwaysLeader {
    fn is_leader(&self) -> bool {
        true
    }

    fn leader(&self) -> Option<String> {
        None
    }
}

/// A central node that is not the leader and sends nodes to `leader`.
#[derive(Debug, Clone, Default)]
pub struct Follower {
    /// The leader's address, e.g. `http://10.0.0.2:7075`.
    pub leader: Option<String>,
}

impl Leadership for Follower {
    fn is_leader(&self) -> bool {
        false
    }

    fn leader(&self) -> Option<String> {
        self.leader.clone()
    }
}
