//! Executors that run an operation under a [`RetryPolicy`].

use core::fmt;
use core::future::Future;
use core::time::Duration;

use embedded_hal_async::delay::DelayNs;

use super::{Backoff, Classifier, RandomSource, RetryPolicy, WithoutRandom};
use crate::retry::Jitter;
use crate::time::delay_for;

/// Returned by a sleep function to stop retrying (shutdown, cancellation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Interrupted;

/// Why the executor stopped calling.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum GiveUpReason {
    /// Every call the policy allows failed.
    Exhausted,
    /// The classifier said the error is not worth retrying.
    NonRetryable,
    /// The sleep between calls was interrupted.
    Interrupted,
}

/// The last error of a retried operation, with the number of calls made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct RetryError<E> {
    /// The error of the last call.
    pub error: E,
    /// Calls made, including the first.
    pub attempts: u32,
    /// Why no further call was made.
    pub reason: GiveUpReason,
}

impl<E: fmt::Display> fmt::Display for RetryError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let why = match self.reason {
            GiveUpReason::Exhausted => "retries exhausted",
            GiveUpReason::NonRetryable => "error is not retryable",
            GiveUpReason::Interrupted => "retry interrupted",
        };
        write!(
            f,
            "gave up after {} attempt(s), {why}: {}",
            self.attempts, self.error
        )
    }
}

impl<E: fmt::Debug + fmt::Display> core::error::Error for RetryError<E> {}

/// A policy with jitter was given no source of random bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct JitterNeedsRandom;

impl fmt::Display for JitterNeedsRandom {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the retry policy has jitter but no random source was given")
    }
}

impl core::error::Error for JitterNeedsRandom {}

/// Runs operations under a [`RetryPolicy`] and a [`Classifier`].
///
/// [`RetryExecutor::run_blocking`] sleeps through a function the caller
/// gives (`std::thread::sleep`, a busy wait, a test clock);
/// [`RetryExecutor::run`] awaits an `embedded_hal_async` delay, so the same
/// code runs on embassy and on servers. Dropping the future of `run`
/// cancels cleanly: nothing is left half-done between calls.
///
/// ```
/// use core::time::Duration;
/// use guard_core::retry::{Classifier, GiveUpReason, RetryExecutor, RetryPolicy};
///
/// let policy = RetryPolicy::fixed_delay(2, Duration::from_millis(10));
/// let mut retry = RetryExecutor::new(policy, Classifier::retry_all())?;
/// let mut slept = Duration::ZERO;
/// let result: Result<(), _> = retry.run_blocking(
///     |d| { slept += d; Ok(()) },
///     |_attempt| Err("backend down"),
/// );
/// let err = result.unwrap_err();
/// assert_eq!((err.attempts, err.reason), (3, GiveUpReason::Exhausted));
/// assert_eq!(slept, Duration::from_millis(20));
/// # Ok::<(), guard_core::retry::JitterNeedsRandom>(())
/// ```
#[derive(Debug, Clone)]
pub struct RetryExecutor<E, R = WithoutRandom> {
    policy: RetryPolicy,
    classifier: Classifier<E>,
    random: R,
}

impl<E> RetryExecutor<E, WithoutRandom> {
    /// An executor without randomness; errors if `policy` has jitter.
    pub fn new(policy: RetryPolicy, classifier: Classifier<E>) -> Result<Self, JitterNeedsRandom> {
        Self::with_random(policy, classifier, WithoutRandom)
    }
}

impl<E, R: RandomSource> RetryExecutor<E, R> {
    /// An executor that draws jitter from `random`.
    pub fn with_random(
        policy: RetryPolicy,
        classifier: Classifier<E>,
        random: R,
    ) -> Result<Self, JitterNeedsRandom> {
        if policy.jitter() != Jitter::None && !R::IS_RANDOM {
            return Err(JitterNeedsRandom);
        }
        Ok(RetryExecutor {
            policy,
            classifier,
            random,
        })
    }

    /// The policy.
    pub const fn policy(&self) -> &RetryPolicy {
        &self.policy
    }

    /// Calls `op(attempt)` (1-based) until it succeeds, the error is not
    /// retryable, the policy is exhausted or `sleep` reports an interruption.
    /// A zero wait does not call `sleep`.
    pub fn run_blocking<T>(
        &mut self,
        mut sleep: impl FnMut(Duration) -> Result<(), Interrupted>,
        mut op: impl FnMut(u32) -> Result<T, E>,
    ) -> Result<T, RetryError<E>> {
        let mut backoff = Backoff::new(self.policy);
        let mut attempt = 1u32;
        loop {
            let error = match op(attempt) {
                Ok(value) => return Ok(value),
                Err(error) => error,
            };
            let (wait, error) = self.after_failure(&mut backoff, error, attempt)?;
            if !wait.is_zero() && sleep(wait).is_err() {
                return Err(RetryError {
                    error,
                    attempts: attempt,
                    reason: GiveUpReason::Interrupted,
                });
            }
            attempt = attempt.saturating_add(1);
        }
    }

    /// The async twin of [`Self::run_blocking`], waiting on `delay`.
    pub async fn run<T, F, Fut, D>(&mut self, delay: &mut D, op: F) -> Result<T, RetryError<E>>
    where
        F: FnMut(u32) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        D: DelayNs,
    {
        let sleep = async |wait| {
            delay_for(delay, wait).await;
            Ok(())
        };
        self.run_interruptible(sleep, op).await
    }

    /// As [`Self::run`], waiting with `sleep`, which may end the retries
    /// ([`Interrupted`]: a shutdown, a lease that is gone) before the next
    /// call. Unlike [`Self::run_blocking`], `sleep` is asked before every
    /// call after the first, a zero wait included, so that it can check a
    /// condition every call depends on.
    pub async fn run_interruptible<T, F, Fut, S>(
        &mut self,
        mut sleep: S,
        mut op: F,
    ) -> Result<T, RetryError<E>>
    where
        F: FnMut(u32) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        S: AsyncFnMut(Duration) -> Result<(), Interrupted>,
    {
        let mut backoff = Backoff::new(self.policy);
        let mut attempt = 1u32;
        loop {
            let error = match op(attempt).await {
                Ok(value) => return Ok(value),
                Err(error) => error,
            };
            let (wait, error) = self.after_failure(&mut backoff, error, attempt)?;
            if sleep(wait).await.is_err() {
                return Err(RetryError {
                    error,
                    attempts: attempt,
                    reason: GiveUpReason::Interrupted,
                });
            }
            attempt = attempt.saturating_add(1);
        }
    }

    /// Classifies a failure of call `attempt`: the wait before the next call
    /// (with the error, should the wait be interrupted), or the final error.
    fn after_failure(
        &mut self,
        backoff: &mut Backoff,
        error: E,
        attempt: u32,
    ) -> Result<(Duration, E), RetryError<E>> {
        if !self.classifier.is_retryable(&error) {
            return Err(RetryError {
                error,
                attempts: attempt,
                reason: GiveUpReason::NonRetryable,
            });
        }
        match backoff.next_delay(&mut self.random) {
            Some(wait) => Ok((wait, error)),
            None => Err(RetryError {
                error,
                attempts: attempt,
                reason: GiveUpReason::Exhausted,
            }),
        }
    }
}
