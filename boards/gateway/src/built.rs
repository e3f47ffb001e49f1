//! What a configuration builds before anything runs: the locker, the
//! guards' shared settings, the rate limiters and the Redis connection.

use std::sync::Arc;

use crate::config::{
    Backend, Config, Locker, MAX_SLIDING_LIMIT, Policy, PolicyAlgorithm, sliding_log,
};
use guard_core::key::{Reserved, escaped};
use guard_core::limit::{FullPolicy, SlidingWindow};
use guard_redis::{
    RedisConnection, RedisFixedWindow, RedisGuardError, RedisLeakyBucket, RedisSlidingWindow,
    RedisTokenBucket,
};
use guard_std::ratelimit::{MemoryLimiter, NamedRateLimiter, RateLimiter, RateLimiterRegistry};
use guard_std::{GuardConfig, LocalLocker, SharedLocker, TokenIds};

use crate::error::GatewayError;

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
    /// The lock service's name for what keeps fences (a binlog reader's
    /// checkpoint): an in-process locker's names this process too, since
    /// its fences count from 1 again in every process.
    pub lock_service: String,
    /// Every sink, made, by name.
    pub sinks: std::collections::BTreeMap<String, Arc<dyn guard_endpoints::sink::MessageSink>>,
    /// The queue of each sink that has one, opened, by the sink's name,
    /// with what its recovery found.
    pub queues: std::collections::BTreeMap<
        String,
        (
            Arc<guard_endpoints::sink::queued::QueuedSink>,
            guard_std::disk_queue::Recovery,
        ),
    >,
    /// The dead letters on disk, if configured, with the torn bytes their
    /// recovery cut.
    pub dead_letters: Option<(Arc<crate::dead_letters::DeadLetterStore>, u64)>,
}

/// Connects what `config` names: a Redis locker that cannot be reached is
/// an error; a Redis rate-limit backend without a Redis locker is one too,
/// unless `ratelimit.fallback_to_memory` is set, which then warns.
pub async fn build(config: &Config) -> Result<Built, GatewayError> {
    let redis = match config.redis_locker() {
        Some(locker) => Some(
            locker
                .connect()
                .await
                .map_err(GatewayError::LockerUnreachable)?,
        ),
        None => None,
    };
    let locker = match (&config.locker, &redis) {
        (Locker::Local, _) => Some(SharedLocker::new(LocalLocker::new())),
        (Locker::Redis(l), Some(conn)) => Some(SharedLocker::new(
            l.locker(conn.clone()).map_err(GatewayError::Locker)?,
        )),
        #[cfg(feature = "postgres")]
        (Locker::Postgres(l), _) => Some(SharedLocker::new(crate::lockers::postgres(l).await?)),
        #[cfg(feature = "etcd")]
        (Locker::Etcd(l), _) => Some(SharedLocker::new(crate::lockers::etcd(l).await?)),
        (Locker::None, _) => None,
        // A locker this build cannot make must stop the start: no locker
        // would let every guard allow, silently.
        (other, _) => {
            return Err(GatewayError::LockService {
                kind: match other {
                    Locker::Etcd(_) => "etcd",
                    Locker::Postgres(_) => "postgres",
                    _ => "configured",
                },
                source: "this build of the gateway cannot run it (it needs the gateway's feature of the same name)"
                    .into(),
            });
        }
    };
    let mut guards = config.guard_settings();
    if let Some(locker) = locker {
        guards = guards.with_locker(locker);
    }
    // The quarantine is the leases' alone: a once-guard's key is kept for
    // `once_ttl_s` (an hour), which a quarantine would cost every slot.
    if let (Locker::Redis(l), Some(conn)) = (&config.locker, &redis)
        && l.quarantine
    {
        guards = guards.with_lease_locker(SharedLocker::new(
            l.locker(conn.clone())
                .map_err(GatewayError::Locker)?
                .with_quarantine(true),
        ));
    }
    let mut limiters: Vec<(String, Arc<dyn RateLimiter>)> = Vec::new();
    if let Some(ratelimit) = &config.ratelimit {
        for policy in &ratelimit.policies {
            let limiter = match (policy.backend, &redis) {
                (Backend::Memory, _) => memory(policy),
                (Backend::Redis, Some(conn)) => {
                    remote(policy, &tenant_prefix(config, policy), conn)?
                }
                // The configuration refuses a Redis backend without a
                // Redis locker unless fallback_to_memory is set.
                (Backend::Redis, None) => {
                    tracing::warn!(
                        "rate limiter {}: Redis backend without a Redis locker to connect with; using memory (fallback_to_memory = true)",
                        policy.name
                    );
                    memory(policy)
                }
            };
            limiters.push((policy.name.clone(), limiter));
        }
    }
    let lock_service = match &config.locker {
        Locker::Local => format!("local {}", TokenIds::new().next_id()),
        other => other.lock_service(),
    };
    let sinks = crate::sink::build(
        &config.sinks,
        redis.as_ref(),
        config
            .redis_locker()
            .map_or(std::time::Duration::from_millis(500), |l| l.request_timeout),
    )
    .await?;
    let mut queues = std::collections::BTreeMap::new();
    for sink in &config.sinks {
        if let Some(queue) = &sink.queue {
            queues.insert(sink.name.clone(), crate::queue::open(&sink.name, queue)?);
        }
    }
    let dead_letters = match &config.dead_letters {
        Some(place) => {
            let (store, lost) = crate::dead_letters::DeadLetterStore::open(place)?;
            Some((Arc::new(store), lost))
        }
        None => None,
    };
    Ok(Built {
        guards,
        limiters: RateLimiterRegistry::new(limiters),
        redis,
        lock_service,
        sinks,
        queues,
        dead_letters,
    })
}

