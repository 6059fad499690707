//! A deterministic simulator of a whole deployment in virtual time.
//!
//! It runs the real node [`SlotStore`]s and the real central [`Assigner`]
//! (ledger, buckets, policies) under one [`ManualClock`]; only the network
//! is simulated: reports and quotas travel through a queue with a seeded
//! delay and loss. Requests arrive at each node at the rates a [`Scenario`]
//! gives, each decided by the node's store as the layer would. Minutes of
//! virtual time with hundreds of nodes take well under a second.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::sync::Arc;
use std::time::Duration;

use throttle_central::assigner::{Accepts, Assigner};
use throttle_central::ledger::{Ledger, LedgerConfig, NodeId, PolicyFactory};
use throttle_central::limits::{Limit, LimitSet, StaticLimits};
use throttle_clock::{ManualClock, SlotLength};
use throttle_layer::reporter::report_point;
use throttle_layer::store::{Fallback, ResourceId, ServiceStore, SlotStore};
use throttle_proto::v1;

const SERVICE: &str = "front";
/// Virtual time step.
const STEP_MS: i64 = 5;
/// Reports leave this long after a slot boundary, as the reporter does by
/// default (plus each node's point of [`Scenario::report_spread_ms`]).
const REPORT_DELAY_MS: u64 = 50;
/// Virtual start: an arbitrary whole second.
const T0: i64 = 1_800_000_000_000;

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
    pub limits: Option<fn() -> LimitSet>,
}

/// What a run admitted, per user and slot.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Trace {
    /// The measures of the first user.
    pub outcome: Outcome,
    /// Per user (in the scenario's order), per slot: requests admitted
    /// (in the resource's units).
    pub admitted: Vec<Vec<i64>>,
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
    /// Requests refused of users other than the first while they offered
    /// less than their limit.
    pub others_refused: u64,
    /// Most slots after a shift until a slot is within 5% of the limit.
    pub reconverge_slots: i64,
    /// The lowest level of the measured user's bucket, in seconds of rate.
    pub deepest_debt: f64,
}

/// A small, fast, seeded generator (SplitMix64).
#[derive(Debug, Clone)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    fn range(&mut self, (lo, hi): (i64, i64)) -> i64 {
        if hi <= lo {
            lo
        } else {
            lo + (self.next() % (hi - lo + 1) as u64) as i64
        }
    }
}

#[derive(Debug)]
enum Event {
    Report(usize, v1::Report),
    Quota(usize, v1::Quota),
}

struct SimNode {
    store: SlotStore,
    service: Arc<ServiceStore>,
    requests: ResourceId,
    resource: ResourceId,
    id: Option<NodeId>,
}

/// Runs `scenario` under the policy `policy`.
pub fn run(scenario: &Scenario, policy: PolicyFactory) -> Outcome {
    run_traced(scenario, policy).outcome
}

/// The limits of `scenario`.
fn limits_of(scenario: &Scenario) -> LimitSet {
    if let Some(limits) = scenario.limits {
        return limits();
    }
    let resource = scenario.resource.0;
    let mut limits = LimitSet::new();
    if let Some(rate) = scenario.every_user {
        limits.insert(
            SERVICE,
            Limit {
                user: throttle_central::limits::EVERY_USER.into(),
                per_second: [(resource.to_string(), rate)].into(),
                burst_seconds: scenario.burst_seconds,
                ..Limit::default()
            },
        );
    }
    let own_rules = scenario
        .users
        .iter()
        .filter(|_| scenario.every_user.is_none());
    for u in own_rules {
        limits.insert(
            SERVICE,
            Limit {
                user: u.name.clone(),
                per_second: [(resource.to_string(), u.limit)].into(),
                burst_seconds: scenario.burst_seconds,
                max_debt_seconds: None,
                per_period: Default::default(),
            },
        );
    }
    limits
}

