//! The ledger's task: it owns the [`Assigner`] and carries out every
//! [`Command`], so no stream ever waits on a lock held by another.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use metrics::{counter, gauge};
use throttle_clock::Clock;
use throttle_proto::v1;
use throttle_proto::wire::Outbound;
use tokio::sync::{mpsc, watch};
use tonic::Status;

use super::ahead::{AnswerAhead, Ready};
use super::blocks::SentBlocks;
use super::command::{Command, Outgoing, Snapshot};
use super::monitor::{Connection, Connections, MonitorView, Subject};
use super::received::Received;
use super::sent::{Sent, SentLimits, ToldNow};
use crate::assigner::{Accepts, Assigner, Encoded, Filed, Push};
use crate::ha::leadership::Leadership;
use crate::ledger::{
    FromNode, Ingested, Monitor, NodeId, Page, ReportError, ReportSource, SlotRange, TopUsers,
};
use crate::limits::blocked_at;
use crate::log::{Throttled, peer, truncate};

/// One open node stream, as the ledger's task knows it.
#[derive(Debug)]
struct Conn {
    node_id: String,
    node: NodeId,
    /// The forms its Hello accepts.
    accepts: Accepts,
    addr: Option<SocketAddr>,
    since: Instant,
    reports: u64,
    /// The data slot of the last report received, and when it came.
    last_report: Option<(i64, Instant)>,
    /// Reports of this stream answered ahead of filing ([`AnswerAhead`]).
    answered_ahead: u64,
    tx: Outgoing,
    ahead: Arc<AnswerAhead>,
    /// Lets the stream's lines about dropped entries and refused reports
    /// out once a second.
    drop_log: Throttled,
    /// The block lists this stream was last sent.
    blocks: SentBlocks,
    /// The limits this stream was last sent.
    limits: SentLimits,
    /// The keys bound by a longer period this stream was last sent.
    bound: Sent<v1::Bound>,
}

/// Counts and logs what the ledger did with a report of `node_id`: one
/// line for the entries it left out, at most once a second per stream
/// (`log`).
fn count_filed(out: &Ingested, node_id: &str, slot: i64, log: &Throttled, now_ms: i64) {
    counter!("throttle_central_reports_total").increment(1);
    counter!("throttle_central_report_entries_total").increment(out.entries as u64);
    for (service, resource, consumed, rejected) in &out.totals {
        let labels = [("service", service.clone()), ("resource", resource.clone())];
        for (name, amount) in [
            ("throttle_central_consumed_total", consumed),
            ("throttle_central_rejected_total", rejected),
        ] {
            if *amount > 0 {
                counter!(name, &labels).increment(u64::try_from(*amount).unwrap_or(0));
            }
        }
    }
    if out.duplicate {
        counter!("throttle_central_duplicate_reports_total").increment(1);
        tracing::debug!(%node_id, slot, "duplicate report ignored");
    }
    for (reason, n) in out.dropped.counts() {
        counter!("throttle_central_dropped_entries_total", "reason" => reason.as_str())
            .increment(n);
    }
    let Some((reason, key)) = out.dropped.examples().first() else {
        return;
    };
    if let Some(skipped) = log.allow(now_ms) {
        let dropped = out.dropped.total();
        tracing::warn!(
            %node_id,
            slot,
            dropped,
            first_reason = reason.as_str(),
            first = %truncate(key),
            reports_not_logged = skipped,
            "report entries dropped"
        );
    }
}

/// The ledger's task; see the [module docs](self).
pub(crate) struct Actor {
    assigner: Assigner<Encoded>,
    /// The ledger task's own queue, for work that waits behind the
    /// commands already there.
    me: mpsc::Sender<Command>,
    clock: Arc<dyn Clock>,
    conns: BTreeMap<u64, Conn>,
    next_conn: u64,
    started: Instant,
    /// Read where quotas leave: a central that cannot be sure it leads
    /// sends none.
    leadership: Arc<dyn Leadership>,
    /// Whether it led when last read: leading again after a gap holds
    /// grants until the nodes are back ([`Ledger::await_nodes`]).
    ///
    /// [`Ledger::await_nodes`]: crate::ledger::Ledger::await_nodes
    led: bool,
    /// The last reading of the heaviest users, and when it was taken.
    top: Option<(i64, Arc<TopUsers>)>,
}

