//! A legacy node's behaviour (lua-resty-throttle), as its description
//! gives it: counters per slot, a report 50 ms into each second holding
//! the second before, one answer awaited 200 ms, the same report sent to
//! the next central on a new connection when the answer does not come,
//! and the decision of `throttle(service, user)`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant, SystemTime};

use serde_json::{Value, json};

use crate::legacy_client::{LegacyClient, presigned_query};

/// How long the node waits for an answer.
pub const ANSWER_WAIT: Duration = Duration::from_millis(200);

/// service -> user -> resource -> amount.
type Usage = BTreeMap<String, BTreeMap<String, BTreeMap<String, i64>>>;

/// A legacy node, driven by the test.
#[derive(Debug)]
pub struct LegacyNode {
    /// Its node id.
    pub node_id: String,
    centrals: Vec<SocketAddr>,
    tls: bool,
    key: Option<(String, String)>,
    /// The services it always reports, even with nothing to say.
    services: Vec<String>,
    client: Option<LegacyClient>,
    /// The central it sticks to.
    current: usize,
    consumption: BTreeMap<i64, Usage>,
    rejection: BTreeMap<i64, Usage>,
    /// service -> slot -> the quota document's table.
    quota: BTreeMap<String, BTreeMap<i64, Value>>,
    /// Time from sending each answered report to its answer.
    pub round_trips: Vec<Duration>,
    /// Connections opened.
    pub connections: u32,
}

impl LegacyNode {
    /// A node reporting `services` to `centrals`, signing with `key`
    /// (access key, secret key) when given.
    pub fn new(
        node_id: &str,
        centrals: &[SocketAddr],
        tls: bool,
        key: Option<(&str, &str)>,
        services: &[&str],
    ) -> Self {
        Self {
            node_id: node_id.to_owned(),
            centrals: centrals.to_vec(),
            tls,
            key: key.map(|(a, s)| (a.to_owned(), s.to_owned())),
            services: services.iter().map(|s| (*s).to_owned()).collect(),
            client: None,
            current: 0,
            consumption: BTreeMap::new(),
            rejection: BTreeMap::new(),
            quota: BTreeMap::new(),
            round_trips: Vec::new(),
            connections: 0,
        }
    }

    /// `throttle(service, user)` in `slot`: no quota for the slot or the
    /// user allows; otherwise each resource whose quota is below 1, or
    /// below what the slot consumed, counts a rejection and refuses.
    pub fn throttle(&mut self, service: &str, user: &str, slot: i64) -> bool {
        let quota = self.quota.get(service).and_then(|q| q.get(&slot));
        let Some(Value::Object(resources)) = quota.and_then(|q| q.get(user)) else {
            return true;
        };
        let used = self
            .consumption
            .get(&slot)
            .and_then(|u| u.get(service)?.get(user));
        let mut refused = Vec::new();
        for (resource, amount) in resources {
            let amount = amount.as_f64().unwrap_or(0.0);
            let consumed = used.and_then(|u| u.get(resource)).copied().unwrap_or(0);
            if amount < 1.0 || consumed as f64 > amount {
                refused.push(resource.clone());
            }
        }
        for resource in &refused {
            add(&mut self.rejection, slot, service, user, resource, 1);
        }
        refused.is_empty()
    }

    /// `consume(service, user, {resource: amount})` in `slot`.
    pub fn consume(&mut self, service: &str, user: &str, slot: i64, resource: &str, amount: i64) {
        add(&mut self.consumption, slot, service, user, resource, amount);
    }

    /// The report sent at the start of `slot`, of the slot before.
    pub fn report_json(&self, slot: i64) -> String {
        let usage = |all: &BTreeMap<i64, Usage>| {
            let mut usage = all.get(&(slot - 1)).cloned().unwrap_or_default();
            for s in &self.services {
                usage.entry(s.clone()).or_default();
            }
            usage
        };
        let report = json!({
            "node_id": self.node_id,
            "slot_number": slot,
            "consumption": usage(&self.consumption),
            "rejection": usage(&self.rejection),
        });
        report.to_string()
    }

    /// Sends the report of `slot` to the central it sticks to, then to the
    /// others in turn, each on a new connection after a failure; stores
    /// the quota of the first answer. True when one answered.
    pub fn report(&mut self, slot: i64) -> bool {
        let report = self.report_json(slot);
        for _ in 0..self.centrals.len() {
            if let Some(answer) = self.exchange(&report) {
                self.take(&answer);
                self.forget_before(slot - 10);
                return true;
            }
            self.client = None;
            self.current = (self.current + 1) % self.centrals.len();
        }
        self.forget_before(slot - 10);
        false
    }

    /// Sends `text` on the connection (opened if need be), waits for one
    /// text frame.
    pub fn exchange(&mut self, text: &str) -> Option<Value> {
        let client = self.client()?;
        let sent = Instant::now();
        client.send_text(text).ok()?;
        let answer = client.recv_text(ANSWER_WAIT)?;
        self.round_trips.push(sent.elapsed());
        serde_json::from_str(&answer).ok()
    }

    /// Drops the connection with a bare TCP close.
    pub fn disconnect(&mut self) {
        if let Some(c) = self.client.take() {
            c.close();
        }
    }

    /// The connection to the current central, opened if need be.
    fn client(&mut self) -> Option<&mut LegacyClient> {
        if self.client.is_none() {
            let addr = self.centrals[self.current];
            let query = match &self.key {
                Some((access, secret)) => presigned_query(
                    access,
                    secret,
                    &addr.to_string(),
                    "/throttle",
                    SystemTime::now(),
                ),
                None => String::new(),
            };
            self.connections += 1;
            self.client = LegacyClient::connect(addr, self.tls, &query).ok();
        }
        self.client.as_mut()
    }

    /// Keeps the quota document's tables, the 10 latest slots.
    fn take(&mut self, answer: &Value) {
        let Some(services) = answer.as_object() else {
            return;
        };
        for (service, slots) in services {
            let held = self.quota.entry(service.clone()).or_default();
            for (slot, table) in slots.as_object().into_iter().flatten() {
                if let Ok(slot) = slot.parse() {
                    held.insert(slot, table.clone());
                }
            }
            while held.len() > 10 {
                held.pop_first();
            }
        }
    }

    fn forget_before(&mut self, slot: i64) {
        self.consumption.retain(|s, _| *s >= slot);
        self.rejection.retain(|s, _| *s >= slot);
    }
}

fn add(
    all: &mut BTreeMap<i64, Usage>,
    slot: i64,
    service: &str,
    user: &str,
    resource: &str,
    n: i64,
) {
    let users = all
        .entry(slot)
        .or_default()
        .entry(service.to_owned())
        .or_default();
    *users
        .entry(user.to_owned())
        .or_default()
        .entry(resource.to_owned())
        .or_default() += n;
}
