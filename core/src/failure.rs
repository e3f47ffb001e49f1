//! Failure handling: what to do with an element whose processing failed.
//!
//! [`ReliabilityConfig`] is the original's configuration, validated with its
//! four rules and messages. Unlike the original, where nothing applied it,
//! [`FailureHandler`] does: it runs the operation under the retry policy,
//! then fails fast, skips, ignores or dead-letters, and stops after too
//! many consecutive failures.

use core::fmt;
use core::str::FromStr;
use core::time::Duration;

use embedded_hal_async::delay::DelayNs;

use crate::dlq::{DeadLetterSink, FailedElement};
use crate::retry::{
    Classifier, Interrupted, Jitter, RandomSource, RetryError, RetryExecutor, RetryPolicy,
    WithoutRandom,
};
use crate::time::Instant;

/// What to do when processing an element fails, in the original's order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum FailureStrategy {
    /// One call; a failure goes back to the caller with the element.
    FailFast,
    /// Calls under the retry policy; a final failure goes back to the caller.
    Retry,
    /// One call; a failure is reported as skipped and processing goes on.
    Skip,
    /// Calls under the retry policy; a final failure goes to the
    /// dead-letter queue (or back to the caller if it is full).
    DeadLetterQueue,
    /// One call; a failure is reported as ignored and not counted.
    Ignore,
}

impl FailureStrategy {
    /// Every strategy, in declaration order (ordinals 0 to 4).
    pub const ALL: [FailureStrategy; 5] = [
        FailureStrategy::FailFast,
        FailureStrategy::Retry,
        FailureStrategy::Skip,
        FailureStrategy::DeadLetterQueue,
        FailureStrategy::Ignore,
    ];

    /// The original's name (`FAIL_FAST`, `RETRY`, `SKIP`,
    /// `DEAD_LETTER_QUEUE`, `IGNORE`).
    pub const fn name(&self) -> &'static str {
        match self {
            FailureStrategy::FailFast => "FAIL_FAST",
            FailureStrategy::Retry => "RETRY",
            FailureStrategy::Skip => "SKIP",
            FailureStrategy::DeadLetterQueue => "DEAD_LETTER_QUEUE",
            FailureStrategy::Ignore => "IGNORE",
        }
    }
}

impl fmt::Display for FailureStrategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A name that is not a [`FailureStrategy`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct UnknownStrategy;

impl fmt::Display for UnknownStrategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(
            "unknown failure strategy; expected one of FAIL_FAST, RETRY, SKIP, \
             DEAD_LETTER_QUEUE, IGNORE (case-insensitive, '-' or '_')",
        )
    }
}

impl core::error::Error for UnknownStrategy {}

impl FromStr for FailureStrategy {
    type Err = UnknownStrategy;

    /// Accepts the original's names in any case, with `-` for `_`
    /// (`dead-letter-queue`).
    fn from_str(s: &str) -> Result<Self, UnknownStrategy> {
        FailureStrategy::ALL
            .into_iter()
            .find(|strategy| {
                let name = strategy.name();
                name.len() == s.len()
                    && name.bytes().zip(s.bytes()).all(|(n, c)| {
                        let c = if c == b'-' { b'_' } else { c };
                        n == c.to_ascii_uppercase()
                    })
            })
            .ok_or(UnknownStrategy)
    }
}

/// A configuration that [`ReliabilityConfig::validate`] rejects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum ReliabilityConfigError {
    /// No strategy.
    MissingStrategy,
    /// `Retry` without a policy.
    RetryWithoutPolicy,
    /// `DeadLetterQueue` without a queue.
    DeadLetterWithoutQueue,
    /// `max_consecutive_failures` is zero.
    MaxConsecutiveFailuresNotPositive,
    /// The retry policy has jitter but the handler has no random source.
    JitterWithoutRandom,
}

impl fmt::Display for ReliabilityConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ReliabilityConfigError::MissingStrategy => "Failure strategy must be specified",
            ReliabilityConfigError::RetryWithoutPolicy => {
                "Retry policy must be specified for RETRY strategy"
            }
            ReliabilityConfigError::DeadLetterWithoutQueue => {
                "Dead letter queue must be specified for DEAD_LETTER_QUEUE strategy"
            }
            ReliabilityConfigError::MaxConsecutiveFailuresNotPositive => {
                "Max consecutive failures must be positive"
            }
            ReliabilityConfigError::JitterWithoutRandom => {
                "Retry policy has jitter but no random source was given"
            }
        })
    }
}

impl core::error::Error for ReliabilityConfigError {}

/// How failures are handled; `D` is the dead-letter sink (for example
/// `&mut DeadLetterQueue<T, E, N>` or `&SharedDeadLetterQueue<..>`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReliabilityConfig<D> {
    /// The strategy; required.
    pub failure_strategy: Option<FailureStrategy>,
    /// The retry policy; required by `Retry`, used by `DeadLetterQueue`.
    pub retry_policy: Option<RetryPolicy>,
    /// The dead-letter sink; required by `DeadLetterQueue`.
    pub dead_letter_queue: Option<D>,
    /// Whether processing goes on after a failure (until
    /// `max_consecutive_failures` in a row).
    pub continue_on_failure: bool,
    /// Failures in a row after which the handler stops; positive.
    pub max_consecutive_failures: u32,
}

