//! A bounded dead-letter queue that never drops: a full queue hands the
//! element back.

use core::cell::RefCell;
use core::fmt;

use embassy_sync::blocking_mutex::raw::RawMutex;
use heapless::Deque;

use crate::sync::BlockingMutex;
use crate::time::Instant;

/// The message shown for a failure without an error, or with an empty one.
pub const UNKNOWN_ERROR: &str = "Unknown error";

/// An element that failed, with why, how often and when.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct FailedElement<T, E> {
    element: T,
    error: Option<E>,
    attempts: u32,
    failed_at: Instant,
}

impl<T, E> FailedElement<T, E> {
    /// Records that `element` failed with `error` after `attempts` calls.
    pub const fn new(element: T, error: Option<E>, attempts: u32, failed_at: Instant) -> Self {
        FailedElement {
            element,
            error,
            attempts,
            failed_at,
        }
    }

    /// The element.
    pub const fn element(&self) -> &T {
        &self.element
    }

    /// The element, consuming the record.
    pub fn into_element(self) -> T {
        self.element
    }

    /// The error, if one was recorded.
    pub const fn error(&self) -> Option<&E> {
        self.error.as_ref()
    }

    /// Calls made before giving up.
    pub const fn attempts(&self) -> u32 {
        self.attempts
    }

    /// When it failed.
    pub const fn failed_at(&self) -> Instant {
        self.failed_at
    }

    /// Whether another try stays within `max` attempts (`attempts < max`).
    pub const fn can_retry(&self, max: u32) -> bool {
        self.attempts < max
    }
}

impl<T, E: fmt::Display> FailedElement<T, E> {
    /// The error's message, or [`UNKNOWN_ERROR`] when there is no error or
    /// its message is empty.
    pub fn error_message(&self) -> ErrorMessage<'_, E> {
        ErrorMessage(self.error.as_ref())
    }
}

/// The message of a [`FailedElement`]'s error; see
/// [`FailedElement::error_message`].
#[derive(Clone, Copy, Debug)]
pub struct ErrorMessage<'a, E>(Option<&'a E>);

impl<E: fmt::Display> fmt::Display for ErrorMessage<'_, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(error) if !displays_empty(error) => write!(f, "{error}"),
            _ => f.write_str(UNKNOWN_ERROR),
        }
    }
}

/// Whether `value` formats to the empty string, without allocating.
fn displays_empty(value: &impl fmt::Display) -> bool {
    struct AnyOutput(bool);
    impl fmt::Write for AnyOutput {
        fn write_str(&mut self, s: &str) -> fmt::Result {
            self.0 |= !s.is_empty();
            Ok(())
        }
    }
    let mut out = AnyOutput(false);
    let _ = fmt::write(&mut out, format_args!("{value}"));
    !out.0
}

impl<T: fmt::Debug, E: fmt::Display> fmt::Display for FailedElement<T, E> {
    /// The original's layout: `FailedElement{element=…, errorMessage='…',
    /// attemptCount=N, timestamp=…}` (the timestamp in milliseconds).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "FailedElement{{element={:?}, errorMessage='{}', attemptCount={}, timestamp={}}}",
            self.element,
            self.error_message(),
            self.attempts,
            self.failed_at.as_millis()
        )
    }
}

/// Somewhere failed elements can be sent: a queue in memory, a shared queue,
/// a persistent stream. A sink that cannot take one hands it back.
pub trait DeadLetterSink<T, E> {
    /// Stores `failed`, or returns it if there is no room.
    fn send(&mut self, failed: FailedElement<T, E>) -> Result<(), FailedElement<T, E>>;
}

impl<T, E, S: DeadLetterSink<T, E> + ?Sized> DeadLetterSink<T, E> for &mut S {
    fn send(&mut self, failed: FailedElement<T, E>) -> Result<(), FailedElement<T, E>> {
        (**self).send(failed)
    }
}

/// A FIFO of at most `N` failed elements.
///
/// When full, [`add`](Self::add) hands the new element back; the oldest is
/// never evicted. `N` must be positive (checked at compile time).
///
/// ```
/// use guard_core::dlq::DeadLetterQueue;
/// use guard_core::time::Instant;
///
/// let mut dlq: DeadLetterQueue<&str, &str, 1> = DeadLetterQueue::new();
/// let now = Instant::from_secs(1);
/// assert!(dlq.add("a", Some("timeout"), 4, now).is_ok());
/// let back = dlq.add("b", Some("timeout"), 4, now).unwrap_err();
/// assert_eq!(*back.element(), "b");
/// assert_eq!(dlq.poll().map(|f| f.into_element()), Some("a"));
/// ```
///
/// A zero capacity does not compile (the original rejected `maxSize <= 0`
/// at run time):
///
/// ```compile_fail
/// let q: guard_core::dlq::DeadLetterQueue<u8, (), 0> = guard_core::dlq::DeadLetterQueue::new();
/// ```
#[derive(Clone, Debug)]
pub struct DeadLetterQueue<T, E, const N: usize> {
    queue: Deque<FailedElement<T, E>, N>,
}

impl<T, E, const N: usize> Default for DeadLetterQueue<T, E, N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T, E, const N: usize> DeadLetterQueue<T, E, N> {
    /// An empty queue (usable in a `static`).
    pub const fn new() -> Self {
        const { assert!(N > 0, "a dead-letter queue needs a positive capacity") };
        DeadLetterQueue {
            queue: Deque::new(),
        }
    }

