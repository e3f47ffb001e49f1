//! Sliding-window log: remember the instants of the last admissions.

use core::time::Duration;

use heapless::Deque;

use super::{Algorithm, CostAboveLimit, Decision, LimiterError, Report};
use crate::time::{Instant, nanos_saturating};

/// A sliding-window log limiter: at most `limit` admissions in any window
/// of length `window`.
///
/// At `now`, admissions at instants `<= now - window` have left the window
/// (the boundary is inclusive, as in the original); a request is admitted
/// if fewer than `limit` remain. A denied request is not recorded. Each key
/// stores up to `N` instants, so `limit <= N` (8 bytes per instant).
///
/// Over calls whose readings span `min..=max`, in any order, a key is
/// admitted at most `limit * ((max - min) / window + 1)` times: a reading
/// earlier than the newest admission is recorded at that admission's
/// instant, so recorded instants never go backwards. A window of
/// `u64::MAX` nanoseconds or longer (about 584 years, the clock's whole
/// range; `Duration::MAX` among them) never lets an admission leave: at
/// most `limit` admissions, ever. The instant at which an admission leaves
/// is computed without saturating, so one that would leave after
/// [`Instant::MAX`] never leaves, and a keyed table never forgets it.
///
/// A reading far in the future is recorded like any other: the key is
/// then refused for one window whatever the clock says after, and each
/// denial's `retry_after` says how long. [`super::Limiter::reset`] or
/// [`super::Keyed::forget`] recovers it.
///
/// ```
/// use core::time::Duration;
/// use guard_core::limit::{Limiter, SlidingWindow};
/// use guard_core::time::Instant;
///
/// let mut l = Limiter::new(SlidingWindow::<4>::new(Duration::from_millis(1000), 2)?);
/// let t = Instant::from_secs(5);
/// assert!(l.check(t).is_allowed());
/// assert!(l.check(t + Duration::from_millis(100)).is_allowed());
/// assert!(l.check(t + Duration::from_millis(200)).is_denied());
/// // The first admission leaves the window at exactly t + 1000 ms.
/// assert!(l.check(t + Duration::from_millis(1000)).is_allowed());
/// # Ok::<(), guard_core::limit::LimiterError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct SlidingWindow<const N: usize> {
    window: u64,
    limit: u32,
}

impl<const N: usize> SlidingWindow<N> {
    /// At most `limit` admissions per `window`.
    ///
    /// Errors on a zero window, a zero limit, or a limit above `N`. A
    /// window of `u64::MAX` nanoseconds or longer never empties.
    pub const fn new(window: Duration, limit: u32) -> Result<Self, LimiterError> {
        const { assert!(N > 0, "a sliding window must be able to store an instant") };
        let window = nanos_saturating(window);
        if window == 0 {
            return Err(LimiterError::ZeroWindow);
        }
        if limit == 0 {
            return Err(LimiterError::ZeroLimit);
        }
        if limit as usize > N {
            return Err(LimiterError::LimitAboveMaximum { limit, maximum: N });
        }
        Ok(SlidingWindow { window, limit })
    }

    /// The window length (`u64::MAX` nanoseconds for a window that never
    /// empties).
    pub const fn window(&self) -> Duration {
        Duration::from_nanos(self.window)
    }

    /// The reading at which an admission at `at` leaves the window, `None`
    /// if it never does within the clock's range. Exact: a saturated
    /// instant would say the admission leaves at [`Instant::MAX`].
    const fn leaves_at(&self, at: Instant) -> Option<Instant> {
        if self.window == u64::MAX {
            // The window was at least the clock's whole range (a longer
            // Duration saturates to u64::MAX ns): nothing ever leaves.
            return None;
        }
        match at.as_nanos().checked_add(self.window) {
            Some(n) => Some(Instant::from_nanos(n)),
            None => None,
        }
    }

    /// Whether an admission at `at` is still inside the window at `now`.
    fn inside(&self, at: Instant, now: Instant) -> bool {
        self.leaves_at(at).is_none_or(|leaves| now < leaves)
    }

    /// Admissions allowed per window.
    pub const fn limit(&self) -> u32 {
        self.limit
    }

    /// Admissions still inside the window at `now`.
    pub fn in_window(&self, log: &WindowLog<N>, now: Instant) -> usize {
        log.admitted
            .iter()
            .filter(|&&t| self.inside(t, now))
            .count()
    }
}

