//! One run of a [`Scenario`]: the nodes, the central and the network,
//! stepped together on the virtual clock.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use throttle_central::limits::{Limit, LimitSet, StaticLimits};
use throttle_clock::{ManualClock, SlotLength};
use throttle_core::assigner::{Accepts, Assigner, Push};
use throttle_core::ledger::{Ledger, LedgerConfig, NodeId, PolicyFactory};
use throttle_layer::reporter::report_point;
use throttle_layer::store::{ResourceId, ServiceStore, SlotStore};
use throttle_proto::v1;

use super::network::{Event, Network, Rng};
use super::outage::{Comeback, Kept, OutageOutcome};
use super::sim_proxy::SimProxy;
use super::tally::Tally;
use super::{NodeFaultKind, Scenario, Trace, measure};

const SERVICE: &str = "front";
/// Virtual time step.
const STEP_MS: i64 = 5;
/// Reports leave this long after a slot boundary, as the reporter does by
/// default (plus each node's point of [`Scenario::report_spread_ms`]).
const REPORT_DELAY_MS: u64 = 50;
/// Virtual start: an arbitrary whole second.
const T0: i64 = 1_800_000_000_000;
const SLOT: SlotLength = SlotLength::SECOND;

struct SimNode {
    store: SlotStore,
    service: Arc<ServiceStore>,
    requests: ResourceId,
    resource: ResourceId,
    /// Its id at the central while connected.
    id: Option<NodeId>,
    /// Whether the node runs.
    up: bool,
    /// The central generation it last connected to.
    generation: Option<u32>,
    /// The reports its reporter keeps.
    kept: Kept,
    /// The limits the central last told it.
    told: Option<Arc<v1::Limits>>,
    /// The bound keys and budgets the central last told it.
    bound: Option<Arc<v1::Bound>>,
    /// It was stopped to be started again, with a new store.
    restarted: bool,
}

pub(super) struct World<'a> {
    scenario: &'a Scenario,
    clock: Arc<ManualClock>,
    /// Makes every central's policies (a restarted central makes new ones).
    policy: Arc<Mutex<PolicyFactory>>,
    central: Assigner,
    /// Which central answers: a new process is a new generation.
    generation: u32,
    /// Whether no central answers now.
    down: bool,
    /// The last checkpoint the central wrote.
    checkpoint: Option<v1::Checkpoint>,
    /// The nodes of the library: the scenario's first ones.
    nodes: Vec<SimNode>,
    /// Envoy proxies: the scenario's last [`Scenario::proxies`] nodes.
    proxies: Vec<SimProxy>,
    /// When after each boundary each node reports, on the simulator's steps.
    report_at: Vec<i64>,
    rng: Rng,
    /// When each node is back after the outage (empty without one).
    back_at: Vec<i64>,
    net: Network,
    tally: Tally,
}

/// A central node of `scenario`'s limits, its policies made by `policy`.
fn new_central(scenario: &Scenario, policy: &Arc<Mutex<PolicyFactory>>, now: i64) -> Assigner {
    let shared = policy.clone();
    let ledger = Ledger::with_policies(
        LedgerConfig {
            slot: SLOT,
            ..LedgerConfig::default()
        },
        Box::new(move |service| (shared.lock().unwrap_or_else(PoisonError::into_inner))(service)),
    );
    let limits = Arc::new(StaticLimits::new(limits_of(scenario)));
    let mut central: Assigner = Assigner::new(ledger, limits);
    central.refresh_limits(now);
    central
}

/// The limits of `scenario`.
fn limits_of(scenario: &Scenario) -> LimitSet {
    if let Some(limits) = &scenario.limits {
        return limits.clone();
    }
    let resource = scenario.resource.0;
    let rule = |user: &str, rate: f64| Limit {
        user: user.into(),
        per_second: [(resource.to_string(), rate)].into(),
        burst_seconds: scenario.burst_seconds,
        ..Limit::default()
    };
    let mut limits = LimitSet::new();
    match scenario.every_user {
        Some(rate) => limits.insert(SERVICE, rule(throttle_central::limits::EVERY_USER, rate)),
        None => {
            for u in &scenario.users {
                limits.insert(SERVICE, rule(&u.name, u.limit));
            }
        }
    }
    limits
}

