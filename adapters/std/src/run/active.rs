//! Runs guard-core's `ActiveGuard` state machine on a runtime's timers.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use super::control::{Control, Heard};
use super::lease::LeaseCheck;
use super::{Runtime, RuntimeClock};
use crate::{BoxFuture, Clock, GuardConfig, LockerError, SharedLocker, Throttle};
use futures_lite::future;
use guard_core::guard::{
    Action, ActiveConfig, ActiveConfigError, ActiveGuard, ActiveTiming, DemoteReason, Done, Lease,
    Phase,
};
use guard_core::lock::{KeyError, Locker, Renewal, Scope, Token, Ttl, active_key};

/// The original's timeout for the release of a lease.
pub const DEFAULT_RELEASE_TIMEOUT: Duration = Duration::from_secs(3);

/// An [`ActiveRunner`] that cannot be built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RunnerError {
    /// The lease key cannot be built.
    Key(KeyError),
    /// The timing cannot work.
    Timing(ActiveConfigError),
}

impl fmt::Display for RunnerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RunnerError::Key(e) => write!(f, "active guard key: {e}"),
            RunnerError::Timing(e) => write!(f, "active guard timing: {e}"),
        }
    }
}

impl std::error::Error for RunnerError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            RunnerError::Key(e) => Some(e),
            RunnerError::Timing(e) => Some(e),
        }
    }
}

/// What woke the runner.
enum Wake {
    Done(Done),
    Timeout,
    Heard(Heard),
    GiveUp,
}

/// One replica's single-active consumer for a scope.
///
/// [`run`](Self::run) calls `on_promoted(fence)` when this replica becomes
/// the leader (an error there demotes and releases) and
/// `on_demoted(reason)` when it must stop consuming: lease lost, renew
/// deadline passed, explicit demotion, or stop. Each promotion gets at most
/// one demotion. With no locker configured, `on_promoted(0)` is called
/// once and `on_demoted` once at stop (if the promotion succeeded).
///
/// Work done while leading must be checked against the lease where it
/// happens: [`lease_check`](Self::lease_check) gives the consumer the
/// fence and the renew deadline, refreshed after every step of the
/// runner. `on_promoted` is not called once the deadline has passed (a
/// pause between the grant and the callback); that promotion then gets no
/// `on_demoted` either.
///
/// It makes no at-most-once promise for messages: it keeps concurrent
/// consumption to one replica. For sources that deliver each message to
/// one consumer already (consumer groups, shared subscriptions) use none.
#[derive(Debug)]
pub struct ActiveRunner<R> {
    config: GuardConfig,
    key: String,
    timing: ActiveTiming,
    release_timeout: Duration,
    clock: RuntimeClock<R>,
    lease: LeaseCheck<R>,
}

impl<R: Runtime> Clone for ActiveRunner<R> {
    /// A runner with the same settings and a lease view of its own: a
    /// clone runs (and publishes its lease) independently.
    fn clone(&self) -> Self {
        ActiveRunner {
            config: self.config.clone(),
            key: self.key.clone(),
            timing: self.timing,
            release_timeout: self.release_timeout,
            clock: self.clock.clone(),
            lease: LeaseCheck::new(self.clock.clone()),
        }
    }
}

impl<R: Runtime + Default> ActiveRunner<R> {
    /// A runner for `scope` (key `<prefix>active:<scope>`) with the
    /// default timing (15 s lease, 5 s interval), on the default runtime
    /// of its type.
    pub fn new(config: &GuardConfig, scope: &Scope) -> Result<Self, RunnerError> {
        Self::with_runtime(config, scope, R::default())
    }
}

impl<R: Runtime> ActiveRunner<R> {
    /// [`new`](Self::new) on `runtime`'s clock and timers.
    pub fn with_runtime(
        config: &GuardConfig,
        scope: &Scope,
        runtime: R,
    ) -> Result<Self, RunnerError> {
        let key = active_key(config.prefix(), scope).map_err(RunnerError::Key)?;
        let clock = RuntimeClock::new(runtime);
        Ok(ActiveRunner {
            config: config.clone(),
            key: key.as_str().to_owned(),
            timing: ActiveTiming::new(),
            release_timeout: DEFAULT_RELEASE_TIMEOUT,
            lease: LeaseCheck::new(clock.clone()),
            clock,
        })
    }

    /// Lease timing; validated here, once.
    pub fn with_settings(mut self, settings: ActiveConfig) -> Result<Self, RunnerError> {
        self.timing = settings.validate().map_err(RunnerError::Timing)?;
        Ok(self)
    }

