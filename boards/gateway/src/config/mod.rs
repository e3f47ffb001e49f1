//! A gateway replica's configuration, from a TOML file, parsed once into
//! validated types.
//!
//! Every mistake is an error that names the dotted key, the value given
//! and what is allowed, type errors included (`` `ratelimit.policies.api.capacity`
//! = -1: expected a whole number from 0 to 4294967295 ``); unknown keys,
//! keys of another endpoint kind and a file that configures nothing are
//! refused. Nothing falls back silently (the original warned and used
//! defaults). What comes out cannot be invalid: a [`Config`] holds
//! guard-core's validated values (a [`Ttl`], an [`ActiveTiming`] that
//! passed `validate`, limiter parameters), so its users have no "refused
//! by validation" branches.
//!
//! The file-wide parts (locker, guards, schedules, rate limits, metrics)
//! are checked here; each `[[endpoints]]` kind is read, checked and
//! assembled in its own module of `endpoint` (`endpoint/<kind>.rs`),
//! whose validated types this module re-exports. The checks they share
//! (bounds, `${NAME}`, retries, Redis URLs, a builder's refusal named by
//! its key) are in a leaf module, `check`.
//!
//! URL and host values may name environment variables, `${NAME}`, so that
//! a secret (a Redis URL with a password) stays out of the file; an unset
//! variable is an error naming the key and the variable. Errors and
//! `Debug` output name a URL as written, before expansion, with its
//! password hidden ([`RedactedUrl`]).
//!
//! TLS (with the `tls` feature): a `rediss://` URL connects over TLS, to
//! the locker's deployment (all its URLs `rediss://`) or a Redis
//! endpoint's server; an MQTT endpoint connects over TLS with `tls = true`
//! (its port is then 8883 unless given). Each such connection may name
//! `tls_ca` (a PEM file of the CA certificates to trust instead of the
//! system's roots) and `tls_cert` with `tls_key` (a client certificate
//! and its key, for servers that require one). Paths are relative to the
//! working directory and may name `${NAME}`; each file is read and
//! checked when the configuration is loaded. A Redis endpoint without a
//! `url` of its own shares the locker's connection and TLS settings.
//! Without the feature, every TLS key and `rediss://` URL is refused.
//!
//! ```
//! use guard_gateway::config::{Config, Timing};
//!
//! let config = Config::from_toml(r#"
//!     [locker]
//!     kind = "local"
//!
//!     [[schedules]]
//!     router = "heartbeat"
//!     every_ms = 1000
//! "#)?;
//! assert!(matches!(config.schedules[0].timing, Timing::Every(_)));
//! # Ok::<(), guard_gateway::config::ConfigError>(())
//! ```

pub(crate) mod check;
pub(crate) mod connect;
mod feedback;
// Without its feature a kind is read, then refused.
#[cfg_attr(not(feature = "etcd"), allow(dead_code, unused_imports))]
mod etcd;
#[cfg_attr(not(feature = "postgres"), allow(dead_code, unused_imports))]
mod postgres;
pub(crate) mod ratelimit;
pub(crate) mod raw;
mod resolve;
pub(crate) mod tls;

pub(crate) use check::{ENDPOINT_SCOPE_KINDS, scope_kind};
// Each source kind's validated configuration lives with its assembly.
pub use crate::action::{Action, CommandAction};
pub use crate::endpoint::amqp::{AmqpDelivery, AmqpSource};
pub use crate::endpoint::mqtt::{MqttDelivery, MqttSource};
pub use crate::endpoint::mysql::{BinlogSource, BinlogStart};
pub use crate::endpoint::nats::{JetStreamSource, NatsDelivery, NatsSource};
pub use crate::endpoint::postgres::PgQueueSource;
pub use crate::endpoint::redis::{PubSubSource, StreamSource};
pub use crate::sink::{
    HttpTarget, JetStreamTarget, RedisStreamTarget, Sink, SinkHeader, SinkKind, SinkLimit,
};

use std::fmt;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use guard_core::guard::{ActiveTiming, FailPolicy};
use guard_core::limit::{Algorithm as _, FixedWindow, LeakyBucket, SlidingWindow, TokenBucket};
use guard_core::lock::Ttl;
use guard_core::slot::Every;
use guard_redis::Topology;
use guard_std::CronSchedule;

