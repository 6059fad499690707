//! High availability: several centrals, one leader, and the leader's
//! state kept where the next one finds it.
//!
//! - [`election`]: the campaign on etcd and the role it keeps;
//! - [`leadership`]: what the central reads of that role (leader, follower
//!   and where the leader is);
//! - [`state`]: where the leader's checkpoints are kept (a file, etcd).

pub mod election;
pub mod leadership;
pub mod state;
