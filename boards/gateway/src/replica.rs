//! One gateway replica, configured from a TOML file.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use guard_core::guard::DemoteReason;
use guard_core::limit::{FullPolicy, SlidingWindow};
use guard_core::slot::UnixMillis;
use guard_endpoints::admission::{Admission, Verdict};
use guard_endpoints::config::{
    Backend, Config, Locker, MAX_SLIDING_LIMIT, Policy, PolicyAlgorithm, Source, Timing,
    WhenLimited,
};
use guard_redis::{
    RedisConnection, RedisGuardError, RedisLeakyBucket, RedisLocker, RedisSlidingWindow,
    RedisTokenBucket,
};
use guard_smol::{ActiveRunner, Control, RunnerError, ScheduleError, Scheduler};
use guard_std::ratelimit::{MemoryLimiter, NamedRateLimiter, RateLimiter, RateLimiterRegistry};
use guard_std::{GuardConfig, LocalLocker, SharedLocker};

use crate::endpoint;

/// Something a replica did, printed one per line by `guard-gateway run`.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Event {
    /// This replica ran a scheduled slot.
    Executed {
        /// The router.
        router: String,
        /// The planned slot.
        slot: UnixMillis,
        /// The claim's fence.
        fence: Option<u64>,
    },
    /// This replica became the leader of a consumer.
    Promoted {
        /// The consumer.
        name: String,
        /// The lease's fence.
        fence: u64,
    },
    /// This replica stopped leading a consumer.
    Demoted {
        /// The consumer.
        name: String,
        /// Why.
        reason: DemoteReason,
    },
    /// This replica handled a message of an endpoint.
    Received {
        /// The endpoint.
        endpoint: String,
        /// Where it came from: channel, entry id or topic.
        from: String,
        /// The lease's fence, checked valid just before the handler ran
        /// (elected endpoints; `None` where the source delivers once).
        fence: Option<u64>,
        /// What it carried.
        content: Content,
    },
    /// A message the endpoint's limiter refused, kept as a dead letter.
    DeadLettered {
        /// The endpoint.
        endpoint: String,
        /// Where it came from.
        from: String,
        /// Why.
        reason: String,
    },
    /// A scheduled run its limiter refused: the slot was skipped.
    Skipped {
        /// The router.
        router: String,
        /// The planned slot.
        slot: UnixMillis,
        /// Why.
        reason: String,
    },
}

/// A handled message's content, as text (invalid UTF-8 replaced).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Content {
    /// A Pub/Sub or MQTT payload.
    Payload(String),
    /// A stream entry's fields, by name.
    Fields(Vec<(String, String)>),
}

impl fmt::Display for Content {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Content::Payload(text) => write!(f, "payload={text}"),
            Content::Fields(fields) => {
                let mut first = true;
                for (name, value) in fields {
                    if !first {
                        f.write_str(" ")?;
                    }
                    first = false;
                    write!(f, "{name}={value}")?;
                }
                Ok(())
            }
        }
    }
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Event::Executed {
                router,
                slot,
                fence,
            } => {
                write!(
                    f,
                    "executed router={router} slot={slot} fence={}",
                    fence.map_or("-".into(), |x| x.to_string())
                )
            }
            Event::Promoted { name, fence } => write!(f, "promoted name={name} fence={fence}"),
            Event::Demoted { name, reason } => write!(f, "demoted name={name} reason={reason:?}"),
            Event::Received {
                endpoint,
                from,
                fence,
                content,
            } => write!(
                f,
                "received endpoint={endpoint} from={from} fence={} {content}",
                fence.map_or("-".into(), |x| x.to_string())
            ),
            Event::DeadLettered {
                endpoint,
                from,
                reason,
            } => write!(
                f,
                "dead-lettered endpoint={endpoint} from={from} reason={reason}"
            ),
            Event::Skipped {
                router,
                slot,
                reason,
            } => write!(f, "skipped router={router} slot={slot} reason={reason}"),
        }
    }
}

