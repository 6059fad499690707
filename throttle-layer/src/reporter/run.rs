//! The reporter's task: a report each slot, quotas installed, streams
//! opened again when they end.

use std::collections::VecDeque;
use std::time::Duration;

use bytes::Bytes;
use metrics::{counter, gauge, histogram};
use prost::Message;
use throttle_proto::v1;
use throttle_proto::wire::{Answer, Inbound, RawQuota};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::dial;
use super::handle::ReporterHandle;
use super::repeats::Repeats;
use super::settings::Settings;
use super::status::ReporterStatus;
use super::stream::*;

/// A report kept until its answer, and after it for the kept history:
/// encoded once, sent (and sent again after a reconnection) as the same
/// bytes.
pub(super) struct Pending {
    pub(super) slot: i64,
    pub(super) report: Bytes,
    /// Written as packed usages.
    pub(super) packed: bool,
    pub(super) sent: Option<Instant>,
    /// A central answered it: sent again only to a new ledger, marked
    /// `answered`.
    pub(super) answered: bool,
}

/// `Report.answered = true`, as appended to an encoded report: a field
/// that comes later in the bytes is read as part of the same message.
const ANSWERED: [u8; 2] = [
    (throttle_proto::wire::fields::REPORT_ANSWERED << 3) as u8,
    1,
];

impl Pending {
    /// The bytes to send: marked answered where a central answered it.
    fn bytes(&self) -> Bytes {
        if !self.answered {
            return self.report.clone();
        }
        let mut marked = Vec::with_capacity(self.report.len() + ANSWERED.len());
        marked.extend_from_slice(&self.report);
        marked.extend_from_slice(&ANSWERED);
        marked.into()
    }
}

pub(super) struct Run {
    pub(super) cfg: Settings,
    pub(super) current: usize,
    pub(super) pending: VecDeque<Pending>,
    pub(super) last_collected: i64,
    pub(super) next_tick: Instant,
    /// When after a slot boundary this node reports: the delay and its
    /// place in the spread.
    pub(super) report_after: Duration,
    /// Services named in the last Hello.
    pub(super) announced: usize,
    /// The last central node reached reads packed reports: reports are
    /// written packed for it (and rewritten should the next one not).
    pub(super) packed_reports: bool,
    pub(super) status: watch::Sender<ReporterStatus>,
    /// The last "cannot reach" warning, said once until it changes.
    pub(super) unreachable: Repeats,
    /// The newest leadership epoch a central welcomed this node under: a
    /// central of an older one is a deposed leader, not followed.
    pub(super) epoch: u64,
    /// The incarnation of the last central that welcomed this node: one
    /// of another is a new ledger, sent the answered reports too.
    pub(super) incarnation: u64,
    /// The centrals this node could not reach since it was last welcomed,
    /// named to the next one it tries: a standby that would send it to
    /// one of them keeps it until a leader it can reach is known.
    pub(super) lost: Vec<String>,
}

/// The shortest life of a stream closed to announce a new service: an app
/// that registers services one after another reconnects at most five times
/// a second.
pub(super) const ANNOUNCE_AFTER: Duration = Duration::from_millis(200);

/// A wait drawn over `[backoff/2, backoff]`, so a fleet's nodes do not
/// all try at once.
fn jittered(backoff: Duration) -> Duration {
    backoff.mul_f64(0.5 + rand::random::<f64>() * 0.5)
}

/// Sleeps until `at`, or forever without one.
async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Why a stream ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ended {
    /// Closed, refused, redirected or stuck: reconnect after a backoff.
    Lost,
    /// A service was registered since the Hello: reconnect at once.
    Announce,
}

impl Run {
    /// Starts the task of a reporter built with `cfg`, reporting
    /// `report_after` each slot boundary. Must be called within a Tokio
    /// runtime.
    pub(super) fn spawn(cfg: Settings, report_after: Duration) -> ReporterHandle {
        let (status_tx, status) = watch::channel(ReporterStatus {
            endpoint: cfg.endpoints.first().cloned().unwrap_or_default(),
            ..ReporterStatus::default()
        });
        let last_collected = cfg.store.current_slot() - 1;
        let mut run = Run {
            next_tick: Instant::now(),
            report_after,
            cfg,
            current: 0,
            pending: VecDeque::new(),
            last_collected,
            announced: 0,
            packed_reports: false,
            status: status_tx,
            unreachable: Repeats::default(),
            epoch: 0,
            incarnation: 0,
            lost: Vec::new(),
        };
        run.schedule();
        ReporterHandle::new(tokio::spawn(run.run()), status)
    }
}

impl Run {
    pub(super) fn endpoint(&self) -> &str {
        &self.cfg.endpoints[self.current]
    }

