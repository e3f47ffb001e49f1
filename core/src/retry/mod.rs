//! Retry: a policy (how many times, how long to wait), jitter from random
//! bits the caller supplies, error classification, and executors that
//! listen: to the wait an error asks for ([`RetryExecutor::with_hint`],
//! [`RetryAfter`] for HTTP's header) and to a budget shared with other
//! callers ([`RetryExecutor::with_budget`], [`RetryBudget`]).
//!
//! Semantics follow the original module: `max_attempts` counts *retries*
//! after the first call, so a policy makes `max_attempts + 1` calls in all
//! (at least one); `delay_for_attempt(n)` is the wait after the `n`-th
//! failed call (1-based), `initial * multiplier^(n-1)` when exponential,
//! capped at `max_delay`, never overflowing. All arithmetic is integer.
//!
//! ```
//! use core::time::Duration;
//! use guard_core::retry::RetryPolicy;
//!
//! let policy = RetryPolicy::new(); // 3 retries, 100 ms, x2, cap 10 s
//! let waits: Vec<_> = (1..=5).map(|n| policy.delay_for_attempt(n)).collect();
//! assert_eq!(waits, [100, 200, 400, 800, 1600].map(Duration::from_millis));
//! assert_eq!(policy.total_calls(), 4);
//! ```

mod after;
mod backoff;
mod budget;
mod classify;
mod executor;

pub use after::{InvalidRetryAfter, RetryAfter};
pub use backoff::{Backoff, Jitter, RandomSource, WithoutRandom};
pub use budget::{
    Budget, BudgetOnClock, InvalidRetryBudget, RetryBudget, SharedRetryBudget, Unbudgeted,
};
pub use classify::{Classifier, Classify, Hinted};
pub use executor::{GiveUpReason, Interrupted, JitterNeedsRandom, RetryError, RetryExecutor};

use core::time::Duration;

use crate::time::nanos_saturating;

/// The factor by which each exponential delay grows, in thousandths
/// (`2000` is ×2.0, `1500` is ×1.5). Multiples of 0.125 are exact; others
/// are exact to 2⁻³² per step. A factor below 1 shrinks the delays.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct Multiplier {
    per_mille: u32,
}

impl Multiplier {
    /// ×2, the default.
    pub const DOUBLE: Multiplier = Multiplier::whole(2);

    /// A whole factor (saturating at ×4 294 967).
    pub const fn whole(factor: u32) -> Multiplier {
        Multiplier {
            per_mille: factor.saturating_mul(1000),
        }
    }

    /// A factor in thousandths.
    pub const fn per_mille(per_mille: u32) -> Multiplier {
        Multiplier { per_mille }
    }

    /// The factor in thousandths.
    pub const fn as_per_mille(&self) -> u32 {
        self.per_mille
    }
}

/// How many times to retry and how long to wait in between.
///
/// Build it from [`RetryPolicy::new`] (the original's defaults) and the
/// `with_*` methods, or from [`RetryPolicy::no_retry`] and
/// [`RetryPolicy::fixed_delay`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct RetryPolicy {
    max_attempts: u32,
    initial_delay: Duration,
    max_delay: Duration,
    multiplier: Multiplier,
    exponential: bool,
    jitter: Jitter,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self::new()
    }
}

impl RetryPolicy {
    /// The original's defaults: 3 retries (4 calls), 100 ms initial delay,
    /// 10 s cap, ×2, exponential, no jitter.
    pub const fn new() -> Self {
        RetryPolicy {
            max_attempts: 3,
            initial_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(10),
            multiplier: Multiplier::DOUBLE,
            exponential: true,
            jitter: Jitter::None,
        }
    }

    /// One call, no retry.
    pub const fn no_retry() -> Self {
        Self::new().with_max_attempts(0)
    }

    /// `retries` retries, each after the same `delay`.
    pub const fn fixed_delay(retries: u32, delay: Duration) -> Self {
        Self::new()
            .with_max_attempts(retries)
            .with_initial_delay(delay)
            .with_exponential(false)
    }

