//! Users arriving at nodes that have never seen them, all at once: how
//! much of the `*` rate each is admitted in its first slots, before the
//! central has seen it reported and sent its own quota. Told the limits,
//! each node holds such a user to the default quota (its share of the `*`
//! rate); without them each lets the user through unlimited for a slot.

use super::scenarios::{base, spread};
use super::{Scenario, Trace, User};

/// The `*` rate, requests per second.
const RATE: f64 = 1000.0;
const NODES: usize = 10;
/// Newcomers, one every 2 s from 10.3 s.
pub const NEWCOMERS: usize = 20;
/// The first arrives 300 ms into a slot: its first slot is 70% of one.
const FIRST_MS: i64 = 10_300;
const EVERY_MS: i64 = 2_000;
/// How long each offers three times the rate, over every node.
const STAY_MS: i64 = 4_000;

/// The scenario, with or without the default quota.
pub fn newcomers(name: &'static str, default_quota: bool) -> Scenario {
    let mut users = vec![spread("resident", RATE, 3.0 * RATE, vec![0.1; NODES])];
    for k in 0..NEWCOMERS {
        let from = FIRST_MS + k as i64 * EVERY_MS;
        users.push(User {
            name: format!("newcomer-{k:02}"),
            limit: RATE,
            demand: Box::new(move |t, _| {
                let here = (from..from + STAY_MS).contains(&t);
                if here { 3.0 * RATE / NODES as f64 } else { 0.0 }
            }),
        });
    }
    let mut s = base(name, 21, users, NODES);
    s.seconds = (FIRST_MS + NEWCOMERS as i64 * EVERY_MS + STAY_MS) / 1000 + 2;
    s.every_user = Some(RATE);
    s.default_quota = default_quota;
    s
}

/// Over the newcomers of a run of [`newcomers`]: what each was admitted
/// in its first two slots (the one it arrived in, 70% of a slot, and the
/// next, assigned before the central saw it), the larger as a share of
/// the rate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FirstSlots {
    /// The largest over the newcomers.
    pub worst: f64,
    /// The mean over the newcomers.
    pub mean: f64,
}

impl FirstSlots {
    /// The first slots of `trace`, a run of `scenario` ([`newcomers`]).
    pub fn of(scenario: &Scenario, trace: &Trace) -> Self {
        let firsts: Vec<f64> = (0..NEWCOMERS)
            .map(|k| {
                let slot = ((FIRST_MS + k as i64 * EVERY_MS) / 1000) as usize;
                let admitted = &trace.admitted[k + 1];
                let most = admitted[slot].max(admitted[slot + 1]);
                most as f64 / scenario.users[k + 1].limit
            })
            .collect();
        Self {
            worst: firsts.iter().copied().fold(0.0, f64::max),
            mean: firsts.iter().sum::<f64>() / firsts.len() as f64,
        }
    }
}
