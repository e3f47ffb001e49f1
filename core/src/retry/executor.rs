//! Executors that run an operation under a [`RetryPolicy`].

use core::fmt;
use core::future::Future;
use core::marker::PhantomData;
use core::time::Duration;

use embedded_hal_async::delay::DelayNs;

use super::{
    Backoff, Budget, Classifier, Classify, Hinted, RandomSource, RetryPolicy, Unbudgeted,
    WithoutRandom,
};
use crate::retry::Jitter;
use crate::time::delay_for;

/// Returned by a sleep function to stop retrying (shutdown, cancellation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Interrupted;

/// Why the executor stopped calling.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum GiveUpReason {
    /// Every call the policy allows failed.
    Exhausted,
    /// The classifier said the error is not worth retrying.
    NonRetryable,
    /// The sleep between calls was interrupted.
    Interrupted,
    /// The error asked for a wait longer than the policy's `max_delay`
    /// (a `Retry-After` of an hour, say): retrying sooner would ignore it
    /// and sleeping that long is the caller's decision, so the executor
    /// stops and hands the wait back.
    HintBeyondMaxDelay {
        /// The wait the error asked for.
        retry_after: Duration,
    },
    /// The retry budget shared with other callers allowed no retry.
    BudgetSpent,
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
        write!(f, "gave up after {} attempt(s), ", self.attempts)?;
        match self.reason {
            GiveUpReason::Exhausted => f.write_str("retries exhausted")?,
            GiveUpReason::NonRetryable => f.write_str("error is not retryable")?,
            GiveUpReason::Interrupted => f.write_str("retry interrupted")?,
            GiveUpReason::HintBeyondMaxDelay { retry_after } => write!(
                f,
                "the error asks to wait {} ms, beyond the policy's max_delay",
                retry_after.as_millis()
            )?,
            GiveUpReason::BudgetSpent => f.write_str("retry budget spent")?,
        }
        write!(f, ": {}", self.error)
    }
}

/// The last call's error is the source.
impl<E: core::error::Error + 'static> core::error::Error for RetryError<E> {
    fn source(&self) -> Option<&(dyn core::error::Error + 'static)> {
        Some(&self.error)
    }
}

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

/// Runs operations under a [`RetryPolicy`] and a classifier.
///
/// [`RetryExecutor::run_blocking`] sleeps through a function the caller
/// gives (`std::thread::sleep`, a busy wait, a test clock);
/// [`RetryExecutor::run`] awaits an `embedded_hal_async` delay, so the same
/// code runs on embassy and on servers. Dropping the future of `run`
/// cancels cleanly: nothing is left half-done between calls.
///
/// The classifier is a [`Classifier`] or any closure `Fn(&E) -> bool`
/// ([`Classify`]). Two more things it listens to:
///
/// - a hint ([`Self::with_hint`]): the wait an error asks for (a server's
///   `Retry-After`, see [`crate::retry::RetryAfter`]). The next call comes
///   no sooner than that, nor sooner than the policy's own wait; a hint
///   beyond the policy's `max_delay` ends the retries
///   ([`GiveUpReason::HintBeyondMaxDelay`], with the wait it asked for);
/// - a budget ([`Self::with_budget`]) shared with other callers: a deposit
///   before each first call, a withdrawal before each retry, and no retry
///   when it is spent ([`GiveUpReason::BudgetSpent`]).
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
///
/// A closure classifier and a server's hint:
///
/// ```
/// use core::time::Duration;
/// use guard_core::retry::{RetryExecutor, RetryPolicy};
///
/// #[derive(Debug)]
/// struct Status { code: u16, retry_after: Option<Duration> }
///
/// let policy = RetryPolicy::fixed_delay(3, Duration::from_millis(100));
/// let mut retry = RetryExecutor::new(policy, |e: &Status| e.code == 429 || e.code >= 500)?
///     .with_hint(|e: &Status| e.retry_after);
/// let mut waits = Vec::new();
/// let result = retry.run_blocking(
///     |d| { waits.push(d); Ok(()) },
///     |attempt| match attempt {
///         1 => Err(Status { code: 429, retry_after: Some(Duration::from_secs(2)) }),
///         2 => Err(Status { code: 503, retry_after: None }),
///         _ => Ok("sent"),
///     },
/// );
/// assert_eq!(result.unwrap(), "sent");
/// // The server's two seconds, then the policy's own wait.
/// assert_eq!(waits, [Duration::from_secs(2), Duration::from_millis(100)]);
/// # Ok::<(), guard_core::retry::JitterNeedsRandom>(())
/// ```
pub struct RetryExecutor<E, R = WithoutRandom, C = Classifier<E>, B = Unbudgeted> {
    policy: RetryPolicy,
    classifier: C,
    random: R,
    budget: B,
    /// The errors `C` classifies.
    errors: PhantomData<fn(&E)>,
}