impl<const N: usize> SlidingWindow<N> {
    /// Decides `cost` entries (`cost <= limit`) at `now`, with the report.
    fn decide_n(&self, log: &mut WindowLog<N>, cost: u32, now: Instant) -> Report {
        // Keep the log sorted: a clock read out of order is recorded at the
        // newest instant already in the log. That is conservative (the entry
        // leaves the window later), so a backwards timestamp never frees room.
        // A denial still measures its wait from the caller's own reading.
        let reading = now;
        let now = match log.admitted.back() {
            Some(&newest) if newest > now => newest,
            _ => now,
        };
        while log
            .admitted
            .front()
            .is_some_and(|&oldest| !self.inside(oldest, now))
        {
            log.admitted.pop_front();
        }
        let held = log.admitted.len();
        let cost = cost as usize;
        let after = held.saturating_add(cost);
        let decision = if after <= self.limit as usize && after <= N {
            // The log has room for every entry (after <= N), so no push
            // fails and the request is counted whole.
            for _ in 0..cost {
                if log.admitted.push_back(now).is_err() {
                    break;
                }
            }
            Decision::Allowed
        } else {
            // Room for `cost` more once `after - limit` of the held
            // admissions have left: the oldest first, so the wait ends
            // when the one at index `after - limit - 1` leaves. One that
            // never leaves asks to wait until the end of the clock.
            let index = after.saturating_sub(self.limit as usize).saturating_sub(1);
            match log.admitted.iter().nth(index) {
                Some(&leaving) => {
                    Decision::denied_until(self.leaves_at(leaving).unwrap_or(Instant::MAX), reading)
                }
                None => Decision::denied_until(now, reading),
            }
        };
        let held = log.admitted.len();
        let reset_at = match log.admitted.back() {
            Some(&newest) => self.leaves_at(newest).unwrap_or(Instant::MAX),
            None => reading,
        };
        Report {
            decision,
            limit: self.limit,
            #[allow(
                clippy::cast_possible_truncation,
                reason = "the difference is below limit, a u32"
            )]
            remaining: (self.limit as usize).saturating_sub(held) as u32,
            reset_after: reset_at.saturating_duration_since(reading),
        }
    }
}

/// One key's sliding-window log: the instants of its recent admissions,
/// oldest first.
#[derive(Clone, Debug)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct WindowLog<const N: usize> {
    admitted: Deque<Instant, N>,
}

impl<const N: usize> WindowLog<N> {
    /// An empty log.
    pub const fn new() -> Self {
        WindowLog {
            admitted: Deque::new(),
        }
    }

    /// The recorded admissions, oldest first (including ones that have left
    /// the window but were not pruned yet).
    pub fn iter(&self) -> impl Iterator<Item = &Instant> {
        self.admitted.iter()
    }
}

impl<const N: usize> Default for WindowLog<N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<const N: usize> Algorithm for SlidingWindow<N> {
    type State = WindowLog<N>;
    const NEW_STATE: WindowLog<N> = WindowLog::new();

    fn check(&self, log: &mut WindowLog<N>, now: Instant) -> Decision {
        // One unit never exceeds the limit (at least 1).
        self.decide_n(log, 1, now).decision
    }

    fn limit(&self) -> u32 {
        self.limit
    }

    /// `cost` entries at one instant, all or nothing: admitted when the
    /// window holds at most `limit - cost` admissions.
    fn check_n(
        &self,
        log: &mut WindowLog<N>,
        cost: u32,
        now: Instant,
    ) -> Result<Report, CostAboveLimit> {
        if cost > self.limit {
            return Err(CostAboveLimit {
                cost,
                limit: self.limit,
            });
        }
        Ok(self.decide_n(log, cost, now))
    }

    /// Keeps the log: its admissions are measured against the new window
    /// and limit. A key that holds more than a lowered limit is refused
    /// until enough of them have left the window.
    fn carry_over(&self, _previous: &Self, _log: &mut WindowLog<N>, _now: Instant) {}

    fn fresh_at(&self, log: &WindowLog<N>) -> Option<Instant> {
        match log.admitted.back() {
            Some(&newest) => self.leaves_at(newest),
            None => Some(Instant::ZERO),
        }
    }

    /// `limit` admissions that leave the window exactly at `at`: every log
    /// fresh by `at` holds at most `limit` admissions, each leaving at `at`
    /// or earlier. Before one window has passed since the origin no
    /// admission can have left, so only the empty log is fresh.
    fn state_settled_at(&self, at: Instant) -> WindowLog<N> {
        let mut log = WindowLog::new();
        if self.window == u64::MAX {
            return log;
        }
        if let Some(admitted) = at.as_nanos().checked_sub(self.window) {
            for _ in 0..self.limit {
                // limit <= N was checked by the constructor; a full log would
                // only hold fewer, still fresh by `at`.
                if log
                    .admitted
                    .push_back(Instant::from_nanos(admitted))
                    .is_err()
                {
                    break;
                }
            }
        }
        log
    }
}