impl<D> Default for ReliabilityConfig<D> {
    /// The original's defaults: `Retry` with the default policy, no queue,
    /// continue on failure, stop after 10 failures in a row.
    fn default() -> Self {
        ReliabilityConfig {
            failure_strategy: Some(FailureStrategy::Retry),
            retry_policy: Some(RetryPolicy::new()),
            dead_letter_queue: None,
            continue_on_failure: true,
            max_consecutive_failures: 10,
        }
    }
}

impl<D> ReliabilityConfig<D> {
    /// Retry with the default policy.
    pub fn with_retry() -> Self {
        Self::default()
    }

    /// Retry, then dead-letter into `queue`.
    pub fn with_dead_letter_queue(queue: D) -> Self {
        ReliabilityConfig {
            failure_strategy: Some(FailureStrategy::DeadLetterQueue),
            dead_letter_queue: Some(queue),
            ..Self::default()
        }
    }

    /// Fail fast and stop at the first failure.
    pub fn fail_fast() -> Self {
        ReliabilityConfig {
            failure_strategy: Some(FailureStrategy::FailFast),
            continue_on_failure: false,
            ..Self::default()
        }
    }

    /// Checks the original's four rules, in its order.
    pub fn validate(&self) -> Result<(), ReliabilityConfigError> {
        let strategy = self
            .failure_strategy
            .ok_or(ReliabilityConfigError::MissingStrategy)?;
        if strategy == FailureStrategy::Retry && self.retry_policy.is_none() {
            return Err(ReliabilityConfigError::RetryWithoutPolicy);
        }
        if strategy == FailureStrategy::DeadLetterQueue && self.dead_letter_queue.is_none() {
            return Err(ReliabilityConfigError::DeadLetterWithoutQueue);
        }
        if self.max_consecutive_failures == 0 {
            return Err(ReliabilityConfigError::MaxConsecutiveFailuresNotPositive);
        }
        Ok(())
    }
}

/// What became of one element.
#[derive(Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Handled<R, T, E> {
    /// The operation succeeded after `attempts` calls.
    Succeeded {
        /// Its result.
        value: R,
        /// Calls made.
        attempts: u32,
    },
    /// `FailFast` or `Retry` gave up: the element comes back to the caller.
    Failed(FailedElement<T, E>),
    /// `Skip`: the failure was counted and the element set aside; it comes
    /// back so that skipping is never silent.
    Skipped(FailedElement<T, E>),
    /// `Ignore`: the failure was not counted.
    Ignored(FailedElement<T, E>),
    /// `DeadLetterQueue`: the element is in the queue.
    DeadLettered {
        /// Calls made before giving up.
        attempts: u32,
    },
    /// `DeadLetterQueue`, but the queue refused it: the element comes back.
    DeadLetterRefused(FailedElement<T, E>),
    /// The handler has stopped (see [`FailureHandler::is_halted`]); the
    /// operation was not called.
    Halted(T),
}

/// Applies a validated [`ReliabilityConfig`] to each element.
///
/// Failures that count (all but `Ignore`) are counted in a row; a success
/// resets the count. The handler halts after a counted failure when
/// `continue_on_failure` is false, or when `max_consecutive_failures` are
/// reached; a halted handler returns every element untouched until
/// [`resume`](Self::resume).
///
/// ```
/// use guard_core::dlq::DeadLetterQueue;
/// use guard_core::failure::{FailureHandler, Handled, ReliabilityConfig};
/// use guard_core::retry::{Classifier, RetryPolicy};
/// use guard_core::time::Instant;
///
/// let mut dlq: DeadLetterQueue<u32, &str, 8> = DeadLetterQueue::new();
/// let mut config = ReliabilityConfig::with_dead_letter_queue(&mut dlq);
/// config.retry_policy = Some(RetryPolicy::no_retry().with_max_attempts(1));
/// let mut handler = FailureHandler::new(config, Classifier::retry_all())?;
/// let now = Instant::from_secs(1);
/// let out: Handled<(), u32, &str> =
///     handler.process(7, now, |_| Ok(()), |_, _attempt| Err("down"));
/// assert_eq!(out, Handled::DeadLettered { attempts: 2 });
/// // The handler borrowed the queue; it is free again.
/// assert_eq!(dlq.poll().map(|f| f.into_element()), Some(7));
/// # Ok::<(), guard_core::failure::ReliabilityConfigError>(())
/// ```
#[derive(Debug)]
pub struct FailureHandler<D, E, R = WithoutRandom> {
    strategy: FailureStrategy,
    queue: Option<D>,
    continue_on_failure: bool,
    max_consecutive_failures: u32,
    retry: RetryExecutor<E, R>,
    consecutive_failures: u32,
    halted: bool,
}

