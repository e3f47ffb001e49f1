//! Scheduled jobs, each planned slot executed once across replicas.

use std::collections::HashSet;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use super::control::{Control, Heard};
use super::hold::{LockWatchdog, RunLock};
use super::{Runtime, RuntimeClock};
use crate::{Clock, GuardConfig, Throttle};
use futures_lite::future;
use guard_core::guard::{
    ActiveConfig, ActiveConfigError, ActiveTiming, FailPolicy, HoldLost, OnceEvent, OnceGuard,
    OnceOutcome,
};
use guard_core::lock::{KeyError, Scope, Ttl, once_key};
use guard_core::slot::{Schedule, SlotTimer, UnixMillis};

/// The last part of the key each run of a job holds with
/// [`Scheduler::with_exclusive_runs`].
pub const RUNNING_KEY: &str = "running";

/// A scheduler's settings for every job.
#[derive(Clone, Copy, Debug)]
struct Settings {
    /// `None`: the once-guard default, one hour.
    slot_ttl: Option<Ttl>,
    fail_policy: FailPolicy,
    /// The timing of each run's lock, with exclusive runs.
    exclusive: Option<ActiveTiming>,
}

/// The scope component of scheduled jobs.
pub const SCHEDULE_COMPONENT: &str = "schedule";

/// One execution of a job.
///
/// With [`Scheduler::with_exclusive_runs`] it holds the run's lock until
/// the job's future ends (dropping it early does not release the lock):
/// a job that runs long races [`lost`](Self::lost) and stops when it
/// resolves, since from then on another replica may take the lock and
/// start the next slot's run beside it.
#[derive(Clone)]
pub struct JobRun {
    /// The planned slot (wall clock, UTC), the same on every replica.
    pub slot: UnixMillis,
    /// The fence of the claim, to pass to the resources the job touches;
    /// `None` without a locker (a single process) or when allowed on a
    /// backend error under fail-open. With exclusive runs, the fence of
    /// the run's lock.
    pub fence: Option<u64>,
    /// The run's lock, with exclusive runs and a locker.
    lock: Option<Arc<dyn RunLock>>,
}

impl JobRun {
    /// Resolves when the run's lock is lost: a renewal refused, or none
    /// succeeded before the deadline (last acquire or renew sent + ttl −
    /// drift, on this process's clock), which comes before the lock can
    /// expire on the server. Pending for ever without exclusive runs: no
    /// lock is held for the run, so none can be lost.
    pub async fn lost(&self) -> HoldLost {
        match &self.lock {
            Some(lock) => lock.lost().await,
            None => future::pending().await,
        }
    }

    /// Whether the run's lock has been lost, its deadline passed on this
    /// process's clock included; `false` without exclusive runs.
    pub fn is_lost(&self) -> bool {
        self.lock
            .as_ref()
            .is_some_and(|lock| lock.fence().is_none())
    }
}

impl fmt::Debug for JobRun {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JobRun")
            .field("slot", &self.slot)
            .field("fence", &self.fence)
            .field("exclusive", &self.lock.is_some())
            .finish()
    }
}

/// Why a planned slot was not run by this replica, though no other
/// replica's claim took it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SlotSkip {
    /// The backend failed the slot's claim and the policy is
    /// fail-closed; the error as the observer saw it.
    BackendError(String),
    /// With exclusive runs: a run of the job was still going on elsewhere.
    RunningElsewhere,
    /// With exclusive runs: the run's lock could not be taken or kept.
    RunLock(String),
}

impl SlotSkip {
    /// Its label in `guard_slots_skipped_total{reason}` and on the
    /// gateway's `skipped` lines.
    pub fn name(&self) -> &'static str {
        match self {
            SlotSkip::BackendError(_) => "backend_error",
            SlotSkip::RunningElsewhere => "running_elsewhere",
            SlotSkip::RunLock(_) => "run_lock",
        }
    }
}

impl fmt::Display for SlotSkip {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SlotSkip::BackendError(e) => write!(f, "the slot's claim failed: {e}"),
            SlotSkip::RunningElsewhere => {
                f.write_str("a run of the job was still going on elsewhere")
            }
            SlotSkip::RunLock(e) => write!(f, "the run's lock: {e}"),
        }
    }
}

