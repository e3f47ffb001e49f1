//! A token bucket shared through `&self`: its state is one atomic word.

use super::gcra::BucketState;
use super::{Algorithm, CostAboveLimit, Decision, Report, TokenBucket};
use crate::sync::{AtomicU64, Ordering};
use crate::time::Instant;

/// A lock-free token bucket for one key, usable from several threads or
/// from interrupt handlers through `&self`.
///
/// The whole bucket is one `u64` (the GCRA settle instant) updated by a
/// compare-and-swap loop around the same decision function as
/// [`TokenBucket`] in a [`super::Limiter`], so both decide identically for
/// the same sequence of calls. Concurrent callers at one instant can never
/// take more tokens than the bucket holds: every admission moves the word
/// forward by one refill interval, and only a caller whose CAS succeeded
/// was admitted.
///
/// It keeps the token bucket's budget on any clock, readings out of order
/// and up to [`Instant::MAX`] included, and a reading far in the future
/// holds it back the same way, saying so in each denial (see
/// [`super::Bucket`]); [`Self::reset`] recovers it.
///
/// Available where the target has compare-and-swap, or with the crate
/// feature `critical-section` (required on Cortex-M0, recommended on other
/// 32-bit Cortex-M when shared with interrupt handlers: see [`crate::sync`]).
///
/// ```
/// use guard_core::limit::{AtomicTokenBucket, Rate, TokenBucket};
/// use guard_core::time::Instant;
///
/// static BUCKET: AtomicTokenBucket = AtomicTokenBucket::new(
///     match TokenBucket::new(3, Rate::per_second(3)) {
///         Ok(bucket) => bucket,
///         Err(_) => panic!("invalid bucket parameters"),
///     },
/// );
/// let now = Instant::from_secs(1);
/// let admitted = (0..5).filter(|_| BUCKET.check(now).is_allowed()).count();
/// assert_eq!(admitted, 3);
/// ```
#[derive(Debug)]
pub struct AtomicTokenBucket {
    bucket: TokenBucket,
    settles_at: AtomicU64,
}

impl AtomicTokenBucket {
    /// A full bucket.
    #[cfg(not(guard_loom))]
    pub const fn new(bucket: TokenBucket) -> Self {
        AtomicTokenBucket {
            bucket,
            settles_at: AtomicU64::new(0),
        }
    }

    /// A full bucket (loom's atomics have no `const` constructor).
    #[cfg(guard_loom)]
    pub fn new(bucket: TokenBucket) -> Self {
        AtomicTokenBucket {
            bucket,
            settles_at: AtomicU64::new(0),
        }
    }

    /// Decides one request at `now`.
    pub fn check(&self, now: Instant) -> Decision {
        // Relaxed is enough: the decision depends on this one word only and
        // publishes no other memory; the CAS alone makes admissions unique.
        let mut current = self.settles_at.load(Ordering::Relaxed);
        loop {
            match self.bucket.gcra().decide(current, now.as_nanos()) {
                Err(admit_from) => {
                    return Decision::denied_until(Instant::from_nanos(admit_from), now);
                }
                Ok(next) => match self.settles_at.compare_exchange_weak(
                    current,
                    next,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => return Decision::Allowed,
                    Err(actual) => current = actual,
                },
            }
        }
    }

    /// Decides a request of `cost` tokens at `now`, all or nothing, with
    /// the bucket's quota after it; see [`super::Algorithm::check_n`].
    /// Decides as [`TokenBucket`] does through a [`super::Limiter`].
    pub fn check_n(&self, cost: u32, now: Instant) -> Result<Report, CostAboveLimit> {
        let mut current = self.settles_at.load(Ordering::Relaxed);
        loop {
            let mut state = BucketState::settling_at(Instant::from_nanos(current));
            let report = self.bucket.check_n(&mut state, cost, now)?;
            let next = state.settles_at().as_nanos();
            // A refusal or a cost of zero changes nothing: no write.
            if next == current {
                return Ok(report);
            }
            match self.settles_at.compare_exchange_weak(
                current,
                next,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Ok(report),
                Err(actual) => current = actual,
            }
        }
    }

    /// Whole tokens available at `now` (a snapshot; others may take them).
    pub fn available(&self, now: Instant) -> u32 {
        self.bucket.available(&self.state(), now)
    }

    /// A snapshot of the state.
    pub fn state(&self) -> BucketState {
        BucketState::settling_at(Instant::from_nanos(self.settles_at.load(Ordering::Relaxed)))
    }

    /// The parameters.
    pub const fn bucket(&self) -> &TokenBucket {
        &self.bucket
    }

    /// Refills the bucket completely.
    pub fn reset(&self) {
        self.settles_at.store(0, Ordering::Relaxed);
    }
}

#[cfg(feature = "defmt")]
impl defmt::Format for AtomicTokenBucket {
    fn format(&self, f: defmt::Formatter<'_>) {
        defmt::write!(
            f,
            "AtomicTokenBucket {{ bucket: {}, state: {} }}",
            self.bucket,
            self.state()
        )
    }
}
