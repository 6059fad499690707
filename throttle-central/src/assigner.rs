//! The central node's reactions, without I/O: what to answer a report, what
//! to push and when.
//!
//! The [`Assigner`] owns the [`Ledger`] and knows which nodes are connected
//! for which services. The gRPC server feeds it connects, reports and timer
//! ticks from real streams; the simulator feeds it the same from virtual
//! time. Both then deliver the [`Push`]es it returns.
//!
//! - [`Assigner::report`] files a report and answers with the node's quota
//!   for the slot after it; when the policy wants it and every active node
//!   has now reported the slot that just ended, it says so, and
//!   [`Assigner::reassign`] re-assigns the current slot and pushes it to
//!   every node of the service.
//! - [`Assigner::tick`], at each mid-slot: reads the limits again, runs every
//!   policy's assign and pushes the result to every connected node, then
//!   forgets what is older than the retention.
//!
//! Quotas come out as messages ([`Messages`], for the simulator and tests) or
//! already encoded ([`Encoded`], for the gRPC server); both say the same.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

use bytes::Bytes;
use throttle_proto::{MAX_NAME_LEN, v1};

use crate::ledger::{Ingested, Ledger, NodeId, ReportError, ReportSource};
use crate::limits::LimitSource;

/// A quota to send to one node.
pub type Push<Q = v1::Quota> = (NodeId, Q);

/// A [`v1::QuotaRef`]: (service, slot, from slot).
pub type QuotaRef<'a> = (&'a str, i64, i64);

/// The form in which an [`Assigner`] hands out quotas.
pub trait QuotaFormat {
    /// One node's quota.
    type Quota: fmt::Debug + Clone;

    /// The quota of `node` for each `(service, slot)`, and `refs` to
    /// tables sent before, answering the report of `report_slot` if given.
    fn render<'a>(
        ledger: &Ledger,
        node: NodeId,
        services: impl IntoIterator<Item = (&'a str, i64)>,
        refs: &[QuotaRef<'_>],
        report_slot: Option<i64>,
    ) -> Self::Quota;
}

/// The forms of quota a stream's node reads besides the original maps, as
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

/// Quotas as [`v1::Quota`] messages.
#[derive(Debug, Clone, Copy, Default)]
pub struct Messages;

impl QuotaFormat for Messages {
    type Quota = v1::Quota;

    fn render<'a>(
        ledger: &Ledger,
        node: NodeId,
        services: impl IntoIterator<Item = (&'a str, i64)>,
        refs: &[QuotaRef<'_>],
        report_slot: Option<i64>,
    ) -> v1::Quota {
        let mut quota = ledger.quota_for(node, services);
        quota.report_slot = report_slot;
        quota.refs = refs
            .iter()
            .map(|&(service, slot, from_slot)| v1::QuotaRef {
                service: service.to_owned(),
                slot,
                from_slot,
            })
            .collect();
        quota
    }
}

/// Quotas as encoded [`v1::CentralMessage`]s, written straight from the
/// grants ([`Ledger::encode_quota_for`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct Encoded;

impl QuotaFormat for Encoded {
    type Quota = Bytes;

