//! [`Charge`]: how a report's consumption reaches its keys' buckets.

/// How a report's consumption is charged to its keys' buckets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Charge {
    /// Not at all: a restored checkpoint holds its charge, or a central
    /// this ledger has no record of answered it.
    No,
    /// To the level, no deeper than the floor: the slot just ended,
    /// while late reports of other nodes may still come (a hold is under
    /// way, or a node reports every few slots).
    OnTime,
    /// As [`Charge::OnTime`], when no late report is awaited: the bucket
    /// first drops the refill its capacity turned away
    /// ([`Bucket::consume_steady`](crate::bucket::Bucket::consume_steady)).
    Steady,
    /// First to the refill the buckets turned away meanwhile
    /// ([`Bucket::consume_late`](crate::bucket::Bucket::consume_late)),
    /// then to the level, never into debt: a slot that has passed, sent
    /// after a gap.
    Late,
    /// First to the refill the buckets turned away meanwhile, then to the
    /// level, no deeper than the floor: a node that reports every few
    /// slots (a proxy), whose slots are charged that late every time;
    /// only the refill turned away since its slot began (`since_ms`).
    Batched {
        /// When the slot charged began.
        since_ms: i64,
    },
    /// Out of what the buckets hold, never into debt: a slot before a
    /// ledger without a checkpoint began, admitted on the refill of a
    /// ledger it has no record of. A key's first consumption so charged
    /// is charged first to the refill since its slot began (`since_ms`):
    /// the nodes admitted on that refill, which the key's new buckets
    /// never held.
    Emptying {
        /// When the slot charged began.
        since_ms: i64,
    },
}

impl Charge {
    /// When the buckets of a key a report meets first start, for a report
    /// of the slot that began at `slot_ms` filed at `now_ms`: in its slot
    /// when it is late (the refill since is kept for it, as for a key met
    /// on time), else now.
    pub(crate) fn met_ms(self, slot_ms: i64, now_ms: i64) -> i64 {
        match self {
            Self::Late => slot_ms.min(now_ms),
            _ => now_ms,
        }
    }

    /// [`Charge::Late`] instead of a charge that could put the buckets in
    /// debt, when `late` (a proxy's slot admitted while its stream was
    /// lost); as it is otherwise.
    pub(crate) fn late_if(self, late: bool) -> Self {
        match self {
            Self::OnTime | Self::Steady | Self::Batched { .. } if late => Self::Late,
            other => other,
        }
    }
}
