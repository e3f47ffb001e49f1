//! The lease an elected consumer checks before every handler call.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use super::{Runtime, RuntimeClock};
use crate::Clock;
use futures_lite::future;
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
///
/// Work that runs for a while (a job done inside `on_promoted`) awaits
/// [`lost`](Self::lost) beside it and stops when it resolves.
#[derive(Clone, Debug)]
pub struct LeaseCheck<R> {
    published: Arc<Mutex<Published>>,
    clock: RuntimeClock<R>,
}

/// The lease published last, and the signal of its end.
#[derive(Debug)]
struct Published {
    lease: Option<Lease>,
    /// Closed when a published lease is replaced by none (demoted,
    /// stopped), then replaced by a fresh pair for the next lease;
    /// nothing is ever sent.
    ended: (async_channel::Sender<()>, async_channel::Receiver<()>),
}

impl<R: Runtime> LeaseCheck<R> {
    pub(crate) fn new(clock: RuntimeClock<R>) -> Self {
        LeaseCheck {
            published: Arc::new(Mutex::new(Published {
                lease: None,
                ended: async_channel::bounded(1),
            })),
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

    /// Now on the runner's clock, which its leases' deadlines are on.
    pub(crate) fn now(&self) -> guard_core::time::Instant {
        self.clock.now()
    }

    /// The lease published last (its deadline is on the runner's clock).
    pub fn lease(&self) -> Option<Lease> {
        self.published().lease
    }

    /// Resolves once this replica may no longer act on the lease it holds
    /// now: the runner demoted (lease lost, a failed renewal, a requested
    /// demotion, stop) or the renew deadline passed on this clock. At once
    /// if it does not lead now. A renewal only moves the deadline on:
    /// this stays pending while the leadership lasts.
    pub async fn lost(&self) {
        loop {
            let (lease, ended) = {
                let published = self.published();
                (published.lease, published.ended.1.clone())
            };
            let Some(lease) = lease else { return };
            if lease.valid_at(self.clock.now()).is_none() {
                return;
            }
            // Woken by the end of the leadership, or at its deadline as
            // published now: a renewal since then has moved it on, which
            // the next turn reads.
            let deadline = self.clock.to_std(lease.until());
            future::or(
                async {
                    // Never sent to: `recv` ends when the lease ends.
                    let _ = ended.recv().await;
                },
                self.clock.runtime().sleep_until(deadline),
            )
            .await;
        }
    }

    pub(crate) fn publish(&self, lease: Option<Lease>) {
        let mut published = self.published();
        if published.lease.is_some() && lease.is_none() {
            // Tell every `lost` waiting on this leadership; the next one
            // gets a signal of its own.
            published.ended.0.close();
            published.ended = async_channel::bounded(1);
        }
        published.lease = lease;
    }

    fn published(&self) -> MutexGuard<'_, Published> {
        // A writer never panics while holding the lock; a poisoned value
        // is still the last one written.
        self.published
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}
