//! Slot arithmetic and the clock both sides read it from.
//!
//! Time is cut into slots of [`SlotLength`] milliseconds (1 s by default).
//! The slot number of an instant is the integer part of its Unix time in slot
//! units, so nodes and the central node agree on slot numbers without talking
//! to each other, as long as their clocks roughly agree.
//!
//! The decision logic of throttle never reads the system time itself: it gets
//! a [`Clock`], so tests and the simulator can drive it with a [`ManualClock`].
//!
//! # Examples
//!
//! ```
//! use std::time::Duration;
//! use throttle_proto::slot::{Clock, ManualClock, SlotLength};
//!
//! let slots = SlotLength::from_ms(1000).unwrap();
//! let clock = ManualClock::new(1_515_118_666_250);
//! let now = clock.now_ms();
//! assert_eq!(slots.slot_at(now), 1_515_118_666);
//! assert_eq!(slots.until_next(now), Duration::from_millis(750));
//! clock.advance(Duration::from_millis(750));
//! assert_eq!(slots.slot_at(clock.now_ms()), 1_515_118_667);
//! ```

use std::fmt;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A source of Unix time in milliseconds.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// Milliseconds since the Unix epoch.
    fn now_ms(&self) -> i64;

    /// The atomic this clock's [`now_ms`](Clock::now_ms) only loads
    /// (`Relaxed`), for good, if it is one: a reader on a hot path may then
    /// load it itself, without the call through a trait object, which reads
    /// the object's vtable, one more cache line per read. `None` (the
    /// default) for any clock that does more.
    fn atomic_ms(&self) -> Option<&'static AtomicI64> {
        None
    }
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    fn now_ms(&self) -> i64 {
        (**self).now_ms()
    }

    fn atomic_ms(&self) -> Option<&'static AtomicI64> {
        (**self).atomic_ms()
    }
}

/// The operating system's real-time clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        match SystemTime::now().duration_since(UNIX_EPOCH) {
            Ok(d) => i64::try_from(d.as_millis()).unwrap_or(i64::MAX),
            // A clock set before 1970: count backwards rather than panic.
            Err(e) => -i64::try_from(e.duration().as_millis()).unwrap_or(i64::MAX),
        }
    }
}

/// The system clock read once per millisecond by a shared background
/// thread, so that reading it is a single atomic load.
///
/// Reading the system clock costs 20-40 ns on many virtual machines, as much
/// as the whole throttling decision; slots are whole seconds (or at least
/// many milliseconds), so a value up to about a millisecond old is as good.
/// The thread starts on first use and lives as long as the process.
#[derive(Debug, Clone, Copy, Default)]
pub struct CoarseClock;

fn coarse_now() -> &'static AtomicI64 {
    static NOW: std::sync::OnceLock<&'static AtomicI64> = std::sync::OnceLock::new();
    NOW.get_or_init(|| {
        let now: &'static AtomicI64 = Box::leak(Box::new(AtomicI64::new(SystemClock.now_ms())));
        let spawned = std::thread::Builder::new()
            .name("throttle-clock".into())
            .spawn(move || {
                loop {
                    now.store(SystemClock.now_ms(), Ordering::Relaxed);
                    std::thread::sleep(Duration::from_millis(1));
                }
            });
        if spawned.is_err() {
            // No thread: the value would freeze, so do not pretend.
            now.store(i64::MIN, Ordering::Relaxed);
        }
        now
    })
}

impl Clock for CoarseClock {
    fn now_ms(&self) -> i64 {
        match coarse_now().load(Ordering::Relaxed) {
            i64::MIN => SystemClock.now_ms(),
            ms => ms,
        }
    }

    /// The shared atomic, unless its thread could not start (then
    /// `now_ms` reads the system clock instead).
    fn atomic_ms(&self) -> Option<&'static AtomicI64> {
        let now = coarse_now();
        (now.load(Ordering::Relaxed) != i64::MIN).then_some(now)
    }
}

/// A clock that only moves when told to; for tests and simulations.
#[derive(Debug, Default)]
pub struct ManualClock {
    ms: AtomicI64,
}

impl ManualClock {
    /// A clock showing `unix_ms`.
    pub fn new(unix_ms: i64) -> Self {
        Self {
            ms: AtomicI64::new(unix_ms),
        }
    }

    /// Sets the time to `unix_ms` (it may go backwards).
    pub fn set(&self, unix_ms: i64) {
        self.ms.store(unix_ms, Ordering::Release);
    }

    /// Moves the time forward by `by`.
    pub fn advance(&self, by: Duration) {
        let by = i64::try_from(by.as_millis()).unwrap_or(i64::MAX);
        self.ms.fetch_add(by, Ordering::AcqRel);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> i64 {
        self.ms.load(Ordering::Acquire)
    }
}

/// The length of a slot, in milliseconds; never zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SlotLength(NonZeroU32);

/// Error of [`SlotLength::from_ms`] for a zero length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ZeroSlotLength;

impl fmt::Display for ZeroSlotLength {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("slot length must be at least 1 ms")
    }
}

impl std::error::Error for ZeroSlotLength {}

impl Default for SlotLength {
    fn default() -> Self {
        Self::SECOND
    }
}

impl SlotLength {
    /// One-second slots, the default of the original system.
    pub const SECOND: Self = Self(NonZeroU32::MIN.saturating_add(999));

    /// A slot length of `ms` milliseconds.
    ///
    /// # Errors
    ///
    /// [`ZeroSlotLength`] when `ms` is 0.
    pub fn from_ms(ms: u32) -> Result<Self, ZeroSlotLength> {
        NonZeroU32::new(ms).map(Self).ok_or(ZeroSlotLength)
    }

