//! One gateway replica, configured from a TOML file: what it runs, and
//! the summary `guard-gateway check` prints.

use guard_endpoints::sink::queued::{NotTaken, forward};
use std::sync::Arc;

use crate::action::{self, Action};
use crate::admission::{Admission, Verdict};
use crate::config::{
    Backend, Config, Cost, Locker, PolicyAlgorithm, Schedule, Source, Timing, WhenLimited,
};
use guard_smol::{ActiveRunner, Control, RunnerError, Scheduler};

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
        log::info!("stopped while connecting");
        return Ok(());
    };
    let built = built?;
    if !built.limiters.is_empty() {
        log::info!("rate limiters: {}", built.limiters.names().join(", "));
    }
    announce_metrics(config, &built);
    let scheduler = || {
        let skipped = emit.clone();
        Scheduler::new(built.guards.clone())
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
            })
    };
    // Exclusive runs are a scheduler's setting: those schedules have one
    // of their own, its run locks as long-lived as a leader's lease.
    let mut plain = scheduler();
    let mut exclusive = match config.schedules.iter().find(|s| s.exclusive) {
        None => None,
        Some(first) => Some(
            scheduler()
                .with_exclusive_runs(config.guards.active.ttl())
                .map_err(|source| GatewayError::Schedule {
                    router: first.router.clone(),
                    source,
                })?,
        ),
    };
    for schedule in &config.schedules {
        let router = schedule.router.clone();
        let emit = emit.clone();
        let doing = Arc::new(Doing::new(schedule, &built, config, &control)?);
        let gate = match &schedule.limit {
            Some(limit) => Some(Admission::new(
                limiter(&built, &limit.limiter)?,
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
                    log::warn!("schedule {router} slot {}: {why}; skipped", run.slot);
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
                    log::warn!(
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
        let scheduler = match (schedule.exclusive, exclusive.as_mut()) {
            (true, Some(exclusive)) => exclusive,
            _ => &mut plain,
        };
        match &schedule.timing {
            Timing::Every(every) => {
                scheduler.add_job(&schedule.router, &schedule.chain, *every, job)
            }
            Timing::Cron(cron) => {
                scheduler.add_job(&schedule.router, &schedule.chain, (**cron).clone(), job)
            }
        }
        .map_err(|source| GatewayError::Schedule {
            router: schedule.router.clone(),
            source,
        })?;
    }
    let executor = smol::LocalExecutor::new();
    let mut tasks = Vec::new();
    for name in &config.active {
        let runner = built
            .guards
            .scope("consumer")
            .and_then(|s| s.segment("name", name))
            .map_err(RunnerError::Key)
            .and_then(|scope| ActiveRunner::new(&built.guards, &scope))
            .and_then(|r| r.with_settings(config.guards.active.into()))
            .map_err(|source| GatewayError::Consumer {
                name: name.clone(),
                source,
            })?;
        let (name, promoted, demoted) = (name.clone(), emit.clone(), emit.clone());
        let control = control.clone();
        tasks.push(executor.spawn(async move {
            let name2 = name.clone();
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
        }));
    }
    for entry in &config.endpoints {
        let task = endpoint::start(
            entry,
            &built,
            config,
            identity,
            control.clone(),
            emit.clone(),
            &ready,
        )
        .await?;
        tasks.push(executor.spawn(task));
    }
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
    tasks.push(executor.spawn(plain.run(control.clone())));
    if let Some(exclusive) = exclusive {
        tasks.push(executor.spawn(exclusive.run(control.clone())));
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
        let (sink, retry) = crate::sink::forwarded(&built, config, name)?;
        let in_flight = config
            .sinks
            .iter()
            .find(|s| s.name == *name)
            .map_or(std::num::NonZeroUsize::MIN, crate::sink::Sink::in_flight);
        let (queued, control, emit, name) =
            (queued.clone(), control.clone(), emit.clone(), name.clone());
        // The configuration refuses a queue without dead letters on disk.
        let store = built
            .dead_letters
            .as_ref()
            .map(|(store, _)| store.clone())
            .ok_or_else(|| GatewayError::DeadLetters {
                source: format!("sink {name} has a queue and there is no [dead_letters]").into(),
            })?;
        tasks.push(executor.spawn(async move {
            let dead_letter = |not: NotTaken| {
                let reason = format!("after {} attempt(s): {}", not.attempts, not.error);
                let letter = crate::dead_letters::DeadLetter {
                    place: "sink".to_owned(),
                    name: name.clone(),
                    sink: Some(name.clone()),
                    id: not.message.as_ref().map(|m| m.id.clone()),
                    from: not.message.as_ref().map(|m| m.origin.clone()).unwrap_or_default(),
                    fence: not.message.as_ref().and_then(|m| m.fence),
                    reason: reason.clone(),
                    attempts: not.attempts,
                    at_ms: crate::dead_letters::now_ms(),
                    payload: not.message.as_ref().map(|m| m.payload.clone()).unwrap_or_default(),
                };
                if let Err(e) = crate::dead_letters::kept(&store, &letter) {
                    log::error!(
                        "sink {name}: {} not kept as a dead letter ({e}): it stays at the head of the queue",
                        letter.id.as_deref().unwrap_or("-")
                    );
                    return false;
                }
                log::warn!("sink {name}: {} dead-lettered: {}", letter.id.as_deref().unwrap_or("-"), not.error);
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
        }));
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
            for task in tasks {
                task.await;
            }
            // A replica runs until it is stopped, even when every task has
            // ended (an endpoint refused for good, nothing scheduled): it
            // keeps answering `/readyz` with what ended.
            control.stopped().await;
        })
        .await;
    ready.set_started(false);
    Ok(())
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
            let backend = match p.backend {
                Backend::Memory => "memory",
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
            "in memory (1,024 per broadcast endpoint, gone at a restart)".to_owned(),
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