    /// Retries after the first call (the original's `maxAttempts`).
    pub const fn with_max_attempts(mut self, retries: u32) -> Self {
        self.max_attempts = retries;
        self
    }

    /// The wait after the first failure.
    pub const fn with_initial_delay(mut self, delay: Duration) -> Self {
        self.initial_delay = delay;
        self
    }

    /// The cap on every wait (exponential or fixed).
    pub const fn with_max_delay(mut self, delay: Duration) -> Self {
        self.max_delay = delay;
        self
    }

    /// The exponential growth factor.
    pub const fn with_multiplier(mut self, multiplier: Multiplier) -> Self {
        self.multiplier = multiplier;
        self
    }

    /// Exponential (`true`) or fixed (`false`) delays.
    pub const fn with_exponential(mut self, exponential: bool) -> Self {
        self.exponential = exponential;
        self
    }

    /// Randomises the waits; the executor then needs a [`RandomSource`].
    pub const fn with_jitter(mut self, jitter: Jitter) -> Self {
        self.jitter = jitter;
        self
    }

    /// Retries after the first call.
    pub const fn max_attempts(&self) -> u32 {
        self.max_attempts
    }

    /// Calls in all: `max_attempts + 1`, saturating.
    pub const fn total_calls(&self) -> u32 {
        self.max_attempts.saturating_add(1)
    }

    /// The wait after the first failure.
    pub const fn initial_delay(&self) -> Duration {
        self.initial_delay
    }

    /// The cap on every wait.
    pub const fn max_delay(&self) -> Duration {
        self.max_delay
    }

    /// The growth factor.
    pub const fn multiplier(&self) -> Multiplier {
        self.multiplier
    }

    /// Whether delays grow.
    pub const fn is_exponential(&self) -> bool {
        self.exponential
    }

    /// The jitter mode.
    pub const fn jitter(&self) -> Jitter {
        self.jitter
    }

    /// The wait (before jitter) after failed call `attempt` (1-based); zero
    /// for `attempt == 0`. Capped at `max_delay`; never overflows.
    pub const fn delay_for_attempt(&self, attempt: u32) -> Duration {
        if attempt == 0 {
            return Duration::ZERO;
        }
        let initial = nanos_saturating(self.initial_delay) as u128;
        let cap = nanos_saturating(self.max_delay) as u128;
        let delay = if self.exponential && attempt > 1 {
            scale(
                initial,
                self.multiplier.per_mille,
                attempt.saturating_sub(1),
            )
        } else {
            initial
        };
        let capped = if delay < cap { delay } else { cap };
        #[allow(clippy::cast_possible_truncation, reason = "capped <= cap <= u64::MAX")]
        let capped = capped as u64;
        Duration::from_nanos(capped)
    }
}

/// Fixed-point scale: 1.0 is 2^32.
const ONE: u128 = 1 << 32;
/// Any factor at or above 2^64 (in Q32: 2^96) exceeds every cap; clamping
/// there keeps every product inside u128.
const HUGE: u128 = 1 << 96;

const fn mul_q32(a: u128, b: u128) -> u128 {
    match a.checked_mul(b) {
        Some(p) => {
            let r = p >> 32;
            if r > HUGE { HUGE } else { r }
        }
        None => HUGE,
    }
}

/// `value * (per_mille / 1000)^power`, by square-and-multiply in Q32, so
/// the cost is logarithmic in `power` and nothing overflows.
const fn scale(value: u128, per_mille: u32, power: u32) -> u128 {
    // per_mille < 2^32, so the product stays below 2^64.
    let mut base = (per_mille as u128).saturating_mul(ONE) / 1000;
    let mut factor = ONE;
    let mut k = power;
    while k > 0 {
        if k & 1 == 1 {
            factor = mul_q32(factor, base);
        }
        k >>= 1;
        if k > 0 {
            base = mul_q32(base, base);
        }
    }
    match value.checked_mul(factor) {
        Some(p) => p >> 32,
        None => u128::MAX,
    }
}
