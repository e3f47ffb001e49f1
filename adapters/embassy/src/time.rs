//! Between embassy-time's clock and guard-core's.
//!
//! guard-core takes time as a `guard_core::time::Instant` (nanoseconds
//! from any origin); embassy-time counts ticks (`TICK_HZ`) from boot.
//! Conversions to embassy round *up* to a whole tick, so a timer set from
//! a guard deadline never fires before it; all of them saturate.

use core::time::Duration;

const NANOS_PER_SEC: u128 = 1_000_000_000;

/// Ticks of at least `nanos` (rounded up; saturating).
fn ticks_ceil(nanos: u128) -> u64 {
    let ticks = nanos
        .saturating_mul(u128::from(embassy_time::TICK_HZ))
        .div_ceil(NANOS_PER_SEC);
    u64::try_from(ticks).unwrap_or(u64::MAX)
}

/// Nanoseconds of `ticks` (saturating).
fn nanos_of(ticks: u64) -> u64 {
    let nanos = u128::from(ticks).saturating_mul(NANOS_PER_SEC) / u128::from(embassy_time::TICK_HZ);
    u64::try_from(nanos).unwrap_or(u64::MAX)
}

/// guard-core's reading of an embassy instant.
pub fn to_core(instant: embassy_time::Instant) -> guard_core::time::Instant {
    guard_core::time::Instant::from_nanos(nanos_of(instant.as_ticks()))
}

/// The embassy instant of a guard-core one, rounded up to the next tick.
pub fn to_embassy(instant: guard_core::time::Instant) -> embassy_time::Instant {
    embassy_time::Instant::from_ticks(ticks_ceil(u128::from(instant.as_nanos())))
}

/// An embassy duration of at least `d` (rounded up to the next tick;
/// saturating).
pub fn duration_to_embassy(d: Duration) -> embassy_time::Duration {
    embassy_time::Duration::from_ticks(ticks_ceil(d.as_nanos()))
}

/// The core duration of an embassy one.
pub fn duration_to_core(d: embassy_time::Duration) -> Duration {
    Duration::from_nanos(nanos_of(d.as_ticks()))
}

/// Now, on guard-core's clock.
pub fn now() -> guard_core::time::Instant {
    to_core(embassy_time::Instant::now())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversions_round_up_towards_embassy() {
        // The host driver ticks at 1 MHz.
        assert_eq!(embassy_time::TICK_HZ, 1_000_000);
        let core = guard_core::time::Instant::from_nanos(1_500);
        assert_eq!(to_embassy(core).as_micros(), 2);
        assert_eq!(to_core(to_embassy(core)).as_nanos(), 2_000);
        assert_eq!(duration_to_embassy(Duration::from_nanos(1)).as_micros(), 1);
        assert_eq!(
            to_embassy(guard_core::time::Instant::from_nanos(u64::MAX)).as_ticks(),
            u64::MAX / 1_000 + 1
        );
        assert_eq!(
            duration_to_core(duration_to_embassy(Duration::from_millis(15))),
            Duration::from_millis(15)
        );
        assert_eq!(
            duration_to_embassy(Duration::MAX),
            embassy_time::Duration::MAX
        );
    }
}
