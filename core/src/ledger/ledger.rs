//! The [`Ledger`]: every service of the central node, and its nodes.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::ops::RangeInclusive;
use std::sync::Arc;

use super::catch_up::CatchUp;
use super::checkpoint::{
    CheckpointError, Restoration, Restored, filed_slots, newer_than, restore_level, service_levels,
};
use super::config::{LedgerConfig, ReportError};
use super::dropped::DropReason;
use super::filing::Filer;
use super::gaps::{Gaps, Lost};
use super::ingested::Ingested;
use super::service::{PolicyFactory, Service};
use super::source::ReportSource;
use super::told::told_nodes;
use crate::arena::charge::Charge;
use crate::arena::filing_at::Filing;
use crate::arena::ids::{Map, NodeId, valid_name};
use crate::arena::rules::ServiceRules;
use crate::arena::state::ServiceState;
use crate::limits::{Hierarchy, Limit};
use crate::policy::{NodeGrants, Projected};
use throttle_proto::v1;

/// The central node's state; see the [module docs](crate::ledger).
pub struct Ledger {
    pub(super) config: LedgerConfig,
    pub(super) node_names: Vec<Box<str>>,
    node_ids: Map<Box<str>, NodeId>,
    pub(crate) services: BTreeMap<Box<str>, Service>,
    /// data slot -> nodes that reported it.
    pub(super) reported: BTreeMap<i64, BTreeSet<NodeId>>,
    policy_factory: PolicyFactory,
    /// Keys held over every service: counted as reports add them, and
    /// again over the services where keys go (forgetting, limits).
    pub(super) key_total: usize,
    /// The charges of a restored checkpoint ([`Ledger::restore`]).
    pub(super) restored: Option<Restored>,
    /// After a restore, the nodes whose reports it waits for.
    pub(super) catch_up: Option<CatchUp>,
    /// Without a restore, the first data slot it charges: the one before
    /// the slot of its first report. Reports of earlier slots (kept by
    /// the nodes while no central answered) were admitted on the refill
    /// of a ledger it has no record of.
    pub(super) charges_from: Option<i64>,
    /// The proxies whose reports a lost stream dropped.
    gaps: Gaps,
}

impl fmt::Debug for Ledger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ledger")
            .field("config", &self.config)
            .field("nodes", &self.node_names.len())
            .field("services", &self.services)
            .finish()
    }
}

impl Ledger {
    /// An empty ledger whose services use the default [`Projected`] policy.
    pub fn new(config: LedgerConfig) -> Self {
        Self::with_policies(config, Box::new(|_| Box::new(Projected::new())))
    }

    /// An empty ledger whose services get their policy from `factory`.
    pub fn with_policies(config: LedgerConfig, factory: PolicyFactory) -> Self {
        Self {
            config,
            node_names: Vec::new(),
            node_ids: Map::default(),
            services: BTreeMap::new(),
            reported: BTreeMap::new(),
            policy_factory: factory,
            key_total: 0,
            restored: None,
            catch_up: None,
            charges_from: None,
            gaps: Gaps::default(),
        }
    }

    /// The settings.
    pub fn config(&self) -> &LedgerConfig {
        &self.config
    }

    /// The interned id of `node`, interning it if new.
    pub fn node_id(&mut self, node: &str) -> NodeId {
        if let Some(&id) = self.node_ids.get(node) {
            return id;
        }
        let id = NodeId(u32::try_from(self.node_names.len()).unwrap_or(u32::MAX));
        self.node_names.push(node.into());
        self.node_ids.insert(node.into(), id);
        id
    }

    /// The id of `node`, if interned.
    pub fn find_node(&self, node: &str) -> Option<NodeId> {
        self.node_ids.get(node).copied()
    }

    /// The name of an interned node.
    pub fn node_name(&self, id: NodeId) -> &str {
        self.node_names.get(id.0 as usize).map_or("", |s| s)
    }

    pub(super) fn service_mut(&mut self, name: &str) -> &mut Service {
        if !self.services.contains_key(name) {
            let policy = (self.policy_factory)(name);
            let service = Service::new(self.config.slot, policy);
            self.services.insert(name.into(), service);
        }
        self.services.get_mut(name).expect("inserted above")
    }

