//! Hierarchical quotas: a service's capacity (L1) split between
//! applications with guaranteed rates, burst ceilings and priorities (L2),
//! then between users and nodes (L3, the nodes' own slot stores).
//!
//! - `split`: [`split`], one resource's capacity between applications;
//!   `fill`: proportional shares with caps;
//! - `burst_allowance`: [`BurstAllowance`], how long an application may burst;
//! - `overshoot`: [`Overshoot`], what a group took past its grants,
//!   paid back from the next ones;
//! - `group`: what the policy keeps of an application, and what it asks
//!   of a slot;
//! - `hierarchical`: [`Hierarchical`], the policy;
//! - `status`: [`AppsStatus`], what `/v1/monitor/apps` shows.

mod burst_allowance;
mod fill;
mod group;
mod hierarchical;
mod overshoot;
mod split;
mod status;
#[cfg(test)]
mod tests;

pub use burst_allowance::BurstAllowance;
pub use hierarchical::Hierarchical;
pub use overshoot::Overshoot;
pub use split::{Ask, Scratch, Share, split};
pub use status::{AppStatus, AppsStatus, ResourceStatus};
