//! The [`Assigner`] itself; see the [module docs](crate::assigner).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

use throttle_proto::v1;

use super::render::{Messages, QuotaFormat, QuotaRef, Rendering, Skeletons};
use crate::ledger::{Ingested, Ledger, NodeId, ReportError, ReportSource, valid_name};
use crate::limits::LimitSource;
use crate::usage_tap::UsageTap;

/// A quota to send to one node.
pub type Push<Q = v1::Quota> = (NodeId, Q);

/// The forms of quota a stream's node reads besides the legacy maps, as
/// its Hello's [`accepts`](v1::Hello::accepts) names them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Accepts {
    /// Tables as [`v1::PackedQuota`]s ([`PACKED_QUOTAS`]).
    ///
    /// [`PACKED_QUOTAS`]: throttle_proto::PACKED_QUOTAS
    pub packed: bool,
    /// Answers that name the push before them ([`v1::QuotaRef`],
    /// [`QUOTA_REFS`]).
    ///
    /// [`QUOTA_REFS`]: throttle_proto::QUOTA_REFS
    pub refs: bool,
}

impl Accepts {
    /// The original forms only.
    pub const NONE: Self = Self {
        packed: false,
        refs: false,
    };
    /// Every form this central writes.
    pub const ALL: Self = Self {
        packed: true,
        refs: true,
    };

    /// The forms a Hello's `accepts` names.
    pub fn from_hello(accepts: &[String]) -> Self {
        let names = |form: &str| accepts.iter().any(|a| a == form);
        Self {
            packed: names(throttle_proto::PACKED_QUOTAS),
            refs: names(throttle_proto::QUOTA_REFS),
        }
    }
}

/// Services with at most this many keys are re-assigned when a node
/// connects (cheap at that size), so the node gets a quota for the current
/// slot at once.
pub const CONNECT_REASSIGN_KEYS: usize = 10_000;

/// What the central node does on each event; see the [module docs](crate::assigner).
pub struct Assigner<F: QuotaFormat = Messages> {
    format: PhantomData<F>,
    ledger: Ledger,
    /// The users last encoded for each node ([`Encoded`] quotas).
    skeletons: Skeletons,
    /// By node index: whether its quotas are written packed
    /// ([`Assigner::is_packed`]).
    packed: Vec<bool>,
    limits: Arc<dyn LimitSource>,
    /// Connected nodes: open streams and the services they declared or reported.
    nodes: BTreeMap<NodeId, (usize, BTreeSet<String>)>,
    /// Per node, its open streams that do not accept packed quotas, and
    /// those that do not accept refs: its quotas take each form only
    /// while there are none.
    lacking: BTreeMap<NodeId, Lacking>,
    /// Per service, the last slot re-assigned once every report was in.
    reassigned: BTreeMap<String, i64>,
    /// Per service, assigned when a hold ended, for its next re-assign
    /// to push rather than assign again: the current slot, and the next
    /// one when the policy leads (the tick that would have assigned it
    /// was skipped while holding).
    released: BTreeMap<String, Option<i64>>,
    /// The [`LimitSource::version`] of the limits applied last.
    limits_applied: Option<u64>,
    /// Where filed reports go to be kept as usage, if anywhere.
    usage: Option<UsageTap>,
}

impl<F: QuotaFormat> fmt::Debug for Assigner<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Assigner")
            .field("ledger", &self.ledger)
            .field("nodes", &self.nodes.len())
            .finish_non_exhaustive()
    }
}

/// The answer to a report, and what else it caused.
#[derive(Debug)]
pub struct Answer<Q = v1::Quota> {
    /// The reporting node's quota for the slot after the report's.
    pub quota: Q,
    /// Services whose active nodes have now all reported the slot that just
    /// ended: call [`Assigner::reassign`] for each, once the answers due
    /// are out.
    pub complete: Vec<String>,
    /// What the ledger did with the report.
    pub ingested: Ingested,
}

