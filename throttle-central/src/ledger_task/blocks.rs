//! Block lists carried to the nodes: a new stream is sent, per service of
//! its node, the users blocked now (an empty list too: a node that
//! reconnects forgets blocks lifted while it was away), and after that each
//! list whenever it differs from the one the stream was last sent. A send
//! that finds the stream's queue full is tried again at the next tick.

use std::collections::BTreeMap;

use metrics::counter;
use throttle_proto::v1::{self, central_message};
use throttle_proto::wire::Outbound;

use super::command::Outgoing;

/// Service -> users blocked now.
pub(super) type BlockedNow = BTreeMap<String, Vec<String>>;

/// What one stream was last sent, per service.
#[derive(Debug)]
pub(super) struct SentBlocks {
    sent: BTreeMap<String, Vec<String>>,
    /// Every list is still to be sent, empty ones included.
    fresh: bool,
}

impl Default for SentBlocks {
    fn default() -> Self {
        Self {
            sent: BTreeMap::new(),
            fresh: true,
        }
    }
}

impl SentBlocks {
    /// Whether the stream has nothing to be told: it was sent every list,
    /// and each was empty.
    pub(super) fn is_empty(&self) -> bool {
        !self.fresh && self.sent.values().all(Vec::is_empty)
    }

    /// Queues on `tx` the Blocks of each of `services` whose users blocked
    /// now (in `now`) differ from what this stream was last sent.
    pub(super) fn sync<'a>(
        &mut self,
        tx: &Outgoing,
        services: impl Iterator<Item = &'a String>,
        now: &BlockedNow,
    ) {
        let mut all = true;
        for service in services {
            let users = now.get(service).map_or(&[][..], Vec::as_slice);
            let sent = self.sent.get(service).map_or(&[][..], Vec::as_slice);
            if users == sent && !self.fresh {
                continue;
            }
            let blocks = v1::Blocks {
                service: service.clone(),
                users: users.to_vec(),
            };
            let kind = central_message::Kind::Blocks(blocks);
            let message = Outbound::Message(v1::CentralMessage { kind: Some(kind) });
            if tx.try_send(Ok(message)).is_ok() {
                self.sent.insert(service.clone(), users.to_vec());
            } else {
                counter!("throttle_central_pushes_dropped_total").increment(1);
                all = false;
            }
        }
        self.fresh &= !all;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::mpsc;

    fn blocks_in(rx: &mut mpsc::Receiver<Result<Outbound, tonic::Status>>) -> Vec<v1::Blocks> {
        let mut out = Vec::new();
        while let Ok(Ok(Outbound::Message(m))) = rx.try_recv() {
            if let Some(central_message::Kind::Blocks(b)) = m.kind {
                out.push(b);
            }
        }
        out
    }

    #[test]
    fn a_new_stream_hears_every_list_then_only_changes() {
        let (tx, mut rx) = mpsc::channel(8);
        let mut sent = SentBlocks::default();
        let services = ["front".to_string(), "back".to_string()];
        let mut now = BlockedNow::new();
        sent.sync(&tx, services.iter(), &now);
        assert_eq!(blocks_in(&mut rx).len(), 2, "empty lists too, once");
        sent.sync(&tx, services.iter(), &now);
        assert!(blocks_in(&mut rx).is_empty(), "nothing changed");
        assert!(sent.is_empty());
        now.insert("front".into(), vec!["mallory".into()]);
        sent.sync(&tx, services.iter(), &now);
        sent.sync(&tx, services.iter(), &now);
        let got = blocks_in(&mut rx);
        assert_eq!(got.len(), 1, "once: {got:?}");
        assert_eq!(
            (got[0].service.as_str(), &got[0].users[..]),
            ("front", &["mallory".to_string()][..])
        );
    }

    #[test]
    fn a_list_the_queue_had_no_room_for_is_sent_at_the_next_try() {
        let (tx, mut rx) = mpsc::channel(1);
        let mut sent = SentBlocks::default();
        let services = ["front".to_string()];
        let now: BlockedNow = [("front".to_string(), vec!["mallory".to_string()])].into();
        let _ = tx.try_send(Ok(Outbound::Message(v1::CentralMessage::default())));
        sent.sync(&tx, services.iter(), &now);
        assert!(blocks_in(&mut rx).is_empty(), "the queue was full");
        sent.sync(&tx, services.iter(), &now);
        assert_eq!(blocks_in(&mut rx)[0].users, ["mallory"]);
    }
}