fn new_node(clock: &Arc<ManualClock>, resource: &str) -> SimNode {
    let store = SlotStore::builder().clock(clock.clone()).slot(SLOT).build();
    let service = store.service(SERVICE);
    let requests = service.resource("requests").expect("fresh service");
    let resource = service.resource(resource).expect("fresh service");
    SimNode {
        store,
        service,
        requests,
        resource,
        id: None,
        up: false,
        generation: None,
        kept: Kept::default(),
        told: None,
        bound: None,
        restarted: false,
    }
}

impl<'a> World<'a> {
    pub(super) fn new(scenario: &'a Scenario, policy: PolicyFactory) -> Self {
        let clock = Arc::new(ManualClock::new(T0));
        let policy = Arc::new(Mutex::new(policy));
        let central = new_central(scenario, &policy, T0);
        let library = scenario.nodes - scenario.proxies;
        let nodes: Vec<SimNode> = (0..library)
            .map(|_| new_node(&clock, scenario.resource.0))
            .collect();
        let proxies = (library..scenario.nodes)
            .map(|i| SimProxy::new(format!("envoy-{i}"), SLOT))
            .collect();
        let report_at = (0..scenario.nodes)
            .map(|i| {
                let at = report_point(
                    &format!("node-{i}"),
                    Duration::from_millis(REPORT_DELAY_MS),
                    Duration::from_millis(scenario.report_spread_ms),
                );
                let ms = i64::try_from(at.as_millis()).unwrap_or(i64::MAX);
                ms - ms % STEP_MS
            })
            .collect();
        let tally = Tally::new(
            scenario.users.len(),
            scenario.nodes,
            scenario.seconds as usize,
            scenario.warm_up as usize,
        );
        Self {
            scenario,
            clock,
            policy,
            central,
            generation: 0,
            down: false,
            checkpoint: None,
            nodes,
            proxies,
            report_at,
            rng: Rng(scenario.seed),
            back_at: (scenario.outage)
                .map(|o| o.back_at(scenario.nodes, scenario.seed))
                .unwrap_or_default(),
            net: Network::default(),
            tally,
        }
    }

    pub(super) fn run(mut self) -> Trace {
        let mut t = 0;
        while t < self.scenario.seconds * 1000 {
            self.step(t);
            t += STEP_MS;
        }
        self.finish()
    }

    fn step(&mut self, t: i64) {
        let now = T0 + t;
        self.clock.set(now);
        let in_slot = now - SLOT.start_ms(SLOT.slot_at(now));
        self.central_comes_and_goes(t, now);
        self.nodes_come_and_go(t, now);
        self.deliver(now);
        self.report(now, in_slot);
        self.proxies_step(now, in_slot);
        // The assigner at mid-slot.
        if in_slot == 500 && !self.down {
            for (to, q) in self.central.tick(now) {
                self.push(to, now, q);
            }
            self.tell(now);
            let measured = &self.scenario.users[0];
            let ledger = self.central.ledger_mut();
            let resource = self.scenario.resource.0;
            if let Some(level) = ledger.bucket_level(SERVICE, &measured.name, resource, now) {
                self.tally.deepest = self.tally.deepest.min(level / measured.limit);
            }
        }
        self.requests(t);
    }