/// Data slots the heaviest users are read over (fewer if the ledger keeps
/// fewer).
pub(crate) const TOP_SLOTS: usize = 60;
/// Users kept per service and resource, by admitted and by refused.
pub(crate) const TOP_KEPT: usize = 100;

impl Actor {
    /// The task over `assigner`; `me` is the sender of its own queue.
    pub(crate) fn new(
        assigner: Assigner<Encoded>,
        me: mpsc::Sender<Command>,
        clock: Arc<dyn Clock>,
        leadership: Arc<dyn Leadership>,
    ) -> Self {
        Self {
            assigner,
            me,
            clock,
            conns: BTreeMap::new(),
            next_conn: 0,
            started: Instant::now(),
            leadership,
            led: false,
            top: None,
        }
    }

    /// Whether this central leads now, read from the lease's deadline. On
    /// leading again, the ledger holds its grants until the nodes that
    /// reported before the gap are back.
    fn leads(&mut self) -> bool {
        let leads = self.leadership.is_leader();
        if leads && !self.led {
            let now = self.clock.now_ms();
            let ledger = self.assigner.ledger_mut();
            ledger.await_nodes(now);
            ledger.begin(now);
        }
        self.led = leads;
        leads
    }
}

/// Files `report` and answers it, or only files it when its answer went
/// out ahead.
fn file_report<R: ReportSource>(
    assigner: &mut Assigner<Encoded>,
    node: NodeId,
    report: &R,
    now_ms: i64,
    answered: bool,
) -> Result<(Filed, Option<bytes::Bytes>), ReportError> {
    if answered {
        return assigner.file(node, report, now_ms).map(|f| (f, None));
    }
    assigner.report(node, report, now_ms).map(|a| {
        let filed = Filed {
            complete: a.complete,
            ingested: a.ingested,
        };
        (filed, Some(a.quota))
    })
}

impl Actor {
    /// Takes commands until the stop, then closes ([`Actor::close`]).
    pub(crate) async fn run(
        mut self,
        mut rx: mpsc::Receiver<Command>,
        mut stop: watch::Receiver<bool>,
    ) {
        self.assigner.refresh_limits(self.clock.now_ms());
        loop {
            let next = tokio::select! {
                // Commands queued before the stop (e.g. a closing snapshot)
                // are answered first.
                biased;
                cmd = rx.recv() => Some(cmd),
                _ = stop.wait_for(|s| *s) => None,
            };
            let cmd = match next {
                Some(Some(cmd)) => cmd,
                // Every sender is gone.
                Some(None) => return,
                None => {
                    self.close(&mut rx, None).await;
                    return;
                }
            };
            if matches!(cmd, Command::Reassign { .. }) {
                // Let the streams write the answers just queued before the
                // re-assignment takes this thread.
                tokio::task::yield_now().await;
            }
            if let Some(snapshot) = self.handle(cmd) {
                self.close(&mut rx, snapshot).await;
                return;
            }
        }
    }

    /// Closes the queue, so that no stream can queue a report any more,
    /// files every report it still holds (a stream answered some of them
    /// ahead: see [`AnswerAhead`]), then answers `snapshot` and closes every
    /// stream with `UNAVAILABLE`.
    async fn close(&mut self, rx: &mut mpsc::Receiver<Command>, snapshot: Option<Snapshot>) {
        rx.close();
        let mut snapshots: Vec<_> = snapshot.into_iter().collect();
        // Ends once the queue is empty and no sender holds a reserved slot.
        while let Some(cmd) = rx.recv().await {
            if let Some(snapshot) = self.handle(cmd) {
                snapshots.extend(snapshot);
            }
        }
        for (subject, reply) in snapshots {
            let _ = reply.send(self.monitor(subject, SlotRange::default(), &Page::ALL));
        }
        // Waits for each stream that answers ahead to queue its answer
        // (it holds this lock until then), so that no answer follows the
        // close.
        self.forget_answers();
        for (_, c) in std::mem::take(&mut self.conns) {
            self.assigner.disconnect(c.node, c.accepts);
            let _ =
                c.tx.try_send(Err(Status::unavailable("central node shutting down")));
        }
        gauge!("throttle_central_connections").set(0.0);
    }