/// What is told of each skipped slot: the job's router id, the slot and why.
type SkippedFn = Arc<dyn Fn(&str, UnixMillis, &SlotSkip) + Send + Sync>;

/// A job that cannot be added.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ScheduleError {
    /// Every job needs a router id: it is part of the dedup key. (The
    /// original fell back to the cron text, so two id-less routers with
    /// the same expression suppressed each other.)
    MissingRouterId,
    /// Two jobs of one scheduler would share a dedup key.
    DuplicateRouterId(String),
    /// The scope or key cannot be built.
    Key(KeyError),
    /// The ttl of exclusive runs leaves no time to renew.
    ExclusiveRuns(ActiveConfigError),
}

impl fmt::Display for ScheduleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ScheduleError::MissingRouterId => f.write_str(
                "a scheduled job needs a non-empty router id (it is part of the dedup key)",
            ),
            ScheduleError::DuplicateRouterId(id) => {
                write!(f, "router id {id:?} is already scheduled in this chain")
            }
            ScheduleError::Key(e) => write!(f, "scheduled job key: {e}"),
            ScheduleError::ExclusiveRuns(e) => write!(f, "exclusive runs: {e}"),
        }
    }
}

impl std::error::Error for ScheduleError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ScheduleError::Key(e) => Some(e),
            ScheduleError::ExclusiveRuns(e) => Some(e),
            _ => None,
        }
    }
}

type JobFn = Box<dyn FnMut(JobRun) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send>;

/// A schedule behind a pointer.
struct DynSchedule(Box<dyn Schedule + Send>);

impl Schedule for DynSchedule {
    fn next_after(&self, t: UnixMillis) -> Option<UnixMillis> {
        self.0.next_after(t)
    }

    fn latest_between(&self, from: UnixMillis, now: UnixMillis) -> UnixMillis {
        self.0.latest_between(from, now)
    }
}

struct Job {
    name: String,
    scope: Scope,
    schedule: DynSchedule,
    run: JobFn,
}

/// Runs jobs on schedules (epoch-aligned [`guard_core::slot::Every`] or a
/// cron [`CronSchedule`](crate::CronSchedule)); every replica computes the same
/// planned slot, and a `OnceGuard` keyed by
/// `scope(schedule, owner, chain, router) + slot` lets one replica run it.
///
/// - A timer that fires early still runs its planned slot; a replica that
///   falls behind skips stale slots and runs only the newest.
/// - One job's runs never overlap on one replica.
/// - Replica clocks must agree to within one period: beyond that they
///   compute different slots and may both run.
pub struct Scheduler<R> {
    runtime: R,
    config: GuardConfig,
    settings: Settings,
    jobs: Vec<Job>,
    keys: HashSet<String>,
    skipped: Option<SkippedFn>,
}

