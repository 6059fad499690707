//! One legacy node's WebSocket: a report per text frame, filed by the
//! ledger's task as a node stream's are, and answered by one text frame.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ws::{Message, WebSocket};
use metrics::counter;
use throttle_proto::v1;
use throttle_proto::{MAX_NAME_LEN, legacy};
use tokio::sync::{mpsc, watch};

use super::answer::MAX_FRAME_BYTES;
use super::quotas::LegacyQuotas;
use crate::ha::leadership::Leadership;
use crate::keys::NodeKeys;
use crate::ledger_task::{Command, Heard, Link, NotFiled, restored};
use crate::log::{Throttled, peer, truncate};

/// Most services one legacy node may name, as for a node stream's Hello.
const MAX_SERVICES: usize = 1_000;

/// A connection silent this long is closed: a legacy node reports every
/// second, and keeps an idle connection 20 s at most.
const IDLE: Duration = Duration::from_secs(60);

/// Lines about refused frames, at most once a second.
static REFUSED: Throttled = Throttled::new();

/// Lines about answers cut to fit a frame, at most once a second.
static LEFT_OUT: Throttled = Throttled::new();

/// Why a session ends.
enum End {
    /// The node closed, went silent, or the ledger stopped.
    Closed,
    /// The node sent what it may not.
    Refused(&'static str, String),
}

/// A legacy node's connection, once its handshake was accepted.
pub(super) struct LegacySession {
    pub(super) commands: mpsc::Sender<Command>,
    pub(super) leadership: Arc<dyn Leadership>,
    /// The keys, and the access key its URL was signed with, when keys
    /// are required.
    pub(super) signed: Option<(Arc<NodeKeys>, String)>,
    /// With a state store: the epoch whose checkpoint is restored.
    pub(super) restored: Option<watch::Receiver<Option<u64>>>,
    pub(super) max_users_per_report: usize,
    pub(super) addr: SocketAddr,
}

/// What the node registered with the ledger's task as.
struct Registered {
    node_id: String,
    services: BTreeSet<String>,
}

/// What a session holds while it runs.
struct Running {
    link: Link,
    quotas: LegacyQuotas,
    registered: Option<Registered>,
}

impl LegacySession {
    /// Serves the connection until it ends; a frame the node may not send
    /// ends it, counted and logged.
    pub(super) async fn run(self, mut socket: WebSocket) {
        let mut running = Running {
            link: Link::new(self.commands.clone()),
            quotas: LegacyQuotas::default(),
            registered: None,
        };
        let mut deposed = self.leadership.deposed();
        let end = loop {
            let frame = tokio::select! {
                frame = tokio::time::timeout(IDLE, socket.recv()) => frame,
                heard = running.link.heard() => match heard {
                    Heard::Message(m) => {
                        running.quotas.absorb(m);
                        continue;
                    }
                    Heard::Closed => break End::Closed,
                },
                () = &mut deposed => break End::Closed,
            };
            let text = match frame {
                Ok(Some(Ok(Message::Text(text)))) => text,
                Ok(Some(Ok(Message::Ping(_) | Message::Pong(_)))) => continue,
                Ok(Some(Ok(Message::Binary(_)))) => {
                    break End::Refused("legacy_frame", "a binary frame".into());
                }
                Ok(Some(Err(e))) => break End::Refused("legacy_frame", e.to_string()),
                Ok(Some(Ok(Message::Close(_))) | None) | Err(_) => break End::Closed,
            };
            let answer = match self.report(&mut running, text.as_str()).await {
                Ok(answer) => answer,
                Err(end) => break end,
            };
            if socket.send(Message::Text(answer.into())).await.is_err() {
                break End::Closed;
            }
        };
        if let End::Refused(reason, why) = end {
            self.refused(reason, &why);
        }
        running.link.disconnect().await;
    }