    /// Gives `service` the policy named `name` (see
    /// [`crate::policy::by_name`]), or, with `None`, the ledger's default
    /// again. A new policy starts afresh, as it would for a new service;
    /// the assignments already made stay in the book. Returns whether the
    /// policy changed; an unknown name changes nothing.
    pub fn use_policy(&mut self, service: &str, name: Option<&str>) -> bool {
        let svc = self.service_mut(service);
        let policy = match name {
            Some(name) if name == svc.policy.name() && svc.named_policy => return false,
            Some(name) => crate::policy::by_name(name),
            None if !svc.named_policy => return false,
            None => Some((self.policy_factory)(service)),
        };
        let Some(policy) = policy else {
            return false;
        };
        let svc = self.service_mut(service);
        svc.policy = policy;
        svc.named_policy = name.is_some();
        true
    }

    /// The name of `service`'s policy, if the service is known.
    pub fn policy_name(&self, service: &str) -> Option<&'static str> {
        self.services.get(service).map(|s| s.policy.name())
    }

    /// Whether `service` is known, or there is room for one more service
    /// ([`LedgerConfig::max_services`]): names from nodes make services,
    /// and each costs memory whether it is used or not.
    pub fn has_room_for(&self, service: &str) -> bool {
        self.services.contains_key(service) || self.services.len() < self.config.max_services
    }

    /// Names of the services seen so far.
    pub fn services(&self) -> impl Iterator<Item = &str> {
        self.services.keys().map(|s| &**s)
    }

    /// Makes `limits` the rules of `service` from `now_ms`: every key is
    /// limited as its user's own rule and the `*` rule say (buckets are
    /// created, changed, or dropped where no rule limits the key any
    /// more), the keys of users with a rule of their own are created, and
    /// keys created later are limited as they are.
    pub fn apply_limits(&mut self, service: &str, limits: &[Limit], now_ms: i64) {
        let svc = self.service_mut(service);
        svc.state.rules = ServiceRules::new(limits);
        svc.told.rules_changed();
        for limit in limits.iter().filter(|l| !l.is_every_user()) {
            for resource in limit.resources() {
                svc.state.find_or_insert(&limit.user, resource, now_ms);
            }
        }
        svc.state.limit_all(now_ms);
        self.key_total = self.key_count();
    }

    /// Makes `hierarchy` the capacity and applications of `service` (none:
    /// its users share no capacity).
    pub fn apply_hierarchy(&mut self, service: &str, hierarchy: Option<Arc<Hierarchy>>) {
        let svc = self.service_mut(service);
        if svc.state.hierarchy.as_deref() != hierarchy.as_deref() {
            svc.state.hierarchy = hierarchy;
            svc.told.rules_changed();
        }
    }

    /// Records that `node` opened a stream for `services` at `now_ms`: it
    /// counts as active from now on, with nothing unreported before the
    /// current slot (a node that reported before keeps its history).
    pub fn connect<'a>(
        &mut self,
        node: NodeId,
        services: impl IntoIterator<Item = &'a str>,
        now_ms: i64,
    ) {
        // A node back after no node reported: hold before it is granted.
        self.await_after_silence(now_ms);
        let before = self.config.slot.slot_at(now_ms) - 1;
        let states = self.services.values().map(|s| &s.state);
        self.gaps.open(node, states, self.restored.as_ref(), before);
        for name in services {
            if valid_name(name) && self.has_room_for(name) {
                self.service_mut(name)
                    .state
                    .last_report
                    .entry(node)
                    .or_insert(before);
            }
        }
    }

    /// Records that `node` reports every `every_ms` for `services` (an
    /// Envoy proxy's 5 s): past a slot, its newest slots count as
    /// unreported until its next report, and its grants for them as spent
    /// ([`ServiceState::lag`]).
    pub fn reports_every<'a>(
        &mut self,
        node: NodeId,
        services: impl IntoIterator<Item = &'a str>,
        every_ms: u32,
    ) {
        let slot_ms = self.config.slot.as_ms().max(1);
        let every = i64::from(every_ms.div_ceil(slot_ms));
        if every <= 1 {
            return;
        }
        // The report's slots, and one for a report that comes late.
        let lag = every + 1;
        for name in services {
            if valid_name(name) && self.services.contains_key(name) {
                self.service_mut(name).state.lags.insert(node, lag);
            }
        }
    }

    /// Runs every service's policy for the slot it assigns (the next, or
    /// the current one for a policy of lead 0) and books its grants;
    /// returns that slot per service.
    pub fn assign(&mut self, now_ms: i64) -> BTreeMap<String, i64> {
        let current = self.config.slot.slot_at(now_ms);
        let mut assigned = BTreeMap::new();
        for (name, svc) in &mut self.services {
            let slot = current + svc.policy.lead();
            svc.assign(slot, now_ms);
            assigned.insert(name.to_string(), slot);
        }
        assigned
    }

    /// Re-assigns the current slot of `service` now, if its policy
    /// re-assigns as reports arrive and the service holds at most
    /// `max_keys` keys (a new node then gets a quota at once instead of
    /// failing open until the next assign). Returns whether it did.
    pub fn reassign_for_new_node(&mut self, service: &str, max_keys: usize, now_ms: i64) -> bool {
        let Some(svc) = self.services.get(service) else {
            return false;
        };
        let keys = svc.state.key_count();
        svc.policy.reassign_when_reported()
            && keys <= max_keys
            && self.reassign(service, self.config.slot.slot_at(now_ms), now_ms)
    }

    /// Whether `service`'s policy re-assigns as reports arrive and every
    /// node active in it has reported data slot `slot - 1`.
    pub fn all_reported(&self, service: &str, slot: i64) -> bool {
        let Some(svc) = self.services.get(service) else {
            return false;
        };
        let recent = slot - 1 - 5;
        // A node that reports every few slots is not waited for.
        let state = &svc.state;
        svc.policy.reassign_when_reported()
            && state
                .last_report
                .iter()
                .filter(|(n, s)| **s > recent && !state.lags.contains_key(n))
                .all(|(_, s)| *s >= slot - 1)
    }

    /// Re-assigns `slot` of `service` now; false for an unknown service.
    pub fn reassign(&mut self, service: &str, slot: i64, now_ms: i64) -> bool {
        let Some(svc) = self.services.get_mut(service) else {
            return false;
        };
        svc.assign(slot, now_ms);
        true
    }

    /// The grants of `node` in (`service`, `slot`), with the service's
    /// keys: what is rendered into the node's quota.
    pub fn grants(
        &self,
        node: NodeId,
        service: &str,
        slot: i64,
    ) -> Option<(&ServiceState, NodeGrants<'_>)> {
        let svc = self.services.get(service)?;
        let grants = svc.policy.grants_for(&svc.book, node, slot)?;
        Some((&svc.state, grants))
    }

    /// Whether `node`'s grants of `service` for `slot` are the very ones
    /// of `other` (a lead-1 policy answers for a slot not yet assigned
    /// with the grants of the slot before): false where either has none.
    pub fn same_grants(&self, node: NodeId, service: &str, slot: i64, other: i64) -> bool {
        let Some(svc) = self.services.get(service) else {
            return false;
        };
        let grants = |slot| svc.policy.grants_for(&svc.book, node, slot);
        match (grants(slot), grants(other)) {
            (Some(a), Some(b)) => a.is(&b),
            _ => false,
        }
    }

    /// Forgets everything older than `nr_slot` slots before `now_ms`.
    pub fn forget(&mut self, now_ms: i64) {
        let current = self.config.slot.slot_at(now_ms);
        let cutoff = current - i64::from(self.config.nr_slot);
        self.reported = self.reported.split_off(&cutoff);
        self.forget_restored(cutoff);
        for svc in self.services.values_mut() {
            // Reports are answered, and pushes sent, for the current slot
            // and the next (for a lead-1 policy, the current one standing
            // in until the next is assigned): older slots are only read by
            // the monitor, and a report older than the previous slot is
            // answered for a slot already past, which its node never reads.
            svc.forget_book(cutoff, current);
            svc.policy.forget_before(cutoff);
            if let Some(len) = svc.state.forget(cutoff, current, now_ms) {
                svc.forget_grants_from(len);
            }
        }
        self.key_total = self.key_count();
        if self.key_total >= self.config.max_keys {
            metrics::counter!("throttle_central_keys_at_cap_total").increment(1);
        }
    }

    /// Level of one bucket at `now_ms`, if it exists.
    pub fn bucket_level(
        &mut self,
        service: &str,
        user: &str,
        resource: &str,
        now_ms: i64,
    ) -> Option<f64> {
        let state = &mut self.services.get_mut(service)?.state;
        let id = state.find(user, resource)?;
        state.key_mut(id).bucket_mut().map(|b| b.level(now_ms))
    }

    /// Sum of consumption (or rejection) of one key in data slot `slot`.
    pub fn slot_sum(
        &self,
        service: &str,
        user: &str,
        resource: &str,
        slot: i64,
        rejection: bool,
    ) -> i64 {
        let Some(state) = self.services.get(service).map(|s| &s.state) else {
            return 0;
        };
        let Some(id) = state.find(user, resource) else {
            return 0;
        };
        state
            .sums
            .iter()
            .find(|c| c.slot == slot)
            .map_or(0, |c| c.get(id, usize::from(rejection)))
    }

    /// Number of (service, user, resource) keys held.
    pub fn key_count(&self) -> usize {
        self.services.values().map(|s| s.state.key_count()).sum()
    }

    /// The state of `service`, if it is known.
    pub fn service_state(&self, service: &str) -> Option<&ServiceState> {
        self.services.get(service).map(|s| &s.state)
    }

    /// Proxy `node` told `user`'s new buckets of `service` (if known)
    /// `per_slot` requests a slot over `slots`: the projected policy counts
    /// them at that until the proxy reports those slots.
    pub fn tell_first_share(
        &mut self,
        service: &str,
        node: NodeId,
        user: &str,
        slots: RangeInclusive<i64>,
        per_slot: f64,
    ) {
        if let Some(s) = self.services.get_mut(service) {
            s.state.first_shares.tell(node, user, slots, per_slot);
        }
    }
}

