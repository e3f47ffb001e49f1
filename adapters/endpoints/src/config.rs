//! Configuration from a TOML file.
//!
//! Unknown keys are errors, and so is every bad value: the message names
//! the key, the value and what is allowed. Nothing falls back silently
//! (the original warned and used defaults).
//!
//! ```
//! let config = guard_endpoints::config::FileConfig::from_toml(r#"
//!     [locker]
//!     kind = "redis"
//!     url = "redis://127.0.0.1:6379/"
//!
//!     [guards]
//!     owner = "tenant1"
//!
//!     [[schedules]]
//!     router = "heartbeat"
//!     every_ms = 1000
//! "#)?;
//! assert_eq!(config.schedules[0].router, "heartbeat");
//! # Ok::<(), guard_endpoints::config::ConfigError>(())
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::time::Duration;

use guard_core::guard::{ActiveConfig, FailPolicy};
use guard_core::limit::{LeakyBucket, Rate, SlidingWindow, TokenBucket};
use guard_core::lock::Ttl;
use serde::Deserialize;

use guard_std::CronSchedule;

/// A configuration that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigError {
    /// The file could not be read.
    Read(String),
    /// Not valid TOML, an unknown key, or a value of the wrong kind; the
    /// message names the key and what is allowed.
    Parse(String),
    /// A value out of range or inconsistent with another.
    Invalid {
        /// The key, e.g. `ratelimit.policies.api.capacity`.
        key: String,
        /// The value given.
        value: String,
        /// What is allowed.
        expected: String,
    },
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::Read(e) => write!(f, "cannot read the configuration: {e}"),
            ConfigError::Parse(e) => write!(f, "invalid configuration: {e}"),
            ConfigError::Invalid {
                key,
                value,
                expected,
            } => {
                write!(
                    f,
                    "invalid configuration: `{key}` = {value}: expected {expected}"
                )
            }
        }
    }
}

impl std::error::Error for ConfigError {}

fn invalid(key: impl Into<String>, value: impl fmt::Display, expected: &str) -> ConfigError {
    ConfigError::Invalid {
        key: key.into(),
        value: value.to_string(),
        expected: expected.to_owned(),
    }
}

/// A whole configuration file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// Rate limiting.
    #[serde(default)]
    pub ratelimit: RateLimitConfig,
    /// The lock service.
    #[serde(default)]
    pub locker: LockerConfig,
    /// Guard settings.
    #[serde(default)]
    pub guards: GuardsConfig,
    /// Scheduled jobs.
    #[serde(default)]
    pub schedules: Vec<ScheduleConfig>,
    /// Leader-only consumers (one active replica each).
    #[serde(default)]
    pub active: Vec<ActiveEntry>,
    /// Message sources: Redis Pub/Sub, Redis Streams, MQTT.
    #[serde(default)]
    pub endpoints: Vec<EndpointConfig>,
    /// Metrics export.
    #[serde(default)]
    pub metrics: MetricsConfig,
}

/// Where limiter state lives.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Backend {
    /// In this process.
    #[default]
    Memory,
    /// In Redis (the locker's connection), shared by every replica.
    Redis,
}

/// A rate-limiting algorithm.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AlgorithmName {
    /// Sliding-window log: `limit` per `window_ms`.
    #[default]
    Sliding,
    /// Token bucket: bursts of `capacity`, `rate_per_second` refill.
    TokenBucket,
    /// Meter leaky bucket: `capacity`, drained at `rate_per_second`.
    LeakyBucket,
}

/// `[ratelimit]`, after the original starter's keys.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RateLimitConfig {
    /// Whether limiters are built at all.
    pub enabled: bool,
    /// The default backend.
    pub backend: Backend,
    /// The default sliding window, in milliseconds.
    pub window_ms: u64,
    /// The default limit per window.
    pub limit: u32,
    /// The default Redis key prefix.
    pub key_prefix: String,
    /// The name of the default limiter (built from the top-level values
    /// when no policy has this name).
    pub default_name: String,
    /// Use memory, with a warning, when Redis is unreachable at start;
    /// otherwise that is an error.
    pub fallback_to_memory: bool,
    /// Keys tracked per in-memory limiter.
    pub memory_keys: usize,
    /// Named policies.
    pub policies: BTreeMap<String, PolicyConfig>,
}