    /// The outage: the central stops answering, and comes back as itself
    /// or as a new process; meanwhile it writes its checkpoints.
    fn central_comes_and_goes(&mut self, t: i64, now: i64) {
        let Some(outage) = self.scenario.outage else {
            return;
        };
        if let Comeback::Checkpoint { every_ms } = outage.comeback
            && !self.down
            && t % every_ms == 0
            && outage.checkpoints_until_ms.is_none_or(|until| t < until)
        {
            self.checkpoint = Some(self.central.ledger().checkpoint(now));
        }
        let away = outage.covers(t);
        if away == self.down {
            return;
        }
        self.down = away;
        if away {
            let same = outage.comeback == Comeback::Same;
            for p in &mut self.proxies {
                p.lose(same.then_some(&mut self.central));
            }
            for n in &mut self.nodes {
                if let Some(id) = n.id.take()
                    && outage.comeback == Comeback::Same
                {
                    self.central.disconnect(id, Accepts::NONE);
                }
            }
            return;
        }
        if outage.comeback == Comeback::Same {
            return;
        }
        self.generation += 1;
        self.central = new_central(self.scenario, &self.policy, now);
        let ledger = self.central.ledger_mut();
        match &self.checkpoint {
            Some(cp) => {
                ledger
                    .restore(cp, now)
                    .expect("a checkpoint of the same slot length");
            }
            // As the ledger's task does at its first leadership.
            None => ledger.begin(now),
        }
    }

    /// Nodes coming and going, connecting when a central answers (after
    /// an outage, each at its time); a node restarted comes back with a
    /// new store, one cut off keeps serving without a stream.
    fn nodes_come_and_go(&mut self, t: i64, now: i64) {
        for i in 0..self.nodes.len() {
            let faults = &self.scenario.node_faults;
            let restarting = faults
                .iter()
                .any(|f| f.covers(t, i, NodeFaultKind::Restart));
            let cut = faults.iter().any(|f| f.covers(t, i, NodeFaultKind::Cut));
            let up = (self.scenario.alive)(t, i) && !restarting;
            if up && !self.nodes[i].up && self.nodes[i].restarted {
                self.nodes[i] = new_node(&self.clock, self.scenario.resource.0);
            }
            let n = &mut self.nodes[i];
            n.up = up;
            n.restarted |= restarting;
            let before = self.scenario.outage.is_some_and(|o| t < o.from_ms);
            let back = before || self.back_at.get(i).is_none_or(|&at| t >= at);
            match (up, n.id) {
                (true, None) if !self.down && back && !cut => self.connect(i, now),
                (true, Some(id)) if cut => {
                    self.central.disconnect(id, Accepts::NONE);
                    n.id = None;
                }
                (false, Some(id)) => {
                    self.central.disconnect(id, Accepts::NONE);
                    // A node that stops loses what its reporter kept.
                    n.id = None;
                    n.kept = Kept::default();
                }
                _ => {}
            }
        }
    }

    /// Connects node `i` and sends what its reporter kept: to the central
    /// it knew, the unanswered reports; to a new one, all.
    fn connect(&mut self, i: usize, now: i64) {
        let name = format!("node-{i}");
        // A node welcomed before says so in its Hello.
        if self.nodes[i].generation.is_some() {
            self.central.resumes(now);
        }
        let (id, pushes) = self
            .central
            .connect(&name, &[SERVICE.to_string()], Accepts::NONE, now);
        let n = &mut self.nodes[i];
        n.id = Some(id);
        n.told = None;
        n.bound = None;
        for (to, q) in pushes {
            match to == id {
                true => self.nodes[i].store.apply_quota(&q),
                false => self.push(to, now, q),
            }
        }
        self.tell(now);
        let n = &mut self.nodes[i];
        let all = n.generation.is_some_and(|g| g != self.generation);
        n.generation = Some(self.generation);
        let replay = n.kept.replay(all);
        if replay.is_empty() {
            return;
        }
        let generation = self.generation;
        let events = replay.into_iter().map(|report| Event::Report {
            node: i,
            central: generation,
            report,
        });
        self.net
            .send_all(&mut self.rng, self.scenario.delay_ms, now, events);
    }

