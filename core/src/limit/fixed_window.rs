//! Fixed windows: a quota per aligned period, given back all at once.

use core::time::Duration;

use super::{Algorithm, CostAboveLimit, Decision, LimiterError, Report};
use crate::time::{Instant, nanos_saturating};

/// A fixed-window counter: at most `limit` units in each window, the
/// windows laid end to end at instants `offset + k × period`, and a
/// window's whole quota given back at once when it ends.
///
/// This is the quota of a metered uplink ("10,000 messages an hour", "50
/// MB a day"), Bucket4j's interval refill aligned to boundaries and
/// Resilience4j's `limitForPeriod`: a client can read when its quota
/// comes back, and every key's comes back at the same instant. It is not
/// a smoothing limiter: a key may spend its whole quota at the end of one
/// window and again at the start of the next, `2 × limit` in a short
/// while. Put a bucket in front of it where bursts matter.
///
/// **Alignment.** The windows are aligned to the clock's origin, shifted
/// by `offset` (reduced modulo `period`). Read the clock from the Unix
/// epoch and a period of a day gives calendar days in UTC; an offset
/// gives them in a time zone at a fixed offset from UTC: local midnight at
/// UTC+02:00 is 22:00 UTC, so `with_offset(22 h)`
/// ([`FixedWindow::with_utc_offset`] computes it). A zone that moves
/// its clocks (daylight saving time) has days of 23 and 25 hours, which
/// a fixed period cannot follow: its windows start an hour off local
/// midnight while the offset differs from the one given. Before the first
/// boundary (`offset` itself), readings fall in a window `[0, offset)`.
///
/// **Readings out of order.** A reading from an earlier window than the
/// key's newest count is counted in that newest window, as a sliding
/// window records such a reading at its newest instant: a clock that
/// steps back never gives a key a window's quota again. A denial still
/// measures its wait from the caller's own reading. So over readings that
/// span `min..=max`, in any order, a key is admitted at most `limit`
/// units in each window those readings touch.
///
/// A window that would end after [`Instant::MAX`] never ends: the key is
/// refused until it is reset.
///
/// ```
/// use core::time::Duration;
/// use guard_core::limit::{FixedWindow, Limiter};
/// use guard_core::time::Instant;
///
/// // Three per minute, minutes aligned to the clock's origin.
/// let mut l = Limiter::new(FixedWindow::new(Duration::from_secs(60), 3)?);
/// let t = Instant::from_secs(120); // a minute's boundary
/// assert!(l.check(t + Duration::from_secs(50)).is_allowed());
/// assert!(l.check(t + Duration::from_secs(55)).is_allowed());
/// assert!(l.check(t + Duration::from_secs(59)).is_allowed());
/// let denied = l.check(t + Duration::from_secs(59));
/// // The quota comes back at the next boundary, a second later.
/// assert_eq!(denied.retry_after(), Some(Duration::from_secs(1)));
/// assert!(l.check(t + Duration::from_secs(60)).is_allowed());
/// # Ok::<(), guard_core::limit::LimiterError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct FixedWindow {
    /// The window's length in nanoseconds, at least 1.
    period: u64,
    /// Where windows start, past each multiple of `period`: below `period`.
    offset: u64,
    limit: u32,
}

/// Seconds in a day: the period of [`FixedWindow::days_at_utc_offset`],
/// and the bound of a zone's offset from UTC.
const DAY_SECS: u64 = 86_400;

impl FixedWindow {
    /// At most `limit` units per `period`, windows starting at multiples of
    /// `period` from the clock's origin.
    ///
    /// Errors on a zero period or a zero limit. A period of `u64::MAX`
    /// nanoseconds or longer (`Duration::MAX` among them) ends its first
    /// window at [`Instant::MAX`].
    pub const fn new(period: Duration, limit: u32) -> Result<Self, LimiterError> {
        let period = nanos_saturating(period);
        if period == 0 {
            return Err(LimiterError::ZeroWindow);
        }
        if limit == 0 {
            return Err(LimiterError::ZeroLimit);
        }
        Ok(FixedWindow {
            period,
            offset: 0,
            limit,
        })
    }