pub use etcd::DEFAULT_TIMEOUT as DEFAULT_ETCD_TIMEOUT;
pub use tls::TlsFiles;

/// A configuration that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be read.
    Read(String),
    /// Not valid TOML.
    Syntax(String),
    /// A value that is missing, of the wrong type, out of range or
    /// inconsistent with another.
    Invalid {
        /// The dotted key, e.g. `ratelimit.policies.api.capacity`.
        key: String,
        /// The value given (`missing` or `set` where there is none to show).
        value: String,
        /// What is allowed.
        expected: String,
    },
    /// The file configures nothing a replica would do.
    Empty,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::Read(e) => write!(f, "cannot read the configuration: {e}"),
            ConfigError::Syntax(e) => write!(f, "invalid configuration: {e}"),
            ConfigError::Invalid {
                key,
                value,
                expected,
            } => write!(
                f,
                "invalid configuration: `{key}` = {value}: expected {expected}"
            ),
            ConfigError::Empty => f.write_str(
                "the configuration does nothing: give at least one [[schedules]], [[active]] or [[endpoints]] entry",
            ),
        }
    }
}

impl std::error::Error for ConfigError {}

pub(crate) fn invalid(
    key: impl Into<String>,
    value: impl fmt::Display,
    expected: impl Into<String>,
) -> ConfigError {
    ConfigError::Invalid {
        key: key.into(),
        value: value.to_string(),
        expected: expected.into(),
    }
}

/// A server's URL from the configuration: the URL to connect to, its
/// `${NAME}`s expanded, and how it is shown, as written with its password
/// hidden. `Display` and `Debug` show only the latter, so a
/// configuration can be printed or logged without its secrets (a
/// variable may hold a password, or the whole URL); the URL itself is
/// [`as_str`](Self::as_str), or the `str` it dereferences to, for
/// connecting.
#[derive(Clone, PartialEq, Eq)]
pub struct RedactedUrl {
    url: String,
    shown: String,
}

impl RedactedUrl {
    /// `url`, expanded from `as_written`, shown as `as_written` with its
    /// user information hidden.
    pub(crate) fn new(url: String, as_written: &str) -> Self {
        RedactedUrl {
            shown: guard_endpoints::redacted(as_written),
            url,
        }
    }

    /// `url`, shown as `shown` (hidden by the caller's own rules: a
    /// PostgreSQL connection string may also be `key=value` pairs).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn with_shown(url: String, shown: String) -> Self {
        RedactedUrl { url, shown }
    }

    /// The URL to connect to, secrets included: never for printing.
    pub fn as_str(&self) -> &str {
        &self.url
    }

    /// The URL as written in the file, its password hidden: what
    /// `Display` and `Debug` show.
    pub fn shown(&self) -> &str {
        &self.shown
    }
}

impl std::ops::Deref for RedactedUrl {
    type Target = str;

    fn deref(&self) -> &str {
        &self.url
    }
}

impl fmt::Display for RedactedUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.shown)
    }
}

impl fmt::Debug for RedactedUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.shown, f)
    }
}

/// The URL to connect to is compared.
impl PartialEq<str> for RedactedUrl {
    fn eq(&self, other: &str) -> bool {
        self.url == other
    }
}

/// The URL to connect to is compared.
impl PartialEq<&str> for RedactedUrl {
    fn eq(&self, other: &&str) -> bool {
        self.url == *other
    }
}

/// A whole, validated configuration.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Config {
    /// The lock service.
    pub locker: Locker,
    /// Guard settings.
    pub guards: Guards,
    /// Scheduled jobs, each run once per slot across replicas.
    pub schedules: Vec<Schedule>,
    /// Leader-only consumers (one active replica each), by name.
    pub active: Vec<String>,
    /// The rate limiters, when `[ratelimit] enabled = true`.
    pub ratelimit: Option<RateLimits>,
    /// Message sources.
    pub endpoints: Vec<Endpoint>,
    /// Where endpoints send what they receive, by name.
    pub sinks: Vec<Sink>,
    /// Metrics and health.
    pub metrics: Metrics,
    /// Where dead letters are kept on disk, if anywhere.
    pub dead_letters: Option<crate::dead_letters::DeadLetters>,
}

