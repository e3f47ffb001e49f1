//! One gateway replica, configured from a TOML file: what it runs, and
//! the summary `guard-gateway check` prints.

use std::collections::BTreeMap;
use std::sync::Arc;

use guard_endpoints::sink::queued::{NotTaken, QueuedSink, forward};

use crate::action::{self, Action};
use crate::admission::{Admission, Verdict};
use crate::config::{
    Backend, Config, ConfigError, Cost, Locker, PolicyAlgorithm, Schedule, Source, Timing,
    WhenLimited,
};
use crate::reload::{self, Part, Unit};
use guard_smol::{ActiveRunner, Control, RunHandle, RunnerError, Scheduler};

use crate::built::limiter;
pub use crate::built::{Built, build};
use crate::endpoint;
pub use crate::error::GatewayError;
pub use crate::event::{Content, Event};
use crate::readiness::Readiness;

/// Makes every documented metric family visible from the start (at zero
/// for what has not happened yet), so a dashboard or an alert never
/// waits for the first event to know the series exists.
fn announce_metrics(config: &Config, built: &Built) {
    use guard_std::metrics::{RETRY_ATTEMPTS, RL_ALLOWED, RL_DENIED, SINK_DROPPED};
    for name in built.limiters.names() {
        metrics::counter!(RL_ALLOWED, "name" => name.to_owned()).increment(0);
        metrics::counter!(RL_DENIED, "name" => name.to_owned()).increment(0);
    }
    for endpoint in &config.endpoints {
        metrics::counter!(SINK_DROPPED, "name" => endpoint.name.clone()).increment(0);
        if let Source::RedisStream(stream) = &endpoint.source {
            metrics::counter!(RETRY_ATTEMPTS, "name" => stream.stream.clone()).increment(0);
        }
    }
}

/// Runs one replica until `control` stops it, reporting every event to
/// `emit`. `identity` tells this replica from the others that run the
/// same file: it names its stream consumers and MQTT clients. `ready` is
/// started once the locker has answered and the tasks run, and watches
/// every endpoint's source.
pub async fn run(
    config: &Config,
    identity: &str,
    control: Control,
    emit: Arc<dyn Fn(Event) + Send + Sync>,
    ready: Arc<Readiness>,
) -> Result<(), GatewayError> {
    // Never sends: the replica runs `config` as it is.
    let (_none, reloads) = smol::channel::bounded(1);
    run_reloading(config, identity, control, emit, ready, reloads).await
}

/// A configuration read again (`SIGHUP`), or why it could not be.
pub type Reload = Result<Config, ConfigError>;

