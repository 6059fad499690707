//! The simulated network: messages delivered after a seeded delay, in
//! order of arrival, and a small seeded generator for every random choice.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

use throttle_proto::v1;

/// A small, fast, seeded generator (SplitMix64).
#[derive(Debug, Clone)]
pub(super) struct Rng(pub(super) u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub(super) fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in [lo, hi].
    pub(super) fn range(&mut self, (lo, hi): (i64, i64)) -> i64 {
        if hi <= lo {
            lo
        } else {
            lo + (self.next() % (hi - lo + 1) as u64) as i64
        }
    }
}

/// A message in flight.
#[derive(Debug)]
pub(super) enum Event {
    /// A report of node `node` to the central of generation `central`.
    Report {
        node: usize,
        central: u32,
        report: v1::Report,
    },
    /// A quota for node `node`.
    Quota(usize, v1::Quota),
}

/// Messages in flight, by arrival time then sending order.
#[derive(Debug, Default)]
pub(super) struct Network {
    queue: BinaryHeap<Reverse<(i64, u64)>>,
    events: BTreeMap<u64, Event>,
    seq: u64,
}

impl Network {
    /// Sends `event` at `at`; it arrives after a delay drawn from `delay_ms`.
    pub(super) fn send(&mut self, rng: &mut Rng, delay_ms: (i64, i64), at: i64, event: Event) {
        self.send_all(rng, delay_ms, at, [event]);
    }

    /// Sends `events` back to back, as on one stream: they arrive together
    /// after one delay, in order.
    pub(super) fn send_all(
        &mut self,
        rng: &mut Rng,
        delay_ms: (i64, i64),
        at: i64,
        events: impl IntoIterator<Item = Event>,
    ) {
        let when = at + rng.range(delay_ms);
        for event in events {
            self.seq += 1;
            self.queue.push(Reverse((when, self.seq)));
            self.events.insert(self.seq, event);
        }
    }

    /// The next message arrived by `now`, if any.
    pub(super) fn arrived(&mut self, now: i64) -> Option<Event> {
        let Reverse((at, seq)) = *self.queue.peek()?;
        if at > now {
            return None;
        }
        self.queue.pop();
        self.events.remove(&seq)
    }
}