/// Which lock service the guards use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Locker {
    /// None: every guard allows (a single process).
    None,
    /// In this process.
    Local,
    /// Redis, shared by every replica.
    Redis(RedisLocker),
    /// A PostgreSQL lease table, shared by every replica (linearizable).
    Postgres(PostgresLocker),
    /// An etcd cluster, shared by every replica (linearizable).
    Etcd(EtcdLocker),
}

impl Locker {
    /// The lock service's name, for a resource that keeps fences (a
    /// binlog reader's checkpoint: `BinlogReader::with_lock_service`),
    /// which compares fences only under one name: `none`, `local`,
    /// `redis` (fences from each server's clock, comparable across
    /// deployments), `postgres:<table>` (the table's sequence), `etcd`.
    /// An in-process locker counts its fences from 1 again in every
    /// process: an application that keeps its fences across runs adds
    /// what tells its processes apart to `local`.
    pub fn lock_service(&self) -> String {
        match self {
            Locker::None => "none".to_owned(),
            Locker::Local => "local".to_owned(),
            Locker::Redis(_) => "redis".to_owned(),
            Locker::Postgres(l) => format!("postgres:{}", l.table),
            Locker::Etcd(_) => "etcd".to_owned(),
        }
    }
}

/// `[locker] kind = "etcd"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdLocker {
    /// The members' client URLs (`http://host:port`), `${VAR}`s expanded.
    pub endpoints: Vec<String>,
    /// Each request's timeout.
    pub request_timeout: Duration,
}

/// `[locker] kind = "postgres"`: checked with guard-postgres's own rules
/// (URL, table, timeout), so a configuration that loads builds its
/// locker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PostgresLocker {
    /// The server's URL, `${VAR}`s expanded (shown as written, its
    /// password hidden).
    pub url: RedactedUrl,
    /// The lease table.
    pub table: String,
    /// Each request's timeout, connecting included.
    pub request_timeout: Duration,
}

/// `[locker] kind = "redis"`.
#[derive(Clone, PartialEq, Eq)]
pub struct RedisLocker {
    /// Standalone, sentinel or cluster, with URLs checked.
    pub topology: Topology,
    /// The key prefix (no braces).
    pub prefix: String,
    /// Each request's timeout.
    pub request_timeout: Duration,
    /// TLS, when the URLs are `rediss://`: the `tls_*` files (none: the
    /// system's roots).
    pub tls: Option<TlsFiles>,
    /// Whether the leases wait one lease TTL after the store lost their
    /// records (`quarantine = true`: guard-redis's
    /// `RedisLocker::with_quarantine`, for the elections only).
    pub quarantine: bool,
    /// How many replicas must acknowledge a grant or renewal, and within
    /// how long (`replica_acks`, `replica_ack_ms`: guard-redis's
    /// `RedisLocker::with_replica_acks`).
    pub replica_acks: Option<(u32, Duration)>,
}

impl fmt::Debug for RedisLocker {
    // The URLs with their passwords hidden. The topology keeps only the
    // expanded URLs, so these are shown expanded: a variable that holds
    // a password in the URL's user information stays hidden.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use guard_endpoints::redacted;
        let shown = |urls: &[String]| urls.iter().map(|u| redacted(u)).collect::<Vec<_>>();
        let topology = match &self.topology {
            Topology::Standalone { url } => format!("Standalone {{ url: {:?} }}", redacted(url)),
            Topology::Sentinel { sentinels, service } => format!(
                "Sentinel {{ sentinels: {:?}, service: {service:?} }}",
                shown(sentinels)
            ),
            Topology::Cluster { nodes } => format!("Cluster {{ nodes: {:?} }}", shown(nodes)),
        };
        f.debug_struct("RedisLocker")
            .field("topology", &format_args!("{topology}"))
            .field("prefix", &self.prefix)
            .field("request_timeout", &self.request_timeout)
            .field("tls", &self.tls)
            .field("quarantine", &self.quarantine)
            .field("replica_acks", &self.replica_acks)
            .finish()
    }
}