/// As [`run`], and applies each configuration `reloads` brings, as
/// [`crate::reload`] states: a refused one changes nothing; units that
/// did not change keep running, their leases held.
pub async fn run_reloading(
    config: &Config,
    identity: &str,
    control: Control,
    emit: Arc<dyn Fn(Event) + Send + Sync>,
    ready: Arc<Readiness>,
    reloads: smol::channel::Receiver<Reload>,
) -> Result<(), GatewayError> {
    // A stop asked while connecting (a Redis that accepts but never
    // answers) ends the start at once, not after the request timeout.
    // A service manager hears `connecting` and the watchdog's pings
    // meanwhile, from this thread: a connect that hangs it stops them.
    let connected = futures_lite::future::or(async { Some(build(config).await) }, async {
        match ready.notifier() {
            Some(notifier) => {
                futures_lite::future::or(control.stopped(), notifier.connecting()).await
            }
            None => control.stopped().await,
        }
        None
    })
    .await;
    let Some(built) = connected else {
        tracing::info!("stopped while connecting");
        return Ok(());
    };
    let built = built?;
    if !built.limiters.is_empty() {
        tracing::info!("rate limiters: {}", built.limiters.names().join(", "));
    }
    announce_metrics(config, &built);
    for outcome in ["applied", "refused"] {
        metrics::counter!(reload::RELOADS, "outcome" => outcome).increment(0);
    }
    if let Some(locker) = config.redis_locker() {
        ready.leases_in_redis(&locker.prefix);
    }
    ready.show(crate::readiness::Storage {
        queues: built
            .queues
            .iter()
            .map(|(name, (queued, _))| (name.clone(), queued.clone()))
            .collect(),
        dead_letters: built.dead_letters.as_ref().map(|(store, _)| store.clone()),
    });
    let executor = smol::LocalExecutor::new();
    let replica = Replica {
        built: &built,
        identity,
        control: &control,
        emit: &emit,
        ready: &ready,
        executor: &executor,
    };
    let mut units = BTreeMap::new();
    for part in reload::parts(config) {
        units.insert(part.unit(), replica.start(&part, config).await?);
    }
    let mut tasks = Vec::new();
    // The keys each in-process limiter holds, refreshed every second for
    // the exporter: a flood of distinct keys shows as a table at its
    // bound, never beyond.
    if built.limiters.iter().any(|l| l.keys_held().is_some()) {
        let (limiters, control) = (built.limiters.clone(), control.clone());
        tasks.push(executor.spawn(async move {
            while !control.is_stopped() {
                for limiter in limiters.iter() {
                    limiter.keys_held();
                }
                futures_lite::future::or(control.stopped(), async {
                    async_io::Timer::after(std::time::Duration::from_secs(1)).await;
                })
                .await;
            }
        }));
    }
    if let Some((store, lost_bytes)) = &built.dead_letters {
        emit(Event::DeadLettersOpened {
            dir: store.dir().display().to_string(),
            lost_bytes: *lost_bytes,
        });
    }
    for (name, (queued, recovery)) in &built.queues {
        emit(Event::QueueOpened {
            sink: name.clone(),
            pending: recovery.pending,
            lost_bytes: recovery.lost_bytes,
            damaged_segments: recovery.damaged_segments,
            missing_segments: recovery.missing_segments,
            cursor_reset: recovery.cursor_reset,
        });
        tasks.push(executor.spawn(replica.forwarding(config, name, queued.clone())?));
    }
    // On the executor that runs everything else: if it hangs, the
    // watchdog's pings stop (service.rs).
    if let Some(notifier) = ready.notifier() {
        tasks.push(executor.spawn(notifier.clone().report(ready.clone(), control.clone())));
    }
    // Everything is connected and the locker has answered.
    ready.set_started(true);
    executor
        .run(async {
            let mut running = config.clone();
            // A replica runs until it is stopped, even when every task
            // has ended (an endpoint refused for good, nothing
            // scheduled): it keeps answering `/readyz` with what ended.
            while let Some(reread) = futures_lite::future::or(
                async {
                    control.stopped().await;
                    None
                },
                async {
                    match reloads.recv().await {
                        Ok(reread) => Some(reread),
                        // No reloads will come: wait for the stop.
                        Err(_) => std::future::pending().await,
                    }
                },
            )
            .await
            {
                if let Some(notifier) = ready.notifier() {
                    notifier.reloading();
                }
                let next = reread
                    .map_err(|e| e.to_string())
                    .and_then(|next| reload::plan(&running, &next).map(|plan| (next, plan)));
                match next {
                    Ok((next, plan)) => {
                        let failed = replica.apply(&mut units, &next, &plan).await;
                        // A unit that did not start is not running: the
                        // next reload starts it again, even from the same
                        // file.
                        running = without(next, &failed);
                    }
                    Err(reason) => {
                        tracing::error!(
                            "reload refused, the running configuration stays: {reason}"
                        );
                        metrics::counter!(reload::RELOADS, "outcome" => "refused").increment(1);
                        emit(Event::ReloadRefused { reason });
                    }
                }
                if let Some(notifier) = ready.notifier() {
                    notifier.reloaded(&ready);
                }
            }
            for running in units.into_values() {
                running.task.await;
            }
            for task in tasks {
                task.await;
            }
        })
        .await;
    ready.set_started(false);
    Ok(())
}

/// `config` without the units in `left_out`.
fn without(mut config: Config, left_out: &[Unit]) -> Config {
    let kept = |part: Part<'_>| !left_out.contains(&part.unit());
    config.endpoints.retain(|e| kept(Part::Endpoint(e)));
    config.schedules.retain(|s| kept(Part::Schedule(s)));
    config.active.retain(|name| kept(Part::Active(name)));
    config
}

/// A unit of the replica, running: the handle that stops it alone, and
/// its task.
struct Running {
    handle: RunHandle,
    task: smol::Task<()>,
}