    /// How long a release (and a stop waiting on a backend call) may take.
    pub fn with_release_timeout(mut self, timeout: Duration) -> Self {
        self.release_timeout = timeout;
        self
    }

    /// The lease key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// What the consumer checks before each handler call: the fence while
    /// this runner leads and its renew deadline has not passed. Follows
    /// [`run`](Self::run) of this runner (run it once at a time).
    pub fn lease_check(&self) -> LeaseCheck<R> {
        self.lease.clone()
    }

    /// Runs until `control` stops it; see the type's documentation.
    pub async fn run<P, PF, E, D, DF>(
        &self,
        control: Control,
        mut on_promoted: P,
        mut on_demoted: D,
    ) where
        P: FnMut(u64) -> PF,
        PF: Future<Output = Result<(), E>>,
        E: fmt::Display,
        D: FnMut(DemoteReason) -> DF,
        DF: Future<Output = ()>,
    {
        let Some(locker) = self.config.locker() else {
            return self.run_unguarded(control, on_promoted, on_demoted).await;
        };
        // A standby is visible from the start (leader 0), not only once it
        // has led.
        crate::metrics::record_standby(&self.key);
        let clock = &self.clock;
        let runtime = clock.runtime();
        let failures = Throttle::new();
        let ttl = self.timing.ttl();
        // From validated timing: the error type is `Infallible`.
        let Ok(mut machine) = ActiveGuard::new(self.timing, locker.can_renew(), clock.now());
        let mut in_flight: Option<BoxFuture<'_, Done>> = None;
        let mut stop_heard = false;
        let mut give_up_at: Option<std::time::Instant> = None;
        // A promotion whose callback was not called (deadline passed
        // first): its demotion is not reported either (callbacks pair up).
        let mut promotion_skipped = false;
        loop {
            // Publish after every step of the machine, before any callback,
            // so the consumer never acts on a lease the machine dropped.
            self.lease.publish(machine.lease());
            while let Some(action) = machine.poll_action() {
                match action {
                    Action::Acquire => {
                        let acquire = acquire(locker, &self.key, ttl, &failures, runtime);
                        in_flight = Some(Box::pin(acquire));
                    }
                    Action::Renew(token) => {
                        let renew = renew(locker, &self.key, token, ttl, &failures, runtime);
                        in_flight = Some(Box::pin(renew));
                    }
                    Action::Release(token) => {
                        in_flight = Some(Box::pin(release(
                            locker,
                            &self.key,
                            token,
                            self.release_timeout,
                            runtime,
                        )));
                    }
                    Action::Promote { fence } => {
                        let now = clock.now();
                        if machine.lease().and_then(|l| l.valid_at(now)).is_none() {
                            // Woken past the deadline between the grant and
                            // this call (a pause): never start acting late.
                            log::warn!(
                                "active guard {} granted fence {fence} too late to act on",
                                self.key
                            );
                            promotion_skipped = true;
                            machine.handle_timeout(now);
                            self.lease.publish(machine.lease());
                            continue;
                        }
                        log::info!("active guard {} promoted (fence {fence})", self.key);
                        crate::metrics::record_promoted(&self.key);
                        if let Err(e) = on_promoted(fence).await {
                            log::warn!("active guard {} activate: {e}", self.key);
                            machine.handle_promote_failed(clock.now());
                            self.lease.publish(machine.lease());
                        }
                    }
                    Action::Demote(_) if promotion_skipped => promotion_skipped = false,
                    Action::Demote(reason) => {
                        self.lease.publish(None);
                        log::info!("active guard {} demoted: {reason:?}", self.key);
                        crate::metrics::record_demoted(&self.key, reason);
                        on_demoted(reason).await;
                    }
                }
            }
            self.lease.publish(machine.lease());
            if machine.phase() == Phase::Stopped {
                return;
            }
            let wake = {
                let op = async {
                    match in_flight.as_mut() {
                        Some(op) => Wake::Done(op.await),
                        None => future::pending().await,
                    }
                };
                let timeout = machine.poll_timeout().map(|at| clock.to_std(at));
                let timer = async {
                    let at = match (timeout, give_up_at) {
                        (Some(t), Some(g)) => t.min(g),
                        (t, g) => match t.or(g) {
                            Some(at) => at,
                            None => return future::pending().await,
                        },
                    };
                    runtime.sleep_until(at).await;
                    match give_up_at {
                        Some(g) if runtime.now() >= g => Wake::GiveUp,
                        _ => Wake::Timeout,
                    }
                };
                let heard = async {
                    if stop_heard {
                        future::pending().await
                    } else {
                        Wake::Heard(control.heard().await)
                    }
                };
                future::or(op, future::or(timer, heard)).await
            };
            let now = clock.now();
            match wake {
                Wake::Done(done) => {
                    in_flight = None;
                    machine.handle(now, done);
                }
                Wake::Timeout => machine.handle_timeout(now),
                Wake::Heard(Heard::Demote) => machine.demote(now),
                Wake::Heard(Heard::Stop) => {
                    stop_heard = true;
                    give_up_at = Some(runtime.now() + self.release_timeout);
                    machine.stop(now);
                }
                Wake::GiveUp => {
                    log::warn!(
                        "active guard {}: backend did not answer within {:?} of stop; the lease expires on its own",
                        self.key,
                        self.release_timeout
                    );
                    return;
                }
            }
        }
    }