/// `[guards]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Guards {
    /// The tenant, a segment of every scope.
    pub owner: String,
    /// How long a once-guard claim (a schedule slot) is kept.
    pub once_ttl: Ttl,
    /// What once-guards do on a backend error.
    pub fail_policy: FailPolicy,
    /// Active-guard lease timing, validated once here.
    pub active: ActiveTiming,
}

/// `[[schedules]]`: one job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    /// The router id: part of the dedup key.
    pub router: String,
    /// The chain (may be empty).
    pub chain: String,
    /// When it runs.
    pub timing: Timing,
    /// The limiter each run must pass, if any (keyed by the router).
    pub limit: Option<ScheduleLimit>,
    /// What a run does.
    pub action: Action,
    /// Whether runs hold a lock for their whole length, so that they
    /// never overlap across replicas.
    pub exclusive: bool,
}

/// When a scheduled job runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Timing {
    /// Epoch-aligned intervals.
    Every(Every),
    /// A cron expression with seconds, in UTC (boxed: a parsed cron
    /// expression is large).
    Cron(Box<CronSchedule>),
}

/// A schedule's limiter: a run waits up to `max_wait` for it, then the
/// slot is skipped, logged and counted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduleLimit {
    /// The limiter's name, one of `[ratelimit.policies]` (or the default).
    pub limiter: String,
    /// How long a run may wait to be admitted.
    pub max_wait: Duration,
}

/// Where limiter state lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// In this process.
    Memory,
    /// In Redis (the locker's connection), shared by every replica.
    Redis,
}

/// The most admissions a sliding window tracks per key.
pub const MAX_SLIDING_LIMIT: usize = 4096;

/// The instants a sliding window's in-memory table keeps per key: the
/// smallest of 16, 128, 1,024 and [`MAX_SLIDING_LIMIT`] that holds its
/// `limit` (8 bytes an instant, so a key of a small limit costs the
/// table little).
pub fn sliding_log(limit: u32) -> usize {
    [16, 128, 1024]
        .into_iter()
        .find(|&log| limit as usize <= log)
        .unwrap_or(MAX_SLIDING_LIMIT)
}

/// The size of every in-memory limiter's table: `[ratelimit]
/// memory_keys` or `memory_bytes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryTables {
    /// So many keys a table (rounded up to whole shards of 1,024).
    Keys(usize),
    /// At most so many bytes a table, keys' text included: as many
    /// whole shards of 1,024 keys as fit at the most a key of its
    /// algorithm can cost ([`PolicyAlgorithm::memory_bytes_per_key`]).
    Bytes(usize),
}

/// The keys a table holds when neither `memory_keys` nor `memory_bytes`
/// is set.
pub const DEFAULT_MEMORY_KEYS: usize = 65_536;

/// A policy's algorithm with validated parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PolicyAlgorithm {
    /// A sliding window.
    Sliding(SlidingWindow<MAX_SLIDING_LIMIT>),
    /// A fixed window aligned to the Unix epoch (or a UTC offset): a
    /// quota given back all at once at each boundary.
    FixedWindow(FixedWindow),
    /// A token bucket.
    TokenBucket(TokenBucket),
    /// A leaky bucket.
    LeakyBucket(LeakyBucket),
}

impl PolicyAlgorithm {
    /// The units a key may use at once: a window's limit, a bucket's
    /// capacity.
    pub fn quota(&self) -> u32 {
        match self {
            PolicyAlgorithm::Sliding(w) => w.limit(),
            PolicyAlgorithm::FixedWindow(w) => w.limit(),
            PolicyAlgorithm::TokenBucket(b) => b.limit(),
            PolicyAlgorithm::LeakyBucket(b) => b.limit(),
        }
    }

