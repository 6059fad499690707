//! Answers rendered ahead: a stream answers its node's report as soon as it
//! has read it.

use std::sync::Arc;

use super::received::Received;

/// A stream's answer to its node's next report, rendered ahead by the
/// ledger task, so that the stream answers a report as soon as it has read
/// it, rather than after the ledger has filed every report queued before
/// it: at each slot boundary every node reports at once, and the ledger is
/// one task.
///
/// At each mid-slot, after assigning, the ledger renders each connected
/// node's answer to the report due at the next boundary
/// ([`Assigner::prepare`](crate::assigner::Assigner::prepare)). Filing a report changes no grant, so the answer
/// is the one the ledger would give; whatever does change grants (an
/// assign, a re-assign, a connect that re-assigns) replaces or clears these
/// answers, under this lock, before its pushes are queued. The stream holds
/// the lock from checking the answer to queuing it, so an answer never
/// overtakes a newer push.
///
/// An answer still acknowledges a filed report, as the legacy system's did:
///
/// - the stream queues the report for the ledger first, marked as answered,
///   and answers only once it is queued;
/// - the ledger files every report it was queued, those queued while it
///   shuts down included: it closes its queue first, so that queuing
///   fails from then on, then files what the queue holds, and only then
///   closes the streams ([`Actor::close`](super::actor::Actor::close)).
///
/// The stream decides before queuing, rather than racing the ledger for
/// the answer after: the ledger's thread, woken by the report, would
/// usually take the report first when it is idle (the scheduler runs the
/// woken thread ahead of the one that woke it), and answer it only after
/// filing.
///
/// A report the stream cannot answer ahead (an older slot, a service
/// outside the prepared answer, a check the ledger would fail) goes the way
/// every report went before: filed, then answered by the ledger.
///
/// For a node that accepts refs ([`QUOTA_REFS`](throttle_proto::QUOTA_REFS)),
/// the answer names the tables of the push queued just before it on the
/// same stream instead of repeating them (the answer to the report after
/// an assign holds the grants that assign pushed). Such an answer is kept
/// only on a stream that took the push; the others answer after filing,
/// in full.
#[derive(Debug, Default)]
pub(crate) struct AnswerAhead {
    pub(super) ready: parking_lot::Mutex<Option<Ready>>,
}

/// An answer rendered ahead: for the report of `report_slot`, covering
/// `services`.
#[derive(Debug, Clone)]
pub(crate) struct Ready {
    pub(super) report_slot: i64,
    pub(super) services: Arc<[String]>,
    pub(super) quota: bytes::Bytes,
}

impl AnswerAhead {
    /// The answer rendered ahead, locked: held until the report it answers
    /// is queued, so that a push of newer grants, queued after the ledger
    /// clears this answer, cannot overtake it.
    pub(crate) fn lock(&self) -> parking_lot::MutexGuard<'_, Option<Ready>> {
        self.ready.lock()
    }
}

impl Ready {
    /// The encoded answer to `report`, if this is its answer: the report is
    /// of `report_slot` and names no service outside `services`.
    pub(crate) fn answers(&self, report: &Received) -> Option<bytes::Bytes> {
        (self.report_slot == report.slot_number() && report.services_within(&self.services))
            .then(|| self.quota.clone())
    }
}