/// What every unit of a replica is started with.
struct Replica<'a> {
    built: &'a Built,
    identity: &'a str,
    control: &'a Control,
    emit: &'a Arc<dyn Fn(Event) + Send + Sync>,
    ready: &'a Arc<Readiness>,
    /// Every task is `'static`: a unit outlives nothing it was started
    /// from.
    executor: &'a smol::LocalExecutor<'static>,
}

impl Replica<'_> {
    /// Starts `part` of `config` under a control of its own, which the
    /// replica's stop stops too.
    async fn start(&self, part: &Part<'_>, config: &Config) -> Result<Running, GatewayError> {
        let (handle, control) = self.control.linked();
        let task: endpoint::Task = match part {
            Part::Endpoint(entry) => {
                endpoint::start(
                    entry,
                    self.built,
                    config,
                    self.identity,
                    control,
                    self.emit.clone(),
                    self.ready,
                )
                .await?
            }
            Part::Schedule(schedule) => self.schedule(schedule, config, control)?,
            Part::Active(name) => self.active(name, config, control)?,
        };
        Ok(Running {
            handle,
            task: self.executor.spawn(task),
        })
    }

    /// Applies `plan`, whose started and restarted units are `next`'s:
    /// what it stops has ended before anything starts again, so an old
    /// and a new endpoint of one name never run together.
    /// Returns the units that did not start.
    async fn apply(
        &self,
        units: &mut BTreeMap<Unit, Running>,
        next: &Config,
        plan: &reload::Plan,
    ) -> Vec<Unit> {
        let stopping: Vec<Running> = plan
            .stopped
            .iter()
            .chain(&plan.restarted)
            .filter_map(|unit| units.remove(unit))
            .collect();
        for running in &stopping {
            running.handle.stop();
        }
        for running in stopping {
            running.task.await;
        }
        for unit in &plan.stopped {
            if let Unit::Endpoint(name) = unit {
                self.ready.forget(name);
            }
        }
        announce_metrics(next, self.built);
        let mut failed = Vec::new();
        for part in reload::parts(next) {
            let unit = part.unit();
            if !plan.started.contains(&unit) && !plan.restarted.contains(&unit) {
                continue;
            }
            match self.start(&part, next).await {
                Ok(running) => {
                    units.insert(unit, running);
                }
                Err(e) => {
                    tracing::error!("reload: {unit} did not start: {e}");
                    failed.push(unit);
                }
            }
        }
        let names = |units: &[Unit]| units.iter().map(Unit::to_string).collect::<Vec<_>>();
        tracing::info!(
            "reloaded: {} started, {} restarted, {} stopped, {} kept",
            plan.started.len(),
            plan.restarted.len(),
            plan.stopped.len(),
            plan.kept.len()
        );
        metrics::counter!(reload::RELOADS, "outcome" => "applied").increment(1);
        (self.emit)(Event::Reloaded {
            started: names(&plan.started),
            restarted: names(&plan.restarted),
            stopped: names(&plan.stopped),
            failed: names(&failed),
            kept: plan.kept.len(),
        });
        failed
    }

    /// One schedule, on a scheduler of its own (exclusive runs are a
    /// scheduler's setting: their run locks as long-lived as a leader's
    /// lease).
    fn schedule(
        &self,
        schedule: &Schedule,
        config: &Config,
        control: Control,
    ) -> Result<endpoint::Task, GatewayError> {
        let failed = |source| GatewayError::Schedule {
            router: schedule.router.clone(),
            source,
        };
        let skipped = self.emit.clone();
        let mut scheduler = Scheduler::new(self.built.guards.clone())
            .with_slot_ttl(config.guards.once_ttl)
            .with_fail_policy(config.guards.fail_policy)
            // A slot skipped on an outage is a line on stdout, as a
            // refused run is (the log's warning about it is throttled).
            .on_skipped(move |router, slot, reason| {
                skipped(Event::Skipped {
                    router: router.to_owned(),
                    slot,
                    reason: reason.name().to_owned(),
                })
            });
        if schedule.exclusive {
            scheduler = scheduler
                .with_exclusive_runs(config.guards.active.ttl())
                .map_err(failed)?;
        }
        let router = schedule.router.clone();
        let emit = self.emit.clone();
        let doing = Arc::new(Doing::new(schedule, self.built, config, &control)?);
        let gate = match &schedule.limit {
            Some(limit) => Some(Admission::new(
                limiter(self.built, &limit.limiter)?,
                WhenLimited::Wait(limit.max_wait),
            )),
            None => None,
        };
        let job = move |run: guard_smol::JobRun| {
            let (emit, router, gate, doing) =
                (emit.clone(), router.clone(), gate.clone(), doing.clone());
            async move {
                if let Some(gate) = &gate
                    && let Verdict::Refused(why) = gate.admit(&router, 0).await
                {
                    tracing::warn!("schedule {router} slot {}: {why}; skipped", run.slot);
                    emit(Event::Skipped {
                        router,
                        slot: run.slot,
                        reason: why.to_string(),
                    });
                    return;
                }
                emit(Event::Executed {
                    router: router.clone(),
                    slot: run.slot,
                    fence: run.fence,
                });
                if let Err(failed) = doing.act(&router, &run).await {
                    tracing::warn!(
                        "schedule {router} slot {}: {} after {} attempt(s)",
                        run.slot,
                        failed.reason,
                        failed.attempts
                    );
                    emit(Event::Failed {
                        router,
                        slot: run.slot,
                        attempts: failed.attempts,
                        reason: failed.reason,
                    });
                }
            }
        };
        match &schedule.timing {
            Timing::Every(every) => {
                scheduler.add_job(&schedule.router, &schedule.chain, *every, job)
            }
            Timing::Cron(cron) => {
                scheduler.add_job(&schedule.router, &schedule.chain, (**cron).clone(), job)
            }
        }
        .map_err(failed)?;
        Ok(Box::pin(scheduler.run(control)))
    }

    /// One leader-only consumer: it reports its promotions and demotions.
    fn active(
        &self,
        name: &str,
        config: &Config,
        control: Control,
    ) -> Result<endpoint::Task, GatewayError> {
        let guards = &self.built.guards;
        let runner = guards
            .scope("consumer")
            .and_then(|s| s.segment("name", name))
            .map_err(RunnerError::Key)
            .and_then(|scope| ActiveRunner::new(guards, &scope))
            .and_then(|r| r.with_settings(config.guards.active.into()))
            .map_err(|source| GatewayError::Consumer {
                name: name.to_owned(),
                source,
            })?;
        self.ready
            .lease_of(&Unit::Active(name.to_owned()).to_string(), runner.key());
        let (promoted, demoted) = (self.emit.clone(), self.emit.clone());
        let (name, name2) = (name.to_owned(), name.to_owned());
        Ok(Box::pin(async move {
            runner
                .run(
                    control,
                    move |fence| {
                        promoted(Event::Promoted {
                            name: name.clone(),
                            fence,
                        });
                        async { Ok::<(), String>(()) }
                    },
                    move |reason| {
                        demoted(Event::Demoted {
                            name: name2.clone(),
                            reason,
                        });
                        async {}
                    },
                )
                .await
        }))
    }

    /// Forwards `name`'s queue to its sink until the replica stops; what
    /// the sink refuses for good becomes a dead letter on disk.
    fn forwarding(
        &self,
        config: &Config,
        name: &str,
        queued: Arc<QueuedSink>,
    ) -> Result<endpoint::Task, GatewayError> {
        let (sink, retry) = crate::sink::forwarded(self.built, config, name)?;
        let in_flight = config
            .sinks
            .iter()
            .find(|s| s.name == *name)
            .map_or(std::num::NonZeroUsize::MIN, crate::sink::Sink::in_flight);
        // The configuration refuses a queue without dead letters on disk.
        let store = self
            .built
            .dead_letters
            .as_ref()
            .map(|(store, _)| store.clone())
            .ok_or_else(|| GatewayError::DeadLetters {
                source: format!("sink {name} has a queue and there is no [dead_letters]").into(),
            })?;
        let (control, emit, name) = (self.control.clone(), self.emit.clone(), name.to_owned());
        Ok(Box::pin(async move {
            let dead_letter = |not: NotTaken| {
                let reason = format!("after {} attempt(s): {}", not.attempts, not.error);
                let letter = crate::dead_letters::DeadLetter {
                    place: "sink".to_owned(),
                    name: name.clone(),
                    sink: Some(name.clone()),
                    id: not.message.as_ref().map(|m| m.id.clone()),
                    from: not
                        .message
                        .as_ref()
                        .map(|m| m.origin.clone())
                        .unwrap_or_default(),
                    fence: not.message.as_ref().and_then(|m| m.fence),
                    reason: reason.clone(),
                    attempts: not.attempts,
                    at_ms: crate::dead_letters::now_ms(),
                    payload: not
                        .message
                        .as_ref()
                        .map(|m| m.payload.clone())
                        .unwrap_or_default(),
                };
                if let Err(e) = crate::dead_letters::kept(&store, &letter) {
                    tracing::error!(
                        "sink {name}: {} not kept as a dead letter ({e}): it stays at the head of the queue",
                        letter.id.as_deref().unwrap_or("-")
                    );
                    return false;
                }
                tracing::warn!(
                    "sink {name}: {} dead-lettered: {}",
                    letter.id.as_deref().unwrap_or("-"),
                    not.error
                );
                emit(Event::SinkDeadLettered {
                    sink: name.clone(),
                    id: letter.id.unwrap_or_default(),
                    from: letter.from,
                    reason,
                });
                true
            };
            futures_lite::future::or(
                forward(&queued, &*sink, &retry, in_flight, dead_letter),
                control.stopped(),
            )
            .await;
        }))
    }
}

