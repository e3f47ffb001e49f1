//! guard-core types with their metrics recorded.

use std::sync::PoisonError;
use std::time::Duration;

use guard_core::dlq::{DeadLetterQueue, DeadLetterSink, FailedElement};
use guard_core::retry::{Budget, Classify, Interrupted, RandomSource, RetryError, RetryExecutor};
use guard_core::time::Instant;

use crate::metrics::{record_dlq_bytes, record_dlq_size, record_retry_attempts};
use crate::sync::{Mutex, MutexGuard};

/// A bounded dead-letter queue shared between threads whose size is the
/// gauge `guard_dlq_size{topic}` after every change.
///
/// Bounded in elements (`N`) and, when built with
/// [`MeteredDeadLetterQueue::bounded_in_bytes`], in bytes too: what its
/// elements weigh by the given measure, kept in `guard_dlq_bytes{topic}`.
/// An element that would take it past either bound is handed back.
pub struct MeteredDeadLetterQueue<T, E, const N: usize> {
    topic: String,
    held: Mutex<Held<T, E, N>>,
    max_bytes: usize,
    weigh: fn(&FailedElement<T, E>) -> usize,
}

/// The queue and the bytes its elements weigh, changed together under
/// one lock so that the count never drifts from the elements.
struct Held<T, E, const N: usize> {
    queue: DeadLetterQueue<T, E, N>,
    bytes: usize,
}

impl<T, E, const N: usize> MeteredDeadLetterQueue<T, E, N> {
    /// An empty queue for `topic`, bounded in elements only.
    pub fn new(topic: impl Into<String>) -> Self {
        Self::bounded_in_bytes(topic, usize::MAX, |_| 0)
    }

    /// An empty queue for `topic` whose elements together weigh at most
    /// `max_bytes` by `weigh` (which must give an element the same weight
    /// each time it is asked).
    pub fn bounded_in_bytes(
        topic: impl Into<String>,
        max_bytes: usize,
        weigh: fn(&FailedElement<T, E>) -> usize,
    ) -> Self {
        let topic = topic.into();
        record_dlq_size(&topic, 0);
        if max_bytes != usize::MAX {
            record_dlq_bytes(&topic, 0);
        }
        MeteredDeadLetterQueue {
            topic,
            held: Mutex::new(Held {
                queue: DeadLetterQueue::new(),
                bytes: 0,
            }),
            max_bytes,
            weigh,
        }
    }

    fn held(&self) -> MutexGuard<'_, Held<T, E, N>> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn changed(&self, held: &Held<T, E, N>) {
        record_dlq_size(&self.topic, held.queue.len());
        if self.max_bytes != usize::MAX {
            record_dlq_bytes(&self.topic, held.bytes);
        }
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

    /// Appends `failed`; hands it back if the queue is full, in elements
    /// or in bytes.
    pub fn push(&self, failed: FailedElement<T, E>) -> Result<(), FailedElement<T, E>> {
        let weight = (self.weigh)(&failed);
        let mut held = self.held();
        if held.bytes.saturating_add(weight) > self.max_bytes {
            return Err(failed);
        }
        let result = held.queue.push(failed);
        if result.is_ok() {
            held.bytes += weight;
        }
        self.changed(&held);
        result
    }

    /// Removes and returns the oldest.
    pub fn poll(&self) -> Option<FailedElement<T, E>> {
        let mut held = self.held();
        let polled = held.queue.poll();
        if let Some(failed) = &polled {
            held.bytes -= (self.weigh)(failed);
        }
        self.changed(&held);
        polled
    }

    /// Elements held.
    pub fn len(&self) -> usize {
        self.held().queue.len()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.held().queue.is_empty()
    }

    /// What the elements held weigh together (zero for a queue bounded
    /// in elements only).
    pub fn bytes(&self) -> usize {
        self.held().bytes
    }

    /// The bound in bytes (`usize::MAX` for a queue bounded in elements
    /// only).
    pub fn max_bytes(&self) -> usize {
        self.max_bytes
    }

    /// Removes everything; returns how many were removed.
    pub fn clear(&self) -> usize {
        let mut held = self.held();
        let removed = held.queue.clear();
        held.bytes = 0;
        self.changed(&held);
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
