//! Which central node does the work.
//!
//! Several central nodes may run; only the one holding leadership accepts
//! node streams, the others answer [`NotLeader`](throttle_proto::v1::NotLeader)
//! with the leader's address so nodes can follow it. The election itself is
//! behind the [`Leadership`] trait: [`AlwaysLeader`] for a single central,
//! [`Follower`] for one that knows it is not the leader, and
//! [`Elected`](crate::ha::election::Elected) for one elected on etcd.

use std::fmt;

use futures_util::future::BoxFuture;

/// Answers whether this central node is the leader, and who is.
pub trait Leadership: Send + Sync + fmt::Debug + 'static {
    /// True while this node holds leadership.
    fn is_leader(&self) -> bool;
    /// The leader's gRPC address as nodes should dial it, when known.
    fn leader(&self) -> Option<String>;

    /// A number that only grows from one leadership to the next (sent to
    /// nodes in `Welcome.epoch`, so they can tell an older leader's
    /// streams from a newer one's); 0 where there is no election.
    fn epoch(&self) -> u64 {
        0
    }

    /// Resolves once the leadership held now is lost: a stream opened
    /// under it then closes. Never, by default.
    fn deposed(&self) -> BoxFuture<'static, ()> {
        Box::pin(std::future::pending())
    }

    /// `"single"`, `"leader"` or `"standby"`, for `/healthz`.
    fn role(&self) -> &'static str {
        if self.is_leader() {
            "leader"
        } else {
            "standby"
        }
    }
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

    fn role(&self) -> &'static str {
        "single"
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