/// Runs `scenario` under the policy `policy`, keeping what each user was
/// admitted in each slot.
pub fn run_traced(scenario: &Scenario, policy: PolicyFactory) -> Trace {
    let slot = SlotLength::SECOND;
    let clock = Arc::new(ManualClock::new(T0));
    let (resource, cost) = scenario.resource;
    let limits = limits_of(scenario);
    let ledger = Ledger::with_policies(
        LedgerConfig {
            slot,
            ..LedgerConfig::default()
        },
        policy,
    );
    let mut central: Assigner = Assigner::new(ledger, Arc::new(StaticLimits::new(limits)));
    central.refresh_limits(T0);
    let mut nodes: Vec<SimNode> = (0..scenario.nodes)
        .map(|_| {
            let store = SlotStore::builder().clock(clock.clone()).slot(slot).build();
            let service = store.service(SERVICE);
            let requests = service.resource("requests").expect("fresh service");
            let resource = service.resource(resource).expect("fresh service");
            SimNode {
                store,
                service,
                requests,
                resource,
                id: None,
            }
        })
        .collect();
    // When after each boundary each node reports, on the simulator's steps.
    let report_at: Vec<i64> = nodes
        .iter()
        .enumerate()
        .map(|(i, _)| {
            let at = report_point(
                &format!("node-{i}"),
                Duration::from_millis(REPORT_DELAY_MS),
                Duration::from_millis(scenario.report_spread_ms),
            );
            let ms = i64::try_from(at.as_millis()).unwrap_or(i64::MAX);
            ms - ms % STEP_MS
        })
        .collect();
    let mut rng = Rng(scenario.seed);
    let mut queue: BinaryHeap<Reverse<(i64, u64, usize)>> = BinaryHeap::new();
    let mut events: BTreeMap<usize, Event> = BTreeMap::new();
    let mut seq = 0u64;
    let mut send = |queue: &mut BinaryHeap<_>,
                    events: &mut BTreeMap<usize, Event>,
                    rng: &mut Rng,
                    at: i64,
                    e: Event| {
        let when = at + rng.range(scenario.delay_ms);
        seq += 1;
        queue.push(Reverse((when, seq, seq as usize)));
        events.insert(seq as usize, e);
    };
    // Fractional arrivals carried between steps, per (user, node).
    let mut owed = vec![vec![0.0f64; scenario.nodes]; scenario.users.len()];
    let mut rates = vec![vec![0.0f64; scenario.nodes]; scenario.users.len()];
    // The (user, node) pairs with demand, as of the last read of the rates.
    let mut active: Vec<(usize, usize)> = Vec::new();
    // Whether each user offers less than their limit: only their refusals
    // count against the policy.
    let mut under = vec![true; scenario.users.len()];
    let slots = scenario.seconds as usize;
    // Per user, per slot (the measured user's is the first).
    let mut admitted = vec![vec![0i64; slots + 1]; scenario.users.len()];
    let mut offered = vec![0i64; slots + 1];
    let mut others_refused = 0u64;
    let mut deepest = f64::INFINITY;
    let measured = &scenario.users[0];
    let end = scenario.seconds * 1000;
    let mut t = 0;
    while t < end {
        let now = T0 + t;
        clock.set(now);
        let slot_now = slot.slot_at(now);
        let in_slot = now - slot.start_ms(slot_now);
        // Nodes coming and going.
        for (i, n) in nodes.iter_mut().enumerate() {
            let up = (scenario.alive)(t, i);
            match (up, n.id) {
                (true, None) => {
                    let (id, pushes) = central.connect(
                        &format!("node-{i}"),
                        &[SERVICE.to_string()],
                        Accepts::NONE,
                        now,
                    );
                    n.id = Some(id);
                    for (_, q) in pushes {
                        n.store.apply_quota(&q);
                    }
                }
                (false, Some(id)) => {
                    central.disconnect(id, Accepts::NONE);
                    n.id = None;
                }
                _ => {}
            }
        }
        // The network.
        while queue.peek().is_some_and(|Reverse((at, _, _))| *at <= now) {
            let Some(Reverse((_, _, key))) = queue.pop() else {
                break;
            };
            match events.remove(&key) {
                Some(Event::Report(i, r)) => {
                    let Some(id) = nodes[i].id else { continue };
                    if let Ok(answer) = central.report(id, &r, now) {
                        send(
                            &mut queue,
                            &mut events,
                            &mut rng,
                            now,
                            Event::Quota(i, answer.quota),
                        );
                        // The central re-assigns after its answers, at the same instant.
                        let pushes: Vec<_> = answer
                            .complete
                            .iter()
                            .flat_map(|s| central.reassign(s, now))
                            .collect();
                        for (to, q) in pushes {
                            if let Some(j) = nodes.iter().position(|n| n.id == Some(to)) {
                                send(&mut queue, &mut events, &mut rng, now, Event::Quota(j, q));
                            }
                        }
                    }
                }
                Some(Event::Quota(i, q)) if nodes[i].id.is_some() => nodes[i].store.apply_quota(&q),
                Some(Event::Quota(..)) => {}
                None => {}
            }
        }
        // Reports, 50 ms after each boundary (or at each node's point of the
        // spread after that).
        for (i, n) in nodes.iter().enumerate() {
            if n.id.is_none() || in_slot != report_at[i] {
                continue;
            }
            let mut r = n.store.collect(slot_now - 1);
            r.node_id = format!("node-{i}");
            if rng.unit() >= scenario.loss {
                send(&mut queue, &mut events, &mut rng, now, Event::Report(i, r));
            }
        }
        // The assigner at mid-slot.
        if in_slot == 500 {
            for (to, q) in central.tick(now) {
                if let Some(j) = nodes.iter().position(|n| n.id == Some(to)) {
                    send(&mut queue, &mut events, &mut rng, now, Event::Quota(j, q));
                }
            }
            if let Some(level) =
                central
                    .ledger_mut()
                    .bucket_level(SERVICE, &measured.name, resource, now)
            {
                deepest = deepest.min(level / measured.limit);
            }
        }
        // Requests. Rates are read every 100 ms of virtual time; pairs with
        // no demand cost nothing.
        if t % 100 == 0 {
            active.clear();
            for (u, user) in scenario.users.iter().enumerate() {
                for (i, r) in rates[u].iter_mut().enumerate() {
                    *r = (user.demand)(t, i);
                    if *r > 0.0 {
                        active.push((u, i));
                    }
                }
                under[u] = rates[u].iter().sum::<f64>() < user.limit;
            }
        }
        let index = (t / 1000) as usize;
        for &(u, i) in &active {
            let (user, n) = (&scenario.users[u], &nodes[i]);
            let rate = rates[u][i];
            if n.id.is_none() {
                continue;
            }
            owed[u][i] += rate * STEP_MS as f64 / 1000.0 * (0.5 + rng.unit());
            while owed[u][i] >= 1.0 {
                owed[u][i] -= 1.0;
                // One request; a resource other than `requests` is
                // charged after the response, like traffic_down.
                let a = n.service.admit_with_handle(
                    &user.name,
                    &[(n.requests, 1)],
                    Fallback::Allow,
                    true,
                );
                let ok = a.decision.is_allowed();
                if ok {
                    admitted[u][index] += cost;
                }
                if u == 0 {
                    offered[index] += cost;
                } else if !ok && under[u] {
                    others_refused += 1;
                }
                if ok
                    && n.resource != n.requests
                    && let Some(h) = a.handle
                {
                    h.consume(n.resource, cost);
                }
            }
        }
        t += STEP_MS;
    }
    for user in &mut admitted {
        user.truncate(slots);
    }
    let outcome = measure(
        scenario,
        &admitted[0],
        &offered[..slots],
        others_refused,
        deepest,
    );
    Trace { outcome, admitted }
}