    /// The most bytes one key costs an in-memory table of this
    /// algorithm, its text included however long (guard-std's
    /// `MemoryLimiter::bytes_per_key`, for the table the gateway builds).
    pub fn memory_bytes_per_key(&self) -> usize {
        use guard_std::ratelimit::MemoryLimiter;
        match self {
            PolicyAlgorithm::Sliding(w) => match sliding_log(w.limit()) {
                16 => MemoryLimiter::<SlidingWindow<16>>::bytes_per_key(),
                128 => MemoryLimiter::<SlidingWindow<128>>::bytes_per_key(),
                1024 => MemoryLimiter::<SlidingWindow<1024>>::bytes_per_key(),
                _ => MemoryLimiter::<SlidingWindow<MAX_SLIDING_LIMIT>>::bytes_per_key(),
            },
            PolicyAlgorithm::FixedWindow(_) => MemoryLimiter::<FixedWindow>::bytes_per_key(),
            PolicyAlgorithm::TokenBucket(_) => MemoryLimiter::<TokenBucket>::bytes_per_key(),
            PolicyAlgorithm::LeakyBucket(_) => MemoryLimiter::<LeakyBucket>::bytes_per_key(),
        }
    }
}

/// What a policy counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cost {
    /// One unit per message (or schedule run).
    Messages,
    /// A message's payload size in bytes (`cost = "bytes"`): a metered
    /// uplink's quota.
    Bytes,
}

/// A named limiter, resolved against the defaults and validated.
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
    /// What it counts.
    pub cost: Cost,
    /// The keys its in-memory table holds (when it runs in memory):
    /// `memory_keys`, or as many as fit `memory_bytes`.
    pub memory_keys: usize,
}

/// `[ratelimit]`, enabled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateLimits {
    /// Every policy, the default one included.
    pub policies: Vec<Policy>,
    /// The default limiter's name.
    pub default_name: String,
    /// The size of each in-memory limiter's table.
    pub memory: MemoryTables,
    /// Use memory, with a warning, when a Redis backend has no Redis
    /// locker to share; otherwise that is an error.
    pub fallback_to_memory: bool,
}

/// `[[endpoints]]`: a message source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// Its unique name: part of its lease key and MQTT client id.
    pub name: String,
    /// What it is and where.
    pub source: Source,
    /// The limiter each message must pass, if any.
    pub limit: Option<EndpointLimit>,
    /// The largest message handed to the handler, in bytes (a stream
    /// entry's field values together); a larger one is dead-lettered with
    /// the reason.
    pub max_payload_bytes: usize,
    /// The sink each message goes to (`to`), one of [`Config::sinks`];
    /// `None`: the message is only reported.
    pub to: Option<String>,
}

impl Endpoint {
    /// The kind in its lease scope (`endpoint/<kind>`, one of
    /// [`scope_kind`]), if its source can elect a replica.
    pub(crate) fn lease_kind(&self) -> Option<&'static str> {
        match &self.source {
            Source::RedisPubsub(_) => Some(scope_kind::REDIS),
            Source::Mqtt(_) => Some(scope_kind::MQTT),
            #[cfg(feature = "nats")]
            Source::Nats(_) => Some(scope_kind::NATS),
            #[cfg(feature = "amqp")]
            Source::Rabbitmq(_) => Some(scope_kind::AMQP),
            #[cfg(feature = "mysql")]
            Source::MysqlBinlog(_) => Some(scope_kind::BINLOG),
            _ => None,
        }
    }

    /// The lease key replicas with `guards` elect it under, if its source
    /// can elect: what `dlq replay` asks the lock service about.
    pub fn lease_key(&self, guards: &guard_std::GuardConfig) -> Option<String> {
        let scope = lease_scope(guards, self.lease_kind()?, &self.name).ok()?;
        guard_core::lock::active_key(guards.prefix(), &scope)
            .ok()
            .map(|key| key.as_str().to_owned())
    }
}

/// The lease scope of an endpoint `name` of `kind` (one of
/// [`scope_kind`]) under `guards`: `endpoint/<kind>`, the owner, the name.
pub(crate) fn lease_scope(
    guards: &guard_std::GuardConfig,
    kind: &str,
    name: &str,
) -> Result<guard_core::lock::Scope, guard_core::lock::KeyError> {
    guards
        .scope(&format!("endpoint/{kind}"))
        .and_then(|s| s.segment("node", name))
}

