//! Slot arithmetic and the clock that throttle's decision logic reads.
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
//! use throttle_clock::{Clock, ManualClock, SlotLength};
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

    /// Whether this clock's [`now_ms`](Clock::now_ms) is
    /// [`CoarseClock::now`]: a reader on a hot path may then call that
    /// itself, without the call through a trait object, which reads the
    /// object's vtable, one more cache line per read. `false` (the default)
    /// for any other clock.
    fn is_coarse(&self) -> bool {
        false
    }
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    fn now_ms(&self) -> i64 {
        (**self).now_ms()
    }

    fn is_coarse(&self) -> bool {
        (**self).is_coarse()
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

/// The system clock as the kernel keeps it at each of its ticks
/// (`CLOCK_REALTIME_COARSE`, read from the vDSO, without a system call):
/// a few nanoseconds a read, where the precise clock can cost as much as
/// the whole throttling decision on a virtual machine (`docs/performance.md`).
/// Its resolution is the kernel's tick, 1 to 10 ms;
/// slots are whole seconds (or at least many milliseconds), so a value a
/// tick old is as good. Where there is no such clock (other than Linux and
/// FreeBSD) it reads the system clock.
///
/// No thread keeps it: a thread woken every millisecond to store the time
/// in an atomic would make each read one load, but would cost a share of
/// a core, requests or none, and preempt the app's threads about 900
/// times a second.
#[derive(Debug, Clone, Copy, Default)]
pub struct CoarseClock;

impl CoarseClock {
    /// Milliseconds since the Unix epoch, as of the kernel's last tick.
    #[inline]
    pub fn now() -> i64 {
        #[cfg(any(target_os = "linux", target_os = "freebsd"))]
        {
            let t = rustix::time::clock_gettime(rustix::time::ClockId::RealtimeCoarse);
            // `tv_nsec` is in 0..1e9 (also before 1970), so this floors.
            t.tv_sec
                .saturating_mul(1000)
                .saturating_add(t.tv_nsec / 1_000_000)
        }
        #[cfg(not(any(target_os = "linux", target_os = "freebsd")))]
        {
            SystemClock.now_ms()
        }
    }

    /// Milliseconds on the kernel's monotonic clock as of its last tick
    /// (`CLOCK_MONOTONIC_COARSE`, from the vDSO): never goes back, so it
    /// suits measuring intervals (as nginx's cached `ngx_current_msec`
    /// does for `limit_req`). The origin is arbitrary but shared by the
    /// whole machine. Elsewhere, the time since the first call.
    #[inline]
    pub fn monotonic_ms() -> u64 {
        #[cfg(any(target_os = "linux", target_os = "freebsd"))]
        {
            let t = rustix::time::clock_gettime(rustix::time::ClockId::MonotonicCoarse);
            let ms = t
                .tv_sec
                .saturating_mul(1000)
                .saturating_add(t.tv_nsec / 1_000_000);
            u64::try_from(ms).unwrap_or(0)
        }
        #[cfg(not(any(target_os = "linux", target_os = "freebsd")))]
        {
            static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
            let start = START.get_or_init(std::time::Instant::now);
            u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX)
        }
    }
}

impl Clock for CoarseClock {
    fn now_ms(&self) -> i64 {
        Self::now()
    }

    fn is_coarse(&self) -> bool {
        true
    }
}

/// Milliseconds on the kernel's coarse monotonic clock
/// ([`CoarseClock::monotonic_ms`]): not Unix time, but never set back,
/// for deadlines that must hold whatever the system clock does.
#[derive(Debug, Clone, Copy, Default)]
pub struct MonotonicClock;

impl Clock for MonotonicClock {
    fn now_ms(&self) -> i64 {
        i64::try_from(CoarseClock::monotonic_ms()).unwrap_or(i64::MAX)
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
    /// One-second slots, the default of the legacy system.
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
        // overlaps the user's lookup.
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

    /// Valgrind (memcheck, callgrind) runs the program with an aux vector of
    /// its own, without the vDSO the kernel's copy names; the clock read it
    /// from the kernel's copy and crashed there. Runs this test binary's
    /// `the_coarse_clock_reads_under_valgrind` child under valgrind where it
    /// is installed (it is on this project's machines).
    #[test]
    fn the_coarse_clock_reads_under_valgrind() {
        const CHILD: &str = "THROTTLE_CLOCK_UNDER_VALGRIND";
        let before = SystemClock.now_ms();
        let read = CoarseClock::now();
        // Coarse: up to a tick (at most 10 ms) behind the precise clock.
        assert!(
            (before - 20..=SystemClock.now_ms()).contains(&read),
            "{read} vs {before}"
        );
        if std::env::var_os(CHILD).is_some() {
            return;
        }
        let Ok(exe) = std::env::current_exe() else {
            panic!("no path to this test binary");
        };
        let run = std::process::Command::new("valgrind")
            .args(["--tool=none", "-q"])
            .arg(exe)
            .args([
                "--exact",
                "slot::tests::the_coarse_clock_reads_under_valgrind",
            ])
            .env(CHILD, "1")
            .output();
        match run {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                eprintln!("valgrind is not installed: the child run is skipped");
            }
            Err(e) => panic!("cannot start valgrind: {e}"),
            Ok(out) => assert!(
                out.status.success(),
                "under valgrind: {}\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ),
        }
    }

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
    fn only_the_coarse_clock_says_it_is_one() {
        let coarse: Arc<dyn Clock> = Arc::new(CoarseClock);
        assert!(coarse.is_coarse());
        assert!(!Arc::new(ManualClock::new(5)).is_coarse());
        assert!(!SystemClock.is_coarse());
    }

    #[test]
    fn coarse_clock_follows_the_system_clock() {
        // Within a kernel tick (at most 10 ms) behind it, never ahead.
        let before = SystemClock.now_ms();
        let coarse = CoarseClock.now_ms();
        assert!(coarse >= before - 10, "{coarse} vs {before}");
        std::thread::sleep(Duration::from_millis(50));
        let later = CoarseClock::now();
        assert!(later >= coarse + 30, "it moves: {coarse} -> {later}");
        assert!(later <= SystemClock.now_ms());
    }

    #[test]
    fn the_coarse_monotonic_clock_moves_with_the_precise_one() {
        let start = std::time::Instant::now();
        let first = CoarseClock::monotonic_ms();
        std::thread::sleep(Duration::from_millis(50));
        let moved = CoarseClock::monotonic_ms() - first;
        let slept = start.elapsed().as_millis() as u64;
        // Within a kernel tick (at most 10 ms) of what passed.
        assert!(
            moved + 10 >= slept && moved <= slept + 10,
            "{moved} vs {slept}"
        );
    }
}
