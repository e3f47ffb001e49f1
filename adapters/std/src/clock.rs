//! Clocks: where guard-core's time comes from on an operating system.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use guard_core::slot::UnixMillis;
use guard_core::time::Instant;

/// A source of monotonic and wall-clock time.
pub trait Clock: Send + Sync {
    /// Monotonic time (never goes backwards), for limiters, TTLs, leases.
    fn now(&self) -> Instant;

    /// Wall-clock time (UTC), for schedule slots that every replica must
    /// compute alike.
    fn wall(&self) -> UnixMillis;
}

/// The operating system's clocks: `std::time::Instant` since this clock
/// was created, and `SystemTime`.
#[derive(Clone, Copy, Debug)]
pub struct SystemClock {
    origin: std::time::Instant,
}

impl SystemClock {
    /// A clock whose monotonic origin is now.
    pub fn new() -> Self {
        SystemClock {
            origin: std::time::Instant::now(),
        }
    }
}

impl SystemClock {
    /// The `std::time::Instant` of a reading of this clock (for timers);
    /// a reading too far ahead to represent maps to the farthest instant.
    pub fn to_std(&self, at: Instant) -> std::time::Instant {
        let offset = std::time::Duration::from_nanos(at.as_nanos());
        self.origin
            .checked_add(offset)
            .unwrap_or_else(|| self.origin + std::time::Duration::from_secs(100 * 365 * 86_400))
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        let nanos = self.origin.elapsed().as_nanos();
        Instant::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    }

    fn wall(&self) -> UnixMillis {
        system_wall()
    }
}

/// `SystemTime` in milliseconds since the epoch.
pub(crate) fn system_wall() -> UnixMillis {
    // A clock set before 1970 reads as the epoch rather than failing.
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    UnixMillis(u64::try_from(ms).unwrap_or(u64::MAX))
}

/// A cheaper monotonic clock for decisions made millions of times a
/// second: `quanta`'s, which reads the CPU's time-stamp counter where it
/// is invariant and synchronised across cores (scaled to nanoseconds by a
/// calibration made at start-up) and the operating system's monotonic
/// clock elsewhere. An atomic bucket's decision on it measured 10 ns,
/// against 36 ns on [`SystemClock`] (`std::time::Instant`), in
/// `benches/RESULTS.md` (`direct_default_clock`).
///
/// The default clock of [`crate::ratelimit::MemoryLimiter`]: a limiter
/// tolerates readings out of order (one never frees room), so a counter
/// read on two cores a few nanoseconds apart costs nothing. Leases and
/// schedules keep [`SystemClock`].
#[derive(Clone, Debug)]
pub struct QuantaClock {
    clock: quanta::Clock,
    origin: u64,
}

impl QuantaClock {
    /// A clock whose monotonic origin is now (the first one built in a
    /// process calibrates the counter, which takes a few milliseconds).
    pub fn new() -> Self {
        let clock = quanta::Clock::new();
        let origin = clock.raw();
        QuantaClock { clock, origin }
    }
}

impl Default for QuantaClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for QuantaClock {
    fn now(&self) -> Instant {
        Instant::from_nanos(self.clock.delta_as_nanos(self.origin, self.clock.raw()))
    }

    fn wall(&self) -> UnixMillis {
        system_wall()
    }
}

/// The operating system's wall clock as the limiters' time: nanoseconds
/// since the Unix epoch (UTC).
///
/// The clock of a limiter whose windows align to the calendar, such as
/// guard-core's `FixedWindow` (on a monotonic clock its windows would
/// align to the moment the process started). A wall clock can step back
/// (an NTP correction, a clock set by hand); a limiter takes a reading out
/// of order without freeing room, so a step back never gives a key its
/// quota again. A step forward ends the windows it passes. A clock set
/// before 1970 reads as the epoch.
#[derive(Clone, Copy, Debug, Default)]
pub struct EpochClock;

impl Clock for EpochClock {
    fn now(&self) -> Instant {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        // u64 nanoseconds reach the year 2554.
        Instant::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    }

    fn wall(&self) -> UnixMillis {
        system_wall()
    }
}

/// A clock moved by hand, for tests: both readings advance together.
#[derive(Clone, Debug, Default)]
pub struct ManualClock {
    nanos: Arc<AtomicU64>,
    wall_origin_ms: u64,
}

impl ManualClock {
    /// A clock at monotonic zero whose wall time starts at `wall`.
    pub fn new(wall: UnixMillis) -> Self {
        ManualClock {
            nanos: Arc::new(AtomicU64::new(0)),
            wall_origin_ms: wall.as_millis(),
        }
    }

    /// Moves both readings forward by `d`.
    pub fn advance(&self, d: std::time::Duration) {
        let add = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        let _ = self
            .nanos
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                Some(n.saturating_add(add))
            });
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Instant {
        Instant::from_nanos(self.nanos.load(Ordering::SeqCst))
    }

    fn wall(&self) -> UnixMillis {
        let elapsed_ms = self.nanos.load(Ordering::SeqCst) / 1_000_000;
        UnixMillis(self.wall_origin_ms.saturating_add(elapsed_ms))
    }
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    fn now(&self) -> Instant {
        (**self).now()
    }

    fn wall(&self) -> UnixMillis {
        (**self).wall()
    }
}
