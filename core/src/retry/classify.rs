//! Which errors are worth retrying, and how long an error asks to wait.

use core::fmt;
use core::time::Duration;

/// What a retry executor asks of an error: whether to retry it, and
/// whether it names its own wait (a server's `Retry-After`, a broker's
/// back-off hint).
///
/// [`Classifier`] is one (lists of `fn` pointers, usable in a `const`);
/// so is any closure `Fn(&E) -> bool`, which says whether `error` may be
/// retried; [`Hinted`] adds a hint to either
/// ([`crate::retry::RetryExecutor::with_hint`]).
///
/// ```
/// use guard_core::retry::Classify;
///
/// #[derive(Debug)]
/// enum Http { Status(u16), Timeout }
/// let transient = |e: &Http| matches!(e, Http::Timeout | Http::Status(429 | 502..=504));
/// assert!(transient.is_retryable(&Http::Status(503)));
/// assert!(!transient.is_retryable(&Http::Status(404)));
/// ```
pub trait Classify<E> {
    /// Whether `error` may be retried.
    fn is_retryable(&self, error: &E) -> bool;

    /// The wait `error` asks for before the next call, if it names one.
    /// The executor waits at least this long (and gives up if it is longer
    /// than the policy's `max_delay`). None by default.
    fn retry_after(&self, error: &E) -> Option<Duration> {
        let _ = error;
        None
    }
}

impl<E, F: Fn(&E) -> bool> Classify<E> for F {
    fn is_retryable(&self, error: &E) -> bool {
        self(error)
    }
}

/// A classifier and a hint read from each error; see
/// [`crate::retry::RetryExecutor::with_hint`].
#[derive(Clone, Copy, Debug)]
pub struct Hinted<C, H> {
    classifier: C,
    hint: H,
}

impl<C, H> Hinted<C, H> {
    /// `classifier`, with the wait `hint` reads from an error.
    pub const fn new(classifier: C, hint: H) -> Self {
        Hinted { classifier, hint }
    }
}

impl<E, C: Classify<E>, H: Fn(&E) -> Option<Duration>> Classify<E> for Hinted<C, H> {
    fn is_retryable(&self, error: &E) -> bool {
        self.classifier.is_retryable(error)
    }

    /// The hint's wait, or else the classifier's.
    fn retry_after(&self, error: &E) -> Option<Duration> {
        (self.hint)(error).or_else(|| self.classifier.retry_after(error))
    }
}

/// Decides which errors are worth retrying.
///
/// As in the original: an error matching `non_retryable` is never retried
/// (it wins over `retryable`); otherwise, if `retryable` is set, only
/// matching errors are retried; with neither set, every error is.
pub struct Classifier<E> {
    retryable: Option<fn(&E) -> bool>,
    non_retryable: Option<fn(&E) -> bool>,
}

impl<E> Clone for Classifier<E> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<E> Copy for Classifier<E> {}

impl<E> fmt::Debug for Classifier<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Classifier")
            .field("retryable", &self.retryable.is_some())
            .field("non_retryable", &self.non_retryable.is_some())
            .finish()
    }
}

impl<E> Default for Classifier<E> {
    fn default() -> Self {
        Self::retry_all()
    }
}

impl<E> Classifier<E> {
    /// Every error is retryable.
    pub const fn retry_all() -> Self {
        Classifier {
            retryable: None,
            non_retryable: None,
        }
    }

    /// Only errors for which `matches` is true are retried (a whitelist).
    pub const fn only(mut self, matches: fn(&E) -> bool) -> Self {
        self.retryable = Some(matches);
        self
    }

    /// Errors for which `matches` is true are never retried (a blacklist,
    /// checked first).
    pub const fn never(mut self, matches: fn(&E) -> bool) -> Self {
        self.non_retryable = Some(matches);
        self
    }

    /// Whether `error` may be retried.
    pub fn is_retryable(&self, error: &E) -> bool {
        if self.non_retryable.is_some_and(|never| never(error)) {
            return false;
        }
        match self.retryable {
            Some(only) => only(error),
            None => true,
        }
    }
}

impl<E> Classify<E> for Classifier<E> {
    fn is_retryable(&self, error: &E) -> bool {
        Classifier::is_retryable(self, error)
    }
}