impl<E, R: Clone, C: Clone, B: Clone> Clone for RetryExecutor<E, R, C, B> {
    fn clone(&self) -> Self {
        RetryExecutor {
            policy: self.policy,
            classifier: self.classifier.clone(),
            random: self.random.clone(),
            budget: self.budget.clone(),
            errors: PhantomData,
        }
    }
}

impl<E, R: fmt::Debug, C: fmt::Debug, B: fmt::Debug> fmt::Debug for RetryExecutor<E, R, C, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryExecutor")
            .field("policy", &self.policy)
            .field("classifier", &self.classifier)
            .field("random", &self.random)
            .field("budget", &self.budget)
            .finish()
    }
}

impl<E, C: Classify<E>> RetryExecutor<E, WithoutRandom, C> {
    /// An executor without randomness; errors if `policy` has jitter.
    pub fn new(policy: RetryPolicy, classifier: C) -> Result<Self, JitterNeedsRandom> {
        Self::with_random(policy, classifier, WithoutRandom)
    }
}

impl<E, R: RandomSource, C: Classify<E>> RetryExecutor<E, R, C> {
    /// An executor that draws jitter from `random`.
    pub fn with_random(
        policy: RetryPolicy,
        classifier: C,
        random: R,
    ) -> Result<Self, JitterNeedsRandom> {
        if policy.jitter() != Jitter::None && !R::IS_RANDOM {
            return Err(JitterNeedsRandom);
        }
        Ok(RetryExecutor {
            policy,
            classifier,
            random,
            budget: Unbudgeted,
            errors: PhantomData,
        })
    }
}

impl<E, R: RandomSource, C: Classify<E>, B: Budget> RetryExecutor<E, R, C, B> {
    /// This executor, waiting at least as long as `hint` reads from each
    /// error (see the type's notes).
    pub fn with_hint<H: Fn(&E) -> Option<Duration>>(
        self,
        hint: H,
    ) -> RetryExecutor<E, R, Hinted<C, H>, B> {
        RetryExecutor {
            policy: self.policy,
            classifier: Hinted::new(self.classifier, hint),
            random: self.random,
            budget: self.budget,
            errors: PhantomData,
        }
    }

    /// This executor, retrying only as `budget` allows (see the type's
    /// notes): for example a [`crate::retry::SharedRetryBudget`] read
    /// through a clock, shared by every caller of one service.
    pub fn with_budget<B2: Budget>(self, budget: B2) -> RetryExecutor<E, R, C, B2> {
        RetryExecutor {
            policy: self.policy,
            classifier: self.classifier,
            random: self.random,
            budget,
            errors: PhantomData,
        }
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
        self.budget.deposit();
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
        self.budget.deposit();
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
    /// The budget is asked last, so that a retry the policy or the error
    /// rules out takes nothing from it.
    fn after_failure(
        &mut self,
        backoff: &mut Backoff,
        error: E,
        attempt: u32,
    ) -> Result<(Duration, E), RetryError<E>> {
        let give_up = |error, reason| RetryError {
            error,
            attempts: attempt,
            reason,
        };
        if !self.classifier.is_retryable(&error) {
            return Err(give_up(error, GiveUpReason::NonRetryable));
        }
        let Some(planned) = backoff.next_delay(&mut self.random) else {
            return Err(give_up(error, GiveUpReason::Exhausted));
        };
        let wait = match self.classifier.retry_after(&error) {
            Some(retry_after) if retry_after > self.policy.max_delay() => {
                let reason = GiveUpReason::HintBeyondMaxDelay { retry_after };
                return Err(give_up(error, reason));
            }
            Some(retry_after) => planned.max(retry_after),
            None => planned,
        };
        if !self.budget.withdraw() {
            return Err(give_up(error, GiveUpReason::BudgetSpent));
        }
        Ok((wait, error))
    }
}
