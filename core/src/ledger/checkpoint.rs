//! The ledger's checkpoint: what a new leader, or a restarted central,
//! cannot rebuild from the reports nodes send again.
//!
//! Nodes keep their last reports, answered or not, and send them again to
//! a central whose ledger is new (`Welcome.incarnation` changed): the sums
//! and the distribution come back from them. Bucket levels do not: a
//! bucket's level is the whole of its history, longer than the reports
//! kept, and a bucket rebuilt from a few seconds of reports would hand a
//! throttled user a fresh burst. So the leader writes every few slots the
//! levels of its buckets below capacity, with the (slot, node) reports
//! already charged to them; the next ledger restores those levels and,
//! as the reports come again, charges only the ones the checkpoint does
//! not hold.
//!
//! # Examples
//!
//! ```
//! use throttle_core::ledger::{Ledger, LedgerConfig};
//! use throttle_core::limits::Limit;
//! use throttle_proto::legacy;
//!
//! let limit = Limit {
//!     user: "alice".into(),
//!     per_second: [("requests".into(), 100.0)].into(),
//!     burst_seconds: 10.0,
//!     ..Limit::default()
//! };
//! let report = legacy::report_from_json(
//!     r#"{"node_id": "n1", "slot_number": 10, "consumption": {"front": {"alice": {"requests": 250}}}, "rejection": {"front": {}}}"#,
//! )?;
//! let mut old = Ledger::new(LedgerConfig::default());
//! old.apply_limits("front", &[limit.clone()], 10_000);
//! old.ingest(&report, 10_050).unwrap();
//! let checkpoint = old.checkpoint(10_100);
//!
//! let mut new = Ledger::new(LedgerConfig::default());
//! new.apply_limits("front", &[limit], 11_000);
//! new.restore(&checkpoint, 11_000).unwrap();
//! // The debt is back (100 + 10 refilled - 250), repaid for the second
//! // between.
//! assert_eq!(new.bucket_level("front", "alice", "requests", 11_100), Some(-140.0 + 100.0));
//! // The same report sent again is filed, and charged nothing twice.
//! new.ingest(&report, 11_100).unwrap();
//! assert_eq!(new.bucket_level("front", "alice", "requests", 11_100), Some(-40.0));
//! # Ok::<(), throttle_proto::legacy::LegacyError>(())
//! ```

use std::collections::{BTreeMap, BTreeSet};

use throttle_proto::v1;

use crate::arena::ids::{NodeId, valid_name};
use crate::arena::state::ServiceState;
use crate::limits::Period;

/// Why a checkpoint was not restored.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CheckpointError {
    /// Written by a central of another slot length: its slots are not
    /// this one's.
    #[error("checkpoint of {found} ms slots; this central runs {expected} ms slots")]
    SlotLength {
        /// This ledger's slot length.
        expected: u32,
        /// The checkpoint's.
        found: u32,
    },
}

/// What a restore put back.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Restoration {
    /// Bucket levels restored.
    pub buckets: usize,
    /// Entries left out: a bad name, a service or key past the ledger's
    /// bounds, a key no rule limits any more, or a period it no longer has.
    pub skipped: usize,
}

/// The reports a restored checkpoint had charged, and the slots it covers.
#[derive(Debug, Clone, Default)]
pub(super) struct Restored {
    filed: BTreeMap<i64, BTreeSet<NodeId>>,
    /// The oldest data slot the checkpoint's list covers.
    from_slot: i64,
}

impl Restored {
    /// The charged reports `filed`, of a checkpoint listing data slots
    /// from `from_slot` on.
    pub(super) fn new(filed: BTreeMap<i64, BTreeSet<NodeId>>, from_slot: i64) -> Self {
        Self { filed, from_slot }
    }

    /// Whether a report of `node` for data slot `slot` charges its
    /// buckets: not if the checkpoint holds its charge (once), nor if it
    /// was `answered` by a central of a slot the checkpoint does not
    /// reach back to.
    pub(super) fn charges(&mut self, node: NodeId, slot: i64, answered: bool) -> bool {
        if (self.filed.get_mut(&slot)).is_some_and(|nodes| nodes.remove(&node)) {
            return false;
        }
        !answered || slot >= self.from_slot
    }