/// Why a replica cannot start.
///
/// The message says what failed, as `guard-gateway run` prints it;
/// [`source`](std::error::Error::source) returns the cause (the Redis
/// backend's, an endpoint's, a guard's).
#[derive(Debug)]
#[non_exhaustive]
pub enum GatewayError {
    /// The Redis locker did not answer.
    LockerUnreachable(RedisGuardError),
    /// The Redis locker cannot be built (its prefix).
    Locker(RedisGuardError),
    /// A Redis rate limiter cannot be built.
    Limiter {
        /// The limiter's name.
        name: String,
        /// Why.
        source: RedisGuardError,
    },
    /// A rate limiter with a Redis backend, and no Redis locker to
    /// connect with (and no fallback to memory allowed).
    LimiterWithoutRedis {
        /// The limiter's name.
        name: String,
    },
    /// A schedule or an endpoint names a rate limiter that does not exist.
    UnknownLimiter {
        /// The name given.
        name: String,
    },
    /// A scheduled job cannot be added.
    Schedule {
        /// The job's router.
        router: String,
        /// Why.
        source: ScheduleError,
    },
    /// A leader-only consumer's guard cannot be built.
    Consumer {
        /// The consumer.
        name: String,
        /// Why.
        source: RunnerError,
    },
    /// An endpoint cannot be built or connected.
    Endpoint {
        /// The endpoint.
        name: String,
        /// Why: a [`guard_endpoints::redis::EndpointError`], a
        /// [`guard_endpoints::mqtt::MqttError`], a [`RedisGuardError`] or
        /// a `guard_core::lock::KeyError`.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// An endpoint of a kind this gateway does not run.
    UnsupportedEndpoint {
        /// The endpoint.
        name: String,
    },
}

impl fmt::Display for GatewayError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GatewayError::LockerUnreachable(e) => write!(f, "cannot reach the Redis locker: {e}"),
            GatewayError::Locker(e) => write!(f, "Redis locker: {e}"),
            GatewayError::Limiter { name, source } => write!(f, "rate limiter {name}: {source}"),
            GatewayError::LimiterWithoutRedis { name } => write!(
                f,
                "rate limiter {name}: backend \"redis\" needs [locker] kind = \"redis\" (or ratelimit.fallback_to_memory = true)"
            ),
            GatewayError::UnknownLimiter { name } => write!(f, "no rate limiter named {name:?}"),
            GatewayError::Schedule { router, source } => write!(f, "schedule {router}: {source}"),
            GatewayError::Consumer { name, source } => write!(f, "consumer {name}: {source}"),
            GatewayError::Endpoint { name, source } => write!(f, "endpoint {name}: {source}"),
            GatewayError::UnsupportedEndpoint { name } => write!(
                f,
                "endpoint {name}: this kind of endpoint is not supported by the gateway"
            ),
        }
    }
}

impl std::error::Error for GatewayError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            GatewayError::LockerUnreachable(e)
            | GatewayError::Locker(e)
            | GatewayError::Limiter { source: e, .. } => Some(e),
            GatewayError::Schedule { source, .. } => Some(source),
            GatewayError::Consumer { source, .. } => Some(source),
            GatewayError::Endpoint { source, .. } => Some(&**source),
            GatewayError::LimiterWithoutRedis { .. }
            | GatewayError::UnknownLimiter { .. }
            | GatewayError::UnsupportedEndpoint { .. } => None,
        }
    }
}

/// What a configuration builds: the guards' shared config, the rate
/// limiters, and the Redis connection when there is one.
pub struct Built {
    /// Locker, owner and prefix for every guard.
    pub guards: GuardConfig,
    /// The named rate limiters.
    pub limiters: RateLimiterRegistry,
    /// The locker's Redis connection, shared by endpoints that name no
    /// URL of their own.
    pub redis: Option<RedisConnection>,
}

/// Connects what `config` names: a Redis locker that cannot be reached is
/// an error; a Redis rate-limit backend without a Redis locker is one too,
/// unless `ratelimit.fallback_to_memory` is set, which then warns.
pub async fn build(config: &Config) -> Result<Built, GatewayError> {
    let redis = match config.redis_locker() {
        Some(locker) => Some(
            RedisConnection::connect(locker.topology.clone(), locker.request_timeout)
                .await
                .map_err(GatewayError::LockerUnreachable)?,
        ),
        None => None,
    };
    let locker = match (&config.locker, &redis) {
        (Locker::Local, _) => Some(SharedLocker::new(LocalLocker::new())),
        (Locker::Redis(l), Some(conn)) => Some(SharedLocker::new(
            RedisLocker::new(conn.clone())
                .with_prefix(&l.prefix)
                .map_err(GatewayError::Locker)?,
        )),
        _ => None,
    };
    let mut guards = GuardConfig::new().with_owner(config.guards.owner.clone());
    if let Some(locker) = locker {
        guards = guards.with_locker(locker);
    }
    let mut limiters: Vec<(String, Arc<dyn RateLimiter>)> = Vec::new();
    if let Some(ratelimit) = &config.ratelimit {
        for policy in &ratelimit.policies {
            let limiter = match (policy.backend, &redis) {
                (Backend::Memory, _) => memory(policy, ratelimit.memory_keys),
                (Backend::Redis, Some(conn)) => remote(policy, conn)?,
                (Backend::Redis, None) if ratelimit.fallback_to_memory => {
                    log::warn!(
                        "rate limiter {}: Redis backend without a Redis locker to connect with; using memory (fallback_to_memory = true)",
                        policy.name
                    );
                    memory(policy, ratelimit.memory_keys)
                }
                (Backend::Redis, None) => {
                    return Err(GatewayError::LimiterWithoutRedis {
                        name: policy.name.clone(),
                    });
                }
            };
            limiters.push((policy.name.clone(), limiter));
        }
    }
    Ok(Built {
        guards,
        limiters: RateLimiterRegistry::new(limiters),
        redis,
    })
}

