//! What the users a node has no quota row for may take together in a slot
//! ([`v1::Limits::newcomers`]): a service's capacity split over its
//! nodes. Each new key is held to its default quota; a client that
//! rotates its keys faster than the central hears of them is held, all
//! its keys together, to this.
//!
//! Read and spent only by decisions on a default row (a user new to this
//! node, or one the central sent no row for): a user with a row of their
//! own never touches it.
//!
//! [`v1::Limits::newcomers`]: throttle_proto::v1::Limits::newcomers

use std::sync::atomic::{AtomicI64, Ordering};

use super::decision::Tightest;
use super::resource::{MAX_RESOURCES, ResourceId};

/// One service's pool for users without a row of their own, on this node.
#[derive(Debug)]
pub(crate) struct Newcomers {
    /// Per resource id, the whole units they may take in a slot (NaN:
    /// not limited together).
    quota: [f32; MAX_RESOURCES],
    /// The slot `used` counts.
    slot: AtomicI64,
    /// Per resource id, what they took in `slot`.
    used: [AtomicI64; MAX_RESOURCES],
}

impl Default for Newcomers {
    fn default() -> Self {
        Self::new([f32::NAN; MAX_RESOURCES])
    }
}

impl Newcomers {
    /// A pool of `quota` per slot (by resource id; NaN: none).
    pub(crate) fn new(quota: [f32; MAX_RESOURCES]) -> Self {
        Self {
            quota,
            slot: AtomicI64::new(i64::MIN),
            used: std::array::from_fn(|_| AtomicI64::new(0)),
        }
    }

    /// Whether it limits anything.
    pub(crate) fn is_limited(&self) -> bool {
        self.quota.iter().any(|q| !q.is_nan())
    }

    /// The first resource of `costs` the pool has no room for in `slot`
    /// (as a quota has none: below one unit, or already exceeded), with
    /// its quota and what was taken of it.
    pub(crate) fn short(&self, slot: i64, costs: &[(ResourceId, i64)]) -> Option<Tightest> {
        self.roll(slot);
        costs.iter().find_map(|&(resource, _)| {
            let quota = f64::from(self.quota[resource.index()]);
            let used = self.used[resource.index()].load(Ordering::Relaxed);
            (!quota.is_nan() && (quota < 1.0 || used as f64 > quota)).then_some(Tightest {
                resource,
                quota,
                used,
            })
        })
    }

    /// Takes `costs` from the pool in `slot`.
    pub(crate) fn spend(&self, slot: i64, costs: &[(ResourceId, i64)]) {
        self.roll(slot);
        for &(resource, amount) in costs {
            if !self.quota[resource.index()].is_nan() {
                self.used[resource.index()].fetch_add(amount, Ordering::Relaxed);
            }
        }
    }

    /// Starts counting `slot` if the pool counts an older one. Two
    /// threads rolling at once may lose a charge made between them: at
    /// most a request or two of a slot's first instant.
    fn roll(&self, slot: i64) {
        let counted = self.slot.load(Ordering::Acquire);
        if counted >= slot {
            return;
        }
        if self
            .slot
            .compare_exchange(counted, slot, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            for used in &self.used {
                used.store(0, Ordering::Relaxed);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(requests: f32) -> Newcomers {
        let mut quota = [f32::NAN; MAX_RESOURCES];
        quota[0] = requests;
        Newcomers::new(quota)
    }

    #[test]
    fn refuses_once_a_slot_is_taken_and_starts_again_the_next() {
        let p = pool(10.0);
        let one = [(ResourceId(0), 4)];
        for _ in 0..3 {
            assert!(p.short(5, &one).is_none());
            p.spend(5, &one);
        }
        let short = p.short(5, &one).expect("12 of 10 taken");
        assert_eq!((short.quota, short.used), (10.0, 12));
        assert!(p.short(6, &one).is_none(), "a new slot");
        assert!(p.short(5, &one).is_none(), "an older slot reads the newest");
    }

    #[test]
    fn a_resource_it_does_not_name_is_not_held() {
        let p = pool(0.0);
        assert!(p.short(1, &[(ResourceId(1), 100)]).is_none());
        assert!(
            p.short(1, &[(ResourceId(0), 1)]).is_some(),
            "below one unit"
        );
        assert!(!Newcomers::default().is_limited());
        assert!(p.is_limited());
    }
}