/// A sliding window whose per-key log holds `M` instants: a key costs 8
/// bytes per instant, so the log is sized to the configured limit's class
/// (`sliding_log`), not to the largest limit allowed (4096 instants, 32
/// KiB a key).
fn sliding<const M: usize>(
    window: SlidingWindow<MAX_SLIDING_LIMIT>,
    keys: usize,
) -> Arc<dyn RateLimiter> {
    match SlidingWindow::<M>::new(window.window(), window.limit()) {
        Ok(window) => Arc::new(MemoryLimiter::new(window, keys, FullPolicy::DenyNewKeys)),
        Err(_) => unreachable!("sliding_log chose a log that holds the limit"),
    }
}

/// `policy`'s table in memory, of its `memory_keys` keys.
fn memory(policy: &Policy) -> Arc<dyn RateLimiter> {
    let keys = policy.memory_keys;
    match policy.algorithm {
        PolicyAlgorithm::Sliding(w) => match sliding_log(w.limit()) {
            16 => sliding::<16>(w, keys),
            128 => sliding::<128>(w, keys),
            1024 => sliding::<1024>(w, keys),
            _ => Arc::new(MemoryLimiter::new(w, keys, FullPolicy::DenyNewKeys)),
        },
        // On the wall clock, so that windows start on the epoch's
        // boundaries as Redis's do.
        PolicyAlgorithm::FixedWindow(w) => {
            Arc::new(MemoryLimiter::aligned(w, keys, FullPolicy::DenyNewKeys))
        }
        PolicyAlgorithm::TokenBucket(b) => {
            Arc::new(MemoryLimiter::new(b, keys, FullPolicy::DenyNewKeys))
        }
        PolicyAlgorithm::LeakyBucket(b) => {
            Arc::new(MemoryLimiter::new(b, keys, FullPolicy::DenyNewKeys))
        }
    }
}

/// The Redis prefix of `policy`'s keys: its `key_prefix`, then the
/// tenant (the locker's prefix and the guards' owner) and the policy's
/// name as labelled segments through guard-core's key codec, the empty
/// ones left out (`guard:rl:env=prod1:owner=tenant1:policy=uplink`), so
/// two environments, two owners or two policies on one Redis never share
/// a budget.
fn tenant_prefix(config: &Config, policy: &Policy) -> String {
    let env = config.redis_locker().map_or("", |l| l.prefix.as_str());
    let mut prefix = policy.key_prefix.clone();
    for (label, value) in [
        ("env", env),
        ("owner", config.guards.owner.as_str()),
        ("policy", policy.name.as_str()),
    ] {
        if !value.is_empty() {
            prefix.push_str(&format!(":{label}={}", escaped(value, Reserved::Segment)));
        }
    }
    prefix
}