// Filing (see `filing`).
impl Ledger {
    /// Files a report: charges the buckets, updates the distribution and the
    /// sums, and lets each service's policy see it. Its
    /// [`packed`](v1::Report::packed) usages are read as the map entries they
    /// stand for ([`v1::Report::unpack`]).
    ///
    /// # Errors
    ///
    /// [`ReportError`] when the report as a whole is unusable; bad entries
    /// are only left out and listed in [`Ingested::dropped`].
    pub fn ingest(&mut self, report: &v1::Report, now_ms: i64) -> Result<Ingested, ReportError> {
        if report.packed.is_empty() {
            return self.ingest_from(report, now_ms);
        }
        let mut unpacked = report.clone();
        unpacked.unpack()?;
        self.ingest_from(&unpacked, now_ms)
    }

    /// [`Ledger::ingest`] for any [`ReportSource`], such as a
    /// [`RawReport`](throttle_proto::wire::RawReport) read in place.
    ///
    /// # Errors
    ///
    /// As [`Ledger::ingest`].
    pub fn ingest_from<R: ReportSource>(
        &mut self,
        report: &R,
        now_ms: i64,
    ) -> Result<Ingested, ReportError> {
        self.config.check(report, now_ms)?;
        let node = self.node_id(report.node_id());
        let slot = report.slot_number() - 1;
        if report.answered() {
            self.await_unknown_nodes(now_ms);
        }
        self.await_after_silence(now_ms);
        if !self.reported.entry(slot).or_default().insert(node) {
            return Ok(Ingested {
                duplicate: true,
                ..Ingested::default()
            });
        }
        self.caught_up(node, slot, now_ms);
        let charge = self.charge_of(node, slot, report.answered(), now_ms);
        let lost = match self.gaps.awaits(node) {
            true => self.gaps.take(node, slot, self.lag_of(node)),
            false => Lost::default(),
        };
        let charge = charge.late_if(lost.late);
        let met_ms = charge.met_ms(self.config.slot.start_ms(slot), now_ms);
        let mut out = Ingested::default();
        // Services filed (or refused), each once, in the order first seen.
        let mut seen: Vec<(&str, bool)> = Vec::new();
        for (name, is_rejection, users) in report.usages() {
            let known = seen.iter().find(|(s, _)| *s == name).map(|&(_, ok)| ok);
            let valid = known.unwrap_or_else(|| {
                let refused = if !valid_name(name) {
                    Some(DropReason::BadName)
                } else if !self.has_room_for(name) {
                    Some(DropReason::TooManyServices)
                } else {
                    None
                };
                if let Some(reason) = refused {
                    out.dropped.push(reason, || name.to_owned());
                }
                seen.push((name, refused.is_none()));
                refused.is_none()
            });
            if valid {
                let at = Filing {
                    node,
                    slot,
                    is_rejection,
                    charge,
                    gap: lost.gap,
                    max_amount: self.config.max_amount,
                    now_ms,
                    met_ms,
                };
                let mut room = self.config.max_keys.saturating_sub(self.key_total);
                let before = room;
                let state = &mut self.service_mut(name).state;
                Filer { state }.file_usage(name, at, users, &mut room, &mut out);
                self.key_total += before - room;
            }
        }
        for (name, _) in seen.into_iter().filter(|(_, valid)| *valid) {
            let svc = self.service_mut(name);
            let last = svc.state.last_report.entry(node).or_insert(slot);
            *last = (*last).max(slot);
            svc.policy.consume(&svc.state, node, slot, now_ms);
        }
        Ok(out)
    }
}

