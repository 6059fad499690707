//! One service: its keys, its policy and the book of its assignments.

use std::collections::BTreeMap;
use std::fmt;

use throttle_clock::SlotLength;

use super::bound::Bound;
use super::told::Told;
use crate::arena::state::ServiceState;
use crate::policy::{Assignment, Granted, Policy, QuotaHistory};

/// Builds the policy of a service when it first appears.
pub type PolicyFactory = Box<dyn Fn(&str) -> Box<dyn Policy> + Send>;

/// One service of the ledger.
pub(crate) struct Service {
    pub(crate) state: ServiceState,
    pub(crate) policy: Box<dyn Policy>,
    /// slot -> node -> quota, for the slots reports and pushes still read
    /// (the previous one on).
    pub(crate) book: BTreeMap<i64, Assignment>,
    /// The older slots of the retention, compact, for the monitor.
    pub(crate) kept: QuotaHistory,
    /// An assignment the book let go, for the next assign to fill: at
    /// 1,000 nodes x 1,000 users an assignment is 4 M grants, and
    /// allocating them afresh twice a slot was page faults and copies.
    pub(crate) spare: Option<Assignment>,
    /// The policy was named by the limits, not built by the ledger's
    /// factory.
    pub(crate) named_policy: bool,
    /// What its nodes are told of its limits.
    pub(crate) told: Told,
    /// Its keys bound by a longer period, as last read.
    pub(crate) bound: Bound,
}

impl Service {
    /// A service new to the ledger, with slots of `slot`, run by `policy`.
    pub(crate) fn new(slot: SlotLength, policy: Box<dyn Policy>) -> Self {
        Self {
            state: ServiceState {
                slot,
                ..ServiceState::default()
            },
            policy,
            book: BTreeMap::new(),
            kept: QuotaHistory::default(),
            spare: None,
            named_policy: false,
            told: Told::default(),
            bound: Bound::default(),
        }
    }

    /// Runs the policy for `slot` and keeps the result, replacing any
    /// earlier assignment of that slot.
    pub(crate) fn assign(&mut self, slot: i64, now_ms: i64) {
        let mut out = self.spare.take().unwrap_or_default();
        out.clear_like(self.book.values().next_back());
        self.state.bind(now_ms);
        let granted = Granted::new(&self.book, &self.kept, self.state.cuts());
        let mut assignment = self.policy.assign(&self.state, granted, slot, now_ms, out);
        assignment.share_keys();
        if let Some(replaced) = self.book.insert(slot, assignment) {
            self.keep_spare(replaced);
        }
    }

    /// Keeps `assignment` for the next assign to fill, cleared (its key
    /// lists would otherwise outlive the keys they name), unless one is
    /// kept already.
    pub(crate) fn keep_spare(&mut self, mut assignment: Assignment) {
        if self.spare.is_none() {
            assignment.clear();
            self.spare = Some(assignment);
        }
    }

    /// Moves the assignments of slots before `open_from` to the compact
    /// [`QuotaHistory`], keeping one for the next assign to fill, and
    /// drops everything before `cutoff`.
    pub(crate) fn forget_book(&mut self, cutoff: i64, open_from: i64) {
        let open = self.book.split_off(&open_from);
        let closed = std::mem::replace(&mut self.book, open);
        for (slot, assignment) in closed {
            if slot >= cutoff {
                self.kept.keep(slot, &assignment);
            }
            self.keep_spare(assignment);
        }
        self.kept.forget_before(cutoff);
    }
}

impl Service {
    /// Drops the book's grants of keys cut from the arena (ids `bound` and
    /// above), so that no quota still to be sent names an id a new key may
    /// hold.
    pub(crate) fn forget_grants_from(&mut self, bound: usize) {
        for assignment in self.book.values_mut() {
            assignment.forget_keys_from(bound);
        }
    }
}

impl fmt::Debug for Service {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Service")
            .field("keys", &self.state.key_count())
            .field("policy", &self.policy.name())
            .field("book_slots", &self.book.len())
            .field("kept_slots", &self.kept.slots().count())
            .finish()
    }
}
