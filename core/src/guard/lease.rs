//! The lease as the consumer sees it: a fence and the instant until which
//! the holder may act, checked where the side effect happens.
//!
//! An [`ActiveGuard`](super::ActiveGuard) enforces its renew deadline when
//! its runtime gets to run. A process that was paused (SIGSTOP, a long GC,
//! a swapped-out VM) wakes with work already queued (messages buffered on
//! a socket) and may hand that work to the handler before the runtime has
//! processed the timeout that demotes it. The consumer therefore checks
//! the lease itself, on its own monotonic clock and with no round trip,
//! immediately before every handler call: [`SharedLease::check`].
//!
//! ```
//! use embassy_sync::blocking_mutex::raw::NoopRawMutex;
//! use guard_core::guard::{Lease, SharedLease};
//! use guard_core::time::Instant;
//!
//! let lease: SharedLease<NoopRawMutex> = SharedLease::new();
//! // The runtime publishes what its ActiveGuard holds after every step.
//! lease.publish(Some(Lease::new(7, Instant::from_millis(3_000))));
//! assert_eq!(lease.check(Instant::from_millis(2_999)), Some(7));
//! // Past the renew deadline nothing may be handled, whatever is queued.
//! assert_eq!(lease.check(Instant::from_millis(3_000)), None);
//! ```

use core::cell::Cell;

use embassy_sync::blocking_mutex::raw::RawMutex;

use crate::sync::BlockingMutex;
use crate::time::Instant;

/// A held lease: its fence, and the renew deadline on the holder's own
/// monotonic clock (send time of the last successful acquire or renew +
/// ttl - drift).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Lease {
    fence: u64,
    until: Instant,
}

impl Lease {
    /// A lease with `fence` that may be acted on before `until`.
    pub const fn new(fence: u64, until: Instant) -> Self {
        Lease { fence, until }
    }

    /// The fencing number to hand to a resource with each side effect.
    pub const fn fence(&self) -> u64 {
        self.fence
    }

    /// The first instant at which the holder may no longer act.
    pub const fn until(&self) -> Instant {
        self.until
    }

    /// The fence, if the holder may still act at `now`: strictly before
    /// the deadline, the same rule the [`ActiveGuard`](super::ActiveGuard)
    /// demotes by.
    pub fn valid_at(&self, now: Instant) -> Option<u64> {
        (now < self.until).then_some(self.fence)
    }
}

/// The lease a runtime publishes and its consumers check.
///
/// One writer (the runtime driving the [`ActiveGuard`](super::ActiveGuard))
/// publishes after every step; any number of readers check before each
/// handler call. Fence and deadline are read together under the mutex, so
/// a reader never pairs one lease's fence with another's deadline. `M` is
/// a critical section on a microcontroller and a thread mutex on a server;
/// `new` is `const`, so it can be a `static`.
pub struct SharedLease<M: RawMutex> {
    inner: BlockingMutex<M, Cell<Option<Lease>>>,
}

impl<M: RawMutex> SharedLease<M> {
    /// Not leading.
    #[cfg(not(guard_loom))]
    pub const fn new() -> Self {
        SharedLease {
            inner: BlockingMutex::new(Cell::new(None)),
        }
    }

    /// Not leading (loom's mutex has no `const` constructor).
    #[cfg(guard_loom)]
    pub fn new() -> Self {
        SharedLease {
            inner: BlockingMutex::new(Cell::new(None)),
        }
    }

    /// Replaces the lease (`None`: not leading).
    pub fn publish(&self, lease: Option<Lease>) {
        self.inner.lock(|cell| cell.set(lease));
    }

    /// The lease published last.
    pub fn get(&self) -> Option<Lease> {
        self.inner.lock(Cell::get)
    }

    /// The fence, if a lease is published and still valid at `now`.
    ///
    /// A demotion published after this check returned cannot recall it:
    /// the deadline, not the demotion, is the guarantee. The check says
    /// the lease had not expired at `now` on this replica's clock, so the
    /// server cannot have expired it either (drift below the margin).
    pub fn check(&self, now: Instant) -> Option<u64> {
        self.get().and_then(|lease| lease.valid_at(now))
    }
}

impl<M: RawMutex> Default for SharedLease<M> {
    fn default() -> Self {
        Self::new()
    }
}

impl<M: RawMutex> core::fmt::Debug for SharedLease<M> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_tuple("SharedLease").field(&self.get()).finish()
    }
}