    /// Windows that start `offset` past each multiple of the period
    /// (reduced modulo the period: an offset of a period and an hour
    /// aligns as one of an hour).
    #[must_use]
    pub const fn with_offset(mut self, offset: Duration) -> Self {
        // The period is at least 1 ns (checked by `new`).
        self.offset = match nanos_saturating(offset).checked_rem(self.period) {
            Some(offset) => offset,
            None => 0,
        };
        self
    }

    /// Windows aligned to local time in a zone `seconds_east` of UTC
    /// (`7200` for UTC+02:00, `-18000` for UTC−05:00), on a clock read
    /// from the Unix epoch: a day starts at local midnight, an hour at
    /// local :00 (:30 in a zone at +05:30).
    ///
    /// Errors on an offset of a day or more either way (real zones lie
    /// within −12 h and +14 h).
    pub const fn with_utc_offset(self, seconds_east: i32) -> Result<Self, LimiterError> {
        let east = seconds_east.unsigned_abs() as u64;
        if east >= DAY_SECS {
            return Err(LimiterError::OffsetAboveWindow {
                offset_secs: seconds_east as i64,
                window_secs: DAY_SECS,
            });
        }
        // Local time east of UTC reaches a boundary that much earlier in
        // UTC: the windows start at -east modulo the period. east is
        // below a day, so its nanoseconds fit in a u64.
        let east = match east.checked_mul(1_000_000_000) {
            Some(nanos) => nanos,
            None => 0,
        };
        let into = match east.checked_rem(self.period) {
            Some(into) => into,
            None => 0,
        };
        let offset = if seconds_east > 0 && into > 0 {
            self.period.saturating_sub(into)
        } else {
            into
        };
        Ok(FixedWindow { offset, ..self })
    }

    /// At most `limit` units per calendar day in a time zone
    /// `seconds_east` of UTC ([`Self::with_utc_offset`] of a day's
    /// window).
    ///
    /// Errors on a zero limit, or an offset of a day or more either way.
    ///
    /// ```
    /// use guard_core::limit::FixedWindow;
    /// use guard_core::time::Instant;
    ///
    /// let days = FixedWindow::days_at_utc_offset(7_200, 100)?;
    /// // 2026-12-02T22:00:00Z is midnight at UTC+02:00.
    /// let midnight = Instant::from_secs(1_796_248_800);
    /// assert_eq!(days.window_start(midnight), midnight);
    /// # Ok::<(), guard_core::limit::LimiterError>(())
    /// ```
    pub const fn days_at_utc_offset(seconds_east: i32, limit: u32) -> Result<Self, LimiterError> {
        match FixedWindow::new(Duration::from_secs(DAY_SECS), limit) {
            Ok(days) => days.with_utc_offset(seconds_east),
            Err(e) => Err(e),
        }
    }

    /// The window's length (`u64::MAX` nanoseconds for a window over the
    /// clock's whole range).
    pub const fn period(&self) -> Duration {
        Duration::from_nanos(self.period)
    }

    /// Where windows start past each multiple of the period.
    pub const fn offset(&self) -> Duration {
        Duration::from_nanos(self.offset)
    }

    /// Units admitted per window.
    pub const fn limit(&self) -> u32 {
        self.limit
    }

    /// The start of the window that holds `at`.
    pub const fn window_start(&self, at: Instant) -> Instant {
        let at = at.as_nanos();
        if at < self.offset {
            return Instant::ZERO;
        }
        // offset <= at, and the period is at least 1 ns.
        let into = match at.saturating_sub(self.offset).checked_rem(self.period) {
            Some(into) => into,
            None => 0,
        };
        Instant::from_nanos(at.saturating_sub(into))
    }

    /// The end of the window that starts at `start` (the next window's
    /// start), `None` if it lies beyond [`Instant::MAX`].
    pub const fn window_end(&self, start: Instant) -> Option<Instant> {
        let start = start.as_nanos();
        if start < self.offset {
            // The partial window before the first boundary.
            return Some(Instant::from_nanos(self.offset));
        }
        match start.checked_add(self.period) {
            Some(end) => Some(Instant::from_nanos(end)),
            None => None,
        }
    }

    /// The window a count kept in `count` is charged to at `now`, and the
    /// units already used in it: the window of `now`, or the count's own
    /// if `now` is earlier (a reading out of order is charged to the
    /// newest window).
    const fn charged(&self, count: &WindowCount, now: Instant) -> (Instant, u32) {
        let window = self.window_start(now);
        if count.used == 0 || count.start.as_nanos() < window.as_nanos() {
            (window, 0)
        } else {
            (count.start, count.used)
        }
    }

