//! Limits carried to the nodes ([`v1::Limits`], and [`v1::Bound`]): a new
//! stream is sent, per service of its node, what the ledger tells of its
//! limits (an empty one too: a node that reconnects forgets limits lifted
//! while it was away), and after that each service's whenever the ledger's
//! is another one. A send that finds the stream's queue full is tried
//! again at the next tick.

use std::collections::BTreeMap;
use std::sync::Arc;

use metrics::counter;
use throttle_proto::v1::{self, central_message};
use throttle_proto::wire::Outbound;

use super::command::Outgoing;

/// Service -> what its nodes are told now.
pub(super) type ToldNow<T = v1::Limits> = BTreeMap<String, Arc<T>>;

/// What one stream was last sent of a kind of message, per service.
#[derive(Debug)]
pub(super) struct Sent<T> {
    sent: BTreeMap<String, Arc<T>>,
}

impl<T> Default for Sent<T> {
    fn default() -> Self {
        Self {
            sent: BTreeMap::new(),
        }
    }
}

/// The limits one stream was last sent.
pub(super) type SentLimits = Sent<v1::Limits>;

/// A message the ledger tells the nodes per service.
pub(super) trait PerService: Clone {
    /// It as a message's kind.
    fn kind(self) -> central_message::Kind;
}

impl PerService for v1::Limits {
    fn kind(self) -> central_message::Kind {
        central_message::Kind::Limits(self)
    }
}

impl PerService for v1::Bound {
    fn kind(self) -> central_message::Kind {
        central_message::Kind::Bound(self)
    }
}

impl<T: PerService> Sent<T> {
    /// Queues on `tx` the message of each of `services` (in `now`) that is
    /// not the one this stream was last sent.
    pub(super) fn sync<'a>(
        &mut self,
        tx: &Outgoing,
        services: impl Iterator<Item = &'a String>,
        now: &ToldNow<T>,
    ) {
        for service in services {
            let Some(limits) = now.get(service) else {
                continue;
            };
            if self
                .sent
                .get(service)
                .is_some_and(|s| Arc::ptr_eq(s, limits))
            {
                continue;
            }
            let kind = T::clone(limits).kind();
            let message = Outbound::Message(v1::CentralMessage { kind: Some(kind) });
            if tx.try_send(Ok(message)).is_ok() {
                self.sent.insert(service.clone(), limits.clone());
            } else {
                counter!("throttle_central_pushes_dropped_total").increment(1);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::mpsc;

    fn limits_in(rx: &mut mpsc::Receiver<Result<Outbound, tonic::Status>>) -> Vec<v1::Limits> {
        let mut out = Vec::new();
        while let Ok(Ok(Outbound::Message(m))) = rx.try_recv() {
            if let Some(central_message::Kind::Limits(l)) = m.kind {
                out.push(l);
            }
        }
        out
    }

    fn limits(service: &str, quota: f64) -> Arc<v1::Limits> {
        Arc::new(v1::Limits {
            service: service.into(),
            default_quota: [("requests".to_string(), quota)].into(),
            ..v1::Limits::default()
        })
    }

    #[test]
    fn a_stream_hears_each_services_limits_once_then_changes() {
        let (tx, mut rx) = mpsc::channel(8);
        let mut sent = SentLimits::default();
        let services = ["front".to_string(), "back".to_string()];
        let mut now: ToldNow = [
            ("front".into(), limits("front", 10.0)),
            ("back".into(), limits("back", 1.0)),
        ]
        .into();
        sent.sync(&tx, services.iter(), &now);
        assert_eq!(limits_in(&mut rx).len(), 2);
        sent.sync(&tx, services.iter(), &now);
        assert!(limits_in(&mut rx).is_empty(), "nothing changed");
        now.insert("front".into(), limits("front", 5.0));
        sent.sync(&tx, services.iter(), &now);
        let got = limits_in(&mut rx);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].default_quota["requests"], 5.0);
    }

    #[test]
    fn limits_the_queue_had_no_room_for_are_sent_at_the_next_try() {
        let (tx, mut rx) = mpsc::channel(1);
        let mut sent = SentLimits::default();
        let services = ["front".to_string()];
        let now: ToldNow = [("front".into(), limits("front", 10.0))].into();
        let _ = tx.try_send(Ok(Outbound::Message(v1::CentralMessage::default())));
        sent.sync(&tx, services.iter(), &now);
        assert!(limits_in(&mut rx).is_empty(), "the queue was full");
        sent.sync(&tx, services.iter(), &now);
        assert_eq!(limits_in(&mut rx).len(), 1);
    }
}
