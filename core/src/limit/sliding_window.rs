//! Sliding-window log: remember the instants of the last admissions.

use core::time::Duration;

use heapless::Deque;

use super::{Algorithm, Decision, LimiterError};
use crate::time::{Instant, nanos_saturating};

/// A sliding-window log limiter: at most `limit` admissions in any window
/// of length `window`.
///
/// At `now`, admissions at instants `<= now - window` have left the window
/// (the boundary is inclusive, as in the original); a request is admitted
/// if fewer than `limit` remain. A denied request is not recorded. Each key
/// stores up to `N` instants, so `limit <= N` (8 bytes per instant).
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
    /// Errors on a zero window, a zero limit, or a limit above `N`.
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

    /// The window length.
    pub const fn window(&self) -> Duration {
        Duration::from_nanos(self.window)
    }

    /// Admissions allowed per window.
    pub const fn limit(&self) -> u32 {
        self.limit
    }

    /// Admissions still inside the window at `now`.
    pub fn in_window(&self, log: &WindowLog<N>, now: Instant) -> usize {
        let Some(cutoff) = now.as_nanos().checked_sub(self.window) else {
            return log.admitted.len();
        };
        log.admitted
            .iter()
            .filter(|t| t.as_nanos() > cutoff)
            .count()
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
        // Keep the log sorted: a clock read out of order is recorded at the
        // newest instant already in the log. That is conservative (the entry
        // leaves the window later), so a backwards timestamp never frees room.
        let now = match log.admitted.back() {
            Some(&newest) if newest > now => newest,
            _ => now,
        };
        // Before `window` has passed since the origin nothing can have left.
        if let Some(cutoff) = now.as_nanos().checked_sub(self.window) {
            while log
                .admitted
                .front()
                .is_some_and(|oldest| oldest.as_nanos() <= cutoff)
            {
                log.admitted.pop_front();
            }
        }
        if log.admitted.len() < self.limit as usize {
            // len < limit <= N, so the log has room; were it ever full the
            // request is refused rather than lost or panicking.
            if log.admitted.push_back(now).is_ok() {
                return Decision::Allowed;
            }
        }
        match log.admitted.front() {
            // The oldest admission leaves the window at oldest + window.
            Some(&oldest) => Decision::denied_until(
                oldest.saturating_add(Duration::from_nanos(self.window)),
                now,
            ),
            None => Decision::denied_until(now, now),
        }
    }

    fn fresh_at(&self, log: &WindowLog<N>) -> Instant {
        match log.admitted.back() {
            Some(&newest) => newest.saturating_add(Duration::from_nanos(self.window)),
            None => Instant::ZERO,
        }
    }
}
