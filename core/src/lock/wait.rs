//! Waiting for a lock: `lock` and `lock_with_retry` on any [`Locker`].

use core::fmt;
use core::time::Duration;

use embedded_hal_async::delay::DelayNs;

use super::{Locker, Token, Ttl};
use crate::time::delay_for;

/// The original's poll interval for a blocking `lock`.
pub const DEFAULT_POLL: Duration = Duration::from_millis(50);

/// Why `lock_with_retry` gave up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum LockWithRetryError<E> {
    /// Every attempt found the key held.
    NotAcquired {
        /// Attempts made (`max_retries + 1`).
        attempts: u32,
    },
    /// The backend failed; no further attempt was made.
    Backend(E),
}

impl<E: fmt::Display> fmt::Display for LockWithRetryError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LockWithRetryError::NotAcquired { attempts } => {
                write!(f, "lock not acquired after {attempts} attempt(s)")
            }
            LockWithRetryError::Backend(e) => write!(f, "lock failed: {e}"),
        }
    }
}

/// A backend failure is the source.
impl<E: core::error::Error + 'static> core::error::Error for LockWithRetryError<E> {
    fn source(&self) -> Option<&(dyn core::error::Error + 'static)> {
        match self {
            LockWithRetryError::Backend(e) => Some(e),
            LockWithRetryError::NotAcquired { .. } => None,
        }
    }
}

/// Waiting forms of [`Locker::try_lock`], for every locker. Waits go
/// through an `embedded_hal_async` delay, so they run on embassy and on
/// servers alike; dropping the future stops waiting.
#[allow(
    async_fn_in_trait,
    reason = "Send-ness follows the locker and the delay"
)]
pub trait LockerExt: Locker {
    /// Waits until `key` is acquired, trying every `poll`. A backend error
    /// ends the wait.
    async fn lock<D: DelayNs>(
        &self,
        key: &str,
        ttl: Ttl,
        poll: Duration,
        delay: &mut D,
    ) -> Result<Token, Self::Error> {
        loop {
            if let Some(token) = self.try_lock(key, ttl).await? {
                return Ok(token);
            }
            delay_for(delay, poll).await;
        }
    }

    /// Makes `max_retries + 1` attempts, the first at once, `interval`
    /// apart, with no wait after the last. A backend error ends at once.
    async fn lock_with_retry<D: DelayNs>(
        &self,
        key: &str,
        ttl: Ttl,
        interval: Duration,
        max_retries: u32,
        delay: &mut D,
    ) -> Result<Token, LockWithRetryError<Self::Error>> {
        let attempts = max_retries.saturating_add(1);
        for attempt in 1..=attempts {
            match self.try_lock(key, ttl).await {
                Ok(Some(token)) => return Ok(token),
                Ok(None) if attempt < attempts => delay_for(delay, interval).await,
                Ok(None) => {}
                Err(e) => return Err(LockWithRetryError::Backend(e)),
            }
        }
        Err(LockWithRetryError::NotAcquired { attempts })
    }
}

impl<L: Locker + ?Sized> LockerExt for L {}
