//! Scheduled slots: every replica computes the same planned instant.
//!
//! A scheduled job is deduplicated by its **planned slot**, the wall-clock
//! instant the schedule meant, never by the time it actually ran. Replicas
//! whose clocks agree to within one period compute the same slot, so their
//! once-guards race for the same key and exactly one runs it.
//!
//! [`Every`] is a fixed period aligned to the Unix epoch: slots are the
//! multiples of the period, so replicas started at different times agree
//! (the original's `@every` was anchored at each replica's start and did
//! not deduplicate). Cron schedules implement [`Schedule`] in the std
//! adapter.

use core::fmt;
use core::time::Duration;

/// Wall-clock time: milliseconds since the Unix epoch (UTC).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct UnixMillis(pub u64);

impl UnixMillis {
    /// The instant `ms` milliseconds after the epoch.
    pub const fn from_millis(ms: u64) -> Self {
        UnixMillis(ms)
    }

    /// Milliseconds since the epoch.
    pub const fn as_millis(&self) -> u64 {
        self.0
    }

    /// `self + d`, saturating.
    pub const fn saturating_add(self, d: Duration) -> Self {
        let ms = d.as_millis();
        let ms = if ms > u64::MAX as u128 {
            u64::MAX
        } else {
            #[allow(clippy::cast_possible_truncation, reason = "checked above")]
            let ms = ms as u64;
            ms
        };
        UnixMillis(self.0.saturating_add(ms))
    }

    /// The span from `earlier` to `self`, zero if `earlier` is later.
    pub const fn saturating_duration_since(self, earlier: UnixMillis) -> Duration {
        Duration::from_millis(self.0.saturating_sub(earlier.0))
    }
}

impl fmt::Display for UnixMillis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A schedule of planned instants.
pub trait Schedule {
    /// The first planned instant strictly after `t`, if any.
    fn next_after(&self, t: UnixMillis) -> Option<UnixMillis>;

    /// The latest planned instant at or before `now`, at or after `from`
    /// (itself planned and `<= now`). The default walks forward from
    /// `from`, at most `limit` steps, and returns the newest it reached;
    /// schedules with arithmetic do better.
    fn latest_between(&self, from: UnixMillis, now: UnixMillis) -> UnixMillis {
        const LIMIT: u32 = 100_000;
        let mut slot = from;
        for _ in 0..LIMIT {
            match self.next_after(slot) {
                Some(next) if next <= now => slot = next,
                _ => break,
            }
        }
        slot
    }
}

/// A fixed period aligned to the Unix epoch: the slots are the multiples
/// of the period (every second: each whole second; every 5 min: :00, :05...).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Every {
    period_ms: u64,
}

/// A period shorter than one millisecond.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct InvalidPeriod;

impl fmt::Display for InvalidPeriod {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a schedule period must be a whole number of milliseconds, at least 1")
    }
}

impl core::error::Error for InvalidPeriod {}

impl Every {
    /// Slots every `period`; it must be a whole number of milliseconds,
    /// at least one.
    pub const fn new(period: Duration) -> Result<Every, InvalidPeriod> {
        let nanos = period.as_nanos();
        if nanos == 0 || !nanos.is_multiple_of(1_000_000) || nanos / 1_000_000 > u64::MAX as u128 {
            return Err(InvalidPeriod);
        }
        #[allow(clippy::cast_possible_truncation, reason = "checked above")]
        let period_ms = (nanos / 1_000_000) as u64;
        Ok(Every { period_ms })
    }

    /// The period.
    pub const fn period(&self) -> Duration {
        Duration::from_millis(self.period_ms)
    }

    /// The slot containing `t`: the latest multiple of the period `<= t`.
    pub const fn slot_of(&self, t: UnixMillis) -> UnixMillis {
        let into_period = match t.0.checked_rem(self.period_ms) {
            Some(r) => r,
            None => 0, // period_ms >= 1 by construction
        };
        UnixMillis(t.0.saturating_sub(into_period))
    }
}

impl Schedule for Every {
    fn next_after(&self, t: UnixMillis) -> Option<UnixMillis> {
        self.slot_of(t)
            .0
            .checked_add(self.period_ms)
            .map(UnixMillis)
    }

    fn latest_between(&self, from: UnixMillis, now: UnixMillis) -> UnixMillis {
        self.slot_of(now).max(from)
    }
}

/// Tracks the next planned slot of one replica's timer, with the
/// original's rule for timers that fire early or late.
///
/// ```
/// use core::time::Duration;
/// use guard_core::slot::{Every, SlotTimer, UnixMillis};
///
/// let every_second = Every::new(Duration::from_secs(1))?;
/// let mut timer = SlotTimer::new(every_second, UnixMillis(10_400));
/// assert_eq!(timer.next_fire(), Some(UnixMillis(11_000)));
/// // The timer fires a little early: it still runs the planned slot.
/// assert_eq!(timer.fire(UnixMillis(10_998)), Some(UnixMillis(11_000)));
/// // The replica was paused: stale slots are skipped, the newest runs.
/// assert_eq!(timer.fire(UnixMillis(15_300)), Some(UnixMillis(15_000)));
/// assert_eq!(timer.next_fire(), Some(UnixMillis(16_000)));
/// # Ok::<(), guard_core::slot::InvalidPeriod>(())
/// ```
#[derive(Clone, Debug)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct SlotTimer<S> {
    schedule: S,
    next: Option<UnixMillis>,
}

impl<S: Schedule> SlotTimer<S> {
    /// A timer whose first slot is the first planned instant after `now`.
    pub fn new(schedule: S, now: UnixMillis) -> Self {
        let next = schedule.next_after(now);
        SlotTimer { schedule, next }
    }

    /// When the timer should fire next (`None`: the schedule has ended).
    pub fn next_fire(&self) -> Option<UnixMillis> {
        self.next
    }

    /// The timer fired at `now`: returns the planned slot to run.
    ///
    /// A timer that fires early (`now` before the planned instant) still
    /// maps to that planned slot; a late one skips the slots it missed and
    /// runs only the newest planned slot `<= now`.
    pub fn fire(&mut self, now: UnixMillis) -> Option<UnixMillis> {
        let planned = self.next?;
        let slot = if now < planned {
            planned
        } else {
            self.schedule.latest_between(planned, now)
        };
        self.next = self.schedule.next_after(slot.max(now));
        Some(slot)
    }

    /// The schedule.
    pub fn schedule(&self) -> &S {
        &self.schedule
    }
}