    /// The messages arrived by `now`.
    fn deliver(&mut self, now: i64) {
        while let Some(event) = self.net.arrived(now) {
            match event {
                Event::Report {
                    node,
                    central,
                    report,
                } => self.file(node, central, &report, now),
                Event::Quota(i, q) => {
                    if self.nodes[i].id.is_some() {
                        self.nodes[i].store.apply_quota(&q);
                    }
                }
            }
        }
    }

    /// The central files a report of node `i` sent to generation
    /// `central` and answers it (unless another central answered it).
    fn file(&mut self, i: usize, central: u32, report: &v1::Report, now: i64) {
        let Some(id) = self.nodes[i].id else { return };
        if self.down || central != self.generation {
            return;
        }
        if report.answered {
            let _ = self.central.file(id, report, now);
            return;
        }
        let Ok(answer) = self.central.report(id, report, now) else {
            return;
        };
        self.nodes[i].kept.answered(report.slot_number);
        let delay = self.scenario.delay_ms;
        self.net
            .send(&mut self.rng, delay, now, Event::Quota(i, answer.quota));
        // The central re-assigns after its answers, at the same instant.
        let pushes: Vec<_> = answer
            .complete
            .iter()
            .flat_map(|s| self.central.reassign(s, now))
            .collect();
        for (to, q) in pushes {
            self.push(to, now, q);
        }
    }

    /// Sends each connected node the central's limits, and its bound keys
    /// with their budgets, where they are not the ones it last sent it
    /// (unless the scenario leaves them out).
    /// They arrive at once: drawing delays for them would move every
    /// later draw of the run, and so every scenario's numbers.
    fn tell(&mut self, now: i64) {
        if !self.scenario.default_quota {
            return;
        }
        let Some(told) = self.central.ledger_mut().told(SERVICE, now) else {
            return;
        };
        for p in &mut self.proxies {
            p.limits(&told);
        }
        let bound = self.central.ledger_mut().bound(SERVICE, now);
        for n in &mut self.nodes {
            if n.id.is_none() {
                continue;
            }
            if !n.told.as_ref().is_some_and(|t| Arc::ptr_eq(t, &told)) {
                n.store.set_limits(v1::Limits::clone(&told));
                n.told = Some(told.clone());
            }
            if let Some(b) = &bound
                && !n.bound.as_ref().is_some_and(|t| Arc::ptr_eq(t, b))
            {
                n.store.set_bound(v1::Bound::clone(b));
                n.bound = Some(b.clone());
            }
        }
    }

    /// What the proxies and their streams do at `now` (see
    /// [`SimProxy::step`]); while no central answers, Envoy drops the
    /// reports due.
    fn proxies_step(&mut self, now: i64, in_slot: i64) {
        if self.down {
            self.proxies.iter_mut().for_each(|p| p.drop_due(now));
            return;
        }
        let mut pushes = Vec::new();
        for p in &mut self.proxies {
            pushes.extend(p.step(&mut self.central, now, in_slot));
        }
        self.push_all(now, pushes);
    }

    fn push_all(&mut self, now: i64, pushes: Vec<Push>) {
        for (to, q) in pushes {
            self.push(to, now, q);
        }
    }

    /// Sends `quota` to the node with id `to`; a proxy's stream takes it
    /// at once.
    fn push(&mut self, to: NodeId, now: i64, quota: v1::Quota) {
        if let Some(p) = self.proxies.iter_mut().find(|p| p.id() == Some(to)) {
            p.quota(&mut self.central, quota, now);
        } else if let Some(j) = self.nodes.iter().position(|n| n.id == Some(to)) {
            let delay = self.scenario.delay_ms;
            self.net
                .send(&mut self.rng, delay, now, Event::Quota(j, quota));
        }
    }