/// What `config` configures, for `guard-gateway check`: one line a
/// section, no secrets (URLs are not printed).
pub fn summary(config: &Config) -> String {
    let locker = match &config.locker {
        Locker::None => {
            "none (every guard allows: a single process; elections are within it)".to_owned()
        }
        Locker::Local => {
            "local (in this process: elections and once-guards do not reach other replicas)"
                .to_owned()
        }
        Locker::Redis(l) => {
            let mode = match &l.topology {
                guard_redis::Topology::Standalone { .. } => "standalone",
                guard_redis::Topology::Sentinel { .. } => "sentinel",
                guard_redis::Topology::Cluster { .. } => "cluster",
            };
            format!(
                "redis ({mode}), prefix {:?}, request timeout {:?}",
                l.prefix, l.request_timeout
            )
        }
        Locker::Postgres(l) => format!(
            "postgres, table {:?}, request timeout {:?}",
            l.table, l.request_timeout
        ),
        Locker::Etcd(l) => match l.endpoints.len() {
            1 => "etcd, 1 member".to_owned(),
            n => format!("etcd, {n} members"),
        },
    };
    let schedules: Vec<String> = config
        .schedules
        .iter()
        .map(|s| {
            let when = match &s.timing {
                Timing::Every(every) => format!("{} every {:?}", s.router, every.period()),
                Timing::Cron(cron) => format!("{} on cron {:?}", s.router, cron.expression()),
            };
            let does = match &s.action {
                Action::Report => String::new(),
                Action::Command(c) => format!(
                    ", runs {:?} (timeout {:?}, {} retries)",
                    c.argv,
                    c.timeout,
                    c.retry.max_attempts()
                ),
                Action::Send { sink } => format!(", to {sink}"),
            };
            let exclusive = if s.exclusive {
                ", never overlapping"
            } else {
                ""
            };
            format!("{when}{does}{exclusive}")
        })
        .collect();
    let endpoints: Vec<String> = config
        .endpoints
        .iter()
        .map(|e| {
            let kind = endpoint::describe(&e.source);
            let limit = e
                .limit
                .as_ref()
                .map_or(String::new(), |l| format!(", limited by {}", l.limiter));
            let to =
                e.to.as_ref()
                    .map_or(String::new(), |to| format!(", to {to}"));
            format!("{} ({kind}{limit}{to})", e.name)
        })
        .collect();
    let sinks: Vec<String> = config.sinks.iter().map(crate::sink::describe).collect();
    let limiters: Vec<String> = config
        .ratelimit
        .iter()
        .flat_map(|r| &r.policies)
        .map(|p| {
            let algorithm = match p.algorithm {
                PolicyAlgorithm::Sliding(w) => {
                    format!("sliding, {} per {:?}", w.limit(), w.window())
                }
                PolicyAlgorithm::FixedWindow(w) => {
                    format!(
                        "fixed-window, {} per {:?} from {:?} past each multiple since the epoch",
                        w.limit(),
                        w.period(),
                        w.offset()
                    )
                }
                PolicyAlgorithm::TokenBucket(b) => format!(
                    "token-bucket, {} deep, {} per {:?}",
                    b.capacity(),
                    b.rate().amount(),
                    b.rate().period()
                ),
                PolicyAlgorithm::LeakyBucket(b) => format!(
                    "leaky-bucket, {} deep, {} per {:?}",
                    b.capacity(),
                    b.rate().amount(),
                    b.rate().period()
                ),
            };
            // The table as built: whole shards, each key at most its
            // bytes however long the key.
            let keys = p.memory_keys.div_ceil(guard_std::ratelimit::SHARD_KEYS)
                * guard_std::ratelimit::SHARD_KEYS;
            let in_memory = format!(
                "memory, {keys} keys in at most {} bytes",
                keys.saturating_mul(p.algorithm.memory_bytes_per_key())
            );
            let backend = match p.backend {
                Backend::Memory => in_memory.as_str(),
                Backend::Redis => "redis",
            };
            let counting = match p.cost {
                Cost::Messages => "",
                Cost::Bytes => ", counting bytes",
            };
            format!("{} ({algorithm}{counting}, {backend})", p.name)
        })
        .collect();
    let list = |items: &[String]| {
        if items.is_empty() {
            "none".to_owned()
        } else {
            items.join(", ")
        }
    };
    // Every value in force, those from defaults included: a key left out
    // shows what it became.
    let guards = &config.guards;
    let owner = if guards.owner.is_empty() {
        "none (keys carry no tenant)".to_owned()
    } else {
        format!("{:?}", guards.owner)
    };
    let guards = format!(
        "owner {owner}, lease {:?} renewed every {:?}, slots kept {:?}, fail {}",
        guards.active.ttl().as_duration(),
        guards.active.interval(),
        guards.once_ttl.as_duration(),
        match guards.fail_policy {
            guard_core::guard::FailPolicy::FailClosed => "closed",
            guard_core::guard::FailPolicy::FailOpen => "open",
        }
    );
    format!(
        "configuration is valid\nlocker     {locker}\nguards     {guards}\nschedules  {}\nactive     {}\nendpoints  {}\nsinks      {}\nlimiters   {}\nmetrics    {}\ndead letters {}\n",
        list(&schedules),
        list(&config.active),
        list(&endpoints),
        list(&sinks),
        list(&limiters),
        config
            .metrics
            .prometheus
            .map_or("none".to_owned(), |a| a.to_string()),
        config.dead_letters.as_ref().map_or(
            "in memory (1,024 and 16 MiB per broadcast endpoint, gone at a restart)".to_owned(),
            |d| format!("{} (at most {} bytes)", d.dir.display(), d.max_bytes)
        ),
    )
}