    /// Records a failure; hands it back if the queue is full.
    pub fn add(
        &mut self,
        element: T,
        error: Option<E>,
        attempts: u32,
        failed_at: Instant,
    ) -> Result<(), FailedElement<T, E>> {
        self.push(FailedElement::new(element, error, attempts, failed_at))
    }

    /// Appends `failed`; hands it back if the queue is full.
    pub fn push(&mut self, failed: FailedElement<T, E>) -> Result<(), FailedElement<T, E>> {
        self.queue.push_back(failed)
    }

    /// Removes and returns the oldest.
    pub fn poll(&mut self) -> Option<FailedElement<T, E>> {
        self.queue.pop_front()
    }

    /// The oldest, left in place.
    pub fn peek(&self) -> Option<&FailedElement<T, E>> {
        self.queue.front()
    }

    /// Oldest first, without removing.
    pub fn iter(&self) -> impl Iterator<Item = &FailedElement<T, E>> {
        self.queue.iter()
    }

    /// Elements held.
    pub fn len(&self) -> usize {
        self.queue.len()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Whether the next add will be handed back.
    pub fn is_full(&self) -> bool {
        self.queue.is_full()
    }

    /// The most elements it holds.
    pub const fn capacity(&self) -> usize {
        N
    }

    /// Removes everything; returns how many were removed.
    pub fn clear(&mut self) -> usize {
        let removed = self.queue.len();
        self.queue.clear();
        removed
    }
}

impl<T, E, const N: usize> DeadLetterSink<T, E> for DeadLetterQueue<T, E, N> {
    fn send(&mut self, failed: FailedElement<T, E>) -> Result<(), FailedElement<T, E>> {
        self.push(failed)
    }
}

/// A [`DeadLetterQueue`] shared through `&self`: behind an `embassy_sync`
/// blocking mutex (a critical section on a microcontroller, a thread mutex
/// on a server), with a `const fn new` so it can be a `static`.
///
/// Each method holds the lock for one queue operation, so the length never
/// exceeds `N`, `len` always equals the elements iterated, and a clear never
/// loses a concurrent add. The closures of [`with_each`](Self::with_each)
/// and [`with_oldest`](Self::with_oldest) run under the lock: calling a
/// mutating method of the same queue from them finds it busy (an add hands
/// its element back, a poll returns `None`) instead of deadlocking.
pub struct SharedDeadLetterQueue<M: RawMutex, T, E, const N: usize> {
    inner: BlockingMutex<M, RefCell<DeadLetterQueue<T, E, N>>>,
}

impl<M: RawMutex, T, E, const N: usize> SharedDeadLetterQueue<M, T, E, N> {
    /// An empty queue.
    #[cfg(not(guard_loom))]
    pub const fn new() -> Self {
        SharedDeadLetterQueue {
            inner: BlockingMutex::new(RefCell::new(DeadLetterQueue::new())),
        }
    }

    /// An empty queue (loom's mutex has no `const` constructor).
    #[cfg(guard_loom)]
    pub fn new() -> Self {
        SharedDeadLetterQueue {
            inner: BlockingMutex::new(RefCell::new(DeadLetterQueue::new())),
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

    /// Appends `failed`; hands it back if the queue is full (or busy).
    pub fn push(&self, failed: FailedElement<T, E>) -> Result<(), FailedElement<T, E>> {
        self.inner.lock(|q| match q.try_borrow_mut() {
            Ok(mut q) => q.push(failed),
            Err(_) => Err(failed),
        })
    }

    /// Removes and returns the oldest.
    pub fn poll(&self) -> Option<FailedElement<T, E>> {
        self.inner
            .lock(|q| q.try_borrow_mut().ok().and_then(|mut q| q.poll()))
    }

    /// Runs `f` on the oldest element, left in place.
    pub fn with_oldest<R>(&self, f: impl FnOnce(Option<&FailedElement<T, E>>) -> R) -> R {
        self.inner.lock(|q| match q.try_borrow() {
            Ok(q) => f(q.peek()),
            Err(_) => f(None),
        })
    }

    /// Runs `f` on each element, oldest first, without removing.
    pub fn with_each(&self, mut f: impl FnMut(&FailedElement<T, E>)) {
        self.inner.lock(|q| {
            if let Ok(q) = q.try_borrow() {
                q.iter().for_each(&mut f);
            }
        });
    }

    /// Elements held.
    pub fn len(&self) -> usize {
        self.inner.lock(|q| q.try_borrow().map_or(0, |q| q.len()))
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the next add will be handed back.
    pub fn is_full(&self) -> bool {
        self.inner
            .lock(|q| q.try_borrow().map_or(true, |q| q.is_full()))
    }

    /// The most elements it holds.
    pub const fn capacity(&self) -> usize {
        N
    }

    /// Removes everything; returns how many were removed.
    pub fn clear(&self) -> usize {
        self.inner
            .lock(|q| q.try_borrow_mut().map_or(0, |mut q| q.clear()))
    }
}

impl<M: RawMutex, T, E, const N: usize> Default for SharedDeadLetterQueue<M, T, E, N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<M: RawMutex, T, E, const N: usize> DeadLetterSink<T, E>
    for &SharedDeadLetterQueue<M, T, E, N>
{
    fn send(&mut self, failed: FailedElement<T, E>) -> Result<(), FailedElement<T, E>> {
        self.push(failed)
    }
}
