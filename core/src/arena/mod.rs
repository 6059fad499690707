//! The ground the policies read: a service's keys, one per (user,
//! resource), in one dense arena ([`ServiceState`]), with their buckets,
//! their distribution over the nodes and the per-slot sums.
//!
//! The [`Ledger`](crate::ledger::Ledger) above it files reports into it and
//! asks a [`Policy`](crate::policy::Policy) to assign from it; neither of
//! those is imported here.
//!
//! The files, from the ground floor up:
//!
//! - `ids`: interned nodes, key ids, resource names;
//! - `charge`, `filing_at`: how an entry is charged, and where it is filed;
//! - `periods`: keys limited over several periods;
//! - `key`: [`Key`], everything kept for one (user, resource);
//! - `sums`: the per-slot sums of a service, a column per slot;
//! - `recent`: per node, the users of its last report (a filing shortcut);
//! - `rules`: a service's limit rules, which limit keys as they appear;
//! - `cuts`: [`Cuts`], where the key arena was cut, for readers of
//!   older grants;
//! - `first_shares`: what proxies' new buckets were told
//!   before their first report;
//! - `state`: [`ServiceState`], a service's keys and all of the above.

pub(crate) mod charge;
pub(crate) mod cuts;
pub(crate) mod filing_at;
pub(crate) mod first_shares;
pub(crate) mod ids;
pub(crate) mod key;
pub(crate) mod periods;
pub(crate) mod recent;
pub(crate) mod rules;
pub(crate) mod state;
pub(crate) mod sums;

pub use cuts::Cuts;
pub use ids::valid_name;
pub use ids::{KeyId, Map, NodeId};
pub use key::{Key, NodeUsage};
pub use state::ServiceState;