/// A node's answer rendered ahead ([`Assigner::tick_and_prepare`]).
pub type Prepared<F> = (NodeId, Ahead<<F as QuotaFormat>::Quota>);

/// A node's answer to its next report, rendered ahead
/// ([`Assigner::prepare`], or with its push at an assign:
/// [`Assigner::tick_each`]).
#[derive(Debug, Clone)]
pub struct Ahead<Q> {
    /// The answer.
    pub quota: Q,
    /// The services it covers.
    pub services: Vec<String>,
    /// It refers to tables of the push rendered with it
    /// ([`v1::QuotaRef`]): it may go only on a stream that push went on.
    pub refers: bool,
}

/// Counts of a node's open streams that lack a form ([`Accepts`]).
#[derive(Debug, Clone, Copy, Default)]
struct Lacking {
    packed: usize,
    refs: usize,
}

/// A report filed without an answer ([`Assigner::file`]).
#[derive(Debug)]
pub struct Filed {
    /// As [`Answer::complete`].
    pub complete: Vec<String>,
    /// What the ledger did with the report.
    pub ingested: Ingested,
}

impl<F: QuotaFormat> Assigner<F> {
    /// An assigner over `ledger`, reading limits from `limits`.
    pub fn new(ledger: Ledger, limits: Arc<dyn LimitSource>) -> Self {
        Self {
            format: PhantomData,
            ledger,
            skeletons: Skeletons::default(),
            packed: Vec::new(),
            limits,
            nodes: BTreeMap::new(),
            lacking: BTreeMap::new(),
            reassigned: BTreeMap::new(),
            released: BTreeMap::new(),
            limits_applied: None,
            usage: None,
        }
    }

    /// Hands every report filed from now on to `tap` too.
    pub fn tap_usage(&mut self, tap: UsageTap) {
        self.usage = Some(tap);
    }

    /// The ledger.
    pub fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    /// The ledger, mutably (monitor queries refill buckets).
    pub fn ledger_mut(&mut self) -> &mut Ledger {
        &mut self.ledger
    }

    /// A stream opened for `node_id` with `services`, accepting the forms
    /// `accepts` (from its Hello). Returns the node and, for services small
    /// enough to re-assign on the spot (up to [`CONNECT_REASSIGN_KEYS`]
    /// keys), its quota for the current slot, so a new node does not fail
    /// open until the next assign.
    ///
    /// A node's quotas take a form while every stream it has open accepts
    /// it (a process replacing another of the same id may not).
    pub fn connect(
        &mut self,
        node_id: &str,
        services: &[String],
        accepts: Accepts,
        now_ms: i64,
    ) -> (NodeId, Vec<Push<F::Quota>>) {
        let node = self.ledger.node_id(node_id);
        let lacking = self.lacking.entry(node).or_default();
        lacking.packed += usize::from(!accepts.packed);
        lacking.refs += usize::from(!accepts.refs);
        let packed = lacking.packed == 0;
        self.set_packed(node, packed);
        self.ledger
            .connect(node, services.iter().map(String::as_str), now_ms);
        // Past the ledger's cap a new service is not made: the node gets
        // no quotas for it, and fails open there as without a central.
        let held: Vec<&String> = services
            .iter()
            .filter(|s| valid_name(s) && self.ledger.service_state(s).is_some())
            .collect();
        let refused = services.iter().filter(|s| valid_name(s)).count() - held.len();
        if refused > 0 {
            metrics::counter!("throttle_central_services_at_cap_total").increment(refused as u64);
            tracing::warn!(%node_id, refused, "services past the central's cap not tracked");
        }
        let entry = self.nodes.entry(node).or_default();
        entry.0 += 1;
        entry.1.extend(held.iter().map(|s| (*s).clone()));
        let current = self.ledger.config().slot.slot_at(now_ms);
        let mut pushes = Vec::new();
        // A restored ledger grants once the nodes' reports are back.
        let holding = self.ledger.holding();
        for service in held.into_iter().filter(|_| !holding) {
            if !self
                .ledger
                .reassign_for_new_node(service, CONNECT_REASSIGN_KEYS, now_ms)
            {
                continue;
            }
            // Every node of the service is sent its new share of the
            // slot: the nodes before it keep their old ones otherwise, and
            // each node that joins would be handed the bucket again.
            let serving = (self.nodes.iter())
                .filter(|(_, (_, services))| services.contains(service.as_str()))
                .map(|(n, _)| *n);
            for to in serving {
                let quota = F::render(self.rendering(to), [(service.as_str(), current)], &[], None);
                pushes.push((to, quota));
            }
        }
        (node, pushes)
    }