// Holds after a restore or a gap (see `catch_up`).
impl Ledger {
    /// Whether grants are held: the ledger was restored, or leads again
    /// after a gap, and still waits for the reports of a node it heard
    /// from last (see `catch_up`). Only [`Ledger::release`] ends a hold,
    /// its time included (the assigner calls it on every report and tick).
    pub fn holding(&self) -> bool {
        self.catch_up.is_some()
    }

    /// Holds grants, as after a restore, until the nodes that filed the
    /// newest two slots this ledger holds report again (or [`hold_ms`]
    /// passed): for a ledger that leads again after a gap. Nothing if a
    /// hold is under way or no node is awaited.
    ///
    /// [`hold_ms`]: super::hold_ms
    pub fn await_nodes(&mut self, now_ms: i64) {
        if self.catch_up.is_some() {
            return;
        }
        self.catch_up = CatchUp::after_gap(&self.reported, now_ms, self.config.slot);
        if let Some(c) = &self.catch_up {
            tracing::info!(
                nodes = c.awaited(),
                "after a time without reports: holding grants until the nodes' reports are back"
            );
        }
    }

    /// Holds as [`Ledger::await_nodes`] does when a report comes after no
    /// node reported for two slots or more: every node was cut off from a
    /// central that led on, and its buckets refilled meanwhile. Granted
    /// to the first node back before the others' kept reports are filed,
    /// that refill would be spent twice.
    pub(super) fn await_after_silence(&mut self, now_ms: i64) {
        let current = self.config.slot.slot_at(now_ms);
        let Some(&newest) = self.reported.keys().next_back() else {
            return;
        };
        if self.catch_up.is_some() || newest >= current - 2 {
            return;
        }
        // Nodes that report every few slots (proxies) are silent between
        // their reports: silence is longer than their lag.
        let lags = self.services.values().flat_map(|s| s.state.lags.values());
        if newest < current - 2 - lags.copied().max().unwrap_or(0) {
            self.await_nodes(now_ms);
        }
    }

