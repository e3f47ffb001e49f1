//! The file as written: serde structs that mirror the TOML, with unknown
//! keys refused. They never leave this module's parent: [`super::Config`]
//! is built from them once, validated.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::{ConfigError, invalid};

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct File {
    #[serde(default)]
    pub ratelimit: Option<RateLimit>,
    #[serde(default)]
    pub locker: Locker,
    #[serde(default)]
    pub guards: Guards,
    #[serde(default)]
    pub schedules: Vec<Schedule>,
    #[serde(default)]
    pub active: Vec<Active>,
    /// Read as tables first: each is then read as its `kind`'s struct,
    /// so that errors inside an entry keep their full key path (serde
    /// loses it inside an internally tagged enum).
    #[serde(default)]
    pub endpoints: Vec<toml::Table>,
    /// Likewise.
    #[serde(default)]
    pub sinks: Vec<toml::Table>,
    #[serde(default)]
    pub metrics: Metrics,
    pub dead_letters: Option<crate::dead_letters::DeadLettersEntry>,
}

/// The file as read: its tables, and its endpoints and sinks each read
/// as its kind's struct.
#[derive(Debug)]
pub(super) struct Parsed {
    pub file: File,
    pub endpoints: Vec<Routed>,
    pub sinks: Vec<crate::sink::Entry>,
}