    fn render<'a>(
        ledger: &Ledger,
        node: NodeId,
        services: impl IntoIterator<Item = (&'a str, i64)>,
        refs: &[QuotaRef<'_>],
        report_slot: Option<i64>,
    ) -> Bytes {
        ledger.encode_quota_for(node, services, refs, report_slot)
    }
}

/// Services with at most this many keys are re-assigned when a node
/// connects (cheap at that size), so the node gets a quota for the current
/// slot at once.
pub const CONNECT_REASSIGN_KEYS: usize = 10_000;

/// What the central node does on each event; see the [module docs](self).
pub struct Assigner<F: QuotaFormat = Messages> {
    format: PhantomData<F>,
    ledger: Ledger,
    limits: Arc<dyn LimitSource>,
    /// Connected nodes: open streams and the services they declared or reported.
    nodes: BTreeMap<NodeId, (usize, BTreeSet<String>)>,
    /// Per node, its open streams that do not accept packed quotas, and
    /// those that do not accept refs: its quotas take each form only
    /// while there are none.
    lacking: BTreeMap<NodeId, Lacking>,
    /// Per service, the last slot re-assigned once every report was in.
    reassigned: BTreeMap<String, i64>,
    /// The [`LimitSource::version`] of the limits applied last.
    limits_applied: Option<u64>,
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

fn valid(name: &str) -> bool {
    !name.is_empty() && name.len() <= MAX_NAME_LEN
}

impl<F: QuotaFormat> Assigner<F> {
    /// An assigner over `ledger`, reading limits from `limits`.
    pub fn new(ledger: Ledger, limits: Arc<dyn LimitSource>) -> Self {
        Self {
            format: PhantomData,
            ledger,
            limits,
            nodes: BTreeMap::new(),
            lacking: BTreeMap::new(),
            reassigned: BTreeMap::new(),
            limits_applied: None,
        }
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
        self.ledger.set_packed(node, lacking.packed == 0);
        self.ledger
            .connect(node, services.iter().map(String::as_str), now_ms);
        let entry = self.nodes.entry(node).or_default();
        entry.0 += 1;
        entry
            .1
            .extend(services.iter().filter(|s| valid(s)).cloned());
        let current = self.ledger.config().slot.slot_at(now_ms);
        let mut pushes = Vec::new();
        for service in services.iter().filter(|s| valid(s)) {
            if self
                .ledger
                .reassign_for_new_node(service, CONNECT_REASSIGN_KEYS, now_ms)
            {
                let quota = F::render(&self.ledger, node, [(service.as_str(), current)], &[], None);
                pushes.push((node, quota));
            }
        }
        (node, pushes)
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
            self.ledger.set_packed(node, packed);
        }
    }