impl<D, E> FailureHandler<D, E, WithoutRandom> {
    /// Validates `config` and builds a handler without jitter.
    pub fn new(
        config: ReliabilityConfig<D>,
        classifier: Classifier<E>,
    ) -> Result<Self, ReliabilityConfigError> {
        Self::with_random(config, classifier, WithoutRandom)
    }
}

impl<D, E, R: RandomSource> FailureHandler<D, E, R> {
    /// Validates `config` and builds a handler that jitters with `random`.
    pub fn with_random(
        config: ReliabilityConfig<D>,
        classifier: Classifier<E>,
        random: R,
    ) -> Result<Self, ReliabilityConfigError> {
        config.validate()?;
        let strategy = config
            .failure_strategy
            .ok_or(ReliabilityConfigError::MissingStrategy)?;
        // Only Retry and DeadLetterQueue retry; the others make one call.
        let policy = match (strategy, config.retry_policy) {
            (FailureStrategy::Retry | FailureStrategy::DeadLetterQueue, Some(policy)) => policy,
            _ => RetryPolicy::no_retry().with_jitter(Jitter::None),
        };
        let retry = RetryExecutor::with_random(policy, classifier, random)
            .map_err(|_| ReliabilityConfigError::JitterWithoutRandom)?;
        Ok(FailureHandler {
            strategy,
            queue: config.dead_letter_queue,
            continue_on_failure: config.continue_on_failure,
            max_consecutive_failures: config.max_consecutive_failures,
            retry,
            consecutive_failures: 0,
            halted: false,
        })
    }

    /// Processes `element` with `op(&element, attempt)`, sleeping between
    /// calls with `sleep`; `now` stamps a failure.
    pub fn process<T, V>(
        &mut self,
        element: T,
        now: Instant,
        sleep: impl FnMut(Duration) -> Result<(), Interrupted>,
        mut op: impl FnMut(&T, u32) -> Result<V, E>,
    ) -> Handled<V, T, E>
    where
        D: DeadLetterSink<T, E>,
    {
        if self.halted {
            return Handled::Halted(element);
        }
        let mut attempts = 0u32;
        let result = self.retry.run_blocking(sleep, |attempt| {
            attempts = attempt;
            op(&element, attempt)
        });
        self.settle(element, result, attempts, now)
    }

    /// The async twin of [`Self::process`], waiting on `delay`.
    pub async fn process_async<T, V, F, Fut, W>(
        &mut self,
        element: T,
        now: Instant,
        delay: &mut W,
        mut op: F,
    ) -> Handled<V, T, E>
    where
        D: DeadLetterSink<T, E>,
        F: FnMut(&T, u32) -> Fut,
        Fut: Future<Output = Result<V, E>>,
        W: DelayNs,
    {
        if self.halted {
            return Handled::Halted(element);
        }
        let mut attempts = 0u32;
        let result = self
            .retry
            .run(delay, |attempt| {
                attempts = attempt;
                op(&element, attempt)
            })
            .await;
        self.settle(element, result, attempts, now)
    }

    /// Applies the strategy to the outcome of the calls.
    fn settle<T, V>(
        &mut self,
        element: T,
        result: Result<V, RetryError<E>>,
        attempts: u32,
        now: Instant,
    ) -> Handled<V, T, E>
    where
        D: DeadLetterSink<T, E>,
    {
        let error = match result {
            Ok(value) => {
                self.consecutive_failures = 0;
                return Handled::Succeeded { value, attempts };
            }
            Err(e) => e,
        };
        let failed = FailedElement::new(element, Some(error.error), error.attempts, now);
        if self.strategy == FailureStrategy::Ignore {
            return Handled::Ignored(failed);
        }
        self.count_failure();
        match self.strategy {
            FailureStrategy::DeadLetterQueue => match self.queue.as_mut() {
                Some(queue) => match queue.send(failed) {
                    Ok(()) => Handled::DeadLettered {
                        attempts: error.attempts,
                    },
                    Err(refused) => Handled::DeadLetterRefused(refused),
                },
                None => Handled::DeadLetterRefused(failed),
            },
            FailureStrategy::Skip => Handled::Skipped(failed),
            _ => Handled::Failed(failed),
        }
    }

    fn count_failure(&mut self) {
        self.consecutive_failures = self.consecutive_failures.saturating_add(1);
        if !self.continue_on_failure || self.consecutive_failures >= self.max_consecutive_failures {
            self.halted = true;
        }
    }

    /// Whether the handler has stopped processing.
    pub const fn is_halted(&self) -> bool {
        self.halted
    }

    /// Counted failures in a row.
    pub const fn consecutive_failures(&self) -> u32 {
        self.consecutive_failures
    }

    /// Starts processing again after a halt, with the count reset.
    pub fn resume(&mut self) {
        self.halted = false;
        self.consecutive_failures = 0;
    }

    /// The strategy applied.
    pub const fn strategy(&self) -> FailureStrategy {
        self.strategy
    }
}
