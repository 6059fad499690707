//! One Envoy proxy of a run: the filter ([`EnvoyProxy`]) and its RLQS
//! stream at the central ([`RlqsStream`]), joined without a network, as
//! the gRPC session joins them to the ledger's task.

use std::sync::Arc;

use envoy_types::pb::envoy::service::rate_limit_quota::v3::RateLimitQuotaUsageReports;
use throttle_central::DEFAULT_RLQS_TTL;
use throttle_central::nodes::rlqs::RlqsStream;
use throttle_clock::SlotLength;
use throttle_core::assigner::{Accepts, Assigner, Push};
use throttle_core::ledger::NodeId;
use throttle_proto::v1::{self, central_message};

use super::envoy_proxy::EnvoyProxy;

/// The largest count a bucket may report (the central's default).
const MAX_AMOUNT: i64 = throttle_central::MAX_AMOUNT;

pub(super) struct SimProxy {
    slot: SlotLength,
    envoy: EnvoyProxy,
    stream: RlqsStream,
    /// Its id at the central, once its stream opened.
    id: Option<NodeId>,
    /// The limits it was last told.
    told: Option<Arc<v1::Limits>>,
}

impl SimProxy {
    /// Proxy `name`, on slots of `slot`.
    pub(super) fn new(name: String, slot: SlotLength) -> Self {
        Self {
            slot,
            envoy: EnvoyProxy::default(),
            stream: stream(name, slot),
            id: None,
            told: None,
        }
    }

    /// Its stream lost with its central (which, if still there, sees it
    /// go): Envoy keeps its buckets and their assignments until their
    /// TTL, and opens a new stream at its next report.
    pub(super) fn lose(&mut self, central: Option<&mut Assigner>) {
        if let (Some(id), Some(central)) = (self.id.take(), central) {
            central.disconnect(id, Accepts::NONE);
        }
        self.stream = stream(self.stream.node_id().to_owned(), self.slot);
        self.told = None;
    }

    /// Envoy's report due at `now` while no central answers: dropped.
    pub(super) fn drop_due(&mut self, now: i64) {
        self.envoy.periodic(now);
    }

    /// Its id at the central, once connected.
    pub(super) fn id(&self) -> Option<NodeId> {
        self.id
    }

    /// One request of `user` at `now`; whether it passes, and what the
    /// central pushes to others as it files a new bucket's report.
    pub(super) fn admit(
        &mut self,
        central: Option<&mut Assigner>,
        user: &str,
        now: i64,
    ) -> (bool, Vec<Push>) {
        let (ok, first) = self.envoy.admit(user, now);
        let Some(central) = central else {
            return (ok, Vec::new());
        };
        let pushes = first
            .map(|r| self.take(central, r, now))
            .unwrap_or_default();
        (ok, pushes)
    }

    /// What the proxy and its stream do at `now`, `in_slot` ms into the
    /// slot: Envoy's 5 s report; 20 ms into a slot, what waited is filed
    /// and the assignments due are told.
    pub(super) fn step(&mut self, central: &mut Assigner, now: i64, in_slot: i64) -> Vec<Push> {
        let mut pushes = Vec::new();
        if let Some(reports) = self.envoy.periodic(now) {
            pushes = self.take(central, reports, now);
        }
        if in_slot == 20 && self.id.is_some() {
            if let Some(report) = self.stream.carried(now) {
                pushes.extend(self.file(central, &report, now));
            }
            self.tell(central, now);
        }
        pushes
    }

    /// A quota the central pushed to this proxy's stream.
    pub(super) fn quota(&mut self, central: &mut Assigner, quota: v1::Quota, now: i64) {
        self.absorb_quota(quota);
        self.tell(central, now);
    }

    /// The central's limits of the service, when they are new to it.
    pub(super) fn limits(&mut self, told: &Arc<v1::Limits>) {
        if self.id.is_none() || self.told.as_ref().is_some_and(|t| Arc::ptr_eq(t, told)) {
            return;
        }
        let kind = central_message::Kind::Limits(v1::Limits::clone(told));
        self.stream.absorb(v1::CentralMessage { kind: Some(kind) });
        self.told = Some(told.clone());
    }

    /// The stream takes one report: opens at the first, files.
    fn take(
        &mut self,
        central: &mut Assigner,
        r: RateLimitQuotaUsageReports,
        now: i64,
    ) -> Vec<Push> {
        match self.stream.opens(&r.domain) {
            Ok(true) => self.open(central, r.domain, now),
            Ok(false) => {}
            Err(refused) => panic!("the simulated proxy's report is refused: {refused:?}"),
        }
        let taken = self.stream.take(r.bucket_quota_usages, now);
        let mut pushes = Vec::new();
        for report in &taken.reports {
            pushes.extend(self.file(central, report, now));
        }
        if taken.new_buckets {
            self.tell(central, now);
        }
        pushes
    }

    /// Connects to the central as the stream's Hello does.
    fn open(&mut self, central: &mut Assigner, domain: String, now: i64) {
        let hello = self.stream.hello(&domain);
        let (id, pushes) = central.connect(&hello.node_id, &hello.services, Accepts::NONE, now);
        let services = hello.services.iter().map(String::as_str);
        central
            .ledger_mut()
            .reports_every(id, services, hello.report_every_ms);
        self.id = Some(id);
        self.stream.opened(domain.clone(), None);
        for (_, q) in pushes {
            self.absorb_quota(q);
        }
        if let Some(told) = central.ledger_mut().told(&domain, now) {
            self.limits(&told);
        }
    }

    /// Files `report` and takes the answer; the central's re-assignment
    /// after it, this proxy's share taken, the rest returned.
    fn file(&mut self, central: &mut Assigner, report: &v1::Report, now: i64) -> Vec<Push> {
        let Some(id) = self.id else { return Vec::new() };
        let Ok(answer) = central.report(id, report, now) else {
            return Vec::new();
        };
        self.absorb_quota(answer.quota);
        let pushes: Vec<Push> = (answer.complete.iter())
            .flat_map(|s| central.reassign(s, now))
            .collect();
        let (mine, others): (Vec<Push>, Vec<Push>) = pushes.into_iter().partition(|p| p.0 == id);
        for (_, q) in mine {
            self.absorb_quota(q);
        }
        others
    }

    fn absorb_quota(&mut self, quota: v1::Quota) {
        let kind = central_message::Kind::Quota(quota);
        self.stream.absorb(v1::CentralMessage { kind: Some(kind) });
    }

    /// Sends the proxy what is due, the ledger the first shares.
    fn tell(&mut self, central: &mut Assigner, now: i64) {
        let told = self.stream.due(now);
        let (Some(response), Some(id)) = (told.response, self.id) else {
            return;
        };
        if let Some(service) = self.stream.service() {
            for s in told.first_shares {
                let ledger = central.ledger_mut();
                ledger.tell_first_share(service, id, &s.user, s.slots, s.per_slot);
            }
        }
        self.envoy.apply(response, now);
    }
}

/// A new RLQS stream of proxy `name` at the central.
fn stream(name: String, slot: SlotLength) -> RlqsStream {
    let ttl_s = DEFAULT_RLQS_TTL.as_secs() as i64;
    RlqsStream::new(name, slot, MAX_AMOUNT, ttl_s)
}