/// What one schedule's runs do, made once: its action with the sink it
/// names, if any.
struct Doing {
    chain: String,
    stop: Control,
    action: Action,
    exclusive: bool,
    sink: Option<(
        Arc<dyn guard_endpoints::sink::MessageSink>,
        guard_core::retry::RetryPolicy,
    )>,
}

impl Doing {
    fn new(
        schedule: &Schedule,
        built: &Built,
        config: &Config,
        stop: &Control,
    ) -> Result<Self, GatewayError> {
        let sink = match &schedule.action {
            Action::Send { sink } => Some(crate::sink::made(built, config, sink)?),
            _ => None,
        };
        Ok(Doing {
            chain: schedule.chain.clone(),
            stop: stop.clone(),
            action: schedule.action.clone(),
            exclusive: schedule.exclusive,
            sink,
        })
    }

    /// Does the action of `router`'s `run`.
    async fn act(&self, router: &str, run: &guard_smol::JobRun) -> Result<(), action::Failed> {
        let slot = action::Slot {
            router,
            chain: &self.chain,
            run,
            stop: &self.stop,
        };
        match (&self.action, &self.sink) {
            (Action::Command(command), _) => action::run_command(command, &slot).await,
            (Action::Send { .. }, Some((sink, retry))) => {
                action::send(&**sink, retry, &slot, self.exclusive).await
            }
            _ => Ok(()),
        }
    }
}