impl Default for RateLimitConfig {
    fn default() -> Self {
        RateLimitConfig {
            enabled: false,
            backend: Backend::Memory,
            window_ms: 1000,
            limit: 100,
            key_prefix: "guard:rl".to_owned(),
            default_name: "default".to_owned(),
            fallback_to_memory: false,
            memory_keys: 65_536,
            policies: BTreeMap::new(),
        }
    }
}

/// `[ratelimit.policies.<name>]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyConfig {
    /// The algorithm.
    #[serde(default)]
    pub algorithm: AlgorithmName,
    /// The backend (default: `ratelimit.backend`).
    pub backend: Option<Backend>,
    /// Sliding window, in milliseconds (default: `ratelimit.window_ms`).
    pub window_ms: Option<u64>,
    /// Sliding limit (default: `ratelimit.limit`).
    pub limit: Option<u32>,
    /// Bucket capacity.
    #[serde(default = "hundred")]
    pub capacity: u32,
    /// Bucket rate per second.
    #[serde(default = "hundred")]
    pub rate_per_second: u32,
    /// Redis key prefix (default: `ratelimit.key_prefix`).
    pub key_prefix: Option<String>,
}

fn hundred() -> u32 {
    100
}

/// The most admissions a sliding window tracks per key.
pub const MAX_SLIDING_LIMIT: usize = 4096;

/// A policy's algorithm with validated parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PolicyAlgorithm {
    /// A sliding window.
    Sliding(SlidingWindow<MAX_SLIDING_LIMIT>),
    /// A token bucket.
    TokenBucket(TokenBucket),
    /// A leaky bucket.
    LeakyBucket(LeakyBucket),
}

/// A named policy, resolved against the defaults and validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// Its name.
    pub name: String,
    /// Its backend.
    pub backend: Backend,
    /// Its algorithm.
    pub algorithm: PolicyAlgorithm,
    /// Its Redis key prefix.
    pub key_prefix: String,
}

impl RateLimitConfig {
    /// Every policy, plus the default one when no policy has its name.
    pub fn resolved(&self) -> Result<Vec<Policy>, ConfigError> {
        let mut policies: Vec<Policy> = self
            .policies
            .iter()
            .map(|(name, p)| self.resolve(name, p))
            .collect::<Result<_, _>>()?;
        if !self.policies.contains_key(&self.default_name) {
            let default = PolicyConfig {
                algorithm: AlgorithmName::Sliding,
                backend: None,
                window_ms: None,
                limit: None,
                capacity: 100,
                rate_per_second: 100,
                key_prefix: None,
            };
            policies.push(self.resolve(&self.default_name, &default)?);
        }
        Ok(policies)
    }

