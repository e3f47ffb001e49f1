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

/// The README's examples, compiled and run as doctests.
#[doc = include_str!("../../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

mod active;
mod control;
mod delay;
mod lease;
mod scheduler;
mod wait;

pub use active::{ActiveRunner, RunnerError};
pub use control::{Control, RunHandle, control};
pub use delay::TimerDelay;
pub use lease::{LeaseCheck, LeaseState};
pub use scheduler::{JobRun, ScheduleError, Scheduler};
pub use wait::{LINE_CAPACITY, WaitingLimiter};