    /// Sets the next report time: the next slot boundary plus the delay
    /// and this node's place in the spread.
    pub(super) fn schedule(&mut self) {
        let slot = self.cfg.store.slot_length();
        let until = slot.until_next(self.cfg.store.clock().now_ms());
        self.next_tick = Instant::now() + until + self.report_after;
    }

    pub(super) fn publish(&self, f: impl FnOnce(&mut ReporterStatus)) {
        let unanswered = self.pending.iter().filter(|p| !p.answered).count();
        self.status.send_modify(|s| {
            f(s);
            s.buffered = unanswered;
        });
        gauge!("throttle_reports_buffered").set(unanswered as f64);
    }

    /// Collects finished slots into reports and sends them if connected.
    pub(super) fn tick(&mut self, tx: Option<&mpsc::Sender<Inbound>>) -> bool {
        self.schedule();
        let finished = self.cfg.store.current_slot() - 1;
        if finished <= self.last_collected {
            return true;
        }
        self.last_collected = finished;
        let packed = self.packed_reports;
        let report = self
            .cfg
            .store
            .collect_encoded_as(finished, &self.cfg.node_id, packed);
        let slot = finished + 1;
        let mut ok = true;
        let sent = match tx {
            Some(tx) => {
                ok = tx.try_send(Inbound::Report(report.clone())).is_ok();
                ok.then(Instant::now)
            }
            None => None,
        };
        self.pending.push_back(Pending {
            slot,
            report,
            packed,
            sent,
            answered: false,
        });
        while self.pending.len() > self.cfg.max_buffered {
            if let Some(p) = self.pending.pop_front()
                && !p.answered
            {
                counter!("throttle_reports_dropped_total").increment(1);
                tracing::warn!(slot = p.slot, "report buffer full; oldest report dropped");
            }
        }
        self.publish(|s| s.reports_sent += u64::from(sent.is_some()));
        ok
    }

    /// Opens a stream; owns its inputs so ticks can run while it connects.
    pub(super) fn open(
        &mut self,
        endpoint: String,
    ) -> impl Future<Output = Result<Opened, OpenError>> + use<> {
        let endpoint = dial::endpoint(&endpoint, self.cfg.connect_timeout, self.cfg.tls.as_ref());
        let queue = self.cfg.max_buffered + 8;
        let services = self.cfg.store.service_names();
        self.announced = services.len();
        let hello = Inbound::Hello(v1::Hello {
            node_id: self.cfg.node_id.clone(),
            slot_ms: self.cfg.store.slot_length().as_ms(),
            services,
            version: throttle_proto::VERSION.to_owned(),
            // Packed: a third of the bytes. Refs: an answer that repeats
            // the push before it names that push rather than sending it
            // again. A central that knows neither sends the legacy form.
            accepts: vec![
                throttle_proto::PACKED_QUOTAS.to_owned(),
                throttle_proto::QUOTA_REFS.to_owned(),
            ],
            resumes: self.incarnation != 0,
            report_every_ms: 0,
        });
        let now = self.cfg.store.clock().now_ms();
        let signed = self
            .cfg
            .credentials
            .as_ref()
            .map(|c| c.sign(&self.cfg.node_id, now));
        let lost = self.lost.clone();
        open(
            endpoint,
            queue,
            self.cfg.max_message_bytes,
            hello,
            signed,
            lost,
        )
    }
    pub(super) fn follow(&mut self, leader: String) {
        if leader.is_empty() {
            self.current = (self.current + 1) % self.cfg.endpoints.len();
            return;
        }
        tracing::info!(from = self.endpoint(), to = %leader, "following the leader");
        self.current = match self.cfg.endpoints.iter().position(|e| *e == leader) {
            Some(i) => i,
            None => {
                self.cfg.endpoints.push(leader);
                self.cfg.endpoints.len() - 1
            }
        };
    }

    async fn sleep_ticking(&mut self, d: Duration) {
        let until = Instant::now() + d;
        loop {
            tokio::select! {
                _ = tokio::time::sleep_until(until) => return,
                _ = tokio::time::sleep_until(self.next_tick) => { self.tick(None); }
            }
        }
    }

