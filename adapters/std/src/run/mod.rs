//! The runners that drive guard-core's state machines, on any async
//! runtime: a [`Runtime`] gives them its clock and its timers, and the
//! runtime adapters (guard-smol on async-io, guard-tokio on tokio) name
//! the types for theirs.
//!
//! - [`ActiveRunner`]: one active consumer per scope, automatic takeover,
//!   the renew deadline, a [`LeaseCheck`] for the consumer; its callbacks
//!   run beside the lease loop, which renews while they work;
//! - [`Scheduler`]: jobs on schedules, each planned slot run once across
//!   the replicas that share a locker;
//! - [`WaitingLimiter`]: waits until any [`RateLimiter`](crate::ratelimit::RateLimiter)
//!   admits, in arrival order per key;
//! - [`LockWatchdog`]: a lock held while a job runs, renewed every
//!   ttl / 3 and released when the job ends; the job sees the fence and
//!   learns when the hold is lost;
//! - [`control`]: stopping and demoting a running guard from elsewhere;
//! - [`held`]: every lease this process's runners compete for, and what
//!   each holds, for a status view.
//!
//! Every future here is `Send` when the callbacks given to it are: a
//! runner can be spawned on a multi-threaded executor.
//!
//! Time comes only from the [`Runtime`], never from the operating system
//! directly, so a runtime with virtual time (tokio's `time::pause`) runs
//! leases and schedules in it: a test of an hour of leadership finishes
//! in milliseconds.

mod active;
mod caller;
mod control;
mod held;
mod hold;
mod lease;
mod scheduler;
mod wait;

use std::future::Future;
use std::time::Duration;

use guard_core::slot::UnixMillis;
use guard_core::time::Instant;

use crate::Clock;

pub use active::{ActiveRunner, DEFAULT_RELEASE_TIMEOUT, RunnerError};
pub use caller::{CallerRuntime, on_tokio};
pub use control::{Control, RunHandle, control};
pub use held::{HeldLease, held};
pub use hold::{Hold, LockWatchdog};
pub use lease::{LeaseCheck, LeaseState};
pub use scheduler::{JobRun, RUNNING_KEY, SCHEDULE_COMPONENT, ScheduleError, Scheduler, SlotSkip};
pub use wait::{LINE_CAPACITY, WaitingLimiter};

/// What a runner reads and waits on: its runtime's monotonic clock, the
/// wall clock, and timers on the same timeline as the monotonic clock.
///
/// A runtime with virtual time gives virtual readings from `now` and
/// sleeps in virtual time; its `wall` should then advance with it (a
/// schedule's slots are wall-clock times).
pub trait Runtime: Clone + Send + Sync + 'static {
    /// Monotonic now on the runtime's timeline.
    fn now(&self) -> std::time::Instant;

    /// Wall-clock now (UTC), for schedule slots that every replica
    /// computes alike. The operating system's by default.
    fn wall(&self) -> UnixMillis {
        crate::clock::system_wall()
    }

    /// Completes at `at` on the runtime's timeline (at once if it has
    /// passed).
    fn sleep_until(&self, at: std::time::Instant) -> impl Future<Output = ()> + Send;

    /// Runs `future` to completion on its own, detached from the caller:
    /// for clean-up that must outlive a dropped future (the release of a
    /// lock whose job was cancelled). `false` if this runtime cannot
    /// (then nothing runs), the default.
    fn spawn_detached(&self, future: crate::BoxFuture<'static, ()>) -> bool {
        drop(future);
        false
    }

    /// Completes after `duration`; a duration too long to represent
    /// sleeps a century.
    fn sleep(&self, duration: Duration) -> impl Future<Output = ()> + Send {
        let now = self.now();
        let at = now
            .checked_add(duration)
            .unwrap_or_else(|| now + Duration::from_secs(100 * 365 * 86_400));
        self.sleep_until(at)
    }
}

/// A [`Clock`] on a runtime's timeline: guard-core readings since the
/// clock was made, and the runtime's wall clock.
#[derive(Clone, Debug)]
pub struct RuntimeClock<R> {
    runtime: R,
    origin: std::time::Instant,
}

impl<R: Runtime> RuntimeClock<R> {
    /// A clock whose origin is the runtime's now.
    pub fn new(runtime: R) -> Self {
        let origin = runtime.now();
        RuntimeClock { runtime, origin }
    }

    /// The runtime this clock reads.
    pub fn runtime(&self) -> &R {
        &self.runtime
    }

    /// The runtime instant of a reading of this clock (for its timers); a
    /// reading too far ahead to represent maps to a century from the
    /// origin.
    pub fn to_std(&self, at: Instant) -> std::time::Instant {
        let offset = Duration::from_nanos(at.as_nanos());
        self.origin
            .checked_add(offset)
            .unwrap_or_else(|| self.origin + Duration::from_secs(100 * 365 * 86_400))
    }

    /// The reading of this clock at a runtime instant (the origin for one
    /// before it).
    pub fn reading(&self, at: std::time::Instant) -> Instant {
        let nanos = at.saturating_duration_since(self.origin).as_nanos();
        Instant::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    }
}

impl<R: Runtime> Clock for RuntimeClock<R> {
    fn now(&self) -> Instant {
        self.reading(self.runtime.now())
    }

    fn wall(&self) -> UnixMillis {
        self.runtime.wall()
    }
}

/// An `embedded_hal_async` delay on a runtime's timers, for guard-core's
/// retry executor, `LockerExt::lock` and `limit::wait`.
#[derive(Clone, Debug, Default)]
pub struct RuntimeDelay<R>(pub R);

impl<R: Runtime> embedded_hal_async::delay::DelayNs for RuntimeDelay<R> {
    async fn delay_ns(&mut self, ns: u32) {
        self.0.sleep(Duration::from_nanos(u64::from(ns))).await;
    }

    async fn delay_us(&mut self, us: u32) {
        self.0.sleep(Duration::from_micros(u64::from(us))).await;
    }

    async fn delay_ms(&mut self, ms: u32) {
        self.0.sleep(Duration::from_millis(u64::from(ms))).await;
    }
}