/// An `[[endpoints]]` entry with the sink it names (`to`), a key every
/// kind has.
#[derive(Debug)]
pub(super) struct Routed {
    pub endpoint: Endpoint,
    pub to: Option<String>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(super) enum Backend {
    #[default]
    Memory,
    Redis,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(super) enum Algorithm {
    #[default]
    Sliding,
    FixedWindow,
    TokenBucket,
    LeakyBucket,
}

/// What a policy counts: each message, or its payload's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(super) enum Cost {
    Message,
    Bytes,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct RateLimit {
    pub enabled: bool,
    pub backend: Backend,
    pub window_ms: u64,
    pub limit: u32,
    pub key_prefix: String,
    pub default_name: String,
    pub fallback_to_memory: bool,
    pub memory_keys: Option<u64>,
    pub memory_bytes: Option<u64>,
    pub policies: BTreeMap<String, Policy>,
}

impl Default for RateLimit {
    fn default() -> Self {
        RateLimit {
            enabled: false,
            backend: Backend::Memory,
            window_ms: 1000,
            limit: 100,
            key_prefix: "guard:rl".to_owned(),
            default_name: "default".to_owned(),
            fallback_to_memory: false,
            memory_keys: None,
            memory_bytes: None,
            policies: BTreeMap::new(),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Policy {
    #[serde(default)]
    pub algorithm: Algorithm,
    pub backend: Option<Backend>,
    pub window_ms: Option<u64>,
    pub limit: Option<u32>,
    pub capacity: Option<u32>,
    pub rate_per_second: Option<u32>,
    pub key_prefix: Option<String>,
    pub utc_offset: Option<String>,
    pub cost: Option<Cost>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(super) enum LockerKind {
    #[default]
    None,
    Local,
    Redis,
    Postgres,
    Etcd,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(super) enum RedisMode {
    #[default]
    Standalone,
    Sentinel,
    Cluster,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct Locker {
    pub kind: LockerKind,
    pub mode: RedisMode,
    pub url: Option<String>,
    pub urls: Vec<String>,
    pub service: Option<String>,
    pub request_timeout_ms: Option<u64>,
    pub prefix: String,
    pub table: Option<String>,
    pub tls_ca: Option<String>,
    pub tls_cert: Option<String>,
    pub tls_key: Option<String>,
    pub quarantine: bool,
    pub replica_acks: Option<u32>,
    pub replica_ack_ms: Option<u64>,
}

impl Default for Locker {
    fn default() -> Self {
        Locker {
            kind: LockerKind::None,
            mode: RedisMode::Standalone,
            url: None,
            urls: Vec::new(),
            service: None,
            request_timeout_ms: None,
            prefix: String::new(),
            table: None,
            tls_ca: None,
            tls_cert: None,
            tls_key: None,
            quarantine: false,
            replica_acks: None,
            replica_ack_ms: None,
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(super) enum FailPolicy {
    #[default]
    Closed,
    Open,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct Guards {
    pub owner: String,
    pub once_ttl_s: u64,
    pub fail_policy: FailPolicy,
    /// Unset: core's default lease.
    pub active_ttl_ms: Option<u64>,
    /// Unset: core's default, derived from the TTL.
    pub active_interval_ms: Option<u64>,
}

impl Default for Guards {
    fn default() -> Self {
        Guards {
            owner: String::new(),
            once_ttl_s: 3600,
            fail_policy: FailPolicy::Closed,
            active_ttl_ms: None,
            active_interval_ms: None,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Schedule {
    pub router: String,
    #[serde(default)]
    pub chain: String,
    pub every_ms: Option<u64>,
    pub cron: Option<String>,
    pub limit: Option<String>,
    pub max_wait_ms: Option<u64>,
    pub run: Option<Vec<String>>,
    pub timeout_ms: Option<u64>,
    pub retries: Option<u32>,
    pub retry_delay_ms: Option<u64>,
    pub to: Option<String>,
    pub exclusive: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Active {
    pub name: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum WhenLimited {
    Wait,
    DeadLetter,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum WhenFull {
    DropNewest,
    DropOldest,
}

/// One `[[endpoints]]` entry, told apart by `kind`; each kind accepts its
/// own keys only.
#[derive(Debug)]
pub(super) enum Endpoint {
    RedisPubsub(crate::endpoint::redis::PubSubEntry),
    RedisStream(crate::endpoint::redis::StreamEntry),
    Mqtt(crate::endpoint::mqtt::MqttEntry),
    Nats(crate::endpoint::nats::NatsEntry),
    NatsJetStream(crate::endpoint::nats::JetStreamEntry),
    Rabbitmq(crate::endpoint::amqp::RabbitmqEntry),
    PostgresQueue(crate::endpoint::postgres::PgQueueEntry),
    MysqlBinlog(crate::endpoint::mysql::BinlogEntry),
}

impl Endpoint {
    pub fn name(&self) -> &str {
        match self {
            Endpoint::RedisPubsub(e) => &e.name,
            Endpoint::RedisStream(e) => &e.name,
            Endpoint::Mqtt(e) => &e.name,
            Endpoint::Nats(e) => &e.name,
            Endpoint::NatsJetStream(e) => &e.name,
            Endpoint::Rabbitmq(e) => &e.name,
            Endpoint::PostgresQueue(e) => &e.name,
            Endpoint::MysqlBinlog(e) => &e.name,
        }
    }
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum BinlogStart {
    Current,
    Beginning,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Metrics {
    pub prometheus: Option<String>,
}

/// A TOML syntax error at its line and column, with the parser's message
/// alone: the line itself is not echoed, since it may hold a password
/// (a URL with an unclosed quote) or bytes a terminal would act on.
fn syntax(text: &str, e: &toml::de::Error) -> ConfigError {
    let at = e
        .span()
        .and_then(|span| text.get(..span.start))
        .map(|before| {
            let line = before.matches('\n').count() + 1;
            let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
            format!("line {line}, column {column}: ")
        })
        .unwrap_or_default();
    let message = e.message().trim_end().escape_debug().to_string();
    ConfigError::Syntax(format!("{at}{message}"))
}

/// Parses TOML text into the file's structs, its endpoints and its
/// sinks; a type error, an unknown key or a missing one names its dotted
/// key.
pub(super) fn parse(text: &str) -> Result<Parsed, ConfigError> {
    let deserializer = toml::Deserializer::parse(text).map_err(|e| syntax(text, &e))?;
    let mut file: File = serde_path_to_error::deserialize(deserializer).map_err(|e| {
        let path = e.path().to_string();
        translate(&path, e.inner().message())
    })?;
    let endpoints = std::mem::take(&mut file.endpoints)
        .into_iter()
        .enumerate()
        .map(|(i, table)| endpoint(i, table))
        .collect::<Result<_, _>>()?;
    let sinks = std::mem::take(&mut file.sinks)
        .into_iter()
        .enumerate()
        .map(|(i, table)| crate::sink::Entry::read(i, table))
        .collect::<Result<_, _>>()?;
    Ok(Parsed {
        file,
        endpoints,
        sinks,
    })
}

/// Entry `i` of `[[endpoints]]`, read as its kind's struct.
fn endpoint(i: usize, mut table: toml::Table) -> Result<Routed, ConfigError> {
    let at = format!("endpoints[{i}]");
    let kinds = "one of `redis-pubsub`, `redis-stream`, `mqtt`, `nats`, `nats-jetstream`, `rabbitmq`, `postgres-queue`, `mysql-binlog`";
    let kind = match table.remove("kind") {
        Some(toml::Value::String(kind)) => kind,
        Some(other) => return Err(invalid(format!("{at}.kind"), other, kinds)),
        None => return Err(invalid(format!("{at}.kind"), "missing", kinds)),
    };
    let to = match table.remove("to") {
        None => None,
        Some(toml::Value::String(to)) => Some(to),
        Some(other) => {
            return Err(invalid(
                format!("{at}.to"),
                other,
                "the name of a [[sinks]] entry, as a string",
            ));
        }
    };
    let endpoint = match kind.as_str() {
        "redis-pubsub" => read_entry(&at, table).map(Endpoint::RedisPubsub),
        "redis-stream" => read_entry(&at, table).map(Endpoint::RedisStream),
        "mqtt" => read_entry(&at, table).map(Endpoint::Mqtt),
        "nats" => read_entry(&at, table).map(Endpoint::Nats),
        "nats-jetstream" => read_entry(&at, table).map(Endpoint::NatsJetStream),
        "rabbitmq" => read_entry(&at, table).map(Endpoint::Rabbitmq),
        "postgres-queue" => read_entry(&at, table).map(Endpoint::PostgresQueue),
        "mysql-binlog" => read_entry(&at, table).map(Endpoint::MysqlBinlog),
        other => Err(invalid(format!("{at}.kind"), format!("{other:?}"), kinds)),
    }?;
    Ok(Routed { endpoint, to })
}

/// The table of entry `at` (`endpoints[0]`), its `kind` taken out, read
/// as that kind's struct; an error names its full dotted key.
pub(crate) fn read_entry<T: serde::de::DeserializeOwned>(
    at: &str,
    table: toml::Table,
) -> Result<T, ConfigError> {
    serde_path_to_error::deserialize(toml::Value::Table(table)).map_err(|e| {
        let inner = e.path().to_string();
        let path = if inner == "." || inner.is_empty() {
            at.to_owned()
        } else {
            format!("{at}.{inner}")
        };
        translate(&path, e.inner().message())
    })
}

/// Turns serde's words into the key, the value and what is allowed; a key
/// that is itself empty (`"" = 1`) is shown as `""`.
fn translate(path: &str, message: &str) -> ConfigError {
    match translate_at(path, message) {
        ConfigError::Invalid {
            key,
            value,
            expected,
        } if key.is_empty() || key.ends_with('.') => ConfigError::Invalid {
            key: format!("{key}\"\""),
            value,
            expected,
        },
        other => other,
    }
}

fn translate_at(path: &str, message: &str) -> ConfigError {
    let key = |field: &str| match path {
        "" | "." => field.to_owned(),
        _ => format!("{path}.{field}"),
    };
    let quoted = |text: &str| text.split('`').nth(1).map(str::to_owned);
    if let Some(rest) = message
        .strip_prefix("invalid value: ")
        .or_else(|| message.strip_prefix("invalid type: "))
    {
        let (found, expected) = rest
            .split_once(", expected ")
            .unwrap_or((rest, "another value"));
        let value = quoted(found)
            .or_else(|| found.strip_prefix("string ").map(str::to_owned))
            .unwrap_or_else(|| found.to_owned());
        return invalid(path, value, expected_in_words(expected));
    }
    if let Some(rest) = message.strip_prefix("unknown field ") {
        let (field, allowed) = rest.split_once(", expected ").unwrap_or((rest, ""));
        let field = quoted(field).unwrap_or_else(|| field.to_owned());
        let allowed = allowed.strip_prefix("one of ").unwrap_or(allowed);
        // The path names the unknown key itself.
        let at = if path.ends_with(field.as_str()) {
            path.to_owned()
        } else {
            key(&field)
        };
        return invalid(at, "set", format!("no such key here (known: {allowed})"));
    }
    if let Some(rest) = message.strip_prefix("unknown variant ") {
        let (value, allowed) = rest.split_once(", expected ").unwrap_or((rest, ""));
        let value = quoted(value).unwrap_or_else(|| value.to_owned());
        // An endpoint's kind is its tag: the path stops at the entry.
        let key = if path.ends_with(']') {
            key("kind")
        } else {
            path.to_owned()
        };
        return invalid(key, format!("{value:?}"), allowed.to_owned());
    }
    if let Some(field) = message.strip_prefix("missing field ") {
        let field = quoted(field).unwrap_or_else(|| field.to_owned());
        return invalid(key(&field), "missing", "a value: this key is required");
    }
    if message.contains("value was too large") || message.contains("expected any valid TOML value")
    {
        // TOML integers are 64-bit signed: a larger number is no number.
        return invalid(
            path,
            "a number too large",
            format!("a whole number up to {}", i64::MAX),
        );
    }
    ConfigError::Syntax(format!("`{path}`: {message}"))
}

/// serde's type names, in a person's words.
fn expected_in_words(expected: &str) -> String {
    let whole = |max: u64| format!("a whole number from 0 to {max}");
    if let Some(name) = expected.strip_prefix("struct ") {
        // A section given as a plain value (`locker = "local"`).
        return format!("a table of keys ([{}])", name.to_lowercase());
    }
    match expected {
        "u8" => whole(u64::from(u8::MAX)),
        "u16" => whole(u64::from(u16::MAX)),
        "u32" => whole(u64::from(u32::MAX)),
        // Larger than TOML can write: a 64-bit signed integer's range.
        "u64" | "usize" => whole(i64::MAX.unsigned_abs()),
        "a boolean" => "true or false".to_owned(),
        other => other.to_owned(),
    }
}