    async fn run(mut self) {
        let mut backoff = self.cfg.backoff_min;
        loop {
            let endpoint = self.endpoint().to_owned();
            self.publish(|s| s.endpoint.clone_from(&endpoint));
            let attempt = self.open(endpoint.clone());
            tokio::pin!(attempt);
            let opened = loop {
                tokio::select! {
                    r = &mut attempt => break r,
                    _ = tokio::time::sleep_until(self.next_tick) => { self.tick(None); }
                }
            };
            match opened {
                Ok(Opened::Stream(_, _, Welcomed { epoch, .. }))
                    if epoch != 0 && epoch < self.epoch =>
                {
                    // A deposed leader that has not noticed yet: its
                    // quotas are older than the ones already taken. (0: a
                    // central without an election, never deposed.)
                    counter!("throttle_reporter_stale_leader_total").increment(1);
                    tracing::warn!(%endpoint, epoch, newer = self.epoch, "central's leadership is older than one already seen; trying the next");
                    self.current = (self.current + 1) % self.cfg.endpoints.len();
                }
                Ok(Opened::Stream(tx, inbound, welcomed)) => {
                    self.epoch = welcomed.epoch;
                    self.lost.clear();
                    backoff = self.cfg.backoff_min;
                    self.unreachable.clear();
                    self.packed_reports = welcomed.packed;
                    let new_ledger = welcomed.incarnation != 0
                        && self.incarnation != 0
                        && welcomed.incarnation != self.incarnation;
                    self.incarnation = welcomed.incarnation;
                    if self.connected(&endpoint, tx, inbound, new_ledger).await == Ended::Announce {
                        // A new stream at once: its Hello names the new
                        // service, and the central pushes its quotas.
                        continue;
                    }
                }
                Ok(Opened::Redirect(leader)) => {
                    // A standby names the leader as soon as it knows one
                    // this node can reach (or after keeping the stream a
                    // while): followed after the least backoff, which a
                    // redirect does not lengthen.
                    self.follow(leader);
                    self.sleep_ticking(jittered(self.cfg.backoff_min)).await;
                    continue;
                }
                Err(e) => {
                    let gone = matches!(e, OpenError::Connect(_) | OpenError::NoWelcome);
                    if gone && !self.lost.contains(&endpoint) {
                        self.lost.push(endpoint.clone());
                    }
                    counter!("throttle_reporter_connect_failures_total").increment(1);
                    let error = e.to_string();
                    let fresh = self
                        .unreachable
                        .fresh(&format!("{endpoint} {error}"), std::time::Instant::now());
                    if fresh {
                        tracing::warn!(%endpoint, %error, "cannot reach central node");
                    } else {
                        tracing::debug!(%endpoint, %error, "cannot reach central node");
                    }
                    self.current = (self.current + 1) % self.cfg.endpoints.len();
                }
            }
            self.sleep_ticking(jittered(backoff)).await;
            backoff = (backoff * 2).min(self.cfg.backoff_max);
        }
    }

    /// Serves one stream until it ends; says why it ended. A `new_ledger`
    /// is sent the answered reports too.
    async fn connected(
        &mut self,
        endpoint: &str,
        tx: mpsc::Sender<Inbound>,
        mut inbound: Box<tonic::Streaming<Answer>>,
        new_ledger: bool,
    ) -> Ended {
        tracing::info!(
            endpoint,
            kept = self.pending.len(),
            new_ledger,
            "connected to central node"
        );
        gauge!("throttle_reporter_connected").set(1.0);
        self.replay(&tx, new_ledger);
        let opened = Instant::now();
        // A layer built after the Hello: only a new Hello tells the central
        // node, which then sends its quotas at once instead of after the
        // next report. The store says when a service is registered; polling
        // for it instead woke the app's runtime 50 times a second, which on
        // a runtime of two workers put some 0.13 ms on its requests' p99
        // (`http-bench --server-threads 2`).
        let mut registered = self.cfg.store.watch_services();
        let mut watching = true;
        let mut announce_at = None;
        let mut ended = Ended::Lost;
        loop {
            // The watch's value is the number of services.
            if announce_at.is_none() && *registered.borrow_and_update() > self.announced {
                announce_at = Some(opened + ANNOUNCE_AFTER);
            }
            tokio::select! {
                msg = inbound.message() => match msg {
                    Ok(Some(Answer::Quota(q))) => self.quota(q),
                    Ok(Some(Answer::Blocks(b))) => self.cfg.store.set_blocked(&b.service, b.users),
                    Ok(Some(Answer::Limits(l))) => self.cfg.store.set_limits(l),
                    Ok(Some(Answer::Bound(b))) => self.cfg.store.set_bound(b),
                    Ok(Some(Answer::NotLeader(nl))) => {
                        self.follow(nl.leader);
                        break;
                    }
                    Ok(Some(_)) => {}
                    Ok(None) => {
                        tracing::warn!(endpoint, "central node closed the stream");
                        break;
                    }
                    Err(status) => {
                        self.refused(endpoint, &status);
                        break;
                    }
                },
                _ = tokio::time::sleep_until(self.next_tick) => {
                    if !self.tick(Some(&tx)) {
                        tracing::warn!(endpoint, "stream is not draining; reconnecting");
                        break;
                    }
                }
                changed = registered.changed(), if watching => {
                    // The loop's head reads the new count; a closed
                    // channel (the store gone) has nothing more to say.
                    watching = changed.is_ok();
                }
                _ = sleep_until_some(announce_at) => {
                    tracing::info!(endpoint, "service registered; reconnecting to announce it");
                    ended = Ended::Announce;
                    break;
                }
            }
        }
        gauge!("throttle_reporter_connected").set(0.0);
        self.publish(|s| s.connected = false);
        ended
    }

