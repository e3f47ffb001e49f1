//! The lease an elected consumer checks before every handler call.

use std::sync::{Arc, Mutex, PoisonError};

use super::{Runtime, RuntimeClock};
use crate::Clock;
use guard_core::guard::Lease;

/// What a [`LeaseCheck`] finds at one instant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseState {
    /// This replica leads and its renew deadline has not passed: act,
    /// with this fence.
    Valid(u64),
    /// This replica holds a lease whose renew deadline has passed on its
    /// own clock (woken from a pause): do not act; the runner demotes.
    PastDeadline,
    /// This replica does not lead (standby, demoted, stopped): do not act.
    NotHeld,
}

/// A view of the lease an [`ActiveRunner`](super::ActiveRunner) holds, on
/// the runner's own monotonic clock.
///
/// The runner publishes its `ActiveGuard`'s lease after every step; an
/// elected consumer calls [`fence`](Self::fence) immediately before each
/// handler call and hands the work over only if it returns a fence. This
/// closes the gap a paused process opens: on waking, messages buffered on
/// its socket may be ready before the runner has processed the timeout
/// that demotes it, and the check (a clock read and an uncontended mutex,
/// no round trip) refuses them once the renew deadline has passed.
///
/// ```
/// use guard_smol::ActiveRunner;
/// use guard_std::{GuardConfig, LocalLocker, SharedLocker};
///
/// let config = GuardConfig::new().with_locker(SharedLocker::new(LocalLocker::new()));
/// let runner = ActiveRunner::new(&config, &config.scope("consumer")?)?;
/// let lease = runner.lease_check();
/// // Not running, so not leading: nothing may be handled.
/// assert_eq!(lease.fence(), None);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
pub struct LeaseCheck<R> {
    lease: Arc<Mutex<Option<Lease>>>,
    clock: RuntimeClock<R>,
}

impl<R: Runtime> LeaseCheck<R> {
    pub(crate) fn new(clock: RuntimeClock<R>) -> Self {
        LeaseCheck {
            lease: Arc::default(),
            clock,
        }
    }

    /// The fence, if this replica leads and its renew deadline has not
    /// passed on its own monotonic clock; `None` means: do not act.
    pub fn fence(&self) -> Option<u64> {
        self.lease()
            .and_then(|lease| lease.valid_at(self.clock.now()))
    }

    /// The fence, or why there is none, in one read: for a consumer that
    /// counts what it refuses by cause.
    pub fn state(&self) -> LeaseState {
        match self.lease() {
            None => LeaseState::NotHeld,
            Some(lease) => match lease.valid_at(self.clock.now()) {
                Some(fence) => LeaseState::Valid(fence),
                None => LeaseState::PastDeadline,
            },
        }
    }

    /// The lease published last (its deadline is on the runner's clock).
    pub fn lease(&self) -> Option<Lease> {
        // A writer never panics while holding the lock; a poisoned value
        // is still the last one written.
        *self.lease.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn publish(&self, lease: Option<Lease>) {
        *self.lease.lock().unwrap_or_else(PoisonError::into_inner) = lease;
    }
}