impl<R> fmt::Debug for Scheduler<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Scheduler")
            .field(
                "jobs",
                &self
                    .jobs
                    .iter()
                    .map(|j| j.name.as_str())
                    .collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl<R: Runtime + Default> Scheduler<R> {
    /// A scheduler using `config`'s locker, owner and prefix, on the
    /// default runtime of its type.
    pub fn new(config: GuardConfig) -> Self {
        Self::with_runtime(config, R::default())
    }
}

impl<R: Runtime> Scheduler<R> {
    /// [`new`](Self::new) on `runtime`'s clocks and timers.
    pub fn with_runtime(config: GuardConfig, runtime: R) -> Self {
        Scheduler {
            runtime,
            config,
            settings: Settings {
                slot_ttl: None,
                fail_policy: FailPolicy::FailClosed,
                exclusive: None,
            },
            jobs: Vec::new(),
            keys: HashSet::new(),
            skipped: None,
        }
    }

    /// How long a claimed slot is kept (default one hour, as the original).
    /// It must exceed the clock skew between replicas, how late a replica
    /// may fire (a long run of the job before, a pause) and the claim's
    /// latency taken together, not each alone: a replica that fires late
    /// still runs the slot its clock is in. A shorter one keeps fewer keys
    /// in the backend.
    pub fn with_slot_ttl(mut self, ttl: Ttl) -> Self {
        self.settings.slot_ttl = Some(ttl);
        self
    }

    /// What a slot claim does when the backend fails (default
    /// fail-closed: the slot is skipped; a missed run heals next period).
    pub fn with_fail_policy(mut self, policy: FailPolicy) -> Self {
        self.settings.fail_policy = policy;
        self
    }

    /// Tells `to` of every slot this replica skips though no other
    /// replica's claim took it (a backend error under fail-closed, a run
    /// still going on elsewhere, a run lock that failed), with the job's
    /// router id, the slot and the reason. Each is counted in
    /// `guard_slots_skipped_total{job, reason}` with or without it.
    pub fn on_skipped(
        mut self,
        to: impl Fn(&str, UnixMillis, &SlotSkip) + Send + Sync + 'static,
    ) -> Self {
        self.skipped = Some(Arc::new(to));
        self
    }

    /// Holds a lock on each job for the whole of each run (key
    /// `<prefix>once:<scope>:running`, beside its slot claims), renewed
    /// every ttl / 3 by a [`LockWatchdog`]: a run that outlasts its period
    /// keeps the replica that claims the next slot from starting it (that
    /// slot is skipped, and logged), so the runs of one job never overlap
    /// across replicas. The job gets that lock's fence, and its
    /// [`JobRun`] holds the lock for the run: [`JobRun::lost`] resolves
    /// when the lock is lost (a renewal refused, or none succeeded before
    /// last acquire or renew sent + ttl − drift), before it can expire on
    /// the server. A job that stops when told never overlaps another
    /// replica's run; one that goes on may. `ttl` bounds how long a
    /// crashed run's lock outlives it. Without a locker it changes
    /// nothing.
    pub fn with_exclusive_runs(mut self, ttl: Ttl) -> Result<Self, ScheduleError> {
        let timing = ActiveConfig::new()
            .with_ttl(ttl)
            .validate()
            .map_err(ScheduleError::ExclusiveRuns)?;
        self.settings.exclusive = Some(timing);
        Ok(self)
    }

    /// Adds `job` on `schedule` for router `router_id` in `chain` (may be
    /// empty).
    pub fn add_job<S, F, Fut>(
        &mut self,
        router_id: &str,
        chain: &str,
        schedule: S,
        mut job: F,
    ) -> Result<(), ScheduleError>
    where
        S: Schedule + Send + 'static,
        F: FnMut(JobRun) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        if router_id.is_empty() {
            return Err(ScheduleError::MissingRouterId);
        }
        let scope = self
            .config
            .scope(SCHEDULE_COMPONENT)
            .and_then(|s| s.segment("chain", chain))
            .and_then(|s| s.segment("router", router_id))
            .map_err(ScheduleError::Key)?;
        if !self.keys.insert(scope.as_str().to_owned()) {
            return Err(ScheduleError::DuplicateRouterId(router_id.to_owned()));
        }
        crate::metrics::record_once_scope(scope.as_str());
        self.jobs.push(Job {
            name: router_id.to_owned(),
            scope,
            schedule: DynSchedule(Box::new(schedule)),
            run: Box::new(move |run| Box::pin(job(run))),
        });
        Ok(())
    }

    /// Runs every job until `control` stops the scheduler.
    pub async fn run(self, control: Control) {
        let executor = async_executor::Executor::new();
        let tasks: Vec<_> = self
            .jobs
            .into_iter()
            .map(|job| {
                executor.spawn(run_job(
                    job,
                    RuntimeClock::new(self.runtime.clone()),
                    self.config.clone(),
                    self.settings,
                    self.skipped.clone(),
                    control.clone(),
                ))
            })
            .collect();
        executor
            .run(async {
                for task in tasks {
                    task.await;
                }
            })
            .await;
    }
}

/// Logs a slot claim and records it in `guard_once_total` (every one is
/// counted there; backend errors are logged at most once per throttle
/// interval).
fn log_outcome(event: &OnceEvent<'_>, failures: &Throttle) {
    crate::metrics::record_once(event);
    match (event.outcome, event.error) {
        (OnceOutcome::SkippedOnError, Some(e)) => {
            if let Some(held) = failures.admit() {
                tracing::warn!(
                    "once guard {} key={} backend error, skip action: {e} ({held} more not logged)",
                    event.scope,
                    event.key
                );
            }
        }
        (OnceOutcome::AllowedOnError, Some(e)) => {
            if let Some(held) = failures.admit() {
                tracing::warn!(
                    "once guard {} key={} backend error, fail-open proceed: {e} ({held} more not logged)",
                    event.scope,
                    event.key
                );
            }
        }
        (OnceOutcome::AlreadyClaimed, _) => tracing::info!(
            "once guard {} key={} already executed by another holder, skip",
            event.scope,
            event.key
        ),
        (outcome, _) => tracing::debug!(
            "once guard {} key={} {}",
            event.scope,
            event.key,
            outcome.name()
        ),
    }
}

