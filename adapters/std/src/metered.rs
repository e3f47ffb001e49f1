//! guard-core types with their metrics recorded.

use std::sync::PoisonError;
use std::time::Duration;

use guard_core::dlq::{DeadLetterQueue, DeadLetterSink, FailedElement};
use guard_core::retry::{Budget, Classify, Interrupted, RandomSource, RetryError, RetryExecutor};
use guard_core::time::Instant;

use crate::metrics::{record_dlq_size, record_retry_attempts};
use crate::sync::{Mutex, MutexGuard};

/// A bounded dead-letter queue shared between threads whose size is the
/// gauge `guard_dlq_size{topic}` after every change.
pub struct MeteredDeadLetterQueue<T, E, const N: usize> {
    topic: String,
    queue: Mutex<DeadLetterQueue<T, E, N>>,
}

impl<T, E, const N: usize> MeteredDeadLetterQueue<T, E, N> {
    /// An empty queue for `topic`.
    pub fn new(topic: impl Into<String>) -> Self {
        let topic = topic.into();
        record_dlq_size(&topic, 0);
        MeteredDeadLetterQueue {
            topic,
            queue: Mutex::new(DeadLetterQueue::new()),
        }
    }

    fn queue(&self) -> MutexGuard<'_, DeadLetterQueue<T, E, N>> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn changed(&self, queue: &DeadLetterQueue<T, E, N>) {
        record_dlq_size(&self.topic, queue.len());
    }

    /// Records a failure; hands it back if the queue is full.
    pub fn add(
        &self,
        element: T,
        error: Option<E>,
        attempts: u32,
        failed_at: Instant,
    ) -> Result<(), FailedElement<T, E>> {
        self.push(FailedElement::new(element, error, attempts, failed_at))
    }

    /// Appends `failed`; hands it back if the queue is full.
    pub fn push(&self, failed: FailedElement<T, E>) -> Result<(), FailedElement<T, E>> {
        let mut queue = self.queue();
        let result = queue.push(failed);
        self.changed(&queue);
        result
    }

    /// Removes and returns the oldest.
    pub fn poll(&self) -> Option<FailedElement<T, E>> {
        let mut queue = self.queue();
        let polled = queue.poll();
        self.changed(&queue);
        polled
    }

    /// Elements held.
    pub fn len(&self) -> usize {
        self.queue().len()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.queue().is_empty()
    }

    /// Removes everything; returns how many were removed.
    pub fn clear(&self) -> usize {
        let mut queue = self.queue();
        let removed = queue.clear();
        self.changed(&queue);
        removed
    }
}

impl<T, E, const N: usize> DeadLetterSink<T, E> for &MeteredDeadLetterQueue<T, E, N> {
    fn send(&mut self, failed: FailedElement<T, E>) -> Result<(), FailedElement<T, E>> {
        self.push(failed)
    }
}

/// Runs `op` under `executor` (see `RetryExecutor::run_blocking`) and adds
/// the calls it made to `guard_retry_attempts_total{name}`, whether it
/// succeeded or gave up.
pub fn retry_blocking<T, E, R: RandomSource, C: Classify<E>, B: Budget>(
    name: &str,
    executor: &mut RetryExecutor<E, R, C, B>,
    sleep: impl FnMut(Duration) -> Result<(), Interrupted>,
    mut op: impl FnMut(u32) -> Result<T, E>,
) -> Result<T, RetryError<E>> {
    let mut calls = 0u32;
    let result = executor.run_blocking(sleep, |attempt| {
        calls = attempt;
        op(attempt)
    });
    record_retry_attempts(name, calls);
    result
}
