//! guard-smol: guard's runtime adapter for servers, on `async-io` timers
//! (smol, or any executor: async-io runs its own reactor).
//!
//! - [`ActiveRunner`] drives guard-core's `ActiveGuard` state machine:
//!   one active consumer per scope, with `on_promoted` / `on_demoted`
//!   callbacks, automatic takeover and the renew deadline;
//! - [`Scheduler`] runs jobs on cron expressions (with seconds) or
//!   epoch-aligned intervals, each planned slot executed once across the
//!   replicas that share a locker;
//! - [`WaitingLimiter`] waits until any guard-std `RateLimiter` admits:
//!   `until_ready` / `until_n_ready`, with a deadline, jitter and the
//!   waiters of a key served in arrival order;
//! - [`LockWatchdog`] holds a lock while a job runs, renewed every
//!   ttl / 3 and released when the job ends; the job gets the fence and
//!   learns when the hold is lost;
//! - [`TimerDelay`] is an `embedded_hal_async` delay, for guard-core's
//!   retry executor and `LockerExt::lock`.
//!
//! ```no_run
//! # smol::block_on(async {
//! use std::time::Duration;
//! use guard_core::slot::Every;
//! use guard_smol::{Scheduler, control};
//! use guard_std::{GuardConfig, LocalLocker, SharedLocker};
//!
//! let config = GuardConfig::new()
//!     .with_locker(SharedLocker::new(LocalLocker::new()))
//!     .with_owner("tenant1");
//! let mut scheduler = Scheduler::new(config);
//! scheduler.add_job("nightly-report", "", Every::new(Duration::from_secs(60))?, |run| async move {
//!     println!("slot {} (fence {:?})", run.slot, run.fence);
//! })?;
//! let (handle, ctl) = control();
//! // handle.stop() from elsewhere ends the scheduler.
//! scheduler.run(ctl).await;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # });
//! ```
// docs.rs (nightly, `--cfg docsrs`) marks each feature-gated item with
// the feature it needs.
#![cfg_attr(docsrs, feature(doc_cfg))]

/// The README's examples, compiled and run as doctests.
#[doc = include_str!("../../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

mod delay;

pub use delay::TimerDelay;
pub use guard_std::run::{
    Control, DEFAULT_RELEASE_TIMEOUT, JobRun, LINE_CAPACITY, LeaseState, RunHandle, RunnerError,
    SCHEDULE_COMPONENT, ScheduleError, SlotSkip, control,
};

/// async-io's clock and timers (`std::time::Instant`, the reactor's
/// timers) and the system's wall clock: the runtime of this adapter's
/// runners.
#[derive(Clone, Copy, Debug, Default)]
pub struct AsyncIo;

impl guard_std::run::Runtime for AsyncIo {
    fn now(&self) -> std::time::Instant {
        std::time::Instant::now()
    }

    async fn sleep_until(&self, at: std::time::Instant) {
        async_io::Timer::at(at).await;
    }

    /// A thread of its own that drives `future` with async-io's
    /// `block_on` (clean-up is rare; no executor is assumed).
    fn spawn_detached(&self, future: guard_std::BoxFuture<'static, ()>) -> bool {
        std::thread::Builder::new()
            .name("guard-cleanup".into())
            .spawn(move || async_io::block_on(future))
            .is_ok()
    }
}

/// guard-std's [`ActiveRunner`](guard_std::run::ActiveRunner) on async-io.
pub type ActiveRunner = guard_std::run::ActiveRunner<AsyncIo>;
/// guard-std's [`Scheduler`](guard_std::run::Scheduler) on async-io.
pub type Scheduler = guard_std::run::Scheduler<AsyncIo>;
/// guard-std's [`WaitingLimiter`](guard_std::run::WaitingLimiter) on async-io.
pub type WaitingLimiter = guard_std::run::WaitingLimiter<AsyncIo>;
/// guard-std's [`LockWatchdog`](guard_std::run::LockWatchdog) on async-io.
pub type LockWatchdog = guard_std::run::LockWatchdog<AsyncIo>;
/// What a job under a [`LockWatchdog`] sees of its lock.
pub type Hold = guard_std::run::Hold<AsyncIo>;
/// guard-std's [`LeaseCheck`](guard_std::run::LeaseCheck) of an [`ActiveRunner`].
pub type LeaseCheck = guard_std::run::LeaseCheck<AsyncIo>;