/// The largest message an endpoint hands over unless configured: 1 MiB.
pub const DEFAULT_MAX_PAYLOAD_BYTES: usize = 1 << 20;

/// An endpoint's source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// Redis Pub/Sub: a broadcast, so one replica subscribes at a time.
    RedisPubsub(PubSubSource),
    /// A Redis Streams consumer group: single delivery by the group.
    RedisStream(StreamSource),
    /// MQTT.
    Mqtt(MqttSource),
    /// A core NATS subject.
    #[cfg(feature = "nats")]
    Nats(NatsSource),
    /// A JetStream durable consumer: single delivery by the server.
    #[cfg(feature = "nats")]
    NatsJetStream(JetStreamSource),
    /// RabbitMQ: a work queue, or a fanout exchange.
    #[cfg(feature = "amqp")]
    Rabbitmq(AmqpSource),
    /// A PostgreSQL table of work, each row claimed by one replica.
    #[cfg(feature = "postgres")]
    PostgresQueue(PgQueueSource),
    /// MariaDB/MySQL binlog change data capture: one elected reader.
    #[cfg(feature = "mysql")]
    MysqlBinlog(BinlogSource),
}

/// The limiter an endpoint's messages must pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointLimit {
    /// The limiter's name, one of `[ratelimit.policies]` (or the default).
    pub limiter: String,
    /// What a message is limited by.
    pub key: LimitKey,
    /// What a message costs (the limiter's policy's).
    pub cost: Cost,
    /// What happens to a message the limiter refuses.
    pub when_limited: WhenLimited,
}

/// What an endpoint's limiter key is taken from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LimitKey {
    /// The whole source: one budget for the endpoint.
    Source,
    /// The channel or topic the message came on (not for a stream, whose
    /// entries all come on the stream).
    Topic,
    /// A field of a stream entry (`field:<name>`); an entry without it,
    /// or whose value is empty, not UTF-8 or longer than a limiter's key
    /// may be, is limited under the whole source's key.
    Field(String),
}

/// What happens to a message the limiter refuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WhenLimited {
    /// Wait until admitted, at most this long; then dead-letter it.
    Wait(Duration),
    /// Dead-letter it at once.
    DeadLetter,
}

/// `[metrics]`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Metrics {
    /// Serve `/metrics`, `/healthz` and `/readyz` on this address.
    pub prometheus: Option<SocketAddr>,
}

impl Config {
    /// Parses and validates TOML text; `${NAME}` reads the process's
    /// environment.
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        Self::from_toml_with_env(text, |name| std::env::var(name).ok())
    }

    /// As [`from_toml`](Self::from_toml), with `${NAME}` looked up by `env`.
    pub fn from_toml_with_env(
        text: &str,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        resolve::config(raw::parse(text)?, &env)
    }

    /// Reads, parses and validates a file.
    pub fn from_path(path: &Path) -> Result<Self, ConfigError> {
        let bytes = std::fs::read(path)
            .map_err(|e| ConfigError::Read(format!("{}: {e}", path.display())))?;
        Self::from_bytes(&bytes)
    }

    /// Parses and validates the bytes of a file: text that is not UTF-8 is
    /// refused with the line and column of its first bad byte.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, ConfigError> {
        let text = std::str::from_utf8(bytes).map_err(|e| {
            let (good, _) = bytes.split_at(e.valid_up_to());
            let line = good.iter().filter(|b| **b == b'\n').count() + 1;
            let column =
                good.len() - good.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1) + 1;
            ConfigError::Syntax(format!(
                "not UTF-8 text: a bad byte at line {line}, column {column}"
            ))
        })?;
        Self::from_toml(text)
    }

    /// The Redis locker, if any.
    pub fn redis_locker(&self) -> Option<&RedisLocker> {
        match &self.locker {
            Locker::Redis(redis) => Some(redis),
            _ => None,
        }
    }

    /// The guards' shared settings without their locker: the owner, and
    /// the default key prefix (what every scope and key is made under).
    pub fn guard_settings(&self) -> guard_std::GuardConfig {
        guard_std::GuardConfig::new().with_owner(self.guards.owner.clone())
    }
}