    /// Decides `cost` units (`cost <= limit`) at `now`, with the report.
    fn decide_n(&self, count: &mut WindowCount, cost: u32, now: Instant) -> Report {
        let (start, used) = self.charged(count, now);
        // The end of the charged window; one that never ends is waited
        // for until the end of the clock.
        let end = self.window_end(start).unwrap_or(Instant::MAX);
        // used <= limit unless a reconfiguration lowered the limit.
        let (decision, used) = match used.checked_add(cost) {
            Some(after) if after <= self.limit => {
                if cost > 0 {
                    *count = WindowCount { start, used: after };
                }
                (Decision::Allowed, after)
            }
            _ => (Decision::denied_until(end, now), used),
        };
        Report {
            decision,
            limit: self.limit,
            remaining: self.limit.saturating_sub(used),
            reset_after: if used == 0 {
                Duration::ZERO
            } else {
                end.saturating_duration_since(now)
            },
        }
    }
}

/// One key's fixed-window count: the window it was last charged in and
/// the units used there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct WindowCount {
    start: Instant,
    used: u32,
}

impl WindowCount {
    /// A key that has used nothing.
    pub const NEW: WindowCount = WindowCount {
        start: Instant::ZERO,
        used: 0,
    };

    /// The start of the window the count belongs to.
    pub const fn window_start(&self) -> Instant {
        self.start
    }

    /// Units used in that window.
    pub const fn used(&self) -> u32 {
        self.used
    }
}

impl Default for WindowCount {
    fn default() -> Self {
        Self::NEW
    }
}

impl Algorithm for FixedWindow {
    type State = WindowCount;
    const NEW_STATE: WindowCount = WindowCount::NEW;

    fn check(&self, count: &mut WindowCount, now: Instant) -> Decision {
        // One unit never exceeds the limit (at least 1).
        self.decide_n(count, 1, now).decision
    }

    fn limit(&self) -> u32 {
        self.limit
    }

    /// `cost` units in the window of `now`, all or nothing.
    fn check_n(
        &self,
        count: &mut WindowCount,
        cost: u32,
        now: Instant,
    ) -> Result<Report, CostAboveLimit> {
        if cost > self.limit {
            return Err(CostAboveLimit {
                cost,
                limit: self.limit,
            });
        }
        Ok(self.decide_n(count, cost, now))
    }

    /// Keeps what the key used in its current window, charged to the new
    /// parameters' window that holds `now` (or the key's newest reading,
    /// if later). A window that had ended under the old parameters leaves
    /// the key new. A key that used more than a lowered limit is refused
    /// until its window ends.
    fn carry_over(&self, previous: &Self, count: &mut WindowCount, now: Instant) {
        if count.used == 0 {
            return;
        }
        let ended = previous
            .window_end(count.start)
            .is_some_and(|end| now.as_nanos() >= end.as_nanos());
        *count = if ended {
            WindowCount::NEW
        } else {
            let at = if count.start.as_nanos() > now.as_nanos() {
                count.start
            } else {
                now
            };
            WindowCount {
                start: self.window_start(at),
                used: count.used,
            }
        };
    }

    fn fresh_at(&self, count: &WindowCount) -> Option<Instant> {
        if count.used == 0 {
            return Some(Instant::ZERO);
        }
        self.window_end(count.start)
    }

    /// The window that ended last at or before `at`, full: every count
    /// fresh by `at` is of that window or an earlier one, and this one
    /// refuses every reading before `at` that such a count could admit.
    /// If no window has ended by `at`, only the new count is fresh.
    fn state_settled_at(&self, at: Instant) -> WindowCount {
        let start = self.window_start(at);
        let s = start.as_nanos();
        let previous = if s == 0 {
            // No window ends at the origin.
            None
        } else if s == self.offset {
            // The partial window before the first boundary.
            Some(Instant::ZERO)
        } else {
            // s >= offset + period: a whole window ends at s.
            Some(Instant::from_nanos(s.saturating_sub(self.period)))
        };
        match previous {
            Some(start) => WindowCount {
                start,
                used: self.limit,
            },
            None => WindowCount::NEW,
        }
    }
}
