//! The node's slot store: per-slot counters and the quotas the central node
//! sent, with the legacy node's decision rules.
//!
//! The store is plain synchronous code reading an injected
//! [`Clock`](throttle_clock::Clock); the layer calls it on the request path and the
//! reporter drains it once per slot.
//!
//! - [`ServiceStore::admit`] applies the legacy `throttle` rules: with no
//!   quota for the current slot the [`Fallback`] decides (by default: the
//!   last quota the central sent, for up to 60 slots, then allow as the
//!   original); with a quota table for the slot but no row for the user,
//!   the user is not limited, unless the central's
//!   [`Limits`](throttle_proto::v1::Limits) give them a default quota (the
//!   share of their rule, or of the `*` rule, the central gives this
//!   node), which then stands as their row until their own comes (see
//!   `default_row`); otherwise, for every resource of the user's
//!   quota, a quota below 1 or this slot's consumption above the quota counts
//!   one rejection for that resource and refuses the request. An admitted
//!   request's fixed costs are added in the same step.
//! - [`UserHandle::consume`] adds amounts known later (body bytes, handler
//!   amounts) to the slot in which they happen.
//! - [`SlotStore::collect`] drains a finished slot into a protocol
//!   [`Report`](throttle_proto::v1::Report), and [`SlotStore::apply_quota`] installs a quota.
//!
//! # Concurrency and memory
//!
//! Each service keeps a lock-free map (`papaya`) of its users. A user is one
//! node of the map holding its name (inline up to 24 bytes) and a small spin
//! lock over its state: two requests contend only when they are for the same
//! user, and a known user costs one hash lookup and one uncontended lock,
//! with no allocation. The state holds, per resource the service counts,
//! this slot's and the last slot's counts and the quota of each of three
//! rows (the current slot, or without it the newest past one, and the next
//! two; in whole units, as `f32`), inline in the map's node: the map is made
//! at the service's first user with room for the resources registered by
//! then, and a user of a resource registered later moves its cells to a
//! separate allocation. A per-service ring of `(slot, version)` says which
//! rows are current, so replacing a slot's table never blocks a reader.
//!
//! The number of tracked users is capped ([`SlotStoreBuilder::max_keys`], default
//! 1,000,000 over all services). At the cap a *new* user is neither tracked nor
//! counted: the layer's [`Fallback`] decides for it, and the metric
//! `throttle_keys_at_cap_total` counts such decisions. Users idle for two slots
//! are forgotten at the next [`SlotStore::collect`], which frees room.
//!
//! # Examples
//!
//! ```
//! use std::sync::Arc;
//! use throttle_layer::store::{Fallback, SlotStore};
//! use throttle_proto::legacy;
//! use throttle_clock::ManualClock;
//!
//! let clock = Arc::new(ManualClock::new(100_000)); // slot 100
//! let store = SlotStore::builder().clock(clock.clone()).build();
//! let front = store.service("front");
//! let requests = front.resource("requests").unwrap();
//!
//! // No quota yet: the fallback (allow) decides.
//! assert!(front.admit("alice", &[(requests, 1)], Fallback::Allow).decision.is_allowed());
//!
//! store.apply_quota(&legacy::quota_from_json(r#"{"front": {"100": {"alice": {"requests": 2.0}}}}"#)?);
//! assert!(front.admit("alice", &[(requests, 1)], Fallback::Allow).decision.is_allowed());
//! assert!(front.admit("alice", &[(requests, 1)], Fallback::Allow).decision.is_allowed());
//! // consumption 3 > quota 2: refused, one rejection counted.
//! assert!(!front.admit("alice", &[(requests, 1)], Fallback::Allow).decision.is_allowed());
//!
//! clock.set(101_050);
//! let report = store.collect(100);
//! assert_eq!(report.slot_number, 101);
//! assert_eq!(report.consumption["front"].users["alice"].resources["requests"], 3);
//! assert_eq!(report.rejection["front"].users["alice"].resources["requests"], 1);
//! # Ok::<(), legacy::LegacyError>(())
//! ```

//!
//! The public surface is what the layer, the reporter and the
//! deterministic simulator drive: [`SlotStore`], [`ServiceStore`]'s
//! decisions, [`SlotStore::collect`] and [`SlotStore::apply_quota`]. The
//! setters of what the central sends besides quotas (`set_limits`,
//! `set_bound`, `set_blocked`), which the reporter installs from the
//! central's messages, and the counts of blocked users, quotas and cells
//! are public only with the `sim` feature: the simulator and the
//! integration tests drive a store through them, not an API to build on.
//!
//! The files, one type each: `decision` ([`Decision`], [`Basis`],
//! [`Tightest`]: what the request path answers), `limits`
//! (`ServiceLimits`, the central's limits as this node holds them),
//! `newcomers` (`Newcomers`, what the users without a row may take
//! together), `user`
//! (`UserState`, a user's counts and rows), `users` (the map of users),
//! `totals` (what a collection took, for the metrics), `service`
//! ([`ServiceStore`]: the request path, the default quota of a user
//! without a row, installing quotas, collecting reports; with
//! [`Admission`] and [`UserHandle`], which it hands out), `installed`
//! (the central's limits, bounds and blocks installed, and the allowance
//! a refusal names), `default_row` (the default row given to a user
//! entering a slot), `taken` (amounts counted outside a decision: taken
//! by a handler before its work, or added after), `slot` ([`SlotStore`]).

mod blocked;
mod budgets;
mod collect;
mod decision;
mod default_row;
mod fallback;
mod installed;
mod limits;
mod newcomers;
mod quota;
mod resource;
mod service;
mod slot;
mod taken;
mod totals;
mod user;
mod users;

#[cfg(test)]
mod tests;

pub use decision::{Basis, Decision, Tightest};
pub use fallback::{Fallback, FallbackParseError};
pub(crate) use limits::period_name;
pub(crate) use resource::counted;
pub use resource::{MAX_RESOURCES, ResourceId};
pub use service::{Admission, ServiceStore, UserHandle};
pub use slot::{SlotStore, SlotStoreBuilder};
