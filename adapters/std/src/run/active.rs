//! Runs guard-core's `ActiveGuard` state machine on a runtime's timers.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
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

/// A promotion's or a demotion's line: debug while promotions fail (a
/// source that cannot connect would otherwise log two lines each
/// interval), info otherwise.
macro_rules! transition {
    ($failing:expr, $($line:tt)+) => {
        if $failing {
            tracing::debug!($($line)+)
        } else {
            tracing::info!($($line)+)
        }
    };
}

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
enum Wake<E> {
    Done(Done),
    Timeout,
    Heard(Heard),
    /// `on_promoted` returned.
    Promoted(Result<(), E>),
    /// `on_demoted` returned.
    Demoted,
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
/// The callbacks' futures are polled beside the lease loop, never in its
/// way: while `on_promoted` runs (a subscription being opened, or the
/// leader's work itself, for any number of leases) the runner keeps
/// renewing and keeps its renew deadline, so no standby is promoted while
/// this replica holds the lease. When the leadership ends while
/// `on_promoted` still runs, it is told: the [`LeaseCheck`] gives no fence
/// from then on and [`LeaseCheck::lost`] resolves; it should stop and
/// return. A lease lost that way (refused or failed renewal, deadline
/// passed) is logged as a warning and counted in
/// [`ACTIVE_CALLBACK_OVERRUNS`](crate::metrics::ACTIVE_CALLBACK_OVERRUNS).
/// `on_demoted` is called once `on_promoted` has returned, and a release
/// (stop, requested demotion, failed promotion) is sent once `on_demoted`
/// has returned: demote before release. Until then this replica does not
/// compete for the lease again. An `on_promoted` that returns `Ok` leaves
/// this replica leading. The callbacks run on the runner's task: work that
/// blocks its thread belongs on a thread of its own.
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