    /// Holds for [`hold_ms`] when this ledger has filed and restored
    /// nothing and its nodes come back from a central it has no record of
    /// (a report that central `answered`, or a Hello that `resumes`):
    /// which of them to wait for is not known (see `catch_up`).
    ///
    /// [`hold_ms`]: super::hold_ms
    pub fn await_unknown_nodes(&mut self, now_ms: i64) {
        let fresh = self.restored.is_none() && self.reported.is_empty();
        if fresh && self.catch_up.is_none() {
            tracing::info!("nodes back from another central: holding grants for their reports");
            self.catch_up = Some(CatchUp::for_unknown_nodes(now_ms, self.config.slot));
        }
    }

    /// Starts a ledger that has filed nothing and restored nothing at
    /// `now_ms`, on its first leadership: what the nodes admitted up to
    /// this slot, on the last quotas of a ledger it has no record of, was
    /// paid for by that ledger's refill, and only empties what its buckets
    /// hold (see `before_start`).
    pub fn begin(&mut self, now_ms: i64) {
        if self.restored.is_none() && self.charges_from.is_none() {
            self.charges_from = Some(self.config.slot.slot_at(now_ms) + 1);
        }
    }

    /// Notes that `node` filed data slot `slot` (see `CatchUp::caught_up`).
    pub(super) fn caught_up(&mut self, node: NodeId, slot: i64, now_ms: i64) {
        let current = self.config.slot.slot_at(now_ms);
        if let Some(c) = &mut self.catch_up {
            c.caught_up(node, slot, current);
        }
    }

