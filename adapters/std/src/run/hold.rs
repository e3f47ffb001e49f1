//! A lock held while a job runs, renewed every ttl / 3 by guard-core's
//! `Watchdog`, released when the job ends.

use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures_lite::future;
use guard_core::guard::{ActiveConfig, ActiveConfigError, ActiveTiming, HoldLost, Lease, Watchdog};
use guard_core::lock::{Locker, Token, Ttl};

use super::active::DEFAULT_RELEASE_TIMEOUT;
use super::{Runtime, RuntimeClock};
use crate::{BoxFuture, Clock, LockerError, SharedLocker};

/// Runs jobs under a lock that renews itself: [`run`](Self::run) takes a
/// key, runs the job while a watchdog renews the lock every ttl / 3, and
/// releases it when the job ends. The job gets a [`Hold`]: the fence to
/// hand to the resources it writes, and a future that resolves when the
/// hold is lost, so it can stop.
///
/// - The job may act while [`Hold::fence`] returns a fence: until the last
///   successful acquire or renew was sent + ttl − drift (ttl / 10), on
///   this process's clock.
/// - A renewal the backend refuses ends the hold at once; one that fails
///   is retried each interval until that deadline (a backend blip shorter
///   than the margin costs nothing).
/// - The lock is released when the job ends; if the job's future is
///   dropped first (cancelled, timed out), the release is sent from a
///   task of the runtime where it can spawn one, else the lock expires
///   after its ttl.
///
/// ```no_run
/// # smol::block_on(async {
/// use guard_core::lock::Ttl;
/// use guard_smol::LockWatchdog;
/// use guard_std::{LocalLocker, SharedLocker};
///
/// let watchdog = LockWatchdog::new(SharedLocker::new(LocalLocker::new()), Ttl::from_secs(30)?)?;
/// let ran = watchdog
///     .run("report:nightly", |hold| async move {
///         // A long job: stop when the lock is lost, pass the fence on.
///         let fence = hold.fence();
///         futures_lite::future::or(async { /* the work, fenced */ fence }, async {
///             hold.lost().await;
///             None
///         })
///         .await
///     })
///     .await?;
/// if ran.is_none() {
///     println!("another process holds the lock");
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # });
/// ```
#[derive(Clone, Debug)]
pub struct LockWatchdog<R> {
    locker: SharedLocker,
    timing: ActiveTiming,
    release_timeout: Duration,
    clock: RuntimeClock<R>,
}

impl<R: Runtime + Default> LockWatchdog<R> {
    /// Locks of `ttl` on `locker`, renewed every ttl / 3, on the default
    /// runtime of its type.
    pub fn new(locker: SharedLocker, ttl: Ttl) -> Result<Self, ActiveConfigError> {
        Self::with_runtime(locker, ttl, R::default())
    }
}

impl<R: Runtime> LockWatchdog<R> {
    /// [`new`](Self::new) on `runtime`'s clock and timers.
    pub fn with_runtime(
        locker: SharedLocker,
        ttl: Ttl,
        runtime: R,
    ) -> Result<Self, ActiveConfigError> {
        Self::with_timing(locker, ActiveConfig::new().with_ttl(ttl), runtime)
    }

    /// Another renew interval or drift margin than ttl / 3 and ttl / 10;
    /// validated here.
    pub fn with_timing(
        locker: SharedLocker,
        timing: ActiveConfig,
        runtime: R,
    ) -> Result<Self, ActiveConfigError> {
        Ok(Self::with_validated(locker, timing.validate()?, runtime))
    }

    pub(crate) fn with_validated(locker: SharedLocker, timing: ActiveTiming, runtime: R) -> Self {
        LockWatchdog {
            locker,
            timing,
            release_timeout: DEFAULT_RELEASE_TIMEOUT,
            clock: RuntimeClock::new(runtime),
        }
    }

    /// How long the release at the end may take (3 s by default).
    pub fn with_release_timeout(mut self, timeout: Duration) -> Self {
        self.release_timeout = timeout;
        self
    }

    /// Takes `key` if nobody holds it and runs `job` while holding it;
    /// `Ok(None)` when another holder has it (the job does not run). An
    /// error is the backend's, from the acquire.
    pub async fn run<F, Fut, T>(&self, key: &str, job: F) -> Result<Option<T>, LockerError>
    where
        F: FnOnce(Hold<R>) -> Fut,
        Fut: Future<Output = T>,
    {
        let ttl = self.timing.ttl();
        let sent = self.clock.now();
        let Some(token) = self.locker.try_lock(key, ttl).await? else {
            return Ok(None);
        };
        let shared = Arc::new(Shared {
            state: Mutex::new(Watchdog::new(self.timing, token, sent)),
            lost: async_channel::bounded(1),
        });
        let hold = Hold {
            shared: shared.clone(),
            clock: self.clock.clone(),
        };
        let mut unreleased = Unreleased {
            locker: self.locker.clone(),
            key: key.to_owned(),
            token: Some(token),
            runtime: self.clock.runtime().clone(),
        };
        let output = future::or(job(hold), async {
            self.renew_until_lost(key, &shared).await;
            future::pending().await
        })
        .await;
        unreleased.token = None;
        if shared.lost().is_none() {
            self.release(key, &token).await;
        }
        Ok(Some(output))
    }