    /// A node about to connect says it resumes from another central's
    /// quotas (`Hello.resumes`): a ledger that has filed and restored
    /// nothing holds its grants, so the first node back is not handed
    /// buckets the others' kept reports are about to empty.
    pub fn resumes(&mut self, now_ms: i64) {
        self.ledger.await_unknown_nodes(now_ms);
    }

    /// A stream of `node` closed (`accepts`: as given to
    /// [`Assigner::connect`] for it).
    pub fn disconnect(&mut self, node: NodeId, accepts: Accepts) {
        if let Some(entry) = self.nodes.get_mut(&node) {
            entry.0 = entry.0.saturating_sub(1);
            if entry.0 == 0 {
                self.nodes.remove(&node);
            }
        }
        if let Some(lacking) = self.lacking.get_mut(&node) {
            lacking.packed = lacking.packed.saturating_sub(usize::from(!accepts.packed));
            lacking.refs = lacking.refs.saturating_sub(usize::from(!accepts.refs));
            let packed = lacking.packed == 0;
            if !self.nodes.contains_key(&node) {
                self.lacking.remove(&node);
            }
            self.set_packed(node, packed);
        }
    }

    /// Whether `node`'s quotas are written as [`v1::PackedQuota`]s (every
    /// stream it has open accepts them: [`PACKED_QUOTAS`]) or in the
    /// original `services` map (the default).
    ///
    /// [`PACKED_QUOTAS`]: throttle_proto::PACKED_QUOTAS
    pub fn is_packed(&self, node: NodeId) -> bool {
        self.packed.get(node.index()).copied().unwrap_or(false)
    }

    /// [`Assigner::is_packed`] for a node known by its name.
    pub fn node_is_packed(&self, node_id: &str) -> bool {
        self.ledger
            .find_node(node_id)
            .is_some_and(|n| self.is_packed(n))
    }

    fn set_packed(&mut self, node: NodeId, packed: bool) {
        let i = node.index();
        if i >= self.packed.len() {
            if !packed {
                return;
            }
            self.packed.resize(i + 1, false);
        }
        self.packed[i] = packed;
    }