    /// The newest data slot the checkpoint lists `node` as filed in, with
    /// the newest it lists at all; `None` if it lists no slot of `node`.
    pub(super) fn last_filed(&self, node: NodeId) -> Option<(i64, i64)> {
        let newest = *self.filed.keys().next_back()?;
        let mut of_node = self.filed.iter().rev().filter(|(_, n)| n.contains(&node));
        of_node.next().map(|(&slot, _)| (slot, newest))
    }

    /// Drops what it says of slots older than `cutoff`.
    pub(super) fn forget(&mut self, cutoff: i64) {
        self.filed = self.filed.split_off(&cutoff);
    }
}

/// The levels of `state`'s buckets below their capacity at `now_ms`, if
/// any.
pub(super) fn service_levels(
    service: &str,
    state: &ServiceState,
    now_ms: i64,
) -> Option<v1::ServiceLevels> {
    let buckets: Vec<v1::BucketLevel> = state
        .keys()
        .flat_map(|(_, key)| key.buckets().map(move |(period, b)| (key, period, b)))
        .filter_map(|(key, period, b)| {
            let level = b.level_at(now_ms);
            (level < b.capacity()).then(|| v1::BucketLevel {
                user: key.user().to_owned(),
                resource: key.resource().to_owned(),
                period_seconds: period.seconds() as u32,
                level,
            })
        })
        .collect();
    (!buckets.is_empty()).then(|| v1::ServiceLevels {
        service: service.to_owned(),
        buckets,
    })
}

/// Whether a ledger that `reported` these slots has filed one at least as
/// new as the newest `checkpoint` holds: the same central leading again,
/// whose buckets hold the charges made after its last checkpoint.
pub(super) fn newer_than(
    reported: &BTreeMap<i64, BTreeSet<NodeId>>,
    checkpoint: &v1::Checkpoint,
) -> bool {
    let own = reported.keys().next_back();
    let theirs = checkpoint.filed.iter().map(|f| f.slot).max();
    own.zip(theirs).is_some_and(|(own, theirs)| *own >= theirs)
}

/// Per data slot, the names of the nodes whose reports of it were charged.
pub(super) fn filed_slots<'n>(
    reported: &BTreeMap<i64, BTreeSet<NodeId>>,
    name_of: impl Fn(NodeId) -> &'n str,
) -> Vec<v1::FiledSlot> {
    let filed = reported.iter().map(|(&slot, nodes)| v1::FiledSlot {
        slot,
        nodes: nodes.iter().map(|&n| name_of(n).to_owned()).collect(),
    });
    filed.collect()
}

/// Restores one bucket's `level` into `state`, read at `taken_ms`, at
/// `now_ms` (`at`), adding its key if there is `room`: whether it had
/// such a bucket, and the keys added.
pub(super) fn restore_level(
    state: &mut ServiceState,
    level: &v1::BucketLevel,
    room: bool,
    (taken_ms, now_ms): (i64, i64),
) -> (bool, usize) {
    let Some(period) = period_of(level.period_seconds) else {
        return (false, 0);
    };
    if !valid_name(&level.user) || !valid_name(&level.resource) {
        return (false, 0);
    }
    let (id, added) = match state.find(&level.user, &level.resource) {
        Some(id) => (id, 0),
        None if room => {
            let id = state.find_or_insert(&level.user, &level.resource, now_ms);
            state.key_mut(id).fill_as_of(taken_ms, now_ms);
            (id, 1)
        }
        None => return (false, 0),
    };
    let bucket = state.key_mut(id).bucket_of_mut(period);
    let restored = bucket.map(|b| b.restore(level.level, taken_ms, now_ms));
    (restored.is_some(), added)
}

/// A period by its length in seconds, as checkpoints write it.
pub(super) fn period_of(seconds: u32) -> Option<Period> {
    Period::ALL
        .into_iter()
        .find(|p| p.seconds() == f64::from(seconds))
}

#[cfg(test)]
mod tests {
    use throttle_clock::SlotLength;
    use throttle_proto::v1;

    use super::CheckpointError;
    use crate::ledger::{Ledger, LedgerConfig};
    use crate::limits::{Allowance, Limit, Period};

    fn ledger(slot_ms: u32) -> Ledger {
        let config = LedgerConfig {
            slot: SlotLength::from_ms(slot_ms).unwrap(),
            ..LedgerConfig::default()
        };
        let mut ledger = Ledger::new(config);
        let minute = Allowance {
            period: Period::Minute,
            rate: 50.0,
            burst_seconds: 60.0,
        };
        let limit = Limit {
            user: "alice".into(),
            per_second: [("requests".into(), 100.0)].into(),
            burst_seconds: 10.0,
            per_period: [("requests".into(), vec![minute])].into(),
            ..Limit::default()
        };
        ledger.apply_limits("front", &[limit], 10_000);
        ledger
    }