    /// Reports, 50 ms after each boundary (or at each node's point of the
    /// spread after that); kept while no central answers.
    fn report(&mut self, now: i64, in_slot: i64) {
        let slot_now = SLOT.slot_at(now);
        for i in 0..self.nodes.len() {
            let n = &mut self.nodes[i];
            if !n.up || in_slot != self.report_at[i] {
                continue;
            }
            let mut r = n.store.collect(slot_now - 1);
            r.node_id = format!("node-{i}");
            // Kept only where a central or a node goes away: otherwise no
            // copy is made (scenario 13's are of 10,000 users).
            if self.scenario.outage.is_some() || !self.scenario.node_faults.is_empty() {
                n.kept.push(r.clone());
            }
            if n.id.is_some() && self.rng.unit() >= self.scenario.loss {
                let event = Event::Report {
                    node: i,
                    central: self.generation,
                    report: r,
                };
                self.net
                    .send(&mut self.rng, self.scenario.delay_ms, now, event);
            }
        }
    }

    /// Requests. Rates are read every 100 ms of virtual time; pairs with
    /// no demand cost nothing.
    fn requests(&mut self, t: i64) {
        let (scenario, tally) = (self.scenario, &mut self.tally);
        if t % 100 == 0 {
            tally.active.clear();
            for (u, user) in scenario.users.iter().enumerate() {
                for (i, r) in tally.rates[u].iter_mut().enumerate() {
                    *r = (user.demand)(t, i);
                    if *r > 0.0 {
                        tally.active.push((u, i));
                    }
                }
                tally.under[u] = tally.rates[u].iter().sum::<f64>() < user.limit;
            }
        }
        let index = (t / 1000) as usize;
        let cost = scenario.resource.1;
        let mut pushes = Vec::new();
        let active = std::mem::take(&mut tally.active);
        for &(u, i) in &active {
            let user = &scenario.users[u];
            if self.nodes.get(i).is_some_and(|n| !n.up) {
                continue;
            }
            let owed = &mut tally.owed[u][i];
            *owed += tally.rates[u][i] * STEP_MS as f64 / 1000.0 * (0.5 + self.rng.unit());
            let mut whole = 0;
            while *owed >= 1.0 {
                *owed -= 1.0;
                whole += 1;
            }
            let Some(n) = self.nodes.get(i) else {
                // A proxy's requests.
                let p = &mut self.proxies[i - self.nodes.len()];
                for _ in 0..whole {
                    let central = (!self.down).then_some(&mut self.central);
                    let (ok, more) = p.admit(central, &user.name, T0 + t);
                    pushes.extend(more);
                    tally.count(u, index, cost, ok);
                }
                continue;
            };
            for _ in 0..whole {
                // One request; a resource other than `requests` is
                // charged after the response, like traffic_down.
                let a = n.service.admit_with_handle(
                    &user.name,
                    &[(n.requests, 1)],
                    scenario.fallback,
                    true,
                );
                let ok = a.decision.is_allowed();
                tally.count(u, index, cost, ok);
                if ok
                    && n.resource != n.requests
                    && let Some(h) = a.handle
                {
                    h.consume(n.resource, u64::try_from(cost).unwrap_or(0));
                }
            }
        }
        tally.active = active;
        self.push_all(T0 + t, pushes);
    }

    fn finish(self) -> Trace {
        let (scenario, mut tally) = (self.scenario, self.tally);
        let slots = scenario.seconds as usize;
        for user in &mut tally.admitted {
            user.truncate(slots);
        }
        let mut outcome = measure::measure(
            scenario,
            &tally.admitted[0],
            &tally.offered[..slots],
            tally.others_refused,
            tally.deepest,
        );
        outcome.outage = scenario
            .outage
            .map(|o| OutageOutcome::measure(&o, &tally.admitted[0], scenario.users[0].limit));
        for user in &mut tally.offered_by {
            user.truncate(slots);
        }
        Trace {
            outcome,
            admitted: tally.admitted,
            offered: tally.offered_by,
        }
    }
}