    /// Files one report and renders its answer.
    async fn report(&self, running: &mut Running, text: &str) -> Result<String, End> {
        let report = legacy::report_from_json(text)
            .map_err(|e| End::Refused("legacy_json", e.to_string()))?;
        self.check(running, &report)?;
        if !self.leadership.is_leader() {
            return Err(End::Closed);
        }
        let services: BTreeSet<String> = report
            .consumption
            .keys()
            .chain(report.rejection.keys())
            .cloned()
            .collect();
        self.register(running, &report.node_id, &services).await?;
        let slot = report.slot_number;
        match running.link.file(report).await {
            Ok(()) => {}
            Err(NotFiled::Refused(status)) => {
                return Err(End::Refused("legacy_report", status.message().to_owned()));
            }
            Err(NotFiled::Stopped) => return Err(End::Closed),
        }
        let quotas = &mut running.quotas;
        if !running.link.drain(|m| quotas.absorb(m)) {
            return Err(End::Closed);
        }
        let names = services.iter().map(String::as_str);
        let answer = running.quotas.answer(names, slot, MAX_FRAME_BYTES);
        if answer.left_out > 0 {
            counter!("throttle_central_legacy_users_left_out_total")
                .increment(answer.left_out as u64);
            if let Some(skipped) = LEFT_OUT.allow_now() {
                let (addr, left_out) = (peer(Some(self.addr)), answer.left_out);
                tracing::warn!(%addr, left_out, skipped, "legacy answer too large for one frame: users with the largest quotas left out");
            }
        }
        Ok(answer.to_json())
    }

    /// The report's node id and size, before anything is filed: the node
    /// id one the key allows, the same on every report of the connection.
    fn check(&self, running: &Running, report: &v1::Report) -> Result<(), End> {
        let node_id = report.node_id.as_str();
        if node_id.is_empty() || node_id.len() > MAX_NAME_LEN {
            let why = format!("node_id must be 1 to {MAX_NAME_LEN} bytes");
            return Err(End::Refused("legacy_report", why));
        }
        let allowed = match &self.signed {
            Some((keys, key)) => keys.current().allows(key, node_id),
            None => true,
        };
        let same = running
            .registered
            .as_ref()
            .is_none_or(|r| r.node_id == node_id);
        if !allowed || !same {
            let why = format!("node id {:?} not allowed here", truncate(node_id));
            return Err(End::Refused("node_not_allowed", why));
        }
        let services = report.consumption.keys().chain(report.rejection.keys());
        if services.count() > 2 * MAX_SERVICES {
            let why = format!("more than {MAX_SERVICES} services");
            return Err(End::Refused("legacy_report", why));
        }
        let users: usize = report.consumption.values().map(|u| u.users.len()).sum();
        let max_users = self.max_users_per_report;
        if users > max_users {
            let why = format!("report carries more users than the limit of {max_users}");
            return Err(End::Refused("too_many_users", why));
        }
        Ok(())
    }

    /// Registers the node with the ledger's task for `services` (and those
    /// it named before), as a node stream's Hello does, unless it is
    /// already registered for them.
    async fn register(
        &self,
        running: &mut Running,
        node_id: &str,
        services: &BTreeSet<String>,
    ) -> Result<(), End> {
        let mut all = services.clone();
        if let Some(r) = &running.registered {
            if services.is_subset(&r.services) {
                return Ok(());
            }
            all.extend(r.services.iter().cloned());
        }
        if all.len() > MAX_SERVICES || all.iter().any(|s| s.is_empty() || s.len() > MAX_NAME_LEN) {
            let why =
                format!("services must be at most {MAX_SERVICES}, of 1 to {MAX_NAME_LEN} bytes");
            return Err(End::Refused("legacy_report", why));
        }
        if !restored(self.restored.as_ref(), self.leadership.epoch()).await {
            return Err(End::Closed);
        }
        let hello = v1::Hello {
            node_id: node_id.to_owned(),
            slot_ms: 1_000,
            services: all.iter().cloned().collect(),
            version: "lua-resty-throttle".to_owned(),
            accepts: Vec::new(),
            resumes: false,
            report_every_ms: 0,
        };
        let linked = running.link.connect(hello, Some(self.addr)).await;
        linked.map_err(|_| End::Closed)?;
        running.quotas.keep_only(&all);
        running.registered = Some(Registered {
            node_id: node_id.to_owned(),
            services: all,
        });
        Ok(())
    }

    fn refused(&self, reason: &'static str, why: &str) {
        match reason {
            "node_not_allowed" => {
                counter!("throttle_central_unauthenticated_total", "reason" => reason)
            }
            _ => counter!("throttle_central_invalid_messages_total", "reason" => reason),
        }
        .increment(1);
        if let Some(skipped) = REFUSED.allow_now() {
            let addr = peer(Some(self.addr));
            tracing::warn!(reason, %addr, skipped, "legacy node connection closed: {why}");
        }
    }
}