/// A sliding window whose per-key log holds `M` instants, if its limit
/// fits: a key costs 8 bytes per instant, so the log is sized to the
/// configured limit's class, not to the largest limit allowed (4096
/// instants, 32 KiB a key).
fn sliding<const M: usize>(
    window: SlidingWindow<MAX_SLIDING_LIMIT>,
    keys: usize,
) -> Option<Arc<dyn RateLimiter>> {
    let window = SlidingWindow::<M>::new(window.window(), window.limit()).ok()?;
    Some(Arc::new(MemoryLimiter::new(
        window,
        keys,
        FullPolicy::DenyNewKeys,
    )))
}

fn memory(policy: &Policy, keys: usize) -> Arc<dyn RateLimiter> {
    match policy.algorithm {
        PolicyAlgorithm::Sliding(w) => sliding::<16>(w, keys)
            .or_else(|| sliding::<128>(w, keys))
            .or_else(|| sliding::<1024>(w, keys))
            .unwrap_or_else(|| Arc::new(MemoryLimiter::new(w, keys, FullPolicy::DenyNewKeys))),
        PolicyAlgorithm::TokenBucket(b) => {
            Arc::new(MemoryLimiter::new(b, keys, FullPolicy::DenyNewKeys))
        }
        PolicyAlgorithm::LeakyBucket(b) => {
            Arc::new(MemoryLimiter::new(b, keys, FullPolicy::DenyNewKeys))
        }
    }
}

fn remote(policy: &Policy, conn: &RedisConnection) -> Result<Arc<dyn RateLimiter>, GatewayError> {
    let name = &policy.name;
    let built: Result<Arc<dyn RateLimiter>, RedisGuardError> = match policy.algorithm {
        PolicyAlgorithm::Sliding(w) => RedisSlidingWindow::new(conn.clone(), w)
            .and_then(|l| l.with_prefix(&policy.key_prefix))
            .map(|l| Arc::new(l) as Arc<dyn RateLimiter>),
        PolicyAlgorithm::TokenBucket(b) => RedisTokenBucket::new(conn.clone(), b)
            .and_then(|l| l.with_prefix(&policy.key_prefix))
            .map(|l| Arc::new(l) as Arc<dyn RateLimiter>),
        PolicyAlgorithm::LeakyBucket(b) => RedisLeakyBucket::new(conn.clone(), b)
            .and_then(|l| l.with_prefix(&policy.key_prefix))
            .map(|l| Arc::new(l) as Arc<dyn RateLimiter>),
    };
    built.map_err(|source| GatewayError::Limiter {
        name: name.clone(),
        source,
    })
}

