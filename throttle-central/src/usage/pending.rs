//! The writer's bounded buffer ([`Pending`]).

use std::collections::VecDeque;

use super::filed::FiledUsage;

/// Reports waiting to be written, oldest first, bounded in entries: while
/// the store is down they wait here, and a report that would pass the
/// bound is refused (the caller counts it as lost).
#[derive(Debug)]
pub(super) struct Pending {
    reports: VecDeque<FiledUsage>,
    entries: usize,
    max_entries: usize,
}

impl Pending {
    /// An empty buffer of at most `max_entries` entries.
    pub(super) fn new(max_entries: usize) -> Self {
        Self {
            reports: VecDeque::new(),
            entries: 0,
            max_entries,
        }
    }

    /// Keeps `report`, or gives it back when there is no room for it.
    ///
    /// # Errors
    ///
    /// The report itself, when keeping it would pass the bound.
    pub(super) fn push(&mut self, report: FiledUsage) -> Result<(), FiledUsage> {
        let n = report.entries.len();
        if self.entries + n > self.max_entries {
            return Err(report);
        }
        self.entries += n;
        self.reports.push_back(report);
        Ok(())
    }

    /// The oldest reports, up to `max_entries` entries (at least one
    /// report), to write next.
    pub(super) fn next_batch(&self, max_entries: usize) -> &[FiledUsage] {
        let (front, _) = self.reports.as_slices();
        let mut taken = 0;
        let n = front
            .iter()
            .take_while(|r| {
                let first = taken == 0;
                taken += r.entries.len();
                first || taken <= max_entries
            })
            .count();
        &front[..n]
    }

    /// Forgets the `n` oldest reports, written.
    pub(super) fn written(&mut self, n: usize) {
        for report in self.reports.drain(..n.min(self.reports.len())) {
            self.entries -= report.entries.len();
        }
        if self.reports.is_empty() {
            self.reports.shrink_to(1_024);
        }
    }

    /// Entries waiting.
    pub(super) fn entries(&self) -> usize {
        self.entries
    }

    /// Reports waiting.
    pub(super) fn len(&self) -> usize {
        self.reports.len()
    }

    /// Whether nothing waits.
    pub(super) fn is_empty(&self) -> bool {
        self.reports.is_empty()
    }

    /// Makes the reports one slice, for [`Pending::next_batch`].
    pub(super) fn settle(&mut self) {
        self.reports.make_contiguous();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::usage::filed::UsageEntry;

    fn report(slot: i64, users: usize) -> FiledUsage {
        let entry = |u: usize| UsageEntry {
            service: "front".into(),
            user: format!("u{u}"),
            resource: "requests".into(),
            admitted: 1,
            refused: 0,
        };
        FiledUsage {
            node: "n1".into(),
            slot,
            start_s: slot,
            entries: (0..users).map(entry).collect(),
        }
    }

    #[test]
    fn the_buffer_refuses_past_its_bound_and_batches_oldest_first() {
        let mut p = Pending::new(10);
        assert!(p.push(report(1, 4)).is_ok());
        assert!(p.push(report(2, 4)).is_ok());
        let refused = p.push(report(3, 3)).unwrap_err();
        assert_eq!(refused.slot, 3);
        assert!(p.push(report(4, 2)).is_ok());
        assert_eq!(p.entries(), 10);
        p.settle();
        let batch: Vec<i64> = p.next_batch(5).iter().map(|r| r.slot).collect();
        assert_eq!(batch, [1]);
        // A report larger than a batch still goes, alone.
        assert_eq!(p.next_batch(2).len(), 1);
        assert_eq!(p.next_batch(100).len(), 3);
        p.written(2);
        assert_eq!(p.entries(), 2);
        p.settle();
        assert_eq!(p.next_batch(100)[0].slot, 4);
        p.written(1);
        assert!(p.is_empty());
    }
}