fn measure(
    scenario: &Scenario,
    admitted: &[i64],
    offered: &[i64],
    others_refused: u64,
    deepest: f64,
) -> Outcome {
    let limit = scenario.users[0].limit;
    let from = scenario.warm_up as usize;
    let steady = &admitted[from.min(admitted.len())..];
    let windows: Vec<f64> = steady
        .windows(10)
        .map(|w| w.iter().sum::<i64>() as f64 / (10.0 * limit))
        .collect();
    let capped: f64 = offered[from.min(offered.len())..]
        .iter()
        .map(|&o| (o as f64).min(limit))
        .sum();
    let reconverge = scenario
        .shifts
        .iter()
        .map(|&shift| {
            let s = (shift / 1000) as usize;
            (s..admitted.len())
                .find(|&k| ((admitted[k] as f64 / limit) - 1.0).abs() <= 0.05)
                .map_or(i64::MAX, |k| (k - s) as i64)
        })
        .max()
        .unwrap_or(0);
    Outcome {
        window_min: windows.iter().copied().fold(f64::INFINITY, f64::min),
        window_max: windows.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        worst_slot: steady.iter().map(|&a| a as f64 / limit).fold(0.0, f64::max),
        utilization: if capped > 0.0 {
            steady.iter().sum::<i64>() as f64 / capped
        } else {
            1.0
        },
        others_refused,
        reconverge_slots: reconverge,
        deepest_debt: if deepest.is_finite() { deepest } else { 0.0 },
    }
}