    fn resolve(&self, name: &str, p: &PolicyConfig) -> Result<Policy, ConfigError> {
        let key = |field: &str| format!("ratelimit.policies.{name}.{field}");
        let algorithm = match p.algorithm {
            AlgorithmName::Sliding => {
                let window_ms = p.window_ms.unwrap_or(self.window_ms);
                let limit = p.limit.unwrap_or(self.limit);
                if window_ms == 0 {
                    return Err(invalid(
                        key("window_ms"),
                        window_ms,
                        "a positive number of milliseconds",
                    ));
                }
                let window = SlidingWindow::new(Duration::from_millis(window_ms), limit)
                    .map_err(|_| invalid(key("limit"), limit, "between 1 and 4096"))?;
                PolicyAlgorithm::Sliding(window)
            }
            AlgorithmName::TokenBucket | AlgorithmName::LeakyBucket => {
                if p.capacity == 0 {
                    return Err(invalid(key("capacity"), p.capacity, "a positive number"));
                }
                if p.rate_per_second == 0 {
                    return Err(invalid(
                        key("rate_per_second"),
                        p.rate_per_second,
                        "a positive number",
                    ));
                }
                let rate = Rate::per_second(p.rate_per_second);
                match p.algorithm {
                    AlgorithmName::TokenBucket => PolicyAlgorithm::TokenBucket(
                        TokenBucket::new(p.capacity, rate)
                            .map_err(|e| invalid(key("capacity"), p.capacity, &e.to_string()))?,
                    ),
                    _ => PolicyAlgorithm::LeakyBucket(
                        LeakyBucket::new(p.capacity, rate)
                            .map_err(|e| invalid(key("capacity"), p.capacity, &e.to_string()))?,
                    ),
                }
            }
        };
        let key_prefix = p
            .key_prefix
            .clone()
            .unwrap_or_else(|| self.key_prefix.clone());
        if key_prefix.trim().is_empty() || key_prefix.contains(['{', '}']) {
            return Err(invalid(
                key("key_prefix"),
                format!("{key_prefix:?}"),
                "a non-empty prefix without braces",
            ));
        }
        Ok(Policy {
            name: name.to_owned(),
            backend: p.backend.unwrap_or(self.backend),
            algorithm,
            key_prefix,
        })
    }
}

/// Which lock service.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LockerKind {
    /// None: every guard allows (a single process).
    #[default]
    None,
    /// In this process.
    Local,
    /// Redis, shared by every replica.
    Redis,
}

/// How Redis is deployed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RedisMode {
    /// One server at `url`.
    #[default]
    Standalone,
    /// A master found through the sentinels at `urls`, service `service`.
    Sentinel,
    /// A cluster seeded by `urls`.
    Cluster,
}

/// `[locker]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LockerConfig {
    /// none, local or redis.
    pub kind: LockerKind,
    /// standalone, sentinel or cluster.
    pub mode: RedisMode,
    /// The standalone server.
    pub url: Option<String>,
    /// Sentinels or cluster seed nodes.
    pub urls: Vec<String>,
    /// The sentinel service name.
    pub service: Option<String>,
    /// Each Redis request's timeout.
    pub request_timeout_ms: u64,
    /// A key prefix for this environment (e.g. `prod1`).
    pub prefix: String,
}

impl Default for LockerConfig {
    fn default() -> Self {
        LockerConfig {
            kind: LockerKind::None,
            mode: RedisMode::Standalone,
            url: None,
            urls: Vec::new(),
            service: None,
            request_timeout_ms: 500,
            prefix: String::new(),
        }
    }
}

/// Fail-closed or fail-open.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FailPolicyName {
    /// Skip on a backend error.
    #[default]
    Closed,
    /// Run on a backend error.
    Open,
}

/// `[guards]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GuardsConfig {
    /// The tenant, a segment of every scope.
    pub owner: String,
    /// How long a once-guard claim is kept, in seconds.
    pub once_ttl_s: u64,
    /// What once-guards do on a backend error.
    pub fail_policy: FailPolicyName,
    /// Active-guard lease, in milliseconds.
    pub active_ttl_ms: u64,
    /// Active-guard renew and poll interval, in milliseconds.
    pub active_interval_ms: u64,
}

impl Default for GuardsConfig {
    fn default() -> Self {
        GuardsConfig {
            owner: String::new(),
            once_ttl_s: 3600,
            fail_policy: FailPolicyName::Closed,
            active_ttl_ms: 15_000,
            active_interval_ms: 5_000,
        }
    }
}

impl GuardsConfig {
    /// The once-guard TTL.
    pub fn once_ttl(&self) -> Result<Ttl, ConfigError> {
        Ttl::from_secs(self.once_ttl_s).map_err(|_| {
            invalid(
                "guards.once_ttl_s",
                self.once_ttl_s,
                "a positive number of seconds",
            )
        })
    }

    /// The once-guard fail policy.
    pub fn fail_policy(&self) -> FailPolicy {
        match self.fail_policy {
            FailPolicyName::Closed => FailPolicy::FailClosed,
            FailPolicyName::Open => FailPolicy::FailOpen,
        }
    }

