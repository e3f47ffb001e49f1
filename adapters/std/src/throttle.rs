//! Logs that cannot become the outage: a line repeated by a fault (an
//! accept error, a backend error every slot, a failed renewal) is let
//! through once per [`THROTTLE_INTERVAL`], with the count of the ones held
//! back.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use guard_core::limit::{Limiter, Rate, TokenBucket};

use crate::clock::{Clock, SystemClock};

/// At most one line of a kind per this interval.
pub const THROTTLE_INTERVAL: Duration = Duration::from_secs(10);

/// One line per interval: guard-core's token bucket of one. Checked when
/// compiled: a refused parameter would fail the build, never a run.
const ONE_PER_INTERVAL: TokenBucket = match TokenBucket::new(1, Rate::per(1, THROTTLE_INTERVAL)) {
    Ok(bucket) => bucket,
    Err(_) => panic!("a bucket of one token per interval is valid"),
};

/// Decides whether a repeated log line may be written now: the first
/// occurrence, then at most one per [`THROTTLE_INTERVAL`], each saying
/// how many were held back since the last.
///
/// ```
/// use guard_std::Throttle;
///
/// let throttle = Throttle::new();
/// assert_eq!(throttle.admit(), Some(0), "the first one is logged");
/// assert_eq!(throttle.admit(), None, "the next ones are counted");
/// assert_eq!(throttle.admit(), None);
/// ```
#[derive(Debug)]
pub struct Throttle {
    state: Mutex<(Limiter<TokenBucket>, u64)>,
    clock: SystemClock,
}

impl Default for Throttle {
    fn default() -> Self {
        Self::new()
    }
}

impl Throttle {
    /// Nothing logged yet.
    pub fn new() -> Self {
        Throttle {
            state: Mutex::new((Limiter::new(ONE_PER_INTERVAL), 0)),
            clock: SystemClock::new(),
        }
    }

    /// `Some(held back since the last line)` when a line may be written
    /// now; `None` when this one is only counted.
    pub fn admit(&self) -> Option<u64> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let (limiter, held) = &mut *state;
        if limiter.check(self.clock.now()).is_allowed() {
            Some(std::mem::take(held))
        } else {
            *held = held.saturating_add(1);
            None
        }
    }
}