fn always(_: i64, _: usize) -> bool {
    true
}

/// A user offering `total` requests per second split by `shares`.
pub(crate) fn spread(name: &str, limit: f64, total: f64, shares: Vec<f64>) -> User {
    User {
        name: name.into(),
        limit,
        demand: Box::new(move |_, n| total * shares.get(n).copied().unwrap_or(0.0)),
    }
}

pub(crate) fn base(name: &'static str, seed: u64, users: Vec<User>, nodes: usize) -> Scenario {
    Scenario {
        name,
        seed,
        seconds: 60,
        nodes,
        users,
        burst_seconds: 10.0,
        resource: ("requests", 1),
        delay_ms: (0, 2),
        loss: 0.0,
        report_spread_ms: 0,
        alive: always,
        warm_up: 10,
        shifts: Vec::new(),
        every_user: None,
        limits: None,
    }
}

/// The scenarios of the accuracy benchmark, in order.
pub fn scenarios() -> Vec<Scenario> {
    let mut out = vec![
        base(
            "1 steady 3x, even",
            1,
            vec![spread("heavy", LIMIT, 3.0 * LIMIT, vec![1.0 / 3.0; 3])],
            3,
        ),
        base(
            "2 steady 3x, 70/20/10",
            2,
            vec![spread("heavy", LIMIT, 3.0 * LIMIT, vec![0.7, 0.2, 0.1])],
            3,
        ),
    ];
    out.push(hot_node_moves("3 hot node moves every 10 s", 3));
    let mut burst = base(
        "4 burst after 30 s idle",
        4,
        vec![User {
            name: "heavy".into(),
            limit: LIMIT,
            demand: Box::new(|t, _| if t < 30_000 { 0.0 } else { 5.0 * LIMIT / 3.0 }),
        }],
        3,
    );
    burst.warm_up = 30;
    out.push(burst);
    let mut many = vec![spread("heavy", LIMIT, 3.0 * LIMIT, vec![0.1; 10])];
    for u in 0..1000 {
        let home = u % 10;
        many.push(User {
            name: format!("light-{u:04}"),
            limit: 20.0,
            demand: Box::new(move |_, n| if n == home { 10.0 } else { 0.0 }),
        });
    }
    out.push(base("5 1000 light users + 1 heavy", 5, many, 10));
    let mut churn = base(
        "6 nodes join and leave",
        6,
        vec![User {
            name: "heavy".into(),
            limit: LIMIT,
            demand: Box::new(|_, _| 300.0),
        }],
        12,
    );
    // Node k is down during the k-th 5-second period (mod 12).
    churn.alive = |t, n| (t / 5_000) as usize % 12 != n;
    out.push(churn);
    let mut debt = base(
        "7 traffic_down charged after 1 MiB responses",
        7,
        vec![spread(
            "heavy",
            10.0 * 1_048_576.0,
            30.0,
            vec![1.0 / 3.0; 3],
        )],
        3,
    );
    debt.resource = ("traffic_down", 1_048_576);
    out.push(debt);
    let mut lossy = base(
        "8 0-300 ms delay, 5% reports lost",
        8,
        vec![spread("heavy", LIMIT, 3.0 * LIMIT, vec![0.7, 0.2, 0.1])],
        3,
    );
    lossy.delay_ms = (0, 300);
    lossy.loss = 0.05;
    out.push(lossy);
    out.push(two_hundred_nodes("9 200 nodes, one user 3x", 9));
    // 100 light users at a fifth of their limit, each on one node at
    // first, then spread over one more node every 4 s (from 12 s on, the
    // same 20 requests/s in all): traffic arriving at nodes that had none
    // of it, as when a load balancer moves users about.
    let mut spreading = vec![spread("heavy", LIMIT, 3.0 * LIMIT, vec![0.1; 10])];
    for u in 0..100usize {
        spreading.push(User {
            name: format!("light-{u:03}"),
            limit: 100.0,
            demand: Box::new(move |t, n| {
                let on =
                    (1 + (t - 12_000 + (u as i64 % 4) * 1_000).max(0) as usize / 4_000).min(10);
                if (n + 10 - u % 10) % 10 < on {
                    20.0 / on as f64
                } else {
                    0.0
                }
            }),
        });
    }
    out.push(base(
        "10 light users arrive at new nodes",
        10,
        spreading,
        10,
    ));
    // Scenarios 3 and 9 with the nodes' reports spread over the 400 ms
    // after the report delay (`ReporterBuilder::report_spread`).
    for mut s in [
        hot_node_moves("11 hot node moves, reports spread 400 ms", 11),
        two_hundred_nodes("12 200 nodes, reports spread 400 ms", 12),
    ] {
        s.report_spread_ms = 400;
        out.push(s);
    }
    out.push(every_user(
        "13 10 heavy + 100,000 light users under *",
        100_000,
    ));
    out
}