    /// The active-guard timing, validated.
    pub fn active(&self) -> Result<ActiveConfig, ConfigError> {
        let ttl = Ttl::from_millis(self.active_ttl_ms).map_err(|_| {
            invalid(
                "guards.active_ttl_ms",
                self.active_ttl_ms,
                "a positive number of milliseconds",
            )
        })?;
        if self.active_interval_ms == 0 {
            return Err(invalid(
                "guards.active_interval_ms",
                0,
                "a positive number of milliseconds",
            ));
        }
        let config = ActiveConfig::new()
            .with_ttl(ttl)
            .with_interval(Duration::from_millis(self.active_interval_ms));
        config
            .validate()
            .map_err(|e| invalid("guards.active_ttl_ms", self.active_ttl_ms, &e.to_string()))?;
        Ok(config)
    }
}

/// `[[schedules]]`: one job, on a fixed interval or a cron expression.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScheduleConfig {
    /// The router id: part of the dedup key, required.
    pub router: String,
    /// The chain (may be empty).
    #[serde(default)]
    pub chain: String,
    /// An epoch-aligned interval in milliseconds.
    pub every_ms: Option<u64>,
    /// A cron expression with seconds, in UTC.
    pub cron: Option<String>,
}

/// `[[active]]`: a leader-only consumer.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ActiveEntry {
    /// Its name: part of the lease key.
    pub name: String,
}

/// What kind of source an `[[endpoints]]` entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EndpointKind {
    /// Redis Pub/Sub: a broadcast, so one replica subscribes at a time
    /// (elected by lease).
    RedisPubsub,
    /// A Redis Streams consumer group: single delivery by the group.
    RedisStream,
    /// MQTT: a shared subscription (single delivery by the broker), or a
    /// plain one, broadcast unless `guard = true`.
    Mqtt,
}

/// `[[endpoints]]`: a message source this replica consumes. Which keys
/// apply depends on `kind`; a key of another kind is refused.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EndpointConfig {
    /// Its name: part of its lease key (Pub/Sub, guarded MQTT) and of its
    /// MQTT client id; unique.
    pub name: String,
    /// What it is.
    pub kind: EndpointKind,
    /// Redis kinds: the server's URL; default `locker.url`.
    pub url: Option<String>,
    /// `redis-pubsub`: channel patterns (`PSUBSCRIBE` syntax).
    #[serde(default)]
    pub patterns: Vec<String>,
    /// `redis-stream`: the stream key.
    pub stream: Option<String>,
    /// `redis-stream`: the consumer group, the same on every replica.
    pub group: Option<String>,
    /// `redis-stream`: claim entries idle this long on a dead consumer
    /// (default 30 s; longer than any handling).
    pub claim_idle_ms: Option<u64>,
    /// `redis-stream`: retries of a failing entry (default 3).
    pub retries: Option<u32>,
    /// `redis-stream`: wait between retries (default 100 ms, doubling).
    pub retry_delay_ms: Option<u64>,
    /// `redis-stream`: dead-letter topic for entries whose retries are
    /// spent; without one they stay pending.
    pub dead_letter_topic: Option<String>,
    /// `mqtt`: the broker's host.
    pub host: Option<String>,
    /// `mqtt`: the broker's port (default 1883).
    pub port: Option<u16>,
    /// `mqtt`: the topic filter.
    pub filter: Option<String>,
    /// `mqtt`: subscribe as `$share/<share_group>/<filter>`.
    pub share_group: Option<String>,
    /// `mqtt` plain subscription: only the elected replica subscribes.
    #[serde(default)]
    pub guard: bool,
}

