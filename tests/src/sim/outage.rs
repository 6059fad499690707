//! A central that goes away: when, who answers after it, the reports the
//! nodes keep meanwhile, and what the measured user was admitted around it.

use std::collections::VecDeque;

use throttle_proto::v1;

/// How many reports a node keeps, answered or not, as the reporter does
/// (`ReporterBuilder::max_buffered`).
const KEPT: usize = 60;

/// A time when no central answers the nodes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Outage {
    /// When it starts, ms since the start of the run.
    pub from_ms: i64,
    /// When a central answers again.
    pub to_ms: i64,
    /// Who answers then.
    pub comeback: Comeback,
    /// The nodes come back over this long after `to_ms`, in an order
    /// drawn from the scenario's seed (0: all at once, in index order).
    pub spread_ms: i64,
    /// Checkpoints are written only before this (ms since the start),
    /// if set: etcd, where they are kept, went away then.
    pub checkpoints_until_ms: Option<i64>,
}

/// The central that answers after an [`Outage`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Comeback {
    /// The same process, which the nodes could not reach: it kept its
    /// state, and each node sends it the reports it did not answer.
    Same,
    /// A new process (the same one restarted, or a standby that took
    /// over) that restores the checkpoint its predecessor wrote last,
    /// every `every_ms` while it led; each node sends it every report it
    /// keeps, the answered ones marked.
    Checkpoint {
        /// How often the predecessor wrote one.
        every_ms: i64,
    },
    /// A new process with no checkpoint.
    Fresh,
}

impl Outage {
    /// Whether no central answers at `t` (ms since the start).
    pub fn covers(&self, t: i64) -> bool {
        (self.from_ms..self.to_ms).contains(&t)
    }

    /// When each of `nodes` nodes is back: from `to_ms` on, `spread_ms`
    /// apart over the nodes, in an order shuffled by `seed`.
    pub fn back_at(&self, nodes: usize, seed: u64) -> Vec<i64> {
        let mut order: Vec<usize> = (0..nodes).collect();
        let mut state = seed ^ 0x9e37_79b9_7f4a_7c15;
        for i in (1..nodes).rev() {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1);
            order.swap(i, (state >> 33) as usize % (i + 1));
        }
        let gap = self.spread_ms / (nodes.max(2) as i64 - 1);
        let mut at = vec![self.to_ms; nodes];
        for (rank, &node) in order.iter().enumerate() {
            at[node] = self.to_ms + gap * rank as i64;
        }
        at
    }

    /// The 30 slots of 1 s centred on the outage, as data-slot indexes
    /// from the start of the run.
    pub fn window(&self) -> std::ops::Range<usize> {
        let middle = (self.from_ms + self.to_ms) / 2;
        let first = ((middle - 15_000).max(0) / 1000) as usize;
        first..first + 30
    }
}

/// What the measured user was admitted around an outage.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct OutageOutcome {
    /// Admitted / limit over the 30 s centred on the outage.
    pub window: f64,
    /// The least slot of those 30, admitted / limit.
    pub lowest_slot: f64,
    /// The largest.
    pub highest_slot: f64,
}

impl OutageOutcome {
    /// Measures `admitted` (per slot) against `limit` per slot.
    pub(super) fn measure(outage: &Outage, admitted: &[i64], limit: f64) -> Self {
        let range = outage.window();
        let slots = &admitted[range.start.min(admitted.len())..range.end.min(admitted.len())];
        let ratio = |a: i64| a as f64 / limit;
        Self {
            window: slots.iter().sum::<i64>() as f64 / (limit * slots.len().max(1) as f64),
            lowest_slot: slots
                .iter()
                .copied()
                .map(ratio)
                .fold(f64::INFINITY, f64::min),
            highest_slot: slots.iter().copied().map(ratio).fold(0.0, f64::max),
        }
    }
}

/// The reports a node keeps for the central, oldest first, each with
/// whether a central answered it.
#[derive(Debug, Default)]
pub(super) struct Kept {
    reports: VecDeque<(v1::Report, bool)>,
}

impl Kept {
    /// Keeps `report`, not yet answered, dropping the oldest beyond
    /// [`KEPT`].
    pub(super) fn push(&mut self, report: v1::Report) {
        self.reports.push_back((report, false));
        while self.reports.len() > KEPT {
            self.reports.pop_front();
        }
    }

    /// Marks the report sent in `slot` answered.
    pub(super) fn answered(&mut self, slot: i64) {
        let found = self.reports.iter_mut().find(|(r, _)| r.slot_number == slot);
        if let Some((_, answered)) = found {
            *answered = true;
        }
    }

    /// What to send a central on connecting: to the one that answered
    /// before, the unanswered reports; to a new one (`all`), every report,
    /// the answered ones marked (`Report.answered`).
    pub(super) fn replay(&self, all: bool) -> Vec<v1::Report> {
        self.reports
            .iter()
            .filter(|(_, answered)| all || !answered)
            .map(|(r, answered)| v1::Report {
                answered: *answered,
                ..r.clone()
            })
            .collect()
    }
}