    /// Ends the hold if nothing is awaited or its time is up; true if it
    /// ended now (once): every service should be assigned at once.
    pub fn release(&mut self, now_ms: i64) -> bool {
        let Some(c) = &self.catch_up else {
            return false;
        };
        let done = c.over(now_ms);
        if done {
            let missing: Vec<&str> = c.awaiting().map(|n| self.node_name(n)).collect();
            tracing::info!(?missing, "granting again");
            self.catch_up = None;
        }
        done
    }
}

// Checkpoints (see `checkpoint`).
impl Ledger {
    /// The levels of every bucket below its capacity at `now_ms`, with the
    /// reports already charged to them (see `Ledger::restore`).
    pub fn checkpoint(&self, now_ms: i64) -> v1::Checkpoint {
        let services = self.services.iter();
        v1::Checkpoint {
            taken_ms: now_ms,
            slot_ms: self.config.slot.as_ms(),
            services: services
                .filter_map(|(name, svc)| service_levels(name, &svc.state, now_ms))
                .collect(),
            filed: filed_slots(&self.reported, |n| self.node_name(n)),
        }
    }

    /// Puts back the levels of `checkpoint`, refilled from when it was
    /// taken, over the keys the limits now make; from now on a report the
    /// checkpoint lists as charged is filed without charging its buckets.
    ///
    /// # Errors
    ///
    /// [`CheckpointError`] for a checkpoint of another slot length;
    /// nothing is restored.
    pub fn restore(
        &mut self,
        checkpoint: &v1::Checkpoint,
        now_ms: i64,
    ) -> Result<Restoration, CheckpointError> {
        let expected = self.config.slot.as_ms();
        if checkpoint.slot_ms != expected {
            return Err(CheckpointError::SlotLength {
                expected,
                found: checkpoint.slot_ms,
            });
        }
        if newer_than(&self.reported, checkpoint) {
            // This ledger wrote it, and has charged since: its own buckets
            // are kept, and it holds as a ledger leading again after a gap.
            tracing::info!("this ledger is newer than the checkpoint; kept");
            self.await_nodes(now_ms);
            return Ok(Restoration::default());
        }
        let mut out = Restoration::default();
        // A bucket the checkpoint does not list was at its capacity.
        for service in self.services.values_mut() {
            service.state.fill_as_of(checkpoint.taken_ms, now_ms);
        }
        for service in &checkpoint.services {
            if !valid_name(&service.service) || !self.has_room_for(&service.service) {
                out.skipped += service.buckets.len();
                continue;
            }
            for level in &service.buckets {
                match self.restore_level(&service.service, level, checkpoint.taken_ms, now_ms) {
                    true => out.buckets += 1,
                    false => out.skipped += 1,
                }
            }
        }
        let mut filed = BTreeMap::new();
        for slot in &checkpoint.filed {
            let nodes = slot.nodes.iter().filter(|n| valid_name(n));
            let ids: BTreeSet<NodeId> = nodes.map(|n| self.node_id(n)).collect();
            filed.insert(slot.slot, ids);
        }
        // The nodes of the newest two slots it holds are still about.
        let recent = filed.values().rev().take(2).flatten().copied().collect();
        self.catch_up = CatchUp::new(recent, now_ms, self.config.slot);
        if let Some(c) = &self.catch_up {
            tracing::info!(
                nodes = c.awaited(),
                "restored: holding grants until the nodes' reports are back"
            );
        }
        let current = self.config.slot.slot_at(checkpoint.taken_ms);
        let from_slot = current - i64::from(self.config.nr_slot);
        self.restored = Some(Restored::new(filed, from_slot));
        self.key_total = self.key_count();
        Ok(out)
    }