    /// The length in milliseconds.
    pub fn as_ms(self) -> u32 {
        self.0.get()
    }

    /// The length as a [`Duration`].
    pub fn as_duration(self) -> Duration {
        Duration::from_millis(u64::from(self.as_ms()))
    }

    /// The slot number that contains the instant `unix_ms`.
    #[inline]
    pub fn slot_at(self, unix_ms: i64) -> i64 {
        // One division by the runtime length. A match arm dividing by a
        // literal 1000 compiles back into this same division (the compiler
        // merges the arms), and a precomputed reciprocal, a multiplication
        // and a shift, measured no faster on a decision: the division
        // overlaps the user's lookup (docs/performance.md, session 18).
        unix_ms.div_euclid(i64::from(self.as_ms()))
    }

    /// The first millisecond of `slot` (saturating for absurd slot numbers).
    pub fn start_ms(self, slot: i64) -> i64 {
        slot.saturating_mul(i64::from(self.as_ms()))
    }

    /// The first millisecond after `slot` (saturating).
    pub fn end_ms(self, slot: i64) -> i64 {
        self.start_ms(slot.saturating_add(1))
    }

    /// How far `unix_ms` is into its slot.
    pub fn offset_in_slot(self, unix_ms: i64) -> Duration {
        Duration::from_millis(u64::from(self.ms_into_slot(unix_ms)))
    }

    /// [`SlotLength::offset_in_slot`] in milliseconds: what is left of
    /// `unix_ms` after [`SlotLength::slot_at`]'s division (whole-number
    /// arithmetic only).
    #[inline]
    fn ms_into_slot(self, unix_ms: i64) -> u32 {
        let ms = i64::from(self.as_ms());
        // The true remainder is in `0..ms`; wrapping arithmetic gets it
        // exactly even where `slot * ms` lies below `i64::MIN`.
        unix_ms.wrapping_sub(self.slot_at(unix_ms).wrapping_mul(ms)) as u32
    }

    /// Time from `unix_ms` to the start of the next slot (never zero).
    pub fn until_next(self, unix_ms: i64) -> Duration {
        Duration::from_millis(u64::from(self.ms_until_next(unix_ms)))
    }

    /// [`SlotLength::until_next`] in milliseconds, in whole-number
    /// arithmetic only (a refusal reads it on every call).
    #[inline]
    pub fn ms_until_next(self, unix_ms: i64) -> u32 {
        // The offset is in `0..ms`, so this is in `1..=ms`.
        self.as_ms() - self.ms_into_slot(unix_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_numbers_are_unix_time_in_slot_units() {
        let s = SlotLength::SECOND;
        assert_eq!(s.as_ms(), 1000);
        assert_eq!(s.slot_at(1_515_118_666_000), 1_515_118_666);
        assert_eq!(s.slot_at(1_515_118_666_999), 1_515_118_666);
        assert_eq!(s.start_ms(1_515_118_666), 1_515_118_666_000);
        assert_eq!(s.end_ms(1_515_118_666), 1_515_118_667_000);
        let tenth = SlotLength::from_ms(100).unwrap();
        assert_eq!(tenth.slot_at(1_050), 10);
        assert_eq!(tenth.until_next(1_050), Duration::from_millis(50));
    }

    #[test]
    fn boundaries_and_negative_time() {
        let s = SlotLength::SECOND;
        assert_eq!(s.until_next(2_000), Duration::from_secs(1));
        assert_eq!(s.ms_until_next(2_000), 1000);
        assert_eq!(s.ms_until_next(2_999), 1);
        assert_eq!(s.ms_until_next(-1), 1);
        assert_eq!(SlotLength::from_ms(100).unwrap().ms_until_next(-150), 50);
        assert_eq!(s.slot_at(-1), -1);
        assert_eq!(s.offset_in_slot(-1), Duration::from_millis(999));
        assert_eq!(s.offset_in_slot(i64::MIN), Duration::from_millis(192));
        assert_eq!(s.ms_until_next(i64::MAX), 193);
        assert_eq!(s.start_ms(i64::MAX), i64::MAX);
        assert_eq!(s.end_ms(i64::MAX), i64::MAX);
    }

    #[test]
    fn zero_length_is_an_error() {
        assert_eq!(SlotLength::from_ms(0), Err(ZeroSlotLength));
    }

    #[test]
    fn manual_clock_moves_only_when_told() {
        let c = ManualClock::new(5);
        assert_eq!(c.now_ms(), 5);
        c.advance(Duration::from_millis(10));
        assert_eq!(c.now_ms(), 15);
        c.set(3);
        assert_eq!(c.now_ms(), 3);
        assert!(SystemClock.now_ms() > 1_500_000_000_000);
    }

    #[test]
    fn only_the_coarse_clock_is_read_as_an_atomic() {
        let coarse: Arc<dyn Clock> = Arc::new(CoarseClock);
        let now = coarse.atomic_ms().expect("the coarse clock's thread runs");
        let (read, called) = (now.load(Ordering::Relaxed), coarse.now_ms());
        assert!((called - read).abs() <= 5, "{read} vs {called}");
        assert!(Arc::new(ManualClock::new(5)).atomic_ms().is_none());
        assert!(SystemClock.atomic_ms().is_none());
    }

    #[test]
    fn coarse_clock_follows_the_system_clock() {
        let before = SystemClock.now_ms();
        let coarse = CoarseClock.now_ms();
        std::thread::sleep(Duration::from_millis(20));
        let later = CoarseClock.now_ms();
        assert!(coarse >= before - 5, "{coarse} vs {before}");
        assert!(later >= coarse + 10, "it moves: {coarse} -> {later}");
        assert!(later <= SystemClock.now_ms());
    }
}
