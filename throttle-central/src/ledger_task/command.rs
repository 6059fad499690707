//! The commands the ledger's task takes, and how the monitor asks one.

use std::net::SocketAddr;
use std::ops::RangeInclusive;
use std::sync::Arc;

use throttle_proto::v1;
use throttle_proto::wire::Outbound;
use tokio::sync::{mpsc, oneshot};
use tonic::Status;

use super::ahead::AnswerAhead;
use super::monitor::{MonitorView, Subject};
use super::received::Received;
use crate::ledger::{CheckpointError, Page, Restoration, SlotRange, TopUsers};

/// A stream's queue of messages to its node. Quotas are queued already
/// encoded ([`Encoded`](crate::assigner::Encoded)): a push to many nodes
/// builds no message at all.
pub(crate) type Outgoing = mpsc::Sender<Result<Outbound, Status>>;

/// Asks the ledger's task a monitor question; `None` once it has stopped.
pub(crate) async fn ask(
    commands: &mpsc::Sender<Command>,
    subject: Subject,
    range: SlotRange,
    page: Page,
) -> Option<MonitorView> {
    let (reply, rx) = oneshot::channel();
    commands
        .send(Command::Monitor {
            subject,
            range,
            page,
            reply,
        })
        .await
        .ok()?;
    rx.await.ok()
}

/// Asks the ledger's task for the heaviest users of each resource
/// ([`TopUsers`]); `None` if it has stopped.
pub(crate) async fn ask_top(commands: &mpsc::Sender<Command>) -> Option<Arc<TopUsers>> {
    let (reply, rx) = oneshot::channel();
    commands.send(Command::Top { reply }).await.ok()?;
    rx.await.ok()
}

/// What the ledger's task is asked to do.
#[derive(Debug)]
pub(crate) enum Command {
    Connect {
        hello: v1::Hello,
        addr: Option<SocketAddr>,
        tx: Outgoing,
        ahead: Arc<AnswerAhead>,
        reply: oneshot::Sender<u64>,
    },
    Disconnect {
        conn: u64,
    },
    Report {
        conn: u64,
        report: Received,
        /// `Ok` once the report is filed and, unless the stream answered
        /// it, its answer queued; the report comes back, to be freed on the
        /// stream's task rather than the ledger's.
        reply: oneshot::Sender<(Result<(), Status>, Received)>,
        /// The stream answered the report ahead of filing (see
        /// [`AnswerAhead`]): the ledger files it and answers nothing.
        answered: bool,
    },
    Tick,
    /// A proxy's bucket new to it was told its first share of `user`:
    /// `per_slot` requests a slot over `slots`, which the quota policy
    /// counts until the proxy reports them.
    FirstShare {
        conn: u64,
        service: String,
        user: String,
        slots: RangeInclusive<i64>,
        per_slot: f64,
    },
    Reassign {
        service: String,
    },
    Monitor {
        subject: Subject,
        range: SlotRange,
        page: Page,
        reply: oneshot::Sender<MonitorView>,
    },
    /// The heaviest users of each resource, read at most once per half
    /// slot however many ask.
    Top {
        reply: oneshot::Sender<Arc<TopUsers>>,
    },
    CloseAll {
        snapshot: Option<Snapshot>,
    },
    /// The ledger's checkpoint, for the keeper to write.
    Checkpoint {
        reply: oneshot::Sender<v1::Checkpoint>,
    },
    /// Puts a checkpoint back in the ledger.
    Restore {
        checkpoint: Box<v1::Checkpoint>,
        reply: oneshot::Sender<Result<Restoration, CheckpointError>>,
    },
}

/// A monitor question to answer as the ledger stands when it closes.
pub(crate) type Snapshot = (Subject, oneshot::Sender<MonitorView>);