fn remote(
    policy: &Policy,
    prefix: &str,
    conn: &RedisConnection,
) -> Result<Arc<dyn RateLimiter>, GatewayError> {
    let name = &policy.name;
    let built: Result<Arc<dyn RateLimiter>, RedisGuardError> = match policy.algorithm {
        PolicyAlgorithm::Sliding(w) => RedisSlidingWindow::new(conn.clone(), w)
            .and_then(|l| l.with_prefix(prefix))
            .map(|l| Arc::new(l) as Arc<dyn RateLimiter>),
        PolicyAlgorithm::FixedWindow(w) => RedisFixedWindow::new(conn.clone(), w)
            .and_then(|l| l.with_prefix(prefix))
            .map(|l| Arc::new(l) as Arc<dyn RateLimiter>),
        PolicyAlgorithm::TokenBucket(b) => RedisTokenBucket::new(conn.clone(), b)
            .and_then(|l| l.with_prefix(prefix))
            .map(|l| Arc::new(l) as Arc<dyn RateLimiter>),
        PolicyAlgorithm::LeakyBucket(b) => RedisLeakyBucket::new(conn.clone(), b)
            .and_then(|l| l.with_prefix(prefix))
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

#[cfg(all(test, feature = "etcd"))]
mod tests {
    #[test]
    fn the_configuration_s_etcd_timeout_is_guard_etcd_s_default() {
        assert_eq!(
            crate::config::DEFAULT_ETCD_TIMEOUT,
            guard_etcd::DEFAULT_TIMEOUT
        );
    }
}

#[cfg(test)]
mod tenant_tests {
    use guard_testkit::RedisServer;

    use super::build;
    use crate::config::Config;

    /// A configuration on `redis` with two sliding-window policies of one
    /// request a minute.
    fn config(redis: &RedisServer, env: &str, owner: &str) -> Config {
        Config::from_toml(&format!(
            "[locker]\nkind = \"redis\"\nurl = \"{}\"\nprefix = \"{env}\"\n\n\
             [guards]\nowner = \"{owner}\"\n\n[[active]]\nname = \"a\"\n\n\
             [ratelimit]\nenabled = true\n\n\
             [ratelimit.policies.first]\nalgorithm = \"sliding\"\nbackend = \"redis\"\nwindow_ms = 60000\nlimit = 1\n\n\
             [ratelimit.policies.second]\nalgorithm = \"sliding\"\nbackend = \"redis\"\nwindow_ms = 60000\nlimit = 1\n",
            redis.url()
        ))
        .unwrap()
    }

    /// Admitted calls of one key on each policy of each configuration, in
    /// turn, twice.
    fn admitted(configs: &[Config]) -> Vec<bool> {
        smol::block_on(async {
            let mut built = Vec::new();
            for c in configs {
                built.push(build(c).await.unwrap());
            }
            let mut out = Vec::new();
            for _ in 0..2 {
                for b in &built {
                    for policy in ["first", "second"] {
                        let limiter = b.limiters.get(policy).unwrap();
                        let report = limiter.check("sensors").await.unwrap();
                        out.push(report.decision.is_allowed());
                    }
                }
            }
            out
        })
    }

    #[test]
    fn environments_owners_and_policies_on_one_redis_never_share_a_budget() {
        let redis = RedisServer::start().expect("redis-server");
        let configs = [
            config(&redis, "prod1", "tenant1"),
            config(&redis, "prod2", "tenant1"),
            config(&redis, "prod1", "tenant2"),
        ];
        let admitted = admitted(&configs);
        // Each configuration and policy admits its one call, then refuses.
        assert_eq!(admitted[..6], [true; 6], "{admitted:?}");
        assert_eq!(admitted[6..], [false; 6], "{admitted:?}");
        // The same tenant again shares the budget with the first.
        assert_eq!(
            self::admitted(&[config(&redis, "prod1", "tenant1")]),
            [false; 4]
        );
    }
}