impl EndpointConfig {
    /// The keys set that `kind` does not use.
    fn foreign_keys(&self) -> Vec<&'static str> {
        let set: [(&'static str, bool, &[EndpointKind]); 13] = [
            (
                "url",
                self.url.is_some(),
                &[EndpointKind::RedisPubsub, EndpointKind::RedisStream],
            ),
            (
                "patterns",
                !self.patterns.is_empty(),
                &[EndpointKind::RedisPubsub],
            ),
            (
                "stream",
                self.stream.is_some(),
                &[EndpointKind::RedisStream],
            ),
            ("group", self.group.is_some(), &[EndpointKind::RedisStream]),
            (
                "claim_idle_ms",
                self.claim_idle_ms.is_some(),
                &[EndpointKind::RedisStream],
            ),
            (
                "retries",
                self.retries.is_some(),
                &[EndpointKind::RedisStream],
            ),
            (
                "retry_delay_ms",
                self.retry_delay_ms.is_some(),
                &[EndpointKind::RedisStream],
            ),
            (
                "dead_letter_topic",
                self.dead_letter_topic.is_some(),
                &[EndpointKind::RedisStream],
            ),
            ("host", self.host.is_some(), &[EndpointKind::Mqtt]),
            ("port", self.port.is_some(), &[EndpointKind::Mqtt]),
            ("filter", self.filter.is_some(), &[EndpointKind::Mqtt]),
            (
                "share_group",
                self.share_group.is_some(),
                &[EndpointKind::Mqtt],
            ),
            ("guard", self.guard, &[EndpointKind::Mqtt]),
        ];
        set.iter()
            .filter(|(_, given, kinds)| *given && !kinds.contains(&self.kind))
            .map(|(key, _, _)| *key)
            .collect()
    }

    /// Checks the keys of its kind; `redis_url` is the locker's URL.
    fn validate(&self, key: &dyn Fn(&str) -> String, redis_url: bool) -> Result<(), ConfigError> {
        if self.name.is_empty() {
            return Err(invalid(key("name"), "\"\"", "a non-empty name"));
        }
        if let Some(foreign) = self.foreign_keys().first() {
            return Err(invalid(
                key(foreign),
                "set",
                &format!("no `{foreign}` for kind {:?}", self.kind),
            ));
        }
        let missing = |field: &str, what: &str| Err(invalid(key(field), "missing", what));
        let empty = |v: &Option<String>| v.as_deref().is_none_or(str::is_empty);
        match self.kind {
            EndpointKind::RedisPubsub | EndpointKind::RedisStream
                if self.url.is_none() && !redis_url =>
            {
                missing(
                    "url",
                    "a Redis URL (or a standalone Redis [locker] to share)",
                )
            }
            EndpointKind::RedisPubsub if self.patterns.iter().all(String::is_empty) => {
                missing("patterns", "at least one channel pattern")
            }
            EndpointKind::RedisStream if empty(&self.stream) => missing("stream", "the stream key"),
            EndpointKind::RedisStream if empty(&self.group) => {
                missing("group", "the consumer group, the same on every replica")
            }
            EndpointKind::RedisStream if self.claim_idle_ms == Some(0) => Err(invalid(
                key("claim_idle_ms"),
                0,
                "a positive number of milliseconds",
            )),
            EndpointKind::Mqtt if empty(&self.host) => missing("host", "the broker's host"),
            EndpointKind::Mqtt if empty(&self.filter) => missing("filter", "a topic filter"),
            EndpointKind::Mqtt if self.share_group.is_some() && self.guard => Err(invalid(
                key("guard"),
                true,
                "no guard with `share_group`: the broker delivers each message to one member already",
            )),
            _ => Ok(()),
        }
    }
}

/// `[metrics]`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsConfig {
    /// Serve Prometheus text at `http://<address>/metrics`.
    pub prometheus: Option<String>,
}

