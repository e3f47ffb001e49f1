//! Time as a value: a monotonic [`Instant`] in nanoseconds, plus
//! [`core::time::Duration`] for spans.
//!
//! Core never reads a clock. Adapters convert from `std::time::Instant`,
//! `async_io` timers or `embassy_time::Instant` by choosing an origin (for
//! example process start or boot) and passing nanoseconds since it.

use core::fmt;
use core::ops::{Add, Sub};
use core::time::Duration;

/// A point on a monotonic clock, in nanoseconds since an origin the caller
/// chooses (boot, process start, ...).
///
/// A `u64` of nanoseconds spans 584 years. All arithmetic saturates, so no
/// input makes it panic or wrap: `Instant::MAX + d == Instant::MAX`.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct Instant(u64);

impl Instant {
    /// The origin.
    pub const ZERO: Instant = Instant(0);
    /// The latest representable instant.
    pub const MAX: Instant = Instant(u64::MAX);

    /// An instant `nanos` nanoseconds after the origin.
    pub const fn from_nanos(nanos: u64) -> Self {
        Instant(nanos)
    }

    /// An instant `micros` microseconds after the origin (saturating).
    pub const fn from_micros(micros: u64) -> Self {
        Instant(micros.saturating_mul(1_000))
    }

    /// An instant `millis` milliseconds after the origin (saturating).
    pub const fn from_millis(millis: u64) -> Self {
        Instant(millis.saturating_mul(1_000_000))
    }

    /// An instant `secs` seconds after the origin (saturating).
    pub const fn from_secs(secs: u64) -> Self {
        Instant(secs.saturating_mul(1_000_000_000))
    }

    /// Nanoseconds since the origin.
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// Whole milliseconds since the origin.
    pub const fn as_millis(self) -> u64 {
        self.0 / 1_000_000
    }

    /// `self + d`, or `None` past [`Instant::MAX`].
    pub const fn checked_add(self, d: Duration) -> Option<Instant> {
        match self.0.checked_add(nanos_saturating(d)) {
            Some(n) => Some(Instant(n)),
            None => None,
        }
    }

    /// `self + d`, clamped to [`Instant::MAX`].
    pub const fn saturating_add(self, d: Duration) -> Instant {
        Instant(self.0.saturating_add(nanos_saturating(d)))
    }

    /// `self - d`, clamped to [`Instant::ZERO`].
    pub const fn saturating_sub(self, d: Duration) -> Instant {
        Instant(self.0.saturating_sub(nanos_saturating(d)))
    }

    /// `self - d`, or `None` before the origin.
    pub const fn checked_sub(self, d: Duration) -> Option<Instant> {
        match self.0.checked_sub(nanos_saturating(d)) {
            Some(n) => Some(Instant(n)),
            None => None,
        }
    }

    /// The span from `earlier` to `self`, or zero if `earlier` is later
    /// (a clock read out of order is not an error).
    pub const fn saturating_duration_since(self, earlier: Instant) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }

    /// The span from `earlier` to `self`, or `None` if `earlier` is later.
    pub const fn checked_duration_since(self, earlier: Instant) -> Option<Duration> {
        match self.0.checked_sub(earlier.0) {
            Some(n) => Some(Duration::from_nanos(n)),
            None => None,
        }
    }
}

impl Add<Duration> for Instant {
    type Output = Instant;
    /// Saturating: never panics.
    fn add(self, d: Duration) -> Instant {
        self.saturating_add(d)
    }
}

impl Sub<Duration> for Instant {
    type Output = Instant;
    /// Saturating: never panics.
    fn sub(self, d: Duration) -> Instant {
        self.saturating_sub(d)
    }
}

impl fmt::Debug for Instant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Instant({}ns)", self.0)
    }
}

/// Waits `d` on an `embedded_hal_async` delay, whose calls take `u32`
/// microseconds: long waits are split, and a partial microsecond rounds up
/// so that no wait is cut short.
pub async fn delay_for<D: embedded_hal_async::delay::DelayNs>(delay: &mut D, d: Duration) {
    let mut micros = d.as_nanos().div_ceil(1_000);
    while micros > 0 {
        let chunk = u32::try_from(micros).unwrap_or(u32::MAX);
        delay.delay_us(chunk).await;
        micros = micros.saturating_sub(u128::from(chunk));
    }
}

/// A duration in whole nanoseconds, saturating at `u64::MAX` (584 years).
pub const fn nanos_saturating(d: Duration) -> u64 {
    let n = d.as_nanos();
    if n > u64::MAX as u128 {
        u64::MAX
    } else {
        #[allow(clippy::cast_possible_truncation, reason = "n <= u64::MAX was checked")]
        let n = n as u64;
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic_saturates_instead_of_panicking() {
        assert_eq!(Instant::MAX + Duration::from_secs(1), Instant::MAX);
        assert_eq!(Instant::ZERO - Duration::from_secs(1), Instant::ZERO);
        assert_eq!(Instant::from_secs(u64::MAX), Instant::MAX);
        assert_eq!(Instant::ZERO.checked_sub(Duration::from_nanos(1)), None);
        assert_eq!(
            Instant::from_secs(1).saturating_duration_since(Instant::from_secs(2)),
            Duration::ZERO
        );
        assert_eq!(nanos_saturating(Duration::MAX), u64::MAX);
    }

    #[test]
    fn units_convert() {
        assert_eq!(Instant::from_millis(3).as_nanos(), 3_000_000);
        assert_eq!(Instant::from_micros(3).as_nanos(), 3_000);
        assert_eq!(Instant::from_secs(2).as_millis(), 2_000);
    }
}