    /// Renews on the watchdog's schedule until the hold is lost.
    async fn renew_until_lost(&self, key: &str, shared: &Shared) {
        let runtime = self.clock.runtime();
        loop {
            let now = self.clock.now();
            let (due, next) = {
                let mut dog = shared.dog();
                (dog.poll_renew(now), dog.poll_timeout())
            };
            let Some(next) = next else {
                // Lost: tell the job, and renew no more.
                shared.lost.0.close();
                tracing::warn!("lock {key}: hold lost ({:?})", shared.lost());
                return;
            };
            let Some(token) = due else {
                runtime.sleep_until(self.clock.to_std(next)).await;
                shared.dog().handle_timeout(self.clock.now());
                continue;
            };
            // The renewal races the deadline: one that never answers ends
            // the hold when the deadline passes.
            let deadline = self.clock.to_std(next);
            let renewed = future::or(
                async { Some(self.locker.renew(key, &token, self.timing.ttl()).await) },
                async {
                    runtime.sleep_until(deadline).await;
                    None
                },
            )
            .await;
            let now = self.clock.now();
            match renewed {
                Some(result) => {
                    if let Err(e) = &result {
                        tracing::warn!("lock {key}: renewal failed, retried: {e}");
                    }
                    shared.dog().handle_renewed(now, result);
                }
                None => shared.dog().handle_timeout(now),
            }
        }
    }

    async fn release(&self, key: &str, token: &Token) {
        let unlock = async {
            if let Err(e) = self.locker.unlock(key, token).await {
                tracing::warn!("lock {key}: release: {e}");
            }
        };
        let late = async {
            self.clock.runtime().sleep(self.release_timeout).await;
            tracing::warn!(
                "lock {key}: release timed out after {:?}; it expires on its own",
                self.release_timeout
            );
        };
        future::or(unlock, late).await;
    }
}

/// The watchdog and the signal of its loss, shared by the renewals and
/// the job's [`Hold`].
#[derive(Debug)]
struct Shared {
    state: Mutex<Watchdog>,
    /// Closed when the hold is lost; nothing is ever sent.
    lost: (async_channel::Sender<()>, async_channel::Receiver<()>),
}

impl Shared {
    fn dog(&self) -> std::sync::MutexGuard<'_, Watchdog> {
        // A holder never panics while holding the lock; a poisoned value
        // is still the last one written.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn lost(&self) -> Option<HoldLost> {
        self.dog().lost()
    }
}

/// What a job running under a [`LockWatchdog`] sees of its lock.
#[derive(Debug)]
pub struct Hold<R> {
    shared: Arc<Shared>,
    clock: RuntimeClock<R>,
}

impl<R: Runtime> Hold<R> {
    /// The fence while the lock is held and its deadline has not passed
    /// on this process's clock; `None` means: stop acting.
    pub fn fence(&self) -> Option<u64> {
        self.lease().and_then(|l| l.valid_at(self.clock.now()))
    }

    /// The lease: the fence and the deadline (on the runner's clock).
    pub fn lease(&self) -> Option<Lease> {
        self.shared.dog().lease()
    }

    /// Why the hold ended, once it has.
    pub fn lost_because(&self) -> Option<HoldLost> {
        self.shared.lost()
    }

    /// Resolves when the hold is lost (a renewal refused, or none
    /// succeeded before the deadline); pending while it holds.
    pub async fn lost(&self) -> HoldLost {
        // Never sent to: `recv` ends when the renewals close the channel.
        let _ = self.shared.lost.1.recv().await;
        self.shared.lost().unwrap_or(HoldLost::Deadline)
    }
}

/// A [`Hold`] without its runtime's type: what a scheduled job's
/// [`JobRun`](super::JobRun) keeps of its run's lock.
pub(crate) trait RunLock: Send + Sync {
    /// [`Hold::fence`].
    fn fence(&self) -> Option<u64>;
    /// [`Hold::lost`].
    fn lost(&self) -> BoxFuture<'_, HoldLost>;
}

impl<R: Runtime> RunLock for Hold<R> {
    fn fence(&self) -> Option<u64> {
        Hold::fence(self)
    }

    fn lost(&self) -> BoxFuture<'_, HoldLost> {
        Box::pin(Hold::lost(self))
    }
}

/// Releases the lock from a task of the runtime if the job's future is
/// dropped before it ends (cancelled, timed out).
struct Unreleased<R: Runtime> {
    locker: SharedLocker,
    key: String,
    token: Option<Token>,
    runtime: R,
}

impl<R: Runtime> Drop for Unreleased<R> {
    fn drop(&mut self) {
        let Some(token) = self.token.take() else {
            return;
        };
        let (locker, key) = (self.locker.clone(), std::mem::take(&mut self.key));
        let spawned = self.runtime.spawn_detached(Box::pin(async move {
            if let Err(e) = locker.unlock(&key, &token).await {
                tracing::warn!("lock {key}: release after the job was dropped: {e}");
            }
        }));
        if !spawned {
            tracing::info!("lock dropped with its job: it expires after its ttl");
        }
    }
}