    /// Sends the reports kept from before the stream opened, in order, as
    /// many as the stream's queue takes (the others stay kept): the
    /// unanswered ones, and to a `new_ledger` the answered ones too.
    pub(super) fn replay(&mut self, tx: &mpsc::Sender<Inbound>, new_ledger: bool) {
        self.rewrite_pending(self.packed_reports);
        let now = Instant::now();
        let mut replayed = 0;
        for p in self
            .pending
            .iter_mut()
            .filter(|p| new_ledger || !p.answered)
        {
            if tx.try_send(Inbound::Report(p.bytes())).is_err() {
                break;
            }
            p.sent = Some(now);
            replayed += 1;
        }
        self.publish(|s| {
            s.connected = true;
            s.connections += 1;
            s.reports_sent += replayed;
        });
    }

    /// Rewrites the reports kept from before the stream opened in the form
    /// this central reads: packed where it reads packed reports (fewer
    /// bytes), as the legacy maps where it does not. A report collected
    /// while the stream was opening was written before the Welcome said
    /// which.
    pub(super) fn rewrite_pending(&mut self, packed: bool) {
        self.pending.retain_mut(|p| {
            if p.packed == packed {
                return true;
            }
            let rewritten = if packed {
                let report = v1::Report::decode(&p.report[..]).map_err(|e| e.to_string());
                report.and_then(|r| throttle_proto::wire::packed_report(&r).map_err(|e| e.to_string()))
            } else {
                throttle_proto::wire::unpacked_report(&p.report).map_err(|e| e.to_string())
            };
            match rewritten {
                Ok(report) => {
                    p.report = report;
                    p.packed = packed;
                    true
                }
                // Maps are read by every central: kept as they are.
                Err(e) if packed => {
                    tracing::debug!(slot = p.slot, error = %e, "buffered report left unpacked");
                    true
                }
                // Only a report this node did not encode could fail here.
                Err(e) => {
                    counter!("throttle_reports_dropped_total").increment(1);
                    tracing::error!(slot = p.slot, error = %e, "buffered report unreadable; dropped");
                    false
                }
            }
        });
    }

    pub(super) fn quota(&mut self, bytes: Bytes) {
        let report_slot = match RawQuota::parse(&bytes) {
            Ok(quota) => {
                self.cfg.store.apply_raw_quota(&quota);
                quota.report_slot()
            }
            // Valid, but not to be read in place: as prost reads it.
            Err(throttle_proto::wire::RawQuotaError::Repeated) => {
                let quota = v1::Quota::decode(bytes).map_err(|e| e.to_string());
                let unpacked =
                    quota.and_then(|mut q| q.unpack().map(|()| q).map_err(|e| e.to_string()));
                match unpacked {
                    Ok(quota) => {
                        self.cfg.store.apply_quota(&quota);
                        quota.report_slot
                    }
                    Err(e) => return self.malformed(&e),
                }
            }
            Err(e) => return self.malformed(&e.to_string()),
        };
        if let Some(slot) = report_slot
            && let Some(p) = self
                .pending
                .iter_mut()
                .find(|p| p.slot == slot && !p.answered)
        {
            p.answered = true;
            if let Some(sent) = p.sent {
                histogram!("throttle_report_rtt_seconds").record(sent.elapsed().as_secs_f64());
            }
        }
        self.publish(|s| s.quotas_received += 1);
    }

    /// A quota that is not one: nothing of it is installed, and the
    /// stream goes on (the next answer may be whole).
    pub(super) fn malformed(&mut self, error: &str) {
        counter!("throttle_quotas_malformed_total").increment(1);
        tracing::error!(error, "malformed quota from the central node; ignored");
    }

    pub(super) fn refused(&mut self, endpoint: &str, status: &tonic::Status) {
        // A report the central could not read, or larger than it accepts
        // (tonic's code for a message over the receiver's size limit).
        if matches!(
            status.code(),
            tonic::Code::InvalidArgument | tonic::Code::OutOfRange
        ) {
            // Answers come in order, so the refused report is the oldest one
            // sent and not answered; sending it again would be refused again.
            if let Some(i) = self
                .pending
                .iter()
                .position(|p| p.sent.is_some() && !p.answered)
                && let Some(p) = self.pending.remove(i)
            {
                counter!("throttle_reports_dropped_total").increment(1);
                tracing::error!(endpoint, slot = p.slot, error = %status.message(), "central node refused a report; dropped");
            }
        } else {
            tracing::warn!(endpoint, code = ?status.code(), error = %status.message(), "stream to central node failed");
        }
    }
}