impl FileConfig {
    /// Parses and validates TOML text.
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        let config: FileConfig =
            toml::from_str(text).map_err(|e| ConfigError::Parse(e.to_string()))?;
        config.validate()?;
        Ok(config)
    }

    /// Reads, parses and validates a file.
    pub fn from_path(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError::Read(format!("{}: {e}", path.display())))?;
        Self::from_toml(&text)
    }

    /// Checks every value that parsing alone cannot.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.ratelimit.enabled {
            self.ratelimit.resolved()?;
        }
        if self.ratelimit.memory_keys == 0 {
            return Err(invalid(
                "ratelimit.memory_keys",
                0,
                "a positive number of keys",
            ));
        }
        self.validate_locker()?;
        self.guards.once_ttl()?;
        self.guards.active()?;
        let mut routers = std::collections::HashSet::new();
        for (i, s) in self.schedules.iter().enumerate() {
            let key = |field: &str| format!("schedules[{i}].{field}");
            if s.router.is_empty() {
                return Err(invalid(
                    key("router"),
                    "\"\"",
                    "a non-empty router id (it is part of the dedup key)",
                ));
            }
            if !routers.insert((s.chain.clone(), s.router.clone())) {
                return Err(invalid(
                    key("router"),
                    format!("{:?}", s.router),
                    "a router id unique within its chain",
                ));
            }
            match (&s.every_ms, &s.cron) {
                (Some(0), _) => {
                    return Err(invalid(
                        key("every_ms"),
                        0,
                        "a positive number of milliseconds",
                    ));
                }
                (Some(_), None) => {}
                (None, Some(cron)) => {
                    cron.parse::<CronSchedule>()
                        .map_err(|e| invalid(key("cron"), format!("{cron:?}"), &e.to_string()))?;
                }
                (Some(_), Some(_)) => {
                    return Err(invalid(
                        key("cron"),
                        "set",
                        "either `every_ms` or `cron`, not both",
                    ));
                }
                (None, None) => {
                    return Err(invalid(key("every_ms"), "missing", "`every_ms` or `cron`"));
                }
            }
        }
        for (i, a) in self.active.iter().enumerate() {
            if a.name.is_empty() {
                return Err(invalid(
                    format!("active[{i}].name"),
                    "\"\"",
                    "a non-empty name",
                ));
            }
        }
        let locker_url = self.locker.kind == LockerKind::Redis
            && self.locker.mode == RedisMode::Standalone
            && self.locker.url.is_some();
        let mut names = std::collections::HashSet::new();
        for (i, e) in self.endpoints.iter().enumerate() {
            let key = |field: &str| format!("endpoints[{i}].{field}");
            e.validate(&key, locker_url)?;
            if !names.insert(e.name.as_str()) {
                return Err(invalid(
                    key("name"),
                    format!("{:?}", e.name),
                    "a unique name",
                ));
            }
        }
        if let Some(address) = &self.metrics.prometheus {
            address.parse::<std::net::SocketAddr>().map_err(|_| {
                invalid(
                    "metrics.prometheus",
                    format!("{address:?}"),
                    "an address such as \"127.0.0.1:9000\"",
                )
            })?;
        }
        Ok(())
    }

    fn validate_locker(&self) -> Result<(), ConfigError> {
        let l = &self.locker;
        if l.kind != LockerKind::Redis {
            return Ok(());
        }
        if guard_core::lock::redis::check_prefix(l.prefix.trim()).is_err() {
            // A brace would move the hash tag that keeps a lock and its
            // fence counter in one cluster slot: every acquisition would
            // fail with CROSSSLOT at run time.
            return Err(invalid(
                "locker.prefix",
                format!("{:?}", l.prefix),
                "a prefix without '{' or '}' (they would move the Redis Cluster hash tag)",
            ));
        }
        if l.request_timeout_ms == 0 {
            return Err(invalid(
                "locker.request_timeout_ms",
                0,
                "a positive number of milliseconds",
            ));
        }
        match l.mode {
            RedisMode::Standalone if l.url.is_none() => Err(invalid(
                "locker.url",
                "missing",
                "a Redis URL such as \"redis://127.0.0.1:6379/\"",
            )),
            RedisMode::Sentinel | RedisMode::Cluster if l.urls.is_empty() => Err(invalid(
                "locker.urls",
                "[]",
                "at least one sentinel or cluster node URL",
            )),
            RedisMode::Sentinel if l.service.as_deref().is_none_or(str::is_empty) => Err(invalid(
                "locker.service",
                "missing",
                "the monitored service name",
            )),
            _ => Ok(()),
        }
    }
}