/// Ten heavy users at 3x the `*` rate (200/s) over 10 nodes, beside `light` light
/// ones each on one node at one request every 10 s: every user is limited
/// by the `*` rule alone, and the central holds the users of the last
/// minute, not a rule per user. (The test suite runs it with fewer light
/// users: in a debug build 100,000 take minutes.)
pub fn every_user(name: &'static str, light: usize) -> Scenario {
    let seed = 13;
    let nodes = 10;
    let rate = LIMIT / 5.0;
    let mut users: Vec<User> = (0..10)
        .map(|h| spread(&format!("heavy-{h}"), rate, 3.0 * rate, vec![0.1; nodes]))
        .collect();
    for u in 0..light {
        let home = u % nodes;
        users.push(User {
            name: format!("light-{u:06}"),
            limit: rate,
            demand: Box::new(move |_, n| if n == home { 0.1 } else { 0.0 }),
        });
    }
    let mut s = base(name, seed, users, nodes);
    s.every_user = Some(rate);
    s
}

/// The limit of the scenarios' measured user, requests per second.
const LIMIT: f64 = 1000.0;

/// Three nodes; the one that gets most of the user's traffic changes every
/// 10 s.
fn hot_node_moves(name: &'static str, seed: u64) -> Scenario {
    let mut moving = base(
        name,
        seed,
        vec![User {
            name: "heavy".into(),
            limit: LIMIT,
            demand: Box::new(|t, n| {
                if (t / 10_000) as usize % 3 == n {
                    2700.0
                } else {
                    150.0
                }
            }),
        }],
        3,
    );
    moving.shifts = (1..6).map(|k| k * 10_000).collect();
    moving
}

/// One user at three times its limit, spread evenly over 200 nodes.
fn two_hundred_nodes(name: &'static str, seed: u64) -> Scenario {
    base(
        name,
        seed,
        vec![spread("heavy", LIMIT, 3.0 * LIMIT, vec![1.0 / 200.0; 200])],
        200,
    )
}

/// The scenario named `prefix...`.
///
/// # Panics
///
/// When there is none: a typo in a test.
pub fn scenario(prefix: &str) -> Scenario {
    scenarios()
        .into_iter()
        .find(|s| s.name.starts_with(prefix))
        .unwrap_or_else(|| panic!("no scenario {prefix:?}"))
}