    async fn run_unguarded<P, PF, E, D, DF>(
        &self,
        control: Control,
        mut on_promoted: P,
        mut on_demoted: D,
    ) where
        P: FnMut(u64) -> PF,
        PF: Future<Output = Result<(), E>>,
        E: fmt::Display,
        D: FnMut(DemoteReason) -> DF,
        DF: Future<Output = ()>,
    {
        // A single process: it is the only candidate, always active, and
        // its lease never expires.
        self.lease
            .publish(Some(Lease::new(0, guard_core::time::Instant::MAX)));
        let promoted = match on_promoted(0).await {
            Ok(()) => true,
            Err(e) => {
                log::warn!("active guard {} activate: {e}", self.key);
                self.lease.publish(None);
                false
            }
        };
        while let Heard::Demote = control.heard().await {
            log::info!(
                "active guard {}: no locker, nobody to hand over to; staying active",
                self.key
            );
        }
        self.lease.publish(None);
        if promoted {
            on_demoted(DemoteReason::Stopping).await;
        }
    }
}

// The backend calls log what went wrong; guard-core maps their results.

// A backend that is down fails every attempt, each interval: logged once
// per throttle interval with the count held back, never a line per try.

/// `request`'s answer, or a backend error once a whole lease has passed
/// without one. The machine waits for the one operation in flight before
/// it starts another: a locker that never answers (no request timeout of
/// its own) would otherwise keep this replica from ever leading again.
/// An acquire abandoned this way that did succeed on the server holds a
/// lock nobody renews: it expires after one ttl.
async fn within_lease<T>(
    request: impl Future<Output = Result<T, LockerError>>,
    ttl: Ttl,
    runtime: &impl Runtime,
) -> Result<T, LockerError> {
    let unanswered = async {
        runtime.sleep(ttl.as_duration()).await;
        Err(LockerError::new(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("no answer within the lease's ttl ({:?})", ttl.as_duration()),
        )))
    };
    future::or(request, unanswered).await
}

async fn acquire(
    locker: &SharedLocker,
    key: &str,
    ttl: Ttl,
    failures: &Throttle,
    runtime: &impl Runtime,
) -> Done {
    let result = within_lease(locker.try_lock(key, ttl), ttl, runtime).await;
    if let Err(e) = &result
        && let Some(held) = failures.admit()
    {
        log::warn!("active guard {key} try lock: {e} ({held} more not logged)");
    }
    Done::acquired(result)
}

async fn renew(
    locker: &SharedLocker,
    key: &str,
    token: Token,
    ttl: Ttl,
    failures: &Throttle,
    runtime: &impl Runtime,
) -> Done {
    let result = within_lease(locker.renew(key, &token, ttl), ttl, runtime).await;
    match &result {
        Ok(Renewal::Held) => {}
        Ok(Renewal::Lost) => log::warn!("active guard {key} lost lease, demote"),
        Err(e) => {
            if let Some(held) = failures.admit() {
                log::warn!("active guard {key} renew: {e} ({held} more not logged)");
            }
        }
    }
    Done::renewed(result)
}

async fn release(
    locker: &SharedLocker,
    key: &str,
    token: Token,
    timeout: Duration,
    runtime: &impl Runtime,
) -> Done {
    let unlock = async {
        let result = locker.unlock(key, &token).await;
        if let Err(e) = &result {
            log::warn!("active guard {key} release: {e}");
        }
        Done::released(result)
    };
    let late = async {
        runtime.sleep(timeout).await;
        log::warn!("active guard {key} release timed out after {timeout:?}");
        Done::Released(false)
    };
    future::or(unlock, late).await
}