    /// Carries out `cmd`; for a close, returns its snapshot's request, for
    /// [`Actor::close`].
    fn handle(&mut self, cmd: Command) -> Option<Option<Snapshot>> {
        match cmd {
            Command::Connect {
                hello,
                addr,
                tx,
                ahead,
                reply,
            } => {
                let conn = self.connect(hello, addr, tx, ahead);
                let _ = reply.send(conn);
            }
            Command::Disconnect { conn } => self.disconnect(conn),
            Command::Report {
                conn,
                report,
                reply,
                answered,
            } => {
                let result = self.report_and_answer(conn, &report, answered);
                let _ = reply.send((result, report));
            }
            Command::Tick => self.tick(),
            Command::FirstShare {
                conn,
                service,
                user,
                slots,
                per_slot,
            } => {
                if let Some(c) = self.conns.get(&conn) {
                    let ledger = self.assigner.ledger_mut();
                    ledger.tell_first_share(&service, c.node, &user, slots, per_slot);
                }
            }
            Command::Reassign { service } => self.reassign(&service),
            Command::Monitor {
                subject,
                range,
                page,
                reply,
            } => {
                let _ = reply.send(self.monitor(subject, range, &page));
            }
            Command::Top { reply } => {
                let _ = reply.send(self.top());
            }
            Command::CloseAll { snapshot } => return Some(snapshot),
            Command::Checkpoint { reply } => {
                let now = self.clock.now_ms();
                let _ = reply.send(self.assigner.ledger().checkpoint(now));
            }
            Command::Restore { checkpoint, reply } => {
                let now = self.clock.now_ms();
                let _ = reply.send(self.assigner.ledger_mut().restore(&checkpoint, now));
            }
        }
        None
    }

    /// The heaviest users over the last [`TOP_SLOTS`] data slots: read
    /// again only once half a slot has passed since the last reading, so
    /// any number of dashboards costs the ledger's task one reading.
    fn top(&mut self) -> Arc<TopUsers> {
        let now = self.clock.now_ms();
        let config = self.assigner.ledger().config();
        let half_slot = i64::from(config.slot.as_ms() / 2);
        if let Some((at, top)) = &self.top
            && (*at..*at + half_slot).contains(&now)
        {
            return top.clone();
        }
        // A data slot is read once a whole slot has passed since it
        // ended: its reports are in by then.
        let to = config.slot.slot_at(now) - 2;
        let slots = TOP_SLOTS.min(config.nr_slot as usize).max(1);
        let top = Arc::new(TopUsers::read(
            self.assigner.ledger(),
            to,
            slots,
            TOP_KEPT,
            now,
        ));
        self.top = Some((now, top.clone()));
        top
    }

    /// Registers a stream that sent `hello`; returns its number.
    fn connect(
        &mut self,
        hello: v1::Hello,
        addr: Option<SocketAddr>,
        tx: Outgoing,
        ahead: Arc<AnswerAhead>,
    ) -> u64 {
        let conn = self.next_conn;
        self.next_conn += 1;
        let leads = self.leads();
        self.replace_streams_of(&hello.node_id);
        let accepts = Accepts::from_hello(&hello.accepts);
        let was_packed = self.assigner.node_is_packed(&hello.node_id);
        if hello.resumes {
            self.assigner.resumes(self.clock.now_ms());
        }
        let (node, pushes) = self.assigner.connect(
            &hello.node_id,
            &hello.services,
            accepts,
            self.clock.now_ms(),
        );
        if hello.report_every_ms > 0 {
            let services = hello.services.iter().map(String::as_str);
            let ledger = self.assigner.ledger_mut();
            ledger.reports_every(node, services, hello.report_every_ms);
        }
        tracing::info!(node_id = %hello.node_id, addr = %peer(addr), services = %hello.services.join(","), packed = accepts.packed, refs = accepts.refs, "node connected");
        let c = Conn {
            node_id: hello.node_id,
            node,
            accepts,
            addr,
            since: Instant::now(),
            reports: 0,
            last_report: None,
            answered_ahead: 0,
            tx,
            ahead,
            drop_log: Throttled::new(),
            blocks: SentBlocks::default(),
            limits: SentLimits::default(),
            bound: Sent::default(),
        };
        self.conns.insert(conn, c);
        self.sync_blocks(Some(conn));
        // Every stream: a node more makes each one's default share less.
        self.sync_limits();
        gauge!("throttle_central_connections").set(self.conns.len() as f64);
        if !pushes.is_empty() || self.assigner.is_packed(node) != was_packed {
            // A service was re-assigned, or the node's quotas
            // change form: answers rendered before are stale.
            self.forget_answers();
        }
        if leads {
            self.deliver(pushes);
        }
        conn
    }

