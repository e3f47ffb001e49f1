//! guard-tokio: guard's runtime adapter for tokio.
//!
//! The runners are guard-std's ([`guard_std::run`]), here on tokio's
//! clock and timers:
//!
//! - [`ActiveRunner`]: one active consumer per scope, with `on_promoted`
//!   / `on_demoted` callbacks, automatic takeover and the renew deadline;
//! - [`Scheduler`]: jobs on cron expressions or epoch-aligned intervals,
//!   each planned slot executed once across the replicas that share a
//!   locker;
//! - [`WaitingLimiter`]: waits until any guard-std `RateLimiter` admits,
//!   with a deadline, jitter and the waiters of a key served in arrival
//!   order;
//! - [`LockWatchdog`]: a lock held while a job runs, renewed every
//!   ttl / 3, released when the job ends (or from a task if its future
//!   is dropped); the job gets the fence and learns when the hold is lost;
//! - [`TokioDelay`]: an `embedded_hal_async` delay for guard-core's retry
//!   executor and `LockerExt::lock`.
//!
//! Their futures are `Send` (with `Send` callbacks), so they go to
//! `tokio::spawn`. They read time only through [`Tokio`], so under
//! `tokio::time::pause` (`#[tokio::test(start_paused = true)]`) leases,
//! renewals and waits run in virtual time: a test of an hour of
//! leadership finishes in milliseconds. Schedules fire at wall-clock
//! slots; give them [`Tokio::with_virtual_wall`] in such tests.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use guard_std::{GuardConfig, LocalLocker, SharedLocker};
//! use guard_tokio::{ActiveRunner, control};
//!
//! let config = GuardConfig::new().with_locker(SharedLocker::new(LocalLocker::new()));
//! let runner = ActiveRunner::new(&config, &config.scope("consumer")?)?;
//! let (handle, ctl) = control();
//! let leading = tokio::spawn(async move {
//!     runner
//!         .run(
//!             ctl,
//!             |fence| async move {
//!                 println!("leading with fence {fence}");
//!                 Ok::<(), std::convert::Infallible>(())
//!             },
//!             |reason| async move { println!("stepped down: {reason:?}") },
//!         )
//!         .await
//! });
//! handle.stop();
//! leading.await?;
//! # Ok(())
//! # }
//! ```
// docs.rs (nightly, `--cfg docsrs`) marks each feature-gated item with
// the feature it needs.
#![cfg_attr(docsrs, feature(doc_cfg))]

use std::future::Future;

use guard_core::slot::UnixMillis;
use guard_std::run::{Runtime, RuntimeDelay};

pub use guard_std::run::{
    Control, DEFAULT_RELEASE_TIMEOUT, JobRun, LINE_CAPACITY, LeaseState, RunHandle, RunnerError,
    SCHEDULE_COMPONENT, ScheduleError, SlotSkip, control,
};

/// tokio's clock and timers: `tokio::time::Instant` and `sleep_until`,
/// virtual when the runtime's time is paused. The wall clock is the
/// system's unless made with [`with_virtual_wall`](Self::with_virtual_wall).
#[derive(Clone, Copy, Debug, Default)]
pub struct Tokio {
    /// `None`: the system's wall clock. `Some`: a wall clock that moves
    /// with tokio's (the wall reading and tokio's instant it started at).
    virtual_wall: Option<(UnixMillis, tokio::time::Instant)>,
}

impl Tokio {
    /// tokio's timers and the system's wall clock.
    pub fn new() -> Self {
        Self::default()
    }

    /// tokio's timers and a wall clock that reads the system's now and
    /// then moves only with tokio's clock: in paused time it advances as
    /// timers do, so schedules fire in virtual time. Make it inside the
    /// runtime (after `pause`); not for production, where every replica's
    /// slots must follow the system clock that NTP keeps in step.
    pub fn with_virtual_wall() -> Self {
        Tokio {
            virtual_wall: Some((
                guard_std::Clock::wall(&guard_std::SystemClock::new()),
                tokio::time::Instant::now(),
            )),
        }
    }
}

impl Runtime for Tokio {
    fn now(&self) -> std::time::Instant {
        tokio::time::Instant::now().into_std()
    }

    fn wall(&self) -> UnixMillis {
        match self.virtual_wall {
            None => guard_std::Clock::wall(&guard_std::SystemClock::new()),
            Some((wall, start)) => {
                let elapsed = tokio::time::Instant::now().saturating_duration_since(start);
                let ms = u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX);
                UnixMillis(wall.0.saturating_add(ms))
            }
        }
    }

    fn sleep_until(&self, at: std::time::Instant) -> impl Future<Output = ()> + Send {
        tokio::time::sleep_until(tokio::time::Instant::from_std(at))
    }

    /// A task on the current tokio runtime; `false` outside one.
    fn spawn_detached(&self, future: guard_std::BoxFuture<'static, ()>) -> bool {
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                drop(handle.spawn(future));
                true
            }
            Err(_) => false,
        }
    }
}

/// guard-std's [`ActiveRunner`](guard_std::run::ActiveRunner) on tokio.
pub type ActiveRunner = guard_std::run::ActiveRunner<Tokio>;
/// guard-std's [`Scheduler`](guard_std::run::Scheduler) on tokio.
pub type Scheduler = guard_std::run::Scheduler<Tokio>;
/// guard-std's [`WaitingLimiter`](guard_std::run::WaitingLimiter) on tokio.
pub type WaitingLimiter = guard_std::run::WaitingLimiter<Tokio>;
/// guard-std's [`LeaseCheck`](guard_std::run::LeaseCheck) of an [`ActiveRunner`].
pub type LeaseCheck = guard_std::run::LeaseCheck<Tokio>;
/// guard-std's [`LockWatchdog`](guard_std::run::LockWatchdog) on tokio.
pub type LockWatchdog = guard_std::run::LockWatchdog<Tokio>;
/// What a job under a [`LockWatchdog`] sees of its lock.
pub type Hold = guard_std::run::Hold<Tokio>;
/// An `embedded_hal_async` delay on tokio's timers.
pub type TokioDelay = RuntimeDelay<Tokio>;