    /// Restores one bucket's level; false if it has no such bucket.
    fn restore_level(
        &mut self,
        service: &str,
        level: &v1::BucketLevel,
        taken_ms: i64,
        now_ms: i64,
    ) -> bool {
        let room = self.key_total < self.config.max_keys;
        let state = &mut self.service_mut(service).state;
        let (restored, added) = restore_level(state, level, room, (taken_ms, now_ms));
        self.key_total += added;
        restored
    }

    /// How a report of `node` for data slot `slot`, filed at `now_ms`,
    /// is charged to its buckets.
    pub(super) fn charge_of(
        &mut self,
        node: NodeId,
        slot: i64,
        answered: bool,
        now_ms: i64,
    ) -> Charge {
        let early = self.before_start(slot, now_ms);
        if !self.charges(node, slot, answered) {
            Charge::No
        } else if early {
            Charge::Emptying {
                since_ms: self.config.slot.start_ms(slot),
            }
        } else if slot >= self.config.slot.slot_at(now_ms) - 1 {
            if self.awaits_late_reports() {
                Charge::OnTime
            } else {
                Charge::Steady
            }
        } else if slot >= self.config.slot.slot_at(now_ms) - 1 - self.lag_of(node) {
            // A node that reports every few slots (a proxy) files its
            // slots that late every time.
            Charge::Batched {
                since_ms: self.config.slot.start_ms(slot),
            }
        } else {
            Charge::Late
        }
    }

    /// Whether late reports may still come: a hold is under way, or a node
    /// reports every few slots (its slots are charged late every time).
    fn awaits_late_reports(&self) -> bool {
        self.holding() || self.services.values().any(|s| !s.state.lags.is_empty())
    }

    /// The most slots `node`'s reports lag, in any service (0 for a node
    /// that reports every slot).
    fn lag_of(&self, node: NodeId) -> i64 {
        let lags = self
            .services
            .values()
            .filter_map(|s| s.state.lags.get(&node));
        lags.copied().max().unwrap_or(0)
    }

    /// Whether a report of `node` for data slot `slot` charges its
    /// buckets: without a checkpoint, unless it was `answered` by a
    /// central whose charges this ledger has no record of; with one, as
    /// [`Restored::charges`] says.
    fn charges(&mut self, node: NodeId, slot: i64, answered: bool) -> bool {
        match &mut self.restored {
            None => !answered,
            Some(restored) => restored.charges(node, slot, answered),
        }
    }

    /// Whether a report of data slot `slot`, filed at `now_ms`, is of a
    /// slot before this ledger began, without a checkpoint: admitted on
    /// the refill of a ledger it has no record of, it only empties what
    /// the buckets hold, never putting them in debt.
    fn before_start(&mut self, slot: i64, now_ms: i64) -> bool {
        if self.restored.is_some() {
            return false;
        }
        let first = self.config.slot.slot_at(now_ms) - 1;
        slot < *self.charges_from.get_or_insert(first)
    }

    /// Drops what a restored checkpoint says of slots older than `cutoff`.
    pub(super) fn forget_restored(&mut self, cutoff: i64) {
        if let Some(restored) = &mut self.restored {
            restored.forget(cutoff);
        }
    }
}

// What the nodes are told besides their quotas.
impl Ledger {
    /// What the nodes of `service` are told of its limits at `now_ms`:
    /// `None` for a service the ledger does not know.
    pub fn told(&mut self, service: &str, now_ms: i64) -> Option<Arc<v1::Limits>> {
        let slot_ms = self.config.slot.as_ms();
        let svc = self.services.get_mut(service)?;
        let nodes = told_nodes(&svc.state, now_ms);
        let limits = (&svc.state.rules, svc.state.hierarchy.as_deref());
        svc.told.read(service, limits, nodes, slot_ms)
    }

    /// The keys of `service` bound now by a longer period than their
    /// shortest, and the budgets of those closest to it at `now_ms`;
    /// `None` for a service the ledger does not know.
    pub fn bound(&mut self, service: &str, now_ms: i64) -> Option<Arc<v1::Bound>> {
        let svc = self.services.get_mut(service)?;
        let newest = svc.book.values().next_back();
        svc.bound.read(service, &svc.state, newest, now_ms)
    }
}