    /// Closes every open stream of `node_id`: one live stream per node id,
    /// the newest. Each stays registered until its task ends, so reports
    /// it already queued (answered ahead, some) are still filed; a node's
    /// reports of one slot are filed once, whichever stream they come on.
    fn replace_streams_of(&self, node_id: &str) {
        for c in self.conns.values().filter(|c| c.node_id == node_id) {
            *c.ahead.ready.lock() = None;
            let status = Status::aborted("replaced by a newer stream of the same node id");
            let _ = c.tx.try_send(Err(status));
            counter!("throttle_central_streams_replaced_total").increment(1);
            tracing::info!(%node_id, "stream replaced by a newer one of the same node id");
        }
    }

    /// Forgets stream `conn`, which closed.
    fn disconnect(&mut self, conn: u64) {
        if let Some(c) = self.conns.remove(&conn) {
            let was_packed = self.assigner.is_packed(c.node);
            self.assigner.disconnect(c.node, c.accepts);
            if self.assigner.is_packed(c.node) != was_packed {
                self.forget_answers();
            }
            tracing::info!(node_id = %c.node_id, reports = c.reports, "node disconnected");
        }
        gauge!("throttle_central_connections").set(self.conns.len() as f64);
    }

    /// Files a report of stream `conn` and, unless the stream answered it
    /// ahead, queues its answer.
    ///
    /// The answer is queued here, by the ledger's own task, so it precedes
    /// anything the ledger sends this stream later (such as the close on
    /// shutdown): a node that saw no answer knows its report was not
    /// filed, and sends it again.
    fn report_and_answer(
        &mut self,
        conn: u64,
        report: &Received,
        answered: bool,
    ) -> Result<(), Status> {
        if !answered && !self.leads() {
            // Not filed either: the node sends it again to the leader. (One
            // answered ahead was answered while this central led.)
            return Err(Status::unavailable("not the leader"));
        }
        let Some(quota) = self.report(conn, report, answered)? else {
            return Ok(());
        };
        let tx = self.conns.get(&conn).map(|c| &c.tx);
        let msg = Ok(Outbound::Encoded(quota));
        if tx.is_some_and(|tx| tx.try_send(msg).is_ok()) {
            return Ok(());
        }
        counter!("throttle_central_pushes_dropped_total").increment(1);
        Err(Status::resource_exhausted("node is not reading its stream"))
    }

    /// Files a report and returns its answer, or `None` when the stream
    /// answered it ahead.
    fn report(
        &mut self,
        conn: u64,
        report: &Received,
        answered: bool,
    ) -> Result<Option<bytes::Bytes>, Status> {
        let now = self.clock.now_ms();
        let Self {
            conns, assigner, ..
        } = self;
        let Some(c) = conns.get_mut(&conn) else {
            return Err(Status::failed_precondition("stream is not registered"));
        };
        // A report may leave out its node id: it is the stream's.
        let claimed = report.node_id();
        if !claimed.is_empty() && claimed != c.node_id {
            counter!("throttle_central_invalid_messages_total", "reason" => "node_id_mismatch")
                .increment(1);
            return Err(Status::invalid_argument(format!(
                "report node_id {:?} differs from the stream's {:?}",
                claimed, c.node_id
            )));
        }
        c.reports += 1;
        c.last_report = Some((report.slot_number(), Instant::now()));
        c.answered_ahead += u64::from(answered);
        let (node, node_id, drop_log) = (c.node, c.node_id.as_str(), &c.drop_log);
        let filed = match report {
            Received::Raw(r) => file_report(assigner, node, &FromNode(node_id, r), now, answered),
            Received::Decoded(r) => {
                file_report(assigner, node, &FromNode(node_id, r), now, answered)
            }
        };
        let (answer, quota) = match filed {
            Ok(a) => a,
            Err(e) => {
                counter!("throttle_central_invalid_messages_total", "reason" => "report")
                    .increment(1);
                // The stream answers ahead only what passes the same check
                // (`LedgerConfig::check`), so `answered` here means the two
                // checks disagreed: say so.
                if let Some(skipped) = drop_log.allow(now) {
                    tracing::warn!(%node_id, error = %e, answered, skipped, "report refused");
                }
                return Err(Status::invalid_argument(e.to_string()));
            }
        };
        if answered {
            counter!("throttle_central_answers_ahead_total").increment(1);
        }
        count_filed(
            &answer.ingested,
            node_id,
            report.slot_number(),
            drop_log,
            now,
        );
        // Re-assign after the answers already queued: the ledger task takes
        // its commands in order.
        for service in answer.complete {
            // A closed queue means the ledger is filing its last reports
            // before it closes: nothing is skipped that anyone would read.
            if let Err(mpsc::error::TrySendError::Full(_)) =
                self.me.try_send(Command::Reassign { service })
            {
                counter!("throttle_central_reassigns_skipped_total").increment(1);
                tracing::warn!("re-assign skipped: the ledger's queue is full");
            }
        }
        Ok(quota)
    }