    /// Whether every open stream of `node` accepts refs.
    fn refers(&self, node: NodeId) -> bool {
        self.lacking.get(&node).is_some_and(|l| l.refs == 0)
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
        let next = report.slot_number() + 1;
        // A connected node is answered for every service it declared or
        // reported; one that is not (a replay racing a disconnect) for
        // those it reports.
        let answering = Some(report.slot_number());
        let quota = match self.nodes.get(&node) {
            Some((_, known)) => F::render(
                &self.ledger,
                node,
                known.iter().map(|s| (s.as_str(), next)),
                &[],
                answering,
            ),
            None => F::render(
                &self.ledger,
                node,
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
        let quota = F::render(&self.ledger, node, rendered, &refs, Some(report_slot));
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
        let reported: BTreeSet<&str> = report
            .usages()
            .map(|(s, ..)| s)
            .filter(|s| valid(s))
            .collect();
        if let Some((_, known)) = self.nodes.get_mut(&node) {
            for s in &reported {
                if !known.contains(*s) {
                    known.insert((*s).to_owned());
                }
            }
        }
        let current = self.ledger.config().slot.slot_at(now_ms);
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
        if !self.ledger.reassign(service, current, now_ms) {
            return;
        }
        metrics::counter!("throttle_central_reassigns_total").increment(1);
        for (&node, (_, services)) in &self.nodes {
            if services.contains(service) {
                each(
                    node,
                    F::render(&self.ledger, node, [(service, current)], &[], None),
                );
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
            let push = F::render(&self.ledger, node, pushed.iter().copied(), &[], None);
            let answer = prepare
                .then(|| self.prepare_after(node, next, &pushed))
                .flatten();
            each(node, push, answer);
        }
        self.ledger.forget(now_ms);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::ledger::LedgerConfig;
    use crate::limits::{Limit, LimitSet, StaticLimits};

    /// Counts how often the limits are read.
    #[derive(Debug)]
    struct Counting {
        inner: StaticLimits,
        versioned: bool,
        reads: AtomicUsize,
    }

    impl LimitSource for Counting {
        fn services(&self) -> Vec<String> {
            self.inner.services()
        }

        fn list_limits(&self, service: &str) -> Vec<crate::limits::Limit> {
            self.reads.fetch_add(1, Ordering::Relaxed);
            self.inner.list_limits(service)
        }

        fn version(&self) -> Option<u64> {
            if self.versioned {
                self.inner.version()
            } else {
                None
            }
        }
    }

    fn set(rate: f64) -> LimitSet {
        let mut set = LimitSet::new();
        set.insert(
            "front",
            Limit {
                user: "alice".into(),
                per_second: [("requests".into(), rate)].into(),
                burst_seconds: 1.0,
            },
        );
        set
    }

    fn assigner(versioned: bool) -> (Assigner, Arc<Counting>) {
        let limits = Arc::new(Counting {
            inner: StaticLimits::new(set(10.0)),
            versioned,
            reads: AtomicUsize::new(0),
        });
        let assigner = Assigner::new(Ledger::new(LedgerConfig::default()), limits.clone());
        (assigner, limits)
    }

    #[test]
    fn limits_are_read_again_only_when_their_version_changes() {
        let (mut a, limits) = assigner(true);
        a.refresh_limits(0);
        a.refresh_limits(1_000);
        assert_eq!(
            limits.reads.load(Ordering::Relaxed),
            1,
            "unchanged: skipped"
        );
        limits.inner.replace(set(20.0));
        a.refresh_limits(2_000);
        assert_eq!(limits.reads.load(Ordering::Relaxed), 2);
        let level = a
            .ledger_mut()
            .bucket_level("front", "alice", "requests", 2_000);
        assert_eq!(level, Some(10.0), "the new rate applies from now on");
        assert_eq!(
            a.ledger_mut()
                .bucket_level("front", "alice", "requests", 3_000),
            Some(20.0)
        );
    }

    /// Accepts packed quotas or not, and no refs.
    fn packed(packed: bool) -> Accepts {
        Accepts {
            packed,
            refs: false,
        }
    }

    fn report(node: &str, slot: i64, requests: i64) -> v1::Report {
        let alice = format!(r#"{{"alice": {{"requests": {requests}}}}}"#);
        crate::ledger::tests::report(node, slot, &alice, "{}")
    }

    #[test]
    fn a_nodes_quotas_are_packed_while_every_stream_of_it_accepts_them() {
        let limits = Arc::new(StaticLimits::new(set(10.0)));
        let mut a: Assigner<Encoded> = Assigner::new(Ledger::new(LedgerConfig::default()), limits);
        let front = ["front".to_string()];
        let (n1, _) = a.connect("n1", &front, packed(true), 0);
        let (n2, _) = a.connect("n2", &front, packed(false), 0);
        assert!(a.ledger().is_packed(n1));
        assert!(!a.ledger().is_packed(n2));
        // A second stream of n1 (a process replacing it) that does not.
        a.connect("n1", &front, packed(false), 0);
        assert!(!a.ledger().is_packed(n1));
        a.disconnect(n1, packed(true));
        assert!(!a.ledger().is_packed(n1), "the stream left does not");
        a.disconnect(n1, packed(false));
        a.connect("n1", &front, packed(true), 0);
        assert!(a.ledger().is_packed(n1));
        // What is rendered for each.
        for (slot, t) in [(1, 1_050), (2, 2_050)] {
            a.report(n1, &report("n1", slot, 3), t).unwrap();
            a.report(n2, &report("n2", slot, 1), t).unwrap();
            a.tick(t + 450);
        }
        let quota = |node| {
            let bytes = a.prepare(node, 2).unwrap().quota;
            match <v1::CentralMessage as prost::Message>::decode(&bytes[..]) {
                Ok(v1::CentralMessage {
                    kind: Some(v1::central_message::Kind::Quota(q)),
                }) => q,
                other => panic!("{other:?}"),
            }
        };
        let (mut packed, classic) = (quota(n1), quota(n2));
        assert!(
            packed.services.is_empty() && packed.packed.len() == 1,
            "{packed:?}"
        );
        assert!(
            classic.packed.is_empty() && classic.services.len() == 1,
            "{classic:?}"
        );
        packed.unpack().unwrap();
        let alice =
            |q: &v1::Quota| q.services["front"].slots[&3].users["alice"].resources["requests"];
        assert!(
            alice(&packed) > alice(&classic),
            "n1 uses more: {packed:?} {classic:?}"
        );
    }

    #[test]
    fn a_prepared_answer_is_the_answer_the_report_gets() {
        let limits = Arc::new(StaticLimits::new(set(10.0)));
        let mut a: Assigner<Encoded> = Assigner::new(Ledger::new(LedgerConfig::default()), limits);
        let (n1, _) = a.connect("n1", &["front".to_string()], packed(false), 0);
        let (n2, _) = a.connect("n2", &["front".to_string()], packed(false), 0);
        for (slot, t) in [(1, 1_050), (2, 2_050), (3, 3_050)] {
            a.report(n1, &report("n1", slot, 3), t).unwrap();
            a.report(n2, &report("n2", slot, 1), t).unwrap();
            a.tick(t + 450);
        }
        let Ahead {
            quota: prepared,
            services,
            refers,
        } = a.prepare(n1, 4).unwrap();
        assert!(!refers);
        assert_eq!(services, ["front"]);
        let answer = a.report(n1, &report("n1", 4, 3), 4_050).unwrap();
        assert_eq!(answer.quota, prepared, "filing changes no grant");
        let decoded = <v1::CentralMessage as prost::Message>::decode(&prepared[..]).unwrap();
        let Some(v1::central_message::Kind::Quota(q)) = decoded.kind else {
            panic!("{decoded:?}")
        };
        assert_eq!(q.report_slot, Some(4));
        let alice = &q.services["front"].slots[&5].users["alice"].resources["requests"];
        assert!(*alice > 0.0, "n1 has a share of alice's bucket: {alice}");
        // Filing alone answers nothing and leaves the next answer as it was.
        a.file(n2, &report("n2", 4, 1), 4_060).unwrap();
        assert_eq!(a.prepare(n1, 4).unwrap().quota, prepared);
        assert!(
            a.prepare(NodeId::from_index(99), 4).is_none(),
            "not connected"
        );
    }

    /// For each policy, a maker of assigners over it, with limits of 10.
    fn per_policy<F: QuotaFormat>() -> [fn() -> Assigner<F>; 3] {
        fn make<F: QuotaFormat>(policy: fn() -> Box<dyn crate::policy::Policy>) -> Assigner<F> {
            let limits = Arc::new(StaticLimits::new(set(10.0)));
            let ledger =
                Ledger::with_policies(LedgerConfig::default(), Box::new(move |_| policy()));
            Assigner::new(ledger, limits)
        }
        [
            || make(|| Box::new(crate::policy::Projected::new())),
            || make(|| Box::new(crate::policy::Classic::new())),
            || make(|| Box::new(crate::policy::StaticSplit::new())),
        ]
    }

    #[test]
    fn answers_rendered_with_the_tick_are_those_prepare_renders() {
        for make in per_policy::<Encoded>() {
            // Two assigners fed alike: one ticks and prepares in one pass,
            // the other ticks, then prepares each node.
            let (mut one, mut two) = (make(), make());
            // n1 is also in a service without limits: nothing to reuse there.
            let services = [
                vec!["front".to_string(), "other".to_string()],
                vec!["front".to_string()],
            ];
            let mut nodes = Vec::new();
            // n1 takes its quotas packed.
            for (name, services) in ["n1", "n2"].iter().zip(&services) {
                nodes.push(one.connect(name, services, packed(*name == "n1"), 0).0);
                two.connect(name, services, packed(*name == "n1"), 0);
            }
            for (slot, t) in [(1, 1_050), (2, 2_050), (3, 3_050)] {
                for (name, requests) in [("n1", 3), ("n2", 1)] {
                    let node = nodes[usize::from(name == "n2")];
                    one.report(node, &report(name, slot, requests), t).unwrap();
                    two.report(node, &report(name, slot, requests), t).unwrap();
                }
                let (pushes, prepared) = one.tick_and_prepare(t + 450);
                assert_eq!(pushes, two.tick(t + 450));
                assert_eq!(prepared.len(), 2);
                for (node, answer) in prepared {
                    let want = two.prepare(node, slot + 1).unwrap();
                    assert_eq!(answer.quota, want.quota, "node {node:?} after slot {slot}");
                    assert_eq!(answer.services, want.services);
                }
            }
        }
    }

    /// An answer rendered ahead for a node that accepts refs names the
    /// tables of the push rendered with it that hold its grants, and once
    /// those tables are put in for the refs it is the whole answer; for
    /// every policy, and only while every stream of the node accepts refs.
    #[test]
    fn an_answer_ahead_refers_to_the_push_it_repeats() {
        for make in per_policy::<Messages>() {
            // `refs` answers n1 with refs, `whole` without; n2 takes none.
            let (mut refs, mut whole) = (make(), make());
            let services = ["front".to_string(), "other".to_string()];
            let n1 = refs.connect("n1", &services, Accepts::ALL, 0).0;
            whole.connect("n1", &services, packed(true), 0);
            let n2 = refs.connect("n2", &services, packed(true), 0).0;
            whole.connect("n2", &services, packed(true), 0);
            for (slot, t) in [(1, 1_050), (2, 2_050), (3, 3_050)] {
                for (node, name, requests) in [(n1, "n1", 3), (n2, "n2", 1)] {
                    refs.report(node, &report(name, slot, requests), t).unwrap();
                    whole
                        .report(node, &report(name, slot, requests), t)
                        .unwrap();
                }
                let mut answers = BTreeMap::new();
                refs.tick_each(t + 450, |node, push, answer| {
                    answers.insert(node, (push, answer.unwrap()));
                });
                let (_, want) = whole.tick_and_prepare(t + 450);
                for (node, want) in want {
                    let (push, mut answer) = answers.remove(&node).unwrap();
                    assert_eq!(answer.services, want.services);
                    assert_eq!(answer.refers, !answer.quota.refs.is_empty());
                    if node == n2 {
                        assert_eq!(answer.quota, want.quota, "n2 takes no refs");
                        continue;
                    }
                    // "front" has grants for n1, which the push holds;
                    // "other" has none, and is sent whole.
                    let referred: Vec<&str> = answer
                        .quota
                        .refs
                        .iter()
                        .map(|r| r.service.as_str())
                        .collect();
                    assert_eq!(referred, ["front"], "slot {slot}");
                    for r in std::mem::take(&mut answer.quota.refs) {
                        assert_eq!(r.slot, slot + 2);
                        let table = push.services[&r.service].slots[&r.from_slot].clone();
                        let slots = &mut answer.quota.services.entry(r.service).or_default().slots;
                        slots.insert(r.slot, table);
                    }
                    assert_eq!(answer.quota, want.quota, "slot {slot}");
                }
            }
            // A second stream of n1 that does not take refs.
            refs.connect("n1", &services, packed(true), 4_000);
            refs.tick_each(4_500, |node, _, answer| {
                assert!(!answer.unwrap().refers, "{node:?}");
            });
        }
    }

    #[test]
    fn limits_without_a_version_are_read_every_time() {
        let (mut a, limits) = assigner(false);
        a.refresh_limits(0);
        a.refresh_limits(1_000);
        assert_eq!(limits.reads.load(Ordering::Relaxed), 2);
    }
}