    /// Runs until `control` stops it; see the type's documentation. After
    /// a stop it returns once the callbacks (told through the lease
    /// check) have returned and the lease is released, or the backend has
    /// not answered within the release timeout.
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
        let Some(locker) = self.config.lease_locker() else {
            return self.run_unguarded(control, on_promoted, on_demoted).await;
        };
        // A standby is visible from the start (leader 0), not only once it
        // has led.
        crate::metrics::record_standby(&self.key);
        let _listed = super::held::list(&self.key, self.lease.clone());
        let clock = &self.clock;
        let runtime = clock.runtime();
        let failures = Throttle::new();
        // A promotion that fails every interval (a source that cannot
        // connect) is one line per throttle interval, with the count.
        let activations = Throttle::new();
        // While promotions fail, their "promoted" and "demoted" lines go
        // to debug (the throttled warning above counts them); the first
        // that succeeds after them is logged at info.
        let mut promotions_failing = false;
        let mut last_fence = 0;
        let ttl = self.timing.ttl();
        // From validated timing: the error type is `Infallible`.
        let Ok(mut machine) = ActiveGuard::new(self.timing, locker.can_renew(), clock.now());
        let mut in_flight: Option<BoxFuture<'_, Done>> = None;
        let mut callbacks = Callbacks::<PF, DF>::default();
        // A release the machine asked for while a demotion's callbacks
        // still run: sent once they have returned (demote before release).
        let mut deferred_release: Option<Token> = None;
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
                    Action::Release(token) if callbacks.demoting() => {
                        deferred_release = Some(token);
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
                            tracing::warn!(
                                "active guard {} granted fence {fence} too late to act on",
                                self.key
                            );
                            promotion_skipped = true;
                            machine.handle_timeout(now);
                            self.lease.publish(machine.lease());
                            continue;
                        }
                        last_fence = fence;
                        transition!(
                            promotions_failing,
                            "active guard {} promoted (fence {fence})",
                            self.key
                        );
                        crate::metrics::record_promoted(&self.key);
                        // Polled beside the lease loop, which keeps
                        // renewing (and keeps the renew deadline) however
                        // long it runs. The slot is free: a standby whose
                        // last leadership's callbacks still run does not
                        // try to acquire (see the wait below).
                        callbacks.promoted = Some(Box::pin(on_promoted(fence)));
                    }
                    Action::Demote(_) if promotion_skipped => promotion_skipped = false,
                    Action::Demote(reason) => {
                        // Tells a running `on_promoted` (its `LeaseCheck`
                        // gives no fence and `lost` resolves).
                        self.lease.publish(None);
                        transition!(
                            promotions_failing,
                            "active guard {} demoted: {reason:?}",
                            self.key
                        );
                        crate::metrics::record_demoted(&self.key, reason);
                        if callbacks.promoted.is_some() {
                            self.report_demoted_while_running(reason);
                        }
                        callbacks.demotion = Some(reason);
                    }
                }
            }
            // `on_demoted` follows the return of `on_promoted`, and the
            // release follows the return of `on_demoted`.
            if callbacks.promoted.is_none()
                && callbacks.demoted.is_none()
                && let Some(reason) = callbacks.demotion.take()
            {
                callbacks.demoted = Some(Box::pin(on_demoted(reason)));
            }
            if !callbacks.demoting()
                && let Some(token) = deferred_release.take()
            {
                in_flight = Some(Box::pin(release(
                    locker,
                    &self.key,
                    token,
                    self.release_timeout,
                    runtime,
                )));
            }
            self.lease.publish(machine.lease());
            if machine.phase() == Phase::Stopped && callbacks.idle() {
                return;
            }
            // The time allowed for the backend after stop counts from the
            // return of the callbacks, which were told and are awaited.
            if stop_heard && give_up_at.is_none() && callbacks.idle() {
                give_up_at = Some(runtime.now() + self.release_timeout);
            }
            let wake = {
                let op = async {
                    match in_flight.as_mut() {
                        Some(op) => Wake::Done(op.await),
                        None => future::pending().await,
                    }
                };
                // A standby whose last leadership's callbacks still run
                // does not compete: it would hold a lease it cannot act on
                // in place of a standby that can, and its next promotion
                // would wait behind them.
                let timeout = if machine.phase() == Phase::Standby && !callbacks.idle() {
                    None
                } else {
                    machine.poll_timeout().map(|at| clock.to_std(at))
                };
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
                let callback = async {
                    if let Some(promoted) = callbacks.promoted.as_mut() {
                        Wake::Promoted(promoted.as_mut().await)
                    } else if let Some(demoted) = callbacks.demoted.as_mut() {
                        demoted.as_mut().await;
                        Wake::Demoted
                    } else {
                        future::pending().await
                    }
                };
                future::or(op, future::or(timer, future::or(heard, callback))).await
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
                    machine.stop(now);
                }
                Wake::Promoted(result) => {
                    callbacks.promoted = None;
                    if let Err(e) = &result
                        && let Some(held) = activations.admit()
                    {
                        tracing::warn!(
                            "active guard {} activate: {e} ({held} more not logged)",
                            self.key
                        );
                    }
                    if result.is_err() {
                        promotions_failing = true;
                        // Demotes, then releases, if this leadership is
                        // still on; nothing once it has ended.
                        machine.handle_promote_failed(now);
                    } else if promotions_failing {
                        promotions_failing = false;
                        tracing::info!(
                            "active guard {} promoted (fence {last_fence}) after failed promotions",
                            self.key
                        );
                    }
                }
                Wake::Demoted => callbacks.demoted = None,
                Wake::GiveUp => {
                    tracing::warn!(
                        "active guard {}: backend did not answer within {:?} of stop; the lease expires on its own",
                        self.key,
                        self.release_timeout
                    );
                    return;
                }
            }
        }
    }

    /// Logs (and, for a lost lease, counts) a demotion that finds
    /// `on_promoted` still running.
    fn report_demoted_while_running(&self, reason: DemoteReason) {
        match reason {
            DemoteReason::LeaseLost | DemoteReason::RenewFailed | DemoteReason::RenewDeadline => {
                tracing::warn!(
                    "active guard {}: lease ended ({reason:?}) while on_promoted still runs; \
                     it is told through its lease check, and what it does until it returns \
                     is not covered by the lease",
                    self.key
                );
                crate::metrics::record_callback_overrun(&self.key);
            }
            DemoteReason::PromoteFailed | DemoteReason::Requested | DemoteReason::Stopping => {
                tracing::info!(
                    "active guard {}: on_promoted told to stop ({reason:?}); on_demoted follows its return",
                    self.key
                );
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
        let stay_active = async {
            while let Heard::Demote = control.heard().await {
                tracing::info!(
                    "active guard {}: no locker, nobody to hand over to; staying active",
                    self.key
                );
            }
        };
        // A stop heard while `on_promoted` runs tells it through its lease
        // check; its return is still awaited.
        let promoting = future::or(on_promoted(0), async {
            stay_active.await;
            self.lease.publish(None);
            future::pending().await
        });
        let promoted = match promoting.await {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!("active guard {} activate: {e}", self.key);
                self.lease.publish(None);
                false
            }
        };
        // At once if stop was heard above: the handles are closed.
        while let Heard::Demote = control.heard().await {
            tracing::info!(
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

/// The callbacks of the current (or last) leadership, polled beside the
/// lease loop, one at a time: `on_promoted`'s future, then `on_demoted`'s.
struct Callbacks<PF, DF> {
    /// `on_promoted`'s future, until it returns.
    promoted: Option<Pin<Box<PF>>>,
    /// A demotion whose `on_demoted` waits for `on_promoted` to return.
    demotion: Option<DemoteReason>,
    /// `on_demoted`'s future, until it returns.
    demoted: Option<Pin<Box<DF>>>,
}

impl<PF, DF> Default for Callbacks<PF, DF> {
    fn default() -> Self {
        Callbacks {
            promoted: None,
            demotion: None,
            demoted: None,
        }
    }
}

impl<PF, DF> Callbacks<PF, DF> {
    /// No callback runs or waits.
    fn idle(&self) -> bool {
        self.promoted.is_none() && self.demotion.is_none() && self.demoted.is_none()
    }

    /// A demotion's `on_demoted` waits or runs: a release waits for it.
    fn demoting(&self) -> bool {
        self.demotion.is_some() || self.demoted.is_some()
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
        tracing::warn!("active guard {key} try lock: {e} ({held} more not logged)");
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
        Ok(Renewal::Lost) => tracing::warn!("active guard {key} lost lease, demote"),
        Err(e) => {
            if let Some(held) = failures.admit() {
                tracing::warn!("active guard {key} renew: {e} ({held} more not logged)");
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
            tracing::warn!("active guard {key} release: {e}");
        }
        Done::released(result)
    };
    let late = async {
        runtime.sleep(timeout).await;
        tracing::warn!("active guard {key} release timed out after {timeout:?}");
        Done::Released(false)
    };
    future::or(unlock, late).await
}
