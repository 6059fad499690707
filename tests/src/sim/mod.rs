//! A deterministic simulator of a whole deployment in virtual time.
//!
//! It runs the real node [`SlotStore`]s and the real central [`Assigner`]
//! (ledger, buckets, policies) under one [`ManualClock`]; only the network
//! is simulated: reports and quotas travel through a queue with a seeded
//! delay and loss. Requests arrive at each node at the rates a [`Scenario`]
//! gives, each decided by the node's store as the layer would. The central
//! may go away for a while ([`Outage`]) and come back as itself or as a new
//! process restored from its checkpoint. Minutes of virtual time with
//! hundreds of nodes take well under a second.
//!
//! [`SlotStore`]: throttle_layer::store::SlotStore
//! [`Assigner`]: throttle_core::assigner::Assigner
//! [`ManualClock`]: throttle_clock::ManualClock

mod envoy_bucket;
mod envoy_proxy;
mod measure;
mod network;
mod newcomers;
mod outage;
mod scenarios;
mod sim_proxy;
mod tally;
mod world;

use throttle_central::limits::LimitSet;
use throttle_core::ledger::PolicyFactory;
use throttle_layer::store::Fallback;

pub use newcomers::{FirstSlots, NEWCOMERS, newcomers};
pub use outage::{Comeback, Outage, OutageOutcome};
pub(crate) use scenarios::base;
pub use scenarios::{every_user, outages, scenario, scenarios};

/// A user's traffic: requests per second at each node, over time.
pub type Demand = Box<dyn Fn(i64, usize) -> f64>;

/// One user of a scenario.
pub struct User {
    /// Name.
    pub name: String,
    /// Limit per second of the limited resource.
    pub limit: f64,
    /// Requests per second offered at (time in ms since start, node).
    pub demand: Demand,
}

impl std::fmt::Debug for User {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("User")
            .field("name", &self.name)
            .field("limit", &self.limit)
            .finish()
    }
}

/// A named, seeded, reproducible case.
#[derive(Debug)]
pub struct Scenario {
    /// Short name for tables.
    pub name: &'static str,
    /// Seed of delays, losses and arrival jitter.
    pub seed: u64,
    /// Virtual seconds to run.
    pub seconds: i64,
    /// Number of node slots (some may be down at times, see `alive`).
    pub nodes: usize,
    /// How many of the nodes, the last ones, are Envoy proxies: each a
    /// token bucket per user that reports every 5 s (see `envoy_proxy`).
    /// They are always up; a central that goes away is left to the
    /// scenarios without proxies.
    pub proxies: usize,
    /// The users; the first is the one measured against its limit.
    pub users: Vec<User>,
    /// Bucket capacity in seconds of rate.
    pub burst_seconds: f64,
    /// The limited resource and its cost per request, charged after the
    /// request is admitted (`("requests", 1)` charges at admission).
    pub resource: (&'static str, i64),
    /// One-way network delay range, ms.
    pub delay_ms: (i64, i64),
    /// Probability that a report is lost.
    pub loss: f64,
    /// The nodes' reports spread over this many ms after the report delay,
    /// each node at its `report_point`, as the reporter places it.
    pub report_spread_ms: u64,
    /// Whether node `n` is up at time `t` (ms since start).
    pub alive: fn(i64, usize) -> bool,
    /// Seconds at the start left out of the measurements.
    pub warm_up: i64,
    /// Times (ms since start) where the load moves; re-convergence is
    /// measured after each.
    pub shifts: Vec<i64>,
    /// Every user is limited by one `*` rule of this rate instead of a
    /// rule of their own (each user's `limit` must be this rate).
    pub every_user: Option<f64>,
    /// The limits, instead of a rule per user (or `every_user`): for
    /// scenarios that measure more than one user's limit.
    pub limits: Option<LimitSet>,
    /// What the nodes decide without a quota for the slot.
    pub fallback: Fallback,
    /// A time when no central answers.
    pub outage: Option<Outage>,
    /// Nodes restarted or cut off from the central for a while.
    pub node_faults: Vec<NodeFault>,
    /// The central tells the nodes its limits, whose default quota holds
    /// a user a node has no quota row for yet; false: such a user is not
    /// limited until their row arrives.
    pub default_quota: bool,
}

/// A node that stops for a while, or keeps serving without reaching any
/// central.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeFault {
    /// Which node.
    pub node: usize,
    /// From when, ms since the start of the run.
    pub from_ms: i64,
    /// Until when.
    pub to_ms: i64,
    /// What happens to it.
    pub kind: NodeFaultKind,
}

/// What a [`NodeFault`] does to its node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeFaultKind {
    /// The process stops and starts again: it serves nothing meanwhile
    /// and loses the reports its reporter kept, and its store.
    Restart,
    /// It keeps serving on its fallback, its stream down; back, it sends
    /// the reports it kept.
    Cut,
}

impl NodeFault {
    /// Whether it covers node `node` at `t` (ms since the start).
    pub fn covers(&self, t: i64, node: usize, kind: NodeFaultKind) -> bool {
        self.node == node && self.kind == kind && (self.from_ms..self.to_ms).contains(&t)
    }
}

/// What a run admitted, per user and slot.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Trace {
    /// The measures of the first user.
    pub outcome: Outcome,
    /// Per user (in the scenario's order), per slot: requests admitted
    /// (in the resource's units).
    pub admitted: Vec<Vec<i64>>,
    /// Per user, per slot: what they offered (in the resource's units).
    pub offered: Vec<Vec<i64>>,
}

/// What a run measured.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Outcome {
    /// Min and max of admitted/limit over every 10-slot window after the
    /// warm-up (1.0 = exactly the limit).
    pub window_min: f64,
    /// See `window_min`.
    pub window_max: f64,
    /// The largest single slot's admitted/limit.
    pub worst_slot: f64,
    /// Admitted / min(offered, limit) after the warm-up.
    pub utilization: f64,
    /// Requests refused, after the warm-up, of users other than the first while they offered
    /// less than their limit.
    pub others_refused: u64,
    /// Most slots after a shift until a slot is within 5% of the limit.
    pub reconverge_slots: i64,
    /// The lowest level of the measured user's bucket, in seconds of rate.
    pub deepest_debt: f64,
    /// Around the outage, when the scenario has one.
    pub outage: Option<OutageOutcome>,
}

/// Runs `scenario` under the policy `policy`.
pub fn run(scenario: &Scenario, policy: PolicyFactory) -> Outcome {
    run_traced(scenario, policy).outcome
}

/// Runs `scenario` under the policy `policy`, keeping what each user was
/// admitted in each slot.
pub fn run_traced(scenario: &Scenario, policy: PolicyFactory) -> Trace {
    world::World::new(scenario, policy).run()
}
