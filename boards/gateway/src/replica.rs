//! One gateway replica, configured from a TOML file.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use guard_core::guard::DemoteReason;
use guard_core::limit::FullPolicy;
use guard_core::lock::Scope;
use guard_core::slot::{Every, UnixMillis};
use guard_endpoints::config::{
    Backend, FileConfig, LockerConfig, LockerKind, Policy, PolicyAlgorithm, RedisMode,
};
use guard_redis::{
    RedisConnection, RedisLeakyBucket, RedisLocker, RedisSlidingWindow, RedisTokenBucket, Topology,
};
use guard_smol::{ActiveRunner, Control, Scheduler};
use guard_std::ratelimit::{MemoryLimiter, RateLimiter, RateLimiterRegistry};
use guard_std::{CronSchedule, GuardConfig, LocalLocker, SharedLocker};

use crate::endpoint;

/// Something a replica did, printed one per line by `guard-gateway run`.
#[derive(Clone, Debug, PartialEq, Eq)]
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
        /// The payload, as text (invalid UTF-8 replaced).
        payload: String,
    },
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
                payload,
            } => write!(
                f,
                "received endpoint={endpoint} from={from} fence={} payload={payload}",
                fence.map_or("-".into(), |x| x.to_string())
            ),
        }
    }
}

/// Why a replica cannot start.
#[derive(Debug)]
pub struct GatewayError(String);

impl fmt::Display for GatewayError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for GatewayError {}

pub(crate) fn error(message: impl fmt::Display) -> GatewayError {
    GatewayError(message.to_string())
}

/// The Redis deployment of a `[locker]` section.
pub fn topology(locker: &LockerConfig) -> Topology {
    match locker.mode {
        RedisMode::Standalone => Topology::Standalone {
            url: locker.url.clone().unwrap_or_default(),
        },
        RedisMode::Sentinel => Topology::Sentinel {
            sentinels: locker.urls.clone(),
            service: locker.service.clone().unwrap_or_default(),
        },
        RedisMode::Cluster => Topology::Cluster {
            nodes: locker.urls.clone(),
        },
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
/// an error; a Redis rate-limit backend that cannot be reached is one too,
/// unless `ratelimit.fallback_to_memory` is set, which then warns.
pub async fn build(config: &FileConfig) -> Result<Built, GatewayError> {
    let timeout = Duration::from_millis(config.locker.request_timeout_ms);
    let redis = if config.locker.kind == LockerKind::Redis {
        Some(
            RedisConnection::connect(topology(&config.locker), timeout)
                .await
                .map_err(|e| error(format!("cannot reach the Redis locker: {e}")))?,
        )
    } else {
        None
    };
    let locker = match (config.locker.kind, &redis) {
        (LockerKind::None, _) => None,
        (LockerKind::Local, _) => Some(SharedLocker::new(LocalLocker::new())),
        (LockerKind::Redis, Some(conn)) => Some(SharedLocker::new(
            RedisLocker::new(conn.clone())
                .with_prefix(&config.locker.prefix)
                .map_err(error)?,
        )),
        (LockerKind::Redis, None) => None,
    };
    let mut guards = GuardConfig::new().with_owner(config.guards.owner.clone());
    if let Some(locker) = locker {
        guards = guards.with_locker(locker);
    }
    let mut limiters: Vec<(String, Arc<dyn RateLimiter>)> = Vec::new();
    if config.ratelimit.enabled {
        for policy in config.ratelimit.resolved().map_err(error)? {
            let limiter = match (policy.backend, &redis) {
                (Backend::Memory, _) => memory(&policy, config.ratelimit.memory_keys),
                (Backend::Redis, Some(conn)) => remote(&policy, conn)?,
                (Backend::Redis, None) if config.ratelimit.fallback_to_memory => {
                    log::warn!(
                        "rate limiter {}: Redis backend without a Redis locker to connect with; using memory (fallback_to_memory = true)",
                        policy.name
                    );
                    memory(&policy, config.ratelimit.memory_keys)
                }
                (Backend::Redis, None) => {
                    return Err(error(format!(
                        "rate limiter {}: backend \"redis\" needs [locker] kind = \"redis\" (or ratelimit.fallback_to_memory = true)",
                        policy.name
                    )));
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

fn memory(policy: &Policy, keys: usize) -> Arc<dyn RateLimiter> {
    match policy.algorithm {
        PolicyAlgorithm::Sliding(w) => {
            Arc::new(MemoryLimiter::new(w, keys, FullPolicy::DenyNewKeys))
        }
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
    let built: Result<Arc<dyn RateLimiter>, guard_redis::RedisGuardError> = match policy.algorithm {
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
    built.map_err(|e| error(format!("rate limiter {name}: {e}")))
}

/// Runs one replica until `control` stops it, reporting every event to
/// `emit`. `identity` tells this replica from the others that run the
/// same file: it names its stream consumers and MQTT clients.
pub async fn run(
    config: &FileConfig,
    identity: &str,
    control: Control,
    emit: Arc<dyn Fn(Event) + Send + Sync>,
) -> Result<(), GatewayError> {
    let built = build(config).await?;
    if !built.limiters.is_empty() {
        log::info!("rate limiters: {}", built.limiters.names().join(", "));
    }
    let mut scheduler = Scheduler::new(built.guards.clone())
        .with_slot_ttl(config.guards.once_ttl().map_err(error)?)
        .with_fail_policy(config.guards.fail_policy());
    for schedule in &config.schedules {
        let router = schedule.router.clone();
        let emit = emit.clone();
        let job = move |run: guard_smol::JobRun| {
            let (emit, router) = (emit.clone(), router.clone());
            async move {
                emit(Event::Executed {
                    router,
                    slot: run.slot,
                    fence: run.fence,
                })
            }
        };
        let added = match (&schedule.every_ms, &schedule.cron) {
            (Some(ms), _) => scheduler.add_job(
                &schedule.router,
                &schedule.chain,
                Every::new(Duration::from_millis(*ms)).map_err(error)?,
                job,
            ),
            (None, Some(cron)) => scheduler.add_job(
                &schedule.router,
                &schedule.chain,
                cron.parse::<CronSchedule>().map_err(error)?,
                job,
            ),
            (None, None) => continue, // refused by validation
        };
        added.map_err(error)?;
    }
    let timing = config.guards.active().map_err(error)?;
    let executor = smol::LocalExecutor::new();
    let mut tasks = Vec::new();
    for entry in &config.active {
        let scope = built
            .guards
            .scope("consumer")
            .and_then(|s| s.segment("name", &entry.name))
            .map_err(error)?;
        let runner = ActiveRunner::new(&built.guards, &scope)
            .and_then(|r| r.with_settings(timing))
            .map_err(error)?;
        let (name, promoted, demoted) = (entry.name.clone(), emit.clone(), emit.clone());
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
    executor
        .run(async {
            for task in tasks {
                task.await;
            }
        })
        .await;
    Ok(())
}

/// A consumer's lease scope (for tests and tools).
pub fn consumer_scope(guards: &GuardConfig, name: &str) -> Result<Scope, GatewayError> {
    guards
        .scope("consumer")
        .and_then(|s| s.segment("name", name))
        .map_err(error)
}