/// The limiter `name`, which validation made sure exists.
pub(crate) fn limiter(built: &Built, name: &str) -> Result<Arc<NamedRateLimiter>, GatewayError> {
    built
        .limiters
        .get(name)
        .cloned()
        .ok_or_else(|| GatewayError::UnknownLimiter {
            name: name.to_owned(),
        })
}

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
/// set once the locker has answered.
pub async fn run(
    config: &Config,
    identity: &str,
    control: Control,
    emit: Arc<dyn Fn(Event) + Send + Sync>,
    ready: Arc<AtomicBool>,
) -> Result<(), GatewayError> {
    let built = build(config).await?;
    if !built.limiters.is_empty() {
        log::info!("rate limiters: {}", built.limiters.names().join(", "));
    }
    announce_metrics(config, &built);
    let mut scheduler = Scheduler::new(built.guards.clone())
        .with_slot_ttl(config.guards.once_ttl)
        .with_fail_policy(config.guards.fail_policy);
    for schedule in &config.schedules {
        let router = schedule.router.clone();
        let emit = emit.clone();
        let gate = match &schedule.limit {
            Some(limit) => Some(Admission::new(
                limiter(&built, &limit.limiter)?,
                WhenLimited::Wait(limit.max_wait),
            )),
            None => None,
        };
        let job = move |run: guard_smol::JobRun| {
            let (emit, router, gate) = (emit.clone(), router.clone(), gate.clone());
            async move {
                if let Some(gate) = &gate
                    && let Verdict::Refused(why) = gate.admit(&router).await
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
                    router,
                    slot: run.slot,
                    fence: run.fence,
                })
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
            .and_then(|r| r.with_settings(config.guards.active))
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
        )
        .await?;
        tasks.push(executor.spawn(task));
    }
    tasks.push(executor.spawn(scheduler.run(control)));
    // Everything is connected and the locker has answered.
    ready.store(true, Ordering::Release);
    executor
        .run(async {
            for task in tasks {
                task.await;
            }
        })
        .await;
    ready.store(false, Ordering::Release);
    Ok(())
}

/// What `config` configures, for `guard-gateway check`: one line a
/// section, no secrets (URLs are not printed).
pub fn summary(config: &Config) -> String {
    let locker = match &config.locker {
        Locker::None => "none (every guard allows: a single process)".to_owned(),
        Locker::Local => "local (in this process)".to_owned(),
        Locker::Redis(l) => {
            let mode = match &l.topology {
                guard_redis::Topology::Standalone { .. } => "standalone",
                guard_redis::Topology::Sentinel { .. } => "sentinel",
                guard_redis::Topology::Cluster { .. } => "cluster",
            };
            format!("redis ({mode}), prefix {:?}", l.prefix)
        }
        _ => "another kind".to_owned(),
    };
    let schedules: Vec<String> = config
        .schedules
        .iter()
        .map(|s| match &s.timing {
            Timing::Every(every) => format!("{} every {:?}", s.router, every.period()),
            Timing::Cron(_) => format!("{} on a cron expression", s.router),
        })
        .collect();
    let endpoints: Vec<String> = config
        .endpoints
        .iter()
        .map(|e| {
            let kind = match &e.source {
                Source::RedisPubsub(_) => "redis-pubsub, elected subscriber".to_owned(),
                Source::RedisStream(s) => format!("redis-stream, consumer group {}", s.group),
                Source::Mqtt(m) => match &m.delivery {
                    guard_endpoints::config::MqttDelivery::Shared(g) => {
                        format!("mqtt, shared subscription {g}")
                    }
                    guard_endpoints::config::MqttDelivery::Broadcast => {
                        "mqtt, broadcast".to_owned()
                    }
                    guard_endpoints::config::MqttDelivery::Elected => {
                        "mqtt, elected subscriber".to_owned()
                    }
                },
                _ => "another kind".to_owned(),
            };
            let limit = e
                .limit
                .as_ref()
                .map_or(String::new(), |l| format!(", limited by {}", l.limiter));
            format!("{} ({kind}{limit})", e.name)
        })
        .collect();
    let limiters: Vec<String> = config
        .ratelimit
        .iter()
        .flat_map(|r| &r.policies)
        .map(|p| {
            let algorithm = match p.algorithm {
                PolicyAlgorithm::Sliding(_) => "sliding",
                PolicyAlgorithm::TokenBucket(_) => "token-bucket",
                PolicyAlgorithm::LeakyBucket(_) => "leaky-bucket",
            };
            let backend = match p.backend {
                Backend::Memory => "memory",
                Backend::Redis => "redis",
            };
            format!("{} ({algorithm}, {backend})", p.name)
        })
        .collect();
    let list = |items: &[String]| {
        if items.is_empty() {
            "none".to_owned()
        } else {
            items.join(", ")
        }
    };
    format!(
        "configuration is valid\nlocker     {locker}\nschedules  {}\nactive     {}\nendpoints  {}\nlimiters   {}\nmetrics    {}\n",
        list(&schedules),
        list(&config.active),
        list(&endpoints),
        list(&limiters),
        config
            .metrics
            .prometheus
            .map_or("none".to_owned(), |a| a.to_string()),
    )
}