    /// Clears every stream's answer rendered ahead: grants changed.
    fn forget_answers(&self) {
        for c in self.conns.values() {
            *c.ahead.ready.lock() = None;
        }
    }

    /// Each node's streams, found once rather than by a scan per push.
    fn streams(conns: &BTreeMap<u64, Conn>) -> BTreeMap<NodeId, Vec<&Conn>> {
        let mut streams: BTreeMap<NodeId, Vec<&Conn>> = BTreeMap::new();
        for c in conns.values() {
            streams.entry(c.node).or_default().push(c);
        }
        streams
    }

    /// Queues `quota` on every stream in `streams`, never waiting. Encoded
    /// once; a node with two streams (for a moment, while it reconnects)
    /// shares the bytes. Returns whether every stream took it.
    fn push(streams: &[&Conn], quota: &bytes::Bytes) -> bool {
        let mut all = true;
        for c in streams {
            if c.tx.try_send(Ok(Outbound::Encoded(quota.clone()))).is_err() {
                counter!("throttle_central_pushes_dropped_total").increment(1);
                tracing::warn!(node_id = %c.node_id, "quota push dropped: stream queue full");
                all = false;
            }
        }
        all
    }

    /// Queues each push on every stream of its node.
    fn deliver(&self, pushes: Vec<Push<bytes::Bytes>>) {
        if pushes.is_empty() {
            return;
        }
        let streams = Self::streams(&self.conns);
        for (node, quota) in pushes {
            Self::push_to(&streams, node, &quota);
        }
    }

    /// Queues `quota` on every stream of `node` in `streams`.
    fn push_to(streams: &BTreeMap<NodeId, Vec<&Conn>>, node: NodeId, quota: &bytes::Bytes) {
        Self::push(streams.get(&node).map_or(&[][..], Vec::as_slice), quota);
    }

    /// Re-assigns `service`: the answers rendered ahead are cleared, and
    /// each node's push is queued as soon as it is rendered.
    fn reassign(&mut self, service: &str) {
        self.forget_answers();
        if !self.leads() {
            return;
        }
        let now = self.clock.now_ms();
        let streams = Self::streams(&self.conns);
        self.assigner.reassign_each(service, now, |node, quota| {
            Self::push_to(&streams, node, &quota);
        });
    }

    /// The mid-slot assign. Node by node, as each is rendered: its streams
    /// get the answer to the node's report due at the next slot boundary
    /// (see [`AnswerAhead`]; none if none was rendered), then its push is
    /// queued (in that order, so an answer never overtakes a newer push).
    /// Only one node's push and answer are held here at a time, and the
    /// first nodes' go out while the others' are rendered.
    fn tick(&mut self) {
        if !self.leads() {
            self.forget_answers();
            return;
        }
        let now = self.clock.now_ms();
        let report_slot = self.assigner.ledger().config().slot.slot_at(now) + 1;
        let mut streams = Self::streams(&self.conns);
        self.assigner.tick_each(now, |node, quota, answer| {
            let refers = answer.as_ref().is_some_and(|a| a.refers);
            let ready = answer.map(|a| Ready {
                report_slot,
                services: a.services.into(),
                quota: a.quota,
            });
            for c in streams.remove(&node).unwrap_or_default() {
                let mut ahead = c.ahead.ready.lock();
                // An answer that refers to the push goes only where the
                // push went: otherwise the ledger answers after filing.
                let pushed = Self::push(&[c], &quota);
                *ahead = ready.clone().filter(|_| pushed || !refers);
            }
        });
        // Streams of a node the assigner no longer serves answer nothing
        // ahead.
        for c in streams.into_values().flatten() {
            *c.ahead.ready.lock() = None;
        }
        self.sync_blocks(None);
        self.sync_limits();
    }

