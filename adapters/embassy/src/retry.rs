//! guard-core's retry executor on embassy-time delays.

use core::future::Future;

use guard_core::retry::{Budget, Classify, RandomSource, RetryError, RetryExecutor};

/// Calls `op(attempt)` under `executor`'s policy, waiting on
/// `embassy_time::Delay` between calls: no busy wait, other tasks run.
///
/// ```no_run
/// # async fn example() {
/// use core::time::Duration;
/// use guard_core::retry::{Classifier, RetryExecutor, RetryPolicy};
///
/// let policy = RetryPolicy::fixed_delay(3, Duration::from_millis(50));
/// let mut executor = RetryExecutor::new(policy, Classifier::retry_all()).unwrap();
/// let result = guard_embassy::retry(&mut executor, |attempt| async move {
///     if attempt < 3 { Err("not yet") } else { Ok(attempt) }
/// })
/// .await;
/// assert_eq!(result.unwrap(), 3);
/// # }
/// ```
pub async fn retry<T, E, R, C, B, F, Fut>(
    executor: &mut RetryExecutor<E, R, C, B>,
    op: F,
) -> Result<T, RetryError<E>>
where
    R: RandomSource,
    C: Classify<E>,
    B: Budget,
    F: FnMut(u32) -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    executor.run(&mut embassy_time::Delay, op).await
}
