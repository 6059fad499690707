//! A [`Case`] run in the simulator: the real node stores, ledger,
//! buckets and policies in virtual time, at the nodes' default fallback.

use throttle_central::limits::LimitSet;
use throttle_core::policy::Projected;

use super::buckets::buckets;
use super::case::{Case, Fault, Load};
use super::oracle::{Verdict, check};
use crate::sim::{self, NodeFault, Scenario, Trace, User};

/// The scenario that runs `case`.
///
/// # Panics
///
/// If the case's limits file does not parse: the generator writes only
/// what the guide allows.
pub fn scenario(case: &Case) -> Scenario {
    let limits = LimitSet::from_toml(&case.limits_toml())
        .unwrap_or_else(|e| panic!("a generated limits file parses: {e}\n{case}"));
    let users: Vec<User> = case
        .users()
        .into_iter()
        .map(|name| {
            let loads: Vec<Load> = case
                .loads
                .iter()
                .filter(|l| l.user == name)
                .cloned()
                .collect();
            let limit = buckets(case, &name)
                .iter()
                .map(|b| b.rate / case.resource.cost as f64)
                .fold(f64::INFINITY, f64::min);
            User {
                name,
                limit: if limit.is_finite() {
                    limit.max(1.0)
                } else {
                    1e9
                },
                demand: Box::new(move |t, n| loads.iter().map(|l| l.at(t, n)).sum()),
            }
        })
        .collect();
    let mut s = sim::base("promise", case.seed, users, case.nodes);
    s.seconds = case.seconds;
    s.resource = (case.resource.name, case.resource.cost);
    s.limits = Some(limits);
    s.warm_up = 0;
    for f in &case.faults {
        match *f {
            Fault::Central { .. } | Fault::Etcd { .. } => {
                if let Some(outage) = f.outage() {
                    s.outage = Some(outage);
                }
            }
            Fault::Node {
                node,
                from_ms,
                to_ms,
                kind,
            } => s.node_faults.push(NodeFault {
                node,
                from_ms,
                to_ms,
                kind,
            }),
        }
    }
    s
}

/// Runs `case` in the simulator and checks what it admitted.
pub fn run(case: &Case) -> (Trace, Verdict) {
    let scenario = scenario(case);
    // The central's default policy.
    let trace = sim::run_traced(&scenario, Box::new(|_| Box::new(Projected::new())));
    let verdict = check(case, &trace.admitted, &trace.offered);
    (trace, verdict)
}