    /// How `node`'s quota is rendered now.
    fn rendering(&self, node: NodeId) -> Rendering<'_> {
        Rendering {
            ledger: &self.ledger,
            skeletons: &self.skeletons,
            node,
            packed: self.is_packed(node),
        }
    }

    /// The users last encoded for each node.
    pub fn skeletons(&self) -> &Skeletons {
        &self.skeletons
    }

    /// Whether every open stream of `node` accepts refs.
    fn refers(&self, node: NodeId) -> bool {
        self.lacking.get(&node).is_some_and(|l| l.refs == 0)
    }

    /// Where the limits (and block lists) come from.
    pub fn limits(&self) -> &Arc<dyn LimitSource> {
        &self.limits
    }

    /// The services `node` declared or reported, if it is connected.
    pub fn services_of(&self, node: NodeId) -> Option<&BTreeSet<String>> {
        self.nodes.get(&node).map(|(_, s)| s)
    }

    /// Reads the limits of every known service again, unless the source
    /// says they are the ones applied last time.
    pub fn refresh_limits(&mut self, now_ms: i64) {
        let version = self.limits.version();
        if version.is_some() && version == self.limits_applied {
            return;
        }
        self.limits_applied = version;
        let mut services: BTreeSet<String> = self.limits.services().into_iter().collect();
        services.extend(self.ledger.services().map(str::to_owned));
        for service in services {
            let limits = self.limits.list_limits(&service);
            self.ledger.apply_limits(&service, &limits, now_ms);
            let hierarchy = self.limits.hierarchy(&service);
            self.ledger.apply_hierarchy(&service, hierarchy);
            let policy = self.limits.policy(&service);
            if self.ledger.use_policy(&service, policy.as_deref()) {
                let name = self.ledger.policy_name(&service).unwrap_or_default();
                tracing::info!(%service, policy = name, "quota policy");
            }
        }
    }

    /// Files `report` from `node` (connected or not) and answers it.
    ///
    /// # Errors
    ///
    /// The ledger's [`ReportError`]: nothing was filed.
    pub fn report<R: ReportSource>(
        &mut self,
        node: NodeId,
        report: &R,
        now_ms: i64,
    ) -> Result<Answer<F::Quota>, ReportError> {
        let (filed, reported) = self.file_inner(node, report, now_ms)?;
        if self.ledger.holding() {
            // Nothing granted yet: the node keeps its last quotas.
            let quota = F::render(self.rendering(node), [], &[], Some(report.slot_number()));
            return Ok(Answer {
                quota,
                complete: filed.complete,
                ingested: filed.ingested,
            });
        }
        let next = report.slot_number() + 1;
        // A connected node is answered for every service it declared or
        // reported; one that is not (a replay racing a disconnect) for
        // those it reports.
        let answering = Some(report.slot_number());
        let quota = match self.nodes.get(&node) {
            Some((_, known)) => F::render(
                self.rendering(node),
                known.iter().map(|s| (s.as_str(), next)),
                &[],
                answering,
            ),
            None => F::render(
                self.rendering(node),
                reported.iter().map(|s| (*s, next)),
                &[],
                answering,
            ),
        };
        Ok(Answer {
            quota,
            complete: filed.complete,
            ingested: filed.ingested,
        })
    }

    /// Files `report` from `node` as [`Assigner::report`] does, without
    /// answering it: its answer went out ahead, from
    /// [`Assigner::prepare`].
    ///
    /// # Errors
    ///
    /// The ledger's [`ReportError`]: nothing was filed.
    pub fn file<R: ReportSource>(
        &mut self,
        node: NodeId,
        report: &R,
        now_ms: i64,
    ) -> Result<Filed, ReportError> {
        self.file_inner(node, report, now_ms)
            .map(|(filed, _)| filed)
    }

    /// The answer [`Assigner::report`] would give a report of `node` for
    /// `report_slot`, rendered ahead, with the services it covers: a report
    /// naming no other service gets exactly this answer, since filing a
    /// report changes no grant. `None` when `node` is not connected.
    ///
    /// Grants change on [`Assigner::tick`], [`Assigner::reassign`] and on a
    /// [`Assigner::connect`] that pushes: an answer prepared before one of
    /// those is stale.
    pub fn prepare(&self, node: NodeId, report_slot: i64) -> Option<Ahead<F::Quota>> {
        self.prepare_after(node, report_slot, &[])
    }

    /// [`Assigner::prepare`], after `node` was pushed the `pushed`
    /// (service, slot) tables, one per service of the node: for a node
    /// whose streams all accept refs, a service whose answer holds the very
    /// grants pushed is a [`v1::QuotaRef`] to that push rather than the
    /// table again.
    fn prepare_after(
        &self,
        node: NodeId,
        report_slot: i64,
        pushed: &[(&str, i64)],
    ) -> Option<Ahead<F::Quota>> {
        let (_, known) = self.nodes.get(&node)?;
        let slot = report_slot + 1;
        let refs: Vec<QuotaRef<'_>> = if self.refers(node) {
            pushed
                .iter()
                .filter(|&&(service, from)| self.ledger.same_grants(node, service, slot, from))
                .map(|&(service, from)| (service, slot, from))
                .collect()
        } else {
            Vec::new()
        };
        let rendered = known
            .iter()
            .map(|s| (s.as_str(), slot))
            .filter(|(s, _)| !refs.iter().any(|r| r.0 == *s));
        let quota = F::render(self.rendering(node), rendered, &refs, Some(report_slot));
        Some(Ahead {
            quota,
            services: known.iter().cloned().collect(),
            refers: !refs.is_empty(),
        })
    }

    /// The connected nodes.
    pub fn nodes(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.nodes.keys().copied()
    }

    fn file_inner<'r, R: ReportSource>(
        &mut self,
        node: NodeId,
        report: &'r R,
        now_ms: i64,
    ) -> Result<(Filed, BTreeSet<&'r str>), ReportError> {
        let ingested = self.ledger.ingest_from(report, now_ms)?;
        if let Some(tap) = &self.usage {
            tap.filed(report);
        }
        let reported: BTreeSet<&str> = report
            .usages()
            .map(|(s, ..)| s)
            .filter(|s| valid_name(s) && self.ledger.service_state(s).is_some())
            .collect();
        if let Some((_, known)) = self.nodes.get_mut(&node) {
            for s in &reported {
                if !known.contains(*s) {
                    known.insert((*s).to_owned());
                }
            }
        }
        let current = self.ledger.config().slot.slot_at(now_ms);
        if self.ledger.release(now_ms) {
            return Ok((self.caught_up(current, now_ms, ingested), reported));
        }
        let mut complete = Vec::new();
        if report.slot_number() == current {
            for service in &reported {
                if self.reassigned.get(*service) != Some(&current)
                    && self.ledger.all_reported(service, current)
                {
                    self.reassigned.insert((*service).to_owned(), current);
                    complete.push((*service).to_owned());
                }
            }
        }
        Ok((Filed { complete, ingested }, reported))
    }

    /// The nodes' reports are back after a restore: every service is
    /// assigned now, its answers rendered from that, and named complete
    /// so each node is pushed its grants.
    fn caught_up(&mut self, current: i64, now_ms: i64, ingested: Ingested) -> Filed {
        let services: Vec<String> = self.ledger.services().map(str::to_owned).collect();
        for service in &services {
            self.ledger.reassign(service, current, now_ms);
            self.reassigned.insert(service.clone(), current);
        }
        // The tick of this slot assigned nothing while holding: the next
        // slot's grants go out with the re-assign, so the nodes do not
        // carry what is left of this slot into the next.
        let assigned = self.ledger.assign(now_ms);
        self.released = services
            .iter()
            .map(|s| {
                (
                    s.clone(),
                    assigned.get(s).copied().filter(|&n| n != current),
                )
            })
            .collect();
        Filed {
            complete: services,
            ingested,
        }
    }

    /// Re-assigns the current slot of `service` (after [`Answer::complete`]
    /// named it) and returns a push for every node of the service. Run it
    /// after the answers already due, so no report waits for an assign.
    pub fn reassign(&mut self, service: &str, now_ms: i64) -> Vec<Push<F::Quota>> {
        let mut pushes = Vec::new();
        self.reassign_each(service, now_ms, |node, quota| pushes.push((node, quota)));
        pushes
    }

    /// [`Assigner::reassign`], handing each node's push to `each` as soon
    /// as it is rendered, so that only one is held at a time and the first
    /// nodes' go out while the others' are rendered.
    pub fn reassign_each(
        &mut self,
        service: &str,
        now_ms: i64,
        mut each: impl FnMut(NodeId, F::Quota),
    ) {
        let current = self.ledger.config().slot.slot_at(now_ms);
        // Assigned already when a hold ended just now.
        let released = self.released.remove(service);
        let assigned = match released {
            Some(_) => true,
            None => !self.ledger.holding() && self.ledger.reassign(service, current, now_ms),
        };
        if !assigned {
            return;
        }
        metrics::counter!("throttle_central_reassigns_total").increment(1);
        let slots = std::iter::once(current).chain(released.flatten());
        for slot in slots {
            for (&node, (_, services)) in &self.nodes {
                if services.contains(service) {
                    let quota = F::render(self.rendering(node), [(service, slot)], &[], None);
                    each(node, quota);
                }
            }
        }
    }

    /// The mid-slot work: limits, assign, a push per connected node, and
    /// retention.
    pub fn tick(&mut self, now_ms: i64) -> Vec<Push<F::Quota>> {
        let mut pushes = Vec::with_capacity(self.nodes.len());
        self.tick_inner(now_ms, false, |node, quota, _| pushes.push((node, quota)));
        pushes
    }

    /// [`Assigner::tick`], and every connected node's answer to its report
    /// due at the next boundary rendered ahead, as [`Assigner::prepare`]
    /// renders it (or, for a node that accepts them, with refs to the
    /// push: see [`Assigner::tick_each`]): each node's answer right after
    /// its push, while the node's encoded users are still in the cache (a
    /// lead-1 policy answers with the grants it pushed).
    pub fn tick_and_prepare(&mut self, now_ms: i64) -> (Vec<Push<F::Quota>>, Vec<Prepared<F>>) {
        let mut pushes = Vec::with_capacity(self.nodes.len());
        let mut prepared = Vec::new();
        self.tick_each(now_ms, |node, quota, answer| {
            pushes.push((node, quota));
            if let Some(answer) = answer {
                prepared.push((node, answer));
            }
        });
        (pushes, prepared)
    }

    /// [`Assigner::tick_and_prepare`], handing each node's push and answer
    /// rendered ahead to `each` as soon as they are rendered: only one
    /// node's are held at a time (at 1,000 nodes x 1,000 users all of them
    /// are some 100 MB), and the first nodes' go out while the others' are
    /// rendered.
    ///
    /// For a node whose streams all accept refs, the answer names the
    /// tables of the push that hold the same grants ([`Ahead::refers`]).
    pub fn tick_each(
        &mut self,
        now_ms: i64,
        each: impl FnMut(NodeId, F::Quota, Option<Ahead<F::Quota>>),
    ) {
        self.tick_inner(now_ms, true, each);
    }

    fn tick_inner(
        &mut self,
        now_ms: i64,
        prepare: bool,
        mut each: impl FnMut(NodeId, F::Quota, Option<Ahead<F::Quota>>),
    ) {
        let next = self.ledger.config().slot.slot_at(now_ms) + 1;
        self.refresh_limits(now_ms);
        self.released.clear();
        self.ledger.release(now_ms);
        if self.ledger.holding() {
            // Restored, the nodes' reports not all back: they keep their
            // last quotas a while longer.
            self.ledger.forget(now_ms);
            return;
        }
        let started = std::time::Instant::now();
        let assigned = self.ledger.assign(now_ms);
        metrics::histogram!("throttle_central_assign_seconds")
            .record(started.elapsed().as_secs_f64());
        for (&node, (_, services)) in &self.nodes {
            // A service the ledger does not know yet has no limits: say so
            // for the next slot, so the node knows the central is alive.
            let pushed: Vec<(&str, i64)> = services
                .iter()
                .map(|s| (s.as_str(), assigned.get(s).copied().unwrap_or(next)))
                .collect();
            let push = F::render(self.rendering(node), pushed.iter().copied(), &[], None);
            let answer = prepare
                .then(|| self.prepare_after(node, next, &pushed))
                .flatten();
            each(node, push, answer);
        }
        self.ledger.forget(now_ms);
        self.skeletons.forget(&self.ledger);
    }
}