    fn report(node: &str, slot_number: i64, amount: i64, answered: bool) -> v1::Report {
        let amounts = v1::Amounts {
            resources: [("requests".to_owned(), amount)].into(),
        };
        let usage = v1::Usage {
            users: [("alice".to_owned(), amounts)].into(),
        };
        v1::Report {
            node_id: node.into(),
            slot_number,
            consumption: [("front".to_owned(), usage)].into(),
            answered,
            ..v1::Report::default()
        }
    }

    fn level(ledger: &mut Ledger, now_ms: i64) -> f64 {
        ledger
            .bucket_level("front", "alice", "requests", now_ms)
            .unwrap()
    }

    #[test]
    fn answered_reports_fill_the_sums_of_a_new_ledger_and_charge_nothing() {
        let mut l = ledger(1000);
        let start = level(&mut l, 11_000);
        l.ingest(&report("n1", 11, 40, true), 11_000).unwrap();
        assert_eq!(
            level(&mut l, 11_000),
            start,
            "no checkpoint: nothing charged"
        );
        assert_eq!(l.slot_sum("front", "alice", "requests", 10, false), 40);
        l.ingest(&report("n1", 12, 40, false), 11_000).unwrap();
        assert_eq!(level(&mut l, 11_000), start - 40.0, "unanswered: charged");
    }

    /// The same central leading again, under a new epoch, after its lease
    /// ran out: its own buckets hold what it charged after its last
    /// checkpoint, and are kept.
    #[test]
    fn a_ledger_newer_than_the_checkpoint_keeps_its_own_buckets() {
        let mut l = ledger(1000);
        l.ingest(&report("n1", 11, 50, false), 11_000).unwrap();
        let checkpoint = l.checkpoint(11_000);
        l.ingest(&report("n1", 12, 70, false), 12_000).unwrap();
        let own = l.bucket_level("front", "alice", "requests", 12_000);
        let restored = l.restore(&checkpoint, 12_000).unwrap();
        assert_eq!(restored.buckets, 0, "nothing put back");
        assert_eq!(l.bucket_level("front", "alice", "requests", 12_000), own);
    }

    #[test]
    fn a_restored_ledger_charges_only_what_its_checkpoint_lacks() {
        let mut old = ledger(1000);
        old.ingest(&report("n1", 11, 500, false), 11_000).unwrap();
        let checkpoint = old.checkpoint(11_000);
        let before = old.bucket_level("front", "alice", "requests", 11_000);
        let mut new = ledger(1000);
        let restored = new.restore(&checkpoint, 11_000).unwrap();
        assert_eq!(restored.buckets, 2, "the second's and the minute's");
        assert_eq!(
            new.bucket_level("front", "alice", "requests", 11_000),
            before
        );
        // Sent again, answered: in the checkpoint, so only summed.
        new.ingest(&report("n1", 11, 500, true), 11_000).unwrap();
        assert_eq!(
            new.bucket_level("front", "alice", "requests", 11_000),
            before
        );
        assert_eq!(new.slot_sum("front", "alice", "requests", 10, false), 500);
        // Answered by the old ledger after its checkpoint: charged.
        new.ingest(&report("n2", 11, 30, true), 11_000).unwrap();
        let after = before.map(|b| b - 30.0);
        assert_eq!(
            new.bucket_level("front", "alice", "requests", 11_000),
            after
        );
        // The minute's bucket came back too: 3,000 - 530 spent.
        let key = new
            .service_state("front")
            .unwrap()
            .find("alice", "requests");
        let state = new.service_state("front").unwrap();
        let levels: Vec<_> = state
            .key(key.unwrap())
            .buckets()
            .map(|(_, b)| b.level_at(11_000))
            .collect();
        assert!(levels.contains(&2_470.0), "{levels:?}");
    }

    #[test]
    fn a_checkpoint_of_another_slot_length_is_refused() {
        let checkpoint = ledger(1000).checkpoint(11_000);
        let refused = ledger(100).restore(&checkpoint, 11_000);
        let expected = CheckpointError::SlotLength {
            expected: 100,
            found: 1000,
        };
        assert_eq!(refused, Err(expected));
    }
}