    /// Sends every stream the limits of its node's services, and their
    /// keys bound by a longer period, that changed since it was last sent
    /// them.
    fn sync_limits(&mut self) {
        let now = self.clock.now_ms();
        let services: BTreeSet<String> = (self.conns.values())
            .filter_map(|c| self.assigner.services_of(c.node))
            .flatten()
            .cloned()
            .collect();
        let ledger = self.assigner.ledger_mut();
        let told: ToldNow = (services.iter())
            .filter_map(|s| ledger.told(s, now).map(|l| (s.clone(), l)))
            .collect();
        let bound: ToldNow<v1::Bound> = (services.into_iter())
            .filter_map(|s| ledger.bound(&s, now).map(|b| (s, b)))
            .collect();
        for c in self.conns.values_mut() {
            if let Some(services) = self.assigner.services_of(c.node) {
                c.limits.sync(&c.tx, services.iter(), &told);
                c.bound.sync(&c.tx, services.iter(), &bound);
            }
        }
    }

    /// Sends stream `only` (every stream, if `None`) the block lists of
    /// its node's services that changed since it was last sent them.
    fn sync_blocks(&mut self, only: Option<u64>) {
        let blocks = self.assigner.limits().blocks();
        if blocks.is_empty() && self.conns.values().all(|c| c.blocks.is_empty()) {
            return;
        }
        let now = blocked_at(&blocks, self.clock.now_ms());
        for (id, c) in &mut self.conns {
            if only.is_some_and(|o| o != *id) {
                continue;
            }
            if let Some(services) = self.assigner.services_of(c.node) {
                c.blocks.sync(&c.tx, services.iter(), &now);
            }
        }
    }

    /// Answers a monitor question from the ledger as it stands.
    fn monitor(&self, subject: Subject, range: SlotRange, page: &Page) -> MonitorView {
        let ledger = self.assigner.ledger();
        match subject {
            Subject::Connections => MonitorView::Connections(self.connections()),
            Subject::Reported => MonitorView::Reported(Monitor::of(ledger).reported(range)),
            Subject::ConsumptionSum => {
                MonitorView::Sums(Monitor::of(ledger).sums(range, false, page))
            }
            Subject::RejectionSum => MonitorView::Sums(Monitor::of(ledger).sums(range, true, page)),
            Subject::Distribution => {
                let now = self.clock.now_ms();
                MonitorView::Distribution(Monitor::of(ledger).distribution(range, now, page))
            }
            Subject::Quota => MonitorView::Quota(Monitor::of(ledger).quota(range, page)),
            Subject::Apps => MonitorView::Apps(Monitor::of(ledger).apps(page.service.as_deref())),
        }
    }

    fn connections(&self) -> Connections {
        let stream = |c: &Conn| Connection {
            node_id: c.node_id.clone(),
            addr: c.addr,
            services: self
                .assigner
                .services_of(c.node)
                .map(|s| s.iter().cloned().collect())
                .unwrap_or_default(),
            connected_seconds: c.since.elapsed().as_secs_f64(),
            reports: c.reports,
            last_slot: c.last_report.map(|(slot, _)| slot),
            last_report_seconds: c.last_report.map(|(_, at)| at.elapsed().as_secs_f64()),
            answered_ahead: c.answered_ahead,
            packed: self.assigner.is_packed(c.node),
            refs: c.accepts.refs,
        };
        Connections {
            streams: self.conns.values().map(stream).collect(),
            uptime_seconds: self.started.elapsed().as_secs_f64(),
        }
    }
}