async fn run_job<R: Runtime>(
    mut job: Job,
    clock: RuntimeClock<R>,
    config: GuardConfig,
    settings: Settings,
    skipped: Option<SkippedFn>,
    control: Control,
) {
    let skip = |slot: UnixMillis, reason: SlotSkip| {
        crate::metrics::record_slot_skipped(&job.name, reason.name());
        if let Some(to) = &skipped {
            to(&job.name, slot, &reason);
        }
    };
    let mut guard = OnceGuard::new(config.locker(), job.scope.clone())
        .with_prefix(config.prefix())
        .with_fail_policy(settings.fail_policy);
    if let Some(ttl) = settings.slot_ttl {
        guard = guard.with_ttl(ttl);
    }
    // A backend that is down fails every slot: its warning is throttled.
    let failures = Throttle::new();
    // The last backend error, for the skipped slot's reason.
    let last_error = std::sync::Mutex::new(String::new());
    let guard = guard.with_observer(|event: &OnceEvent<'_>| {
        if let Some(e) = event.error {
            *last_error.lock().unwrap_or_else(|p| p.into_inner()) = e.to_string();
        }
        log_outcome(event, &failures)
    });
    // The lock each run holds, with exclusive runs and a locker.
    let exclusive = match (settings.exclusive, config.locker()) {
        (Some(timing), Some(locker)) => match once_key(config.prefix(), &job.scope, RUNNING_KEY) {
            Ok(key) => Some((
                LockWatchdog::with_validated(locker.clone(), timing, clock.runtime().clone()),
                key,
            )),
            Err(e) => {
                tracing::error!("scheduled job {}: run lock key: {e}", job.name);
                return;
            }
        },
        _ => None,
    };
    let mut timer = SlotTimer::new(job.schedule, clock.wall());
    while let Some(next) = timer.next_fire() {
        let wait = next.saturating_duration_since(clock.wall());
        let stop = async {
            while let Heard::Demote = control.heard().await {}
            true
        };
        let due = async {
            clock.runtime().sleep(wait).await;
            false
        };
        if control.is_stopped() || future::or(stop, due).await {
            break;
        }
        let Some(slot) = timer.fire(clock.wall()) else {
            break;
        };
        match guard.allow(&slot.as_millis().to_string()).await {
            Ok(outcome) if outcome.is_allowed() => match &exclusive {
                None => {
                    (job.run)(JobRun {
                        slot,
                        fence: outcome.fence(),
                        lock: None,
                    })
                    .await;
                }
                Some((watchdog, key)) => {
                    let run = &mut job.run;
                    let ran = watchdog
                        .run(key, |hold| {
                            // The job keeps the hold for its whole run, to
                            // watch `lost`.
                            run(JobRun {
                                slot,
                                fence: hold.fence(),
                                lock: Some(Arc::new(hold)),
                            })
                        })
                        .await;
                    match ran {
                        Ok(Some(())) => {}
                        Ok(None) => {
                            tracing::info!(
                                "scheduled job {}: slot {} skipped, a run of it is still going on elsewhere",
                                job.name,
                                slot.as_millis()
                            );
                            skip(slot, SlotSkip::RunningElsewhere);
                        }
                        Err(e) => {
                            tracing::error!("scheduled job {}: run lock: {e}", job.name);
                            skip(slot, SlotSkip::RunLock(e.to_string()));
                        }
                    }
                }
            },
            Ok(OnceOutcome::SkippedOnError) => {
                let error = last_error.lock().unwrap_or_else(|p| p.into_inner()).clone();
                skip(slot, SlotSkip::BackendError(error));
            }
            Ok(_) => {}
            Err(e) => tracing::error!("scheduled job {}: {e}", job.name),
        }
    }
}
