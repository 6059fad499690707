//! One task per node stream: the Hello, then reports, each queued for the
//! ledger's task and answered, ahead where it can be.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use metrics::counter;
use throttle_clock::{Clock, SlotLength};
use throttle_proto::v1::{self, central_message};
use throttle_proto::wire::server::central_server::Central as CentralRpc;
use throttle_proto::wire::{Inbound, Outbound};
use throttle_proto::{MAX_NAME_LEN, PACKED_REPORTS};
use tokio::sync::{mpsc, oneshot, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::auth::{authenticate, other_node_id};
use super::standby::{Settled, Standby};
use crate::ha::leadership::Leadership;
use crate::keys::NodeKeys;
use crate::ledger::LedgerConfig;
use crate::ledger_task::{AnswerAhead, Command, Outgoing, Received, restored};
use crate::log::{Throttled, peer, truncate};
use crate::net::NodeConnInfo;

/// Most services one Hello may name: a process serves a few, and each
/// named costs the central memory.
const MAX_SERVICES_PER_HELLO: usize = 1_000;

/// How long a new stream may take to send its Hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// Messages queued per node stream before pushes are dropped.
const STREAM_QUEUE: usize = 32;

/// What to do after a report: read the next, end the stream quietly, or
/// end it with a status.
enum Flow {
    Continue,
    Stop,
    Fail(Status),
}

/// What became of a report offered to [`CentralService::answer_ahead`].
enum Ahead {
    /// Queued for filing, and answered.
    Queued,
    /// Queued for filing, but the node's stream queue is full.
    Full(Status),
    /// Not queued: the caller queues it and the ledger answers after filing.
    Later(Command),
}

/// The gRPC `Central` service: spawns a task per node stream.
#[derive(Clone)]
pub(crate) struct CentralService {
    pub(crate) commands: mpsc::Sender<Command>,
    pub(crate) leadership: Arc<dyn Leadership>,
    /// The keys a stream must prove, if any.
    pub(crate) keys: Option<Arc<NodeKeys>>,
    pub(crate) slot: SlotLength,
    /// The ledger's settings, for its check before answering ahead.
    pub(crate) config: LedgerConfig,
    pub(crate) clock: Arc<dyn Clock>,
    /// With a state store: the epoch whose checkpoint is restored, which a
    /// stream waits for before its Welcome.
    pub(crate) restored: Option<watch::Receiver<Option<u64>>>,
    /// Drawn when the ledger started (`Welcome.incarnation`).
    pub(crate) incarnation: u64,
}

fn message(kind: central_message::Kind) -> Result<Outbound, Status> {
    Ok(Outbound::Message(v1::CentralMessage { kind: Some(kind) }))
}

/// Lets lines about refused Hellos and broken streams out once a second:
/// before its Hello a stream has no node id to count per.
static REFUSED: Throttled = Throttled::new();

fn invalid(reason: &'static str, msg: String) -> Status {
    counter!("throttle_central_invalid_messages_total", "reason" => reason).increment(1);
    if let Some(skipped) = REFUSED.allow_now() {
        tracing::warn!(reason, skipped, "{msg}");
    }
    Status::invalid_argument(msg)
}

impl CentralService {
    fn check_hello(&self, first: Option<Result<Inbound, Status>>) -> Result<v1::Hello, Status> {
        let hello = match first {
            Some(Ok(Inbound::Hello(h))) => h,
            Some(Ok(_)) => {
                return Err(invalid(
                    "no_hello",
                    "the first message must be Hello".into(),
                ));
            }
            Some(Err(s)) => {
                return Err(invalid(
                    "decode",
                    format!("unreadable first message: {}", s.message()),
                ));
            }
            None => return Err(invalid("no_hello", "stream closed before Hello".into())),
        };
        if hello.node_id.is_empty() || hello.node_id.len() > MAX_NAME_LEN {
            return Err(invalid(
                "hello",
                format!("node_id must be 1 to {MAX_NAME_LEN} bytes"),
            ));
        }
        if hello.slot_ms != self.slot.as_ms() {
            return Err(invalid(
                "hello",
                format!(
                    "slot_ms {} differs from the central's {}",
                    hello.slot_ms,
                    self.slot.as_ms()
                ),
            ));
        }
        if hello.services.len() > MAX_SERVICES_PER_HELLO {
            return Err(invalid(
                "hello",
                format!(
                    "Hello names {} services, more than {MAX_SERVICES_PER_HELLO}",
                    hello.services.len()
                ),
            ));
        }
        if let Some(s) = hello
            .services
            .iter()
            .find(|s| s.is_empty() || s.len() > MAX_NAME_LEN)
        {
            return Err(invalid(
                "hello",
                format!(
                    "service name {:?} must be 1 to {MAX_NAME_LEN} bytes",
                    truncate(s)
                ),
            ));
        }
        Ok(hello)
    }

    async fn run_stream(
        self,
        mut inbound: Streaming<Inbound>,
        addr: Option<SocketAddr>,
        signed: Option<String>,
        tx: Outgoing,
    ) {
        // Taken before the Welcome: a leadership lost from here on ends
        // the stream.
        let mut deposed = self.leadership.deposed();
        let opened = self.open(&mut inbound, addr, signed, &tx).await;
        let Some((conn, node_id, ahead)) = opened else {
            return;
        };
        loop {
            let next = tokio::select! {
                next = inbound.next() => next,
                // The response stream is gone (closed by the central node):
                // stop reading, so the connection can wind down.
                () = tx.closed() => break,
                () = &mut deposed => {
                    self.send_not_leader(&tx).await;
                    break;
                }
            };
            let status = match next {
                None => break,
                Some(Err(s)) => {
                    counter!("throttle_central_invalid_messages_total", "reason" => "decode")
                        .increment(1);
                    if let Some(skipped) = REFUSED.allow_now() {
                        tracing::warn!(addr = %peer(addr), status = %s, skipped, "node stream failed");
                    }
                    // Tell the node why (e.g. a message over the size limit).
                    Status::new(s.code(), s.message().to_owned())
                }
                Some(Ok(Inbound::Report(bytes))) => {
                    match self.take_report(conn, &node_id, &ahead, &tx, bytes).await {
                        Flow::Continue => continue,
                        Flow::Stop => break,
                        Flow::Fail(status) => status,
                    }
                }
                Some(Ok(_)) => invalid("unexpected", "expected a Report after Hello".into()),
            };
            let _ = tx.send(Err(status)).await;
            break;
        }
        let _ = self.commands.send(Command::Disconnect { conn }).await;
    }

    /// Tells the node this central does not lead (any more), and who does.
    async fn send_not_leader(&self, tx: &Outgoing) {
        let leader = self.leadership.leader().unwrap_or_default();
        let not_leader = central_message::Kind::NotLeader(v1::NotLeader { leader });
        let _ = tx.send(message(not_leader)).await;
    }

    /// Reads the stream's Hello, welcomes the node and registers the
    /// stream with the ledger's task: its number, node id and answer
    /// ahead; `None` if the stream ended there.
    async fn open(
        &self,
        inbound: &mut Streaming<Inbound>,
        addr: Option<SocketAddr>,
        signed: Option<String>,
        tx: &Outgoing,
    ) -> Option<(u64, String, Arc<AnswerAhead>)> {
        let first = tokio::time::timeout(HELLO_TIMEOUT, inbound.next())
            .await
            .unwrap_or(None);
        let checked = self.check_hello(first).and_then(|hello| match signed {
            Some(id) if id != hello.node_id => Err(other_node_id(addr, self.clock.now_ms())),
            _ => Ok(hello),
        });
        let hello = match checked {
            Ok(h) => h,
            Err(status) => {
                let _ = tx.send(Err(status)).await;
                return None;
            }
        };
        if let Err(status) = self.restored_state().await {
            let _ = tx.send(Err(status)).await;
            return None;
        }
        let welcome = central_message::Kind::Welcome(v1::Welcome {
            slot_ms: self.slot.as_ms(),
            epoch: self.leadership.epoch(),
            accepts: vec![PACKED_REPORTS.to_owned()],
            incarnation: self.incarnation,
        });
        // Welcome goes out before the stream is registered for pushes.
        tx.send(message(welcome)).await.ok()?;
        let node_id = hello.node_id.clone();
        let ahead = Arc::new(AnswerAhead::default());
        let (reply, rx) = oneshot::channel();
        let connect = Command::Connect {
            hello,
            addr,
            tx: tx.clone(),
            ahead: ahead.clone(),
            reply,
        };
        self.commands.send(connect).await.ok()?;
        let conn = rx.await.ok()?;
        Some((conn, node_id, ahead))
    }

    /// Waits until the checkpoint of this leadership is back in the ledger
    /// ([`restored`]).
    async fn restored_state(&self) -> Result<(), Status> {
        match restored(self.restored.as_ref(), self.leadership.epoch()).await {
            true => Ok(()),
            false => Err(Status::unavailable("restoring the checkpoint; try again")),
        }
    }

    /// Takes one report of stream `conn`: queued for filing and answered,
    /// ahead or by the ledger's task once filed.
    async fn take_report(
        &self,
        conn: u64,
        node_id: &str,
        ahead: &AnswerAhead,
        tx: &Outgoing,
        bytes: bytes::Bytes,
    ) -> Flow {
        if !self.leadership.is_leader() {
            self.send_not_leader(tx).await;
            return Flow::Stop;
        }
        let report = match Received::read(bytes, self.config.max_users_per_report) {
            Ok(r) => r,
            Err(status) => return Flow::Fail(status),
        };
        let (reply, rx) = oneshot::channel();
        match self.answer_ahead(conn, node_id, ahead, tx, report, reply) {
            Ahead::Queued => {}
            Ahead::Full(status) => return Flow::Fail(status),
            Ahead::Later(command) => {
                if self.commands.send(command).await.is_err() {
                    return Flow::Stop;
                }
            }
        }
        match rx.await {
            Ok((Ok(()), _report)) => Flow::Continue,
            Ok((Err(status), _report)) => Flow::Fail(status),
            Err(_) => Flow::Stop,
        }
    }

    /// Queues `report` for filing and answers it at once, if its answer was
    /// rendered ahead and may be sent before filing (see [`AnswerAhead`]).
    fn answer_ahead(
        &self,
        conn: u64,
        node_id: &str,
        ahead: &AnswerAhead,
        tx: &Outgoing,
        report: Received,
        reply: oneshot::Sender<(Result<(), Status>, Received)>,
    ) -> Ahead {
        let claimed = report.node_id();
        let valid = (claimed.is_empty() || claimed == node_id)
            && report
                .check(&self.config, node_id, self.clock.now_ms())
                .is_ok();
        let ready = ahead.lock();
        let quota = match ready.as_ref().and_then(|r| r.answers(&report)) {
            Some(quota) if valid => quota,
            _ => {
                return Ahead::Later(Command::Report {
                    conn,
                    report,
                    reply,
                    answered: false,
                });
            }
        };
        let command = Command::Report {
            conn,
            report,
            reply,
            answered: true,
        };
        if let Err(e) = self.commands.try_send(command) {
            // Not queued (a full queue, or a closed one): the caller queues
            // it, if it still can, for the ledger to file and answer.
            let mut command = e.into_inner();
            if let Command::Report { answered, .. } = &mut command {
                *answered = false;
            }
            return Ahead::Later(command);
        }
        // Queued, so the ledger files it, even if it is closing.
        if tx.try_send(Ok(Outbound::Encoded(quota))).is_err() {
            counter!("throttle_central_pushes_dropped_total").increment(1);
            return Ahead::Full(Status::resource_exhausted("node is not reading its stream"));
        }
        drop(ready);
        Ahead::Queued
    }
}

#[tonic::async_trait]
impl CentralRpc for CentralService {
    type ExchangeStream = ReceiverStream<Result<Outbound, Status>>;

    async fn exchange(
        &self,
        request: Request<Streaming<Inbound>>,
    ) -> Result<Response<Self::ExchangeStream>, Status> {
        // The connection is a node's: it stays past the first-stream
        // deadline (whatever the stream's credentials turn out to be, the
        // keep-alive and the cap still bound it).
        let conn = NodeConnInfo::of(&request);
        conn.inspect(|c| c.stream_opened());
        let addr = conn.and_then(|c| c.addr).or_else(|| request.remote_addr());
        let signed = match &self.keys {
            Some(keys) => Some(authenticate(
                keys,
                request.metadata(),
                self.clock.now_ms(),
                addr,
            )?),
            None => None,
        };
        let (tx, rx) = mpsc::channel(STREAM_QUEUE);
        let standby = Standby::of(request.metadata());
        let inbound = request.into_inner();
        if self.leadership.is_leader() {
            tokio::spawn(self.clone().run_stream(inbound, addr, signed, tx));
        } else if standby.keep(&*self.leadership) {
            tokio::spawn(self.clone().hold(standby, inbound, addr, signed, tx));
        } else {
            let leader = self.leadership.leader().unwrap_or_default();
            redirect(&tx, addr, leader);
        }
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

/// Sends the node of a new stream to `leader`.
fn redirect(tx: &Outgoing, addr: Option<SocketAddr>, leader: String) {
    tracing::info!(addr = %peer(addr), %leader, "not the leader; redirecting node");
    let not_leader = central_message::Kind::NotLeader(v1::NotLeader { leader });
    let _ = tx.try_send(message(not_leader));
}

impl CentralService {
    /// Keeps a new stream until this central leads (then serves it) or
    /// knows a leader its node can reach (then sends it there): see
    /// [`Standby`].
    async fn hold(
        self,
        standby: Standby,
        inbound: Streaming<Inbound>,
        addr: Option<SocketAddr>,
        signed: Option<String>,
        tx: Outgoing,
    ) {
        match standby.settle(&*self.leadership).await {
            Settled::Lead => self.run_stream(inbound, addr, signed, tx).await,
            Settled::Redirect(leader) => redirect(&tx, addr, leader),
        }
    }
}
