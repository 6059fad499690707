//! A node the ledger's task serves through another protocol (a legacy
//! node's WebSocket, an Envoy proxy's RLQS stream): registered as a node
//! stream is, its reports filed the same way, the messages the ledger
//! queues for it read back.

use std::net::SocketAddr;
use std::ops::RangeInclusive;
use std::sync::Arc;

use throttle_proto::v1::{self, central_message};
use throttle_proto::wire::Outbound;
use tokio::sync::{mpsc, oneshot};
use tonic::Status;

use super::ahead::AnswerAhead;
use super::command::{Command, Outgoing};
use super::received::Received;

/// Messages from the ledger queued for one linked node.
const QUEUE: usize = 32;

/// What the ledger's task said to a linked node.
#[derive(Debug)]
pub(crate) enum Heard {
    /// A message for the node.
    Message(v1::CentralMessage),
    /// Its stream is closed: the ledger stopped, or this central no longer
    /// leads.
    Closed,
}

/// Why a report was not filed.
#[derive(Debug)]
pub(crate) enum NotFiled {
    /// The ledger's task has stopped.
    Stopped,
    /// The ledger refused it.
    Refused(Status),
}

/// One node's registration with the ledger's task, and its queue.
#[derive(Debug)]
pub(crate) struct Link {
    commands: mpsc::Sender<Command>,
    tx: Outgoing,
    rx: mpsc::Receiver<Result<Outbound, Status>>,
    conn: Option<u64>,
}

impl Link {
    /// Not registered yet.
    pub(crate) fn new(commands: mpsc::Sender<Command>) -> Self {
        let (tx, rx) = mpsc::channel(QUEUE);
        Self {
            commands,
            tx,
            rx,
            conn: None,
        }
    }

    /// Registers the node with `hello`, as a stream's Hello does, in place
    /// of any registration before.
    pub(crate) async fn connect(
        &mut self,
        hello: v1::Hello,
        addr: Option<SocketAddr>,
    ) -> Result<(), NotFiled> {
        self.disconnect().await;
        let (reply, conn) = oneshot::channel();
        let connect = Command::Connect {
            hello,
            addr,
            tx: self.tx.clone(),
            // Nothing reads an answer rendered ahead: each report is
            // answered after filing.
            ahead: Arc::new(AnswerAhead::default()),
            reply,
        };
        self.commands
            .send(connect)
            .await
            .map_err(|_| NotFiled::Stopped)?;
        self.conn = Some(conn.await.map_err(|_| NotFiled::Stopped)?);
        Ok(())
    }

    /// Files `report` of the registered node; once filed, its answer is
    /// queued ([`Link::drain`]). Nothing is filed before a registration.
    pub(crate) async fn file(&mut self, report: v1::Report) -> Result<(), NotFiled> {
        let Some(conn) = self.conn else {
            return Ok(());
        };
        let (reply, filed) = oneshot::channel();
        let command = Command::Report {
            conn,
            report: Received::Decoded(report),
            reply,
            answered: false,
        };
        self.commands
            .send(command)
            .await
            .map_err(|_| NotFiled::Stopped)?;
        match filed.await {
            Ok((Ok(()), _)) => Ok(()),
            Ok((Err(status), _)) => Err(NotFiled::Refused(status)),
            Err(_) => Err(NotFiled::Stopped),
        }
    }

    /// Tells the ledger that the registered proxy's bucket of `user` in
    /// `service` was told its first share, `per_slot` requests a slot over
    /// `slots`. Nothing before a registration.
    pub(crate) async fn first_share(
        &self,
        service: &str,
        user: &str,
        slots: RangeInclusive<i64>,
        per_slot: f64,
    ) -> Result<(), NotFiled> {
        let Some(conn) = self.conn else {
            return Ok(());
        };
        let command = Command::FirstShare {
            conn,
            service: service.to_owned(),
            user: user.to_owned(),
            slots,
            per_slot,
        };
        self.commands
            .send(command)
            .await
            .map_err(|_| NotFiled::Stopped)
    }

    /// The next message for the node, waiting for one.
    pub(crate) async fn heard(&mut self) -> Heard {
        loop {
            match self.rx.recv().await.map(heard_of) {
                Some(Some(heard)) => return heard,
                Some(None) => continue,
                None => return Heard::Closed,
            }
        }
    }

    /// Hands `take` every message queued now; false when the stream is
    /// closed.
    pub(crate) fn drain(&mut self, mut take: impl FnMut(v1::CentralMessage)) -> bool {
        while let Ok(message) = self.rx.try_recv() {
            match heard_of(message) {
                Some(Heard::Message(m)) => take(m),
                Some(Heard::Closed) => return false,
                None => {}
            }
        }
        true
    }

    /// Ends the registration, if any.
    pub(crate) async fn disconnect(&mut self) {
        if let Some(conn) = self.conn.take() {
            let _ = self.commands.send(Command::Disconnect { conn }).await;
        }
    }
}

/// A queued message as the node hears it; `None` for one it cannot read.
fn heard_of(message: Result<Outbound, Status>) -> Option<Heard> {
    match message.map(Outbound::into_message) {
        Ok(Ok(v1::CentralMessage {
            kind: Some(central_message::Kind::NotLeader(_)),
        })) => Some(Heard::Closed),
        Ok(Ok(m)) => Some(Heard::Message(m)),
        Ok(Err(_)) => None,
        Err(_) => Some(Heard::Closed),
    }
}
