//! `[[sinks]]`: where an endpoint's messages go (`to = "<sink>"` on the
//! endpoint). Two kinds: `kind = "http"`, a POST of each message's
//! payload with guard-endpoints'
//! [`HttpSink`](guard_endpoints::sink::http::HttpSink) (hyper's client on
//! the gateway's own async-io reactor: no second runtime), and
//! `kind = "redis-stream"`, an `XADD` through
//! [`RedisStreamSink`](guard_endpoints::sink::redis_stream::RedisStreamSink),
//! which refuses stale fences and repeated ids.
//!
//! An endpoint with a sink counts a message handled once the sink took
//! it ([`deliver`](guard_endpoints::sink::deliver) with the sink's retry
//! policy, each attempt only while the lease the message was read under
//! is valid). What it does not take goes where a message its limiter
//! refuses goes: back to a source that retries (a stream entry stays
//! pending, a queue's message is redelivered) or, for a broadcast, to the
//! endpoint's dead letters with the sink's last answer.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use guard_core::limit::Decision;
use guard_core::retry::{Multiplier, RetryPolicy};
use guard_endpoints::sink::redis_stream::RedisStreamSink;
use guard_endpoints::sink::{MessageSink, Outgoing, SinkError};
use guard_redis::{RedisConnection, Topology};
use guard_std::ratelimit::LimitError;
use serde::Deserialize;

use crate::config::check::{
    Env, MAX_LEASE_MS, MAX_TIMEOUT_MS, bounded, expand, no_tls_without_url, non_empty, redis_tls,
    redis_url,
};
use crate::config::tls::{self, TlsFiles, TlsKeys};
use crate::config::{ConfigError, Cost, Policy, RedactedUrl, invalid};
use crate::error::GatewayError;

/// A sink's request timeout unless configured: 10 s.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// A sink's retries of a transient failure unless configured: 10, the
/// delays doubling from [`DEFAULT_RETRY_DELAY`] up to
/// [`DEFAULT_MAX_RETRY_DELAY`] (about 2.5 minutes in all): an uplink's
/// restart is ridden out, a longer outage goes back to the source.
pub const DEFAULT_RETRIES: u32 = 10;
/// The first delay between attempts unless configured: 500 ms.
pub const DEFAULT_RETRY_DELAY: Duration = Duration::from_millis(500);
/// The longest delay between attempts unless configured: 30 s.
pub const DEFAULT_MAX_RETRY_DELAY: Duration = Duration::from_secs(30);
/// The longest sink name.
const MAX_NAME_LEN: usize = 128;
/// The most retries a sink may be given (a day at a minute each).
const MAX_RETRIES: u64 = 24 * 60;

/// `[[sinks]]`: a destination.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sink {
    /// Its unique name, what an endpoint's `to` names.
    pub name: String,
    /// What it is and where.
    pub kind: SinkKind,
    /// How a transient failure is retried before the message goes back.
    pub retry: RetryPolicy,
    /// The quota every message sent must pass, if any.
    pub limit: Option<SinkLimit>,
    /// The queue on disk its messages go through, if any.
    pub queue: Option<crate::queue::SinkQueue>,
}

impl Sink {
    /// Messages its queue's forwarding has out at once: an HTTP sink's
    /// `in_flight`, one for the others (each carries one at a time).
    pub fn in_flight(&self) -> std::num::NonZeroUsize {
        let n = match &self.kind {
            SinkKind::Http(target) => target.in_flight,
            _ => 1,
        };
        std::num::NonZeroUsize::new(n).unwrap_or(std::num::NonZeroUsize::MIN)
    }
}

/// A sink's quota: one of `[ratelimit.policies]`, keyed by the sink's
/// name, so every endpoint and schedule sending there shares it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SinkLimit {
    /// The limiter's name.
    pub limiter: String,
    /// What a message costs (the policy's).
    pub cost: Cost,
}

/// A sink's kind.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SinkKind {
    /// `kind = "http"`: a POST of each payload.
    Http(HttpTarget),
    /// `kind = "redis-stream"`: an entry of a stream per message.
    RedisStream(RedisStreamTarget),
    /// `kind = "nats-jetstream"`: an acknowledged publish per message.
    JetStream(JetStreamTarget),
    /// `kind = "mqtt"`: a QoS 1 publish per message, done at the PUBACK.
    Mqtt(MqttTarget),
}

/// `kind = "mqtt"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MqttTarget {
    /// The broker's host.
    pub host: String,
    /// The broker's port.
    pub port: u16,
    /// The topic published to.
    pub topic: String,
    /// The client id; `None`: `guard-<sink>-<16 hex digits>`, new at each
    /// start (a broker disconnects the older of two clients with one id).
    pub client_id: Option<String>,
    /// Each publish, connecting included, ends within it.
    pub timeout: Duration,
    /// TLS, when `tls = true` or a `tls_*` file is given.
    pub tls: Option<TlsFiles>,
}

/// `kind = "nats-jetstream"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JetStreamTarget {
    /// The server.
    pub url: RedactedUrl,
    /// The subject published to (a stream must listen on it).
    pub subject: String,
    /// Each publish, connecting included, ends within it.
    pub timeout: Duration,
}

/// `kind = "redis-stream"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisStreamTarget {
    /// The server; `None`: the locker's connection.
    pub url: Option<RedactedUrl>,
    /// TLS, when the URL is `rediss://`: the `tls_*` files.
    pub tls: Option<TlsFiles>,
    /// The stream key.
    pub stream: String,
    /// How long an id is remembered: a message sent again within it is
    /// not appended twice.
    pub duplicate_window: Duration,
}

/// `kind = "http"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpTarget {
    /// Where requests go (`http://` or `https://`).
    pub url: RedactedUrl,
    /// Each request, connecting included, ends within it.
    pub timeout: Duration,
    /// The `Content-Type` of every request.
    pub content_type: String,
    /// Requests out at once, each on a connection of its own (1: one at
    /// a time, in order).
    pub in_flight: usize,
    /// Headers sent with every request (`headers`), values expanded.
    pub headers: Vec<SinkHeader>,
    /// TLS settings of an `https://` URL: the `tls_*` files (the system's
    /// roots when none is given).
    pub tls: Option<TlsFiles>,
}

/// A header an HTTP sink sends with every request: its value is often a
/// credential, so `Debug` hides it.
#[derive(Clone, PartialEq, Eq)]
pub struct SinkHeader {
    /// The header's name, as written.
    pub name: String,
    value: String,
}

impl SinkHeader {
    /// The value to send, secrets included: never for printing.
    pub fn value(&self) -> &str {
        &self.value
    }
}

impl std::fmt::Debug for SinkHeader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: (hidden)", self.name)
    }
}

/// A `kind = "http"` entry of `[[sinks]]` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct HttpEntry {
    pub name: String,
    pub limit: Option<String>,
    pub queue: Option<crate::queue::QueueEntry>,
    pub url: String,
    pub timeout_ms: Option<u64>,
    pub content_type: Option<String>,
    pub headers: Option<BTreeMap<String, String>>,
    pub in_flight: Option<u64>,
    pub retries: Option<u32>,
    pub retry_delay_ms: Option<u64>,
    pub max_retry_delay_ms: Option<u64>,
    pub tls_ca: Option<String>,
    pub tls_cert: Option<String>,
    pub tls_key: Option<String>,
}

/// A `kind = "redis-stream"` entry of `[[sinks]]` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RedisStreamEntry {
    pub name: String,
    pub limit: Option<String>,
    pub queue: Option<crate::queue::QueueEntry>,
    pub url: Option<String>,
    pub stream: String,
    pub duplicate_window_ms: Option<u64>,
    pub retries: Option<u32>,
    pub retry_delay_ms: Option<u64>,
    pub max_retry_delay_ms: Option<u64>,
    pub tls_ca: Option<String>,
    pub tls_cert: Option<String>,
    pub tls_key: Option<String>,
}

/// A `kind = "nats-jetstream"` entry of `[[sinks]]` as written.
#[derive(Debug, Deserialize)]
#[cfg_attr(not(feature = "nats"), allow(dead_code))]
#[serde(deny_unknown_fields)]
pub(crate) struct JetStreamEntry {
    pub name: String,
    pub limit: Option<String>,
    pub queue: Option<crate::queue::QueueEntry>,
    pub url: String,
    pub subject: String,
    pub timeout_ms: Option<u64>,
    pub retries: Option<u32>,
    pub retry_delay_ms: Option<u64>,
    pub max_retry_delay_ms: Option<u64>,
}

/// A `kind = "mqtt"` entry of `[[sinks]]` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct MqttEntry {
    pub name: String,
    pub limit: Option<String>,
    pub queue: Option<crate::queue::QueueEntry>,
    pub host: String,
    pub port: Option<u16>,
    pub topic: String,
    pub client_id: Option<String>,
    pub timeout_ms: Option<u64>,
    pub retries: Option<u32>,
    pub retry_delay_ms: Option<u64>,
    pub max_retry_delay_ms: Option<u64>,
    pub tls: Option<bool>,
    pub tls_ca: Option<String>,
    pub tls_cert: Option<String>,
    pub tls_key: Option<String>,
}

/// An entry of `[[sinks]]` as written, read as its kind's struct.
#[derive(Debug)]
pub(crate) enum Entry {
    Http(HttpEntry),
    RedisStream(RedisStreamEntry),
    JetStream(JetStreamEntry),
    Mqtt(MqttEntry),
}

/// The kinds `[[sinks]]` takes, for errors.
pub(crate) const KINDS: &str = "one of `http`, `redis-stream`, `nats-jetstream`, `mqtt`";

impl Entry {
    /// Reads entry `i` of `[[sinks]]` by its `kind`.
    pub(crate) fn read(i: usize, mut table: toml::Table) -> Result<Self, ConfigError> {
        let at = format!("sinks[{i}]");
        let kind = match table.remove("kind") {
            Some(toml::Value::String(kind)) => kind,
            Some(other) => return Err(invalid(format!("{at}.kind"), other, KINDS)),
            None => return Err(invalid(format!("{at}.kind"), "missing", KINDS)),
        };
        match kind.as_str() {
            "http" => crate::config::raw::read_entry(&at, table).map(Entry::Http),
            "redis-stream" => crate::config::raw::read_entry(&at, table).map(Entry::RedisStream),
            "nats-jetstream" => crate::config::raw::read_entry(&at, table).map(Entry::JetStream),
            "mqtt" => crate::config::raw::read_entry(&at, table).map(Entry::Mqtt),
            other => Err(invalid(format!("{at}.kind"), format!("{other:?}"), KINDS)),
        }
    }

    fn name(&self) -> &str {
        match self {
            Entry::Http(h) => &h.name,
            Entry::RedisStream(r) => &r.name,
            Entry::JetStream(j) => &j.name,
            Entry::Mqtt(m) => &m.name,
        }
    }

    fn queue(&self) -> Option<&crate::queue::QueueEntry> {
        match self {
            Entry::Http(h) => h.queue.as_ref(),
            Entry::RedisStream(r) => r.queue.as_ref(),
            Entry::JetStream(j) => j.queue.as_ref(),
            Entry::Mqtt(m) => m.queue.as_ref(),
        }
    }

    fn limit(&self) -> Option<&str> {
        match self {
            Entry::Http(h) => h.limit.as_deref(),
            Entry::RedisStream(r) => r.limit.as_deref(),
            Entry::JetStream(j) => j.limit.as_deref(),
            Entry::Mqtt(m) => m.limit.as_deref(),
        }
    }
}

/// Every `[[sinks]]` entry checked, by name (unique, non-empty);
/// `has_redis`: there is a Redis locker whose connection a Redis sink
/// without a URL shares; `limiters`: the policies a `limit` may name.
pub(crate) fn resolve(
    entries: &[Entry],
    env: Env<'_>,
    has_redis: bool,
    limiters: &[&Policy],
) -> Result<Vec<Sink>, ConfigError> {
    let mut sinks: Vec<Sink> = Vec::new();
    for (i, entry) in entries.iter().enumerate() {
        let key = |field: &str| format!("sinks[{i}].{field}");
        let name = non_empty(&key, "name", entry.name(), "a non-empty name")?;
        if name.len() > MAX_NAME_LEN {
            return Err(invalid(
                key("name"),
                format!("{} bytes", name.len()),
                format!(
                    "a name of at most {MAX_NAME_LEN} bytes (it is part of its quota's key and of dead-letter reasons)"
                ),
            ));
        }
        if sinks.iter().any(|s| s.name == name) {
            return Err(invalid(key("name"), format!("{name:?}"), "a unique name"));
        }
        let sink = match entry {
            Entry::Http(h) => http(h, name, &key, env)?,
            Entry::RedisStream(r) => redis_stream(r, name, &key, env, has_redis)?,
            Entry::JetStream(j) => jetstream(j, name, &key, env)?,
            Entry::Mqtt(m) => mqtt(m, name, &key, env)?,
        };
        let limit = match entry.limit() {
            None => None,
            Some(name) => {
                let policy = crate::config::ratelimit::limiter(&key("limit"), name, limiters)?;
                Some(SinkLimit {
                    limiter: policy.name.clone(),
                    cost: policy.cost,
                })
            }
        };
        let queue = match entry.queue() {
            None => None,
            Some(queue) => {
                let at = |field: &str| key(&format!("queue.{field}"));
                let queue = crate::queue::resolve(queue, &at, env)?;
                if let Some(other) = sinks
                    .iter()
                    .find(|s| s.queue.as_ref().is_some_and(|q| q.dir == queue.dir))
                {
                    return Err(invalid(
                        at("dir"),
                        format!("{:?}", queue.dir.display().to_string()),
                        format!(
                            "a directory of its own (sink {:?} queues there)",
                            other.name
                        ),
                    ));
                }
                Some(queue)
            }
        };
        sinks.push(Sink {
            limit,
            queue,
            ..sink
        });
    }
    Ok(sinks)
}

/// The sink an endpoint's `to` names (`key` is that key), if it exists.
pub(crate) fn named<'a>(key: &str, to: &str, sinks: &'a [Sink]) -> Result<&'a Sink, ConfigError> {
    sinks.iter().find(|s| s.name == to).ok_or_else(|| {
        let known: Vec<&str> = sinks.iter().map(|s| s.name.as_str()).collect();
        invalid(
            key,
            format!("{to:?}"),
            if known.is_empty() {
                "the name of a [[sinks]] entry (there is none)".to_owned()
            } else {
                format!("the name of a [[sinks]] entry: one of {known:?}")
            },
        )
    })
}

fn http(
    h: &HttpEntry,
    name: String,
    key: &dyn Fn(&str) -> String,
    env: Env<'_>,
) -> Result<Sink, ConfigError> {
    let url = expand(&key("url"), &h.url, env)?;
    let timeout = timeout_of(h.timeout_ms, key)?;
    let content_type = match &h.content_type {
        None => "application/octet-stream".to_owned(),
        Some(t) => t.clone(),
    };
    let keys = TlsKeys {
        ca: &h.tls_ca,
        cert: &h.tls_cert,
        key: &h.tls_key,
    };
    let is_https = url.starts_with("https://");
    let tls = match keys.first() {
        Some((field, value)) if !is_https => {
            return Err(invalid(
                key(field),
                format!("{value:?}"),
                "no TLS files for an http:// URL",
            ));
        }
        Some(_) => Some(tls::read(&keys, key, &|at, value| expand(at, value, env))?),
        None => None,
    };
    let mut headers = Vec::new();
    for (name, value) in h.headers.iter().flatten() {
        headers.push(SinkHeader {
            name: name.clone(),
            value: expand(&key(&format!("headers.{name}")), value, env)?,
        });
    }
    let target = HttpTarget {
        url: RedactedUrl::new(url, &h.url),
        headers,
        timeout,
        content_type,
        // Out of range for a usize is out of range: the client names it.
        in_flight: h
            .in_flight
            .map_or(1, |n| usize::try_from(n).unwrap_or(usize::MAX)),
        tls,
    };
    // Every value the client checks, checked now: a bad URL or media type
    // stops `check`, not the first message.
    http_sink(&target).map_err(|e| match e {
        HttpRefused::Input(input) => {
            let field = match input.parameter {
                guard_endpoints::Parameter::ContentType => "content_type",
                guard_endpoints::Parameter::RequestTimeout => "timeout_ms",
                guard_endpoints::Parameter::InFlight => "in_flight",
                _ => "url",
            };
            let value = if field == "url" {
                format!("{:?}", target.url.shown())
            } else {
                format!("{:?}", input.value)
            };
            if input.parameter == guard_endpoints::Parameter::Header {
                // The client names the header, never its value.
                let name = input.value.split(':').next().unwrap_or_default();
                return invalid(
                    key(&format!("headers.{name}")),
                    format!("{:?}", input.value),
                    input.rule,
                );
            }
            invalid(key(field), value, input.rule)
        }
        HttpRefused::Tls(why) => invalid(key("tls_ca"), "set", why),
        HttpRefused::NotBuilt => invalid(
            key("kind"),
            "\"http\"",
            "a kind this build has: `http` needs the gateway's `http` feature",
        ),
    })?;
    Ok(Sink {
        name,
        kind: SinkKind::Http(target),
        retry: retry(
            RetryKeys {
                retries: h.retries,
                delay_ms: h.retry_delay_ms,
                max_delay_ms: h.max_retry_delay_ms,
            },
            key,
        )?,
        limit: None,
        queue: None,
    })
}

fn redis_stream(
    r: &RedisStreamEntry,
    name: String,
    key: &dyn Fn(&str) -> String,
    env: Env<'_>,
    has_redis: bool,
) -> Result<Sink, ConfigError> {
    let keys = TlsKeys {
        ca: &r.tls_ca,
        cert: &r.tls_cert,
        key: &r.tls_key,
    };
    let (url, tls) = match &r.url {
        Some(url) => {
            let checked = redis_url(&key("url"), url, env)?;
            let tls = redis_tls(&[(key("url"), url, checked.clone())], &keys, key, env)?;
            (Some(RedactedUrl::new(checked, url)), tls)
        }
        None if has_redis => {
            no_tls_without_url(&keys, key)?;
            (None, None)
        }
        None => {
            return Err(invalid(
                key("url"),
                "missing",
                "a Redis URL (or a Redis [locker] to share)",
            ));
        }
    };
    let duplicate_window = match r.duplicate_window_ms {
        None => guard_endpoints::sink::redis_stream::DEFAULT_DUPLICATE_WINDOW,
        Some(0) => return Err(invalid(key("duplicate_window_ms"), 0, "at least 1 ms")),
        Some(ms) => Duration::from_millis(bounded(
            &key("duplicate_window_ms"),
            ms,
            MAX_LEASE_MS,
            "milliseconds",
        )?),
    };
    Ok(Sink {
        name,
        kind: SinkKind::RedisStream(RedisStreamTarget {
            url,
            tls,
            stream: non_empty(key, "stream", &r.stream, "the stream key")?,
            duplicate_window,
        }),
        retry: retry(
            RetryKeys {
                retries: r.retries,
                delay_ms: r.retry_delay_ms,
                max_delay_ms: r.max_retry_delay_ms,
            },
            key,
        )?,
        limit: None,
        queue: None,
    })
}

#[cfg(feature = "nats")]
fn jetstream(
    j: &JetStreamEntry,
    name: String,
    key: &dyn Fn(&str) -> String,
    env: Env<'_>,
) -> Result<Sink, ConfigError> {
    Ok(Sink {
        name,
        kind: SinkKind::JetStream(JetStreamTarget {
            url: crate::endpoint::nats::url(&j.url, key, env)?,
            subject: crate::endpoint::nats::subject_of("subject", &j.subject, false, key)?,
            timeout: timeout_of(j.timeout_ms, key)?,
        }),
        retry: retry(
            RetryKeys {
                retries: j.retries,
                delay_ms: j.retry_delay_ms,
                max_delay_ms: j.max_retry_delay_ms,
            },
            key,
        )?,
        limit: None,
        queue: None,
    })
}

#[cfg(not(feature = "nats"))]
fn jetstream(
    _: &JetStreamEntry,
    _: String,
    key: &dyn Fn(&str) -> String,
    _: Env<'_>,
) -> Result<Sink, ConfigError> {
    Err(invalid(
        key("kind"),
        "\"nats-jetstream\"",
        "a kind this build has: `nats-jetstream` needs the gateway's `nats` feature",
    ))
}

/// `kind = "mqtt"`: the broker checked as an MQTT endpoint's is, the
/// topic with the sink's own rule.
fn mqtt(
    m: &MqttEntry,
    name: String,
    key: &dyn Fn(&str) -> String,
    env: Env<'_>,
) -> Result<Sink, ConfigError> {
    use crate::endpoint::mqtt::{Broker, broker};
    let broker = broker(
        &Broker {
            host: &m.host,
            port: m.port,
            tls: m.tls,
            keys: TlsKeys {
                ca: &m.tls_ca,
                cert: &m.tls_cert,
                key: &m.tls_key,
            },
        },
        key,
        env,
    )?;
    let client_id = match &m.client_id {
        None => None,
        Some(id) => Some(crate::config::check::non_empty(
            key,
            "client_id",
            &expand(&key("client_id"), id, env)?,
            "a client id of this replica's own",
        )?),
    };
    let options = guard_endpoints::mqtt::MqttOptions::new(&broker.host, broker.port, "check")
        .map_err(|e| invalid(key("host"), format!("{:?}", m.host), e.to_string()))?;
    guard_endpoints::sink::mqtt::MqttSink::new(options, &m.topic)
        .map_err(|e| invalid(key("topic"), format!("{:?}", m.topic), e.to_string()))?;
    Ok(Sink {
        name,
        kind: SinkKind::Mqtt(MqttTarget {
            host: broker.host,
            port: broker.port,
            topic: m.topic.clone(),
            client_id,
            timeout: timeout_of(m.timeout_ms, key)?,
            tls: broker.tls,
        }),
        retry: retry(
            RetryKeys {
                retries: m.retries,
                delay_ms: m.retry_delay_ms,
                max_delay_ms: m.max_retry_delay_ms,
            },
            key,
        )?,
        limit: None,
        queue: None,
    })
}

/// The MQTT sink of `target`, named `name`.
fn mqtt_sink(
    name: &str,
    target: &MqttTarget,
) -> Result<Arc<dyn MessageSink>, Box<dyn std::error::Error + Send + Sync>> {
    let client_id = match &target.client_id {
        Some(id) => id.clone(),
        None => {
            let started = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
            format!(
                "guard-{name}-{:016x}",
                started ^ u64::from(std::process::id()).rotate_left(32)
            )
        }
    };
    let options = guard_endpoints::mqtt::MqttOptions::new(&target.host, target.port, &client_id)?;
    #[cfg(feature = "tls")]
    let options = match &target.tls {
        Some(tls) => options.with_tls(tls.mqtt().clone()),
        None => options,
    };
    Ok(Arc::new(
        guard_endpoints::sink::mqtt::MqttSink::new(options, &target.topic)?
            .with_timeout(target.timeout)?,
    ))
}

/// A request timeout (`timeout_ms`): 10 s unless given, at least 1 ms.
fn timeout_of(ms: Option<u64>, key: &dyn Fn(&str) -> String) -> Result<Duration, ConfigError> {
    match ms {
        None => Ok(DEFAULT_TIMEOUT),
        Some(0) => Err(invalid(key("timeout_ms"), 0, "at least 1 ms")),
        Some(ms) => Ok(Duration::from_millis(bounded(
            &key("timeout_ms"),
            ms,
            MAX_TIMEOUT_MS,
            "milliseconds",
        )?)),
    }
}

/// The retry keys every sink kind has.
struct RetryKeys {
    retries: Option<u32>,
    delay_ms: Option<u64>,
    max_delay_ms: Option<u64>,
}

/// The retry policy of a sink's `retries`, `retry_delay_ms` and
/// `max_retry_delay_ms`: delays doubling from the first to the longest.
fn retry(h: RetryKeys, key: &dyn Fn(&str) -> String) -> Result<RetryPolicy, ConfigError> {
    let retries = match h.retries {
        None => DEFAULT_RETRIES,
        // No retry: the first transient failure goes back to the source.
        Some(0) => 0,
        Some(n) => u32::try_from(bounded(
            &key("retries"),
            u64::from(n),
            MAX_RETRIES,
            "retries",
        )?)
        .unwrap_or(u32::MAX),
    };
    let ms = |field: &str, value: Option<u64>, default: Duration| match value {
        None => Ok(default),
        Some(ms) => {
            bounded(&key(field), ms, MAX_TIMEOUT_MS, "milliseconds").map(Duration::from_millis)
        }
    };
    let first = ms("retry_delay_ms", h.delay_ms, DEFAULT_RETRY_DELAY)?;
    let longest = ms(
        "max_retry_delay_ms",
        h.max_delay_ms,
        DEFAULT_MAX_RETRY_DELAY.max(first),
    )?;
    if longest < first {
        return Err(invalid(
            key("max_retry_delay_ms"),
            longest.as_millis(),
            format!("at least retry_delay_ms = {}", first.as_millis()),
        ));
    }
    Ok(RetryPolicy::new()
        .with_max_attempts(retries)
        .with_initial_delay(first)
        .with_max_delay(longest)
        .with_exponential(true)
        .with_multiplier(Multiplier::DOUBLE))
}

/// Why an HTTP sink cannot be made of a target.
enum HttpRefused {
    /// A value the client refuses.
    #[cfg_attr(not(feature = "http"), allow(dead_code))]
    Input(guard_endpoints::InvalidInput),
    /// The TLS files do not make a client configuration.
    #[cfg_attr(not(all(feature = "http", feature = "tls")), allow(dead_code))]
    Tls(String),
    /// This build has no HTTP client.
    #[cfg_attr(feature = "http", allow(dead_code))]
    NotBuilt,
}

impl std::fmt::Display for HttpRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HttpRefused::Input(e) => write!(f, "{e}"),
            HttpRefused::Tls(e) => write!(f, "TLS: {e}"),
            HttpRefused::NotBuilt => {
                f.write_str("this build has no HTTP client (the gateway's `http` feature)")
            }
        }
    }
}

#[cfg(feature = "http")]
fn http_sink(target: &HttpTarget) -> Result<Arc<dyn MessageSink>, HttpRefused> {
    use guard_endpoints::sink::http::HttpSink;
    let sink = HttpSink::new(target.url.as_str())
        .and_then(|s| s.with_timeout(target.timeout))
        .and_then(|s| s.with_content_type(&target.content_type))
        .and_then(|s| s.with_in_flight(target.in_flight))
        .and_then(|s| {
            target
                .headers
                .iter()
                .try_fold(s, |s, h| s.with_header(&h.name, h.value()))
        })
        .map_err(HttpRefused::Input)?;
    #[cfg(feature = "tls")]
    let sink = match &target.tls {
        Some(files) => sink.with_tls(
            files
                .mqtt()
                .client_config()
                .map_err(|e| HttpRefused::Tls(e.to_string()))?,
        ),
        None => sink,
    };
    Ok(Arc::new(sink))
}

#[cfg(not(feature = "http"))]
fn http_sink(_: &HttpTarget) -> Result<Arc<dyn MessageSink>, HttpRefused> {
    Err(HttpRefused::NotBuilt)
}

/// Every sink of the configuration, made, by name, each a
/// [`NamedSink`](guard_endpoints::sink::NamedSink): an HTTP sink
/// connects at its first message; a Redis sink with a URL of its own
/// connects now (within `timeout`), one without shares `redis`, the
/// locker's connection.
pub(crate) async fn build(
    sinks: &[Sink],
    redis: Option<&RedisConnection>,
    timeout: Duration,
) -> Result<BTreeMap<String, Arc<dyn MessageSink>>, GatewayError> {
    let mut made = BTreeMap::new();
    for s in sinks {
        let failed = |source: Box<dyn std::error::Error + Send + Sync>| GatewayError::Sink {
            name: s.name.clone(),
            source,
        };
        let sink: Arc<dyn MessageSink> = match &s.kind {
            SinkKind::Http(target) => {
                http_sink(target).map_err(|e| failed(e.to_string().into()))?
            }
            SinkKind::RedisStream(target) => {
                let conn = match (&target.url, redis) {
                    (Some(url), _) => crate::config::connect::connect(
                        Topology::Standalone {
                            url: url.as_str().to_owned(),
                        },
                        timeout,
                        target.tls.as_ref(),
                    )
                    .await
                    .map_err(|e| failed(e.into()))?,
                    (None, Some(shared)) => shared.clone(),
                    (None, None) => {
                        return Err(failed(
                            "no URL and no Redis locker to share (the configuration check refuses this)"
                                .into(),
                        ));
                    }
                };
                Arc::new(
                    RedisStreamSink::new(conn, &target.stream)
                        .and_then(|sink| sink.with_duplicate_window(target.duplicate_window))
                        .map_err(|e| failed(e.into()))?,
                )
            }
            SinkKind::JetStream(target) => jetstream_sink(target).map_err(failed)?,
            SinkKind::Mqtt(target) => mqtt_sink(&s.name, target).map_err(failed)?,
        };
        // Each send traced and timed under the sink's name.
        let sink = Arc::new(guard_endpoints::sink::NamedSink::new(&s.name, sink));
        made.insert(s.name.clone(), sink as Arc<dyn MessageSink>);
    }
    Ok(made)
}

#[cfg(feature = "nats")]
fn jetstream_sink(
    target: &JetStreamTarget,
) -> Result<Arc<dyn MessageSink>, Box<dyn std::error::Error + Send + Sync>> {
    use guard_endpoints::nats::NatsOptions;
    use guard_endpoints::sink::jetstream::JetStreamSink;
    let options = NatsOptions::new(&target.url)?;
    Ok(Arc::new(
        JetStreamSink::new(options, &target.subject)?.with_timeout(target.timeout)?,
    ))
}

#[cfg(not(feature = "nats"))]
fn jetstream_sink(
    _: &JetStreamTarget,
) -> Result<Arc<dyn MessageSink>, Box<dyn std::error::Error + Send + Sync>> {
    Err("this build has no NATS client (the gateway's `nats` feature)".into())
}

/// The sink `name` as an endpoint or a schedule sends through it, with
/// its retry policy: its queue if it has one (which [`forwarded`] takes
/// on), else [`forwarded`] itself.
pub(crate) fn made(
    built: &crate::built::Built,
    config: &crate::config::Config,
    name: &str,
) -> Result<(Arc<dyn MessageSink>, RetryPolicy), GatewayError> {
    let (direct, retry) = forwarded(built, config, name)?;
    match built.queues.get(name) {
        Some((queue, _)) => Ok((queue.clone(), retry)),
        None => Ok((direct, retry)),
    }
}

/// The sink `name` as messages leave the gateway: the one `build` made,
/// behind its quota if it has one, with its retry policy.
pub(crate) fn forwarded(
    built: &crate::built::Built,
    config: &crate::config::Config,
    name: &str,
) -> Result<(Arc<dyn MessageSink>, RetryPolicy), GatewayError> {
    let missing = || GatewayError::Sink {
        name: name.to_owned(),
        source: format!("no sink named {name:?}").into(),
    };
    // The configuration checked every name that refers to a sink, and
    // `build` made every sink.
    let sink = config
        .sinks
        .iter()
        .find(|s| s.name == name)
        .ok_or_else(missing)?;
    let made = built.sinks.get(name).ok_or_else(missing)?.clone();
    let made: Arc<dyn MessageSink> = match &sink.limit {
        None => made,
        Some(limit) => Arc::new(QuotaSink {
            inner: made,
            limiter: crate::built::limiter(built, &limit.limiter)?,
            cost: limit.cost,
            key: name.to_owned(),
        }),
    };
    Ok((made, sink.retry))
}

/// A sink behind a quota: a message goes out only once the limiter
/// admits it (its cost charged under the sink's name); a refusal is a
/// transient failure carrying the limiter's wait, so the delivery waits
/// that long, under the sink's retries, before it asks again. A send
/// that fails after the charge is not refunded: the quota errs toward
/// sending less.
struct QuotaSink {
    inner: Arc<dyn MessageSink>,
    limiter: Arc<guard_std::ratelimit::NamedRateLimiter>,
    cost: Cost,
    key: String,
}

impl MessageSink for QuotaSink {
    fn send<'a>(
        &'a self,
        message: &'a Outgoing<'a>,
    ) -> guard_std::BoxFuture<'a, Result<(), SinkError>> {
        Box::pin(async move {
            let units = match self.cost {
                Cost::Messages => 1,
                Cost::Bytes => u32::try_from(message.payload.len()).unwrap_or(u32::MAX),
            };
            let quota = self.limiter.name();
            match self.limiter.check_n(&self.key, units).await {
                Ok(report) => match report.decision {
                    Decision::Allowed => self.inner.send(message).await,
                    Decision::Denied { retry_after } => Err(SinkError::Transient {
                        reason: format!("over the quota {quota:?}, free again in {retry_after:?}"),
                        retry_after: Some(retry_after),
                    }),
                },
                // More than the whole quota, or a key no limiter takes:
                // it could never pass.
                Err(e @ (LimitError::Cost(_) | LimitError::InvalidKey(_))) => {
                    Err(SinkError::Permanent {
                        reason: format!("the quota {quota:?}: {e}"),
                    })
                }
                Err(e) => Err(SinkError::Transient {
                    reason: format!("the quota {quota:?} gave no decision: {e}"),
                    retry_after: None,
                }),
            }
        })
    }
}

/// What `check` prints of a sink: no URLs (a path or a query may hold a
/// token), an HTTP receiver's host and port only.
pub(crate) fn describe(sink: &Sink) -> String {
    let policy = &sink.retry;
    let mut retries = format!(
        "{} retries from {:?} to {:?}",
        policy.max_attempts(),
        policy.initial_delay(),
        policy.max_delay()
    );
    if let Some(limit) = &sink.limit {
        retries.push_str(&format!(", limited by {}", limit.limiter));
    }
    if let Some(queue) = &sink.queue {
        retries.push_str(&format!(", through a {}", crate::queue::describe(queue)));
    }
    match &sink.kind {
        SinkKind::Http(t) => {
            let host = t
                .url
                .as_str()
                .parse::<hyper::Uri>()
                .ok()
                .and_then(|u| {
                    u.host()
                        .map(|h| format!("{h}:{}", u.port_u16().unwrap_or(default_port(&u))))
                })
                .unwrap_or_default();
            format!(
                "{} (http POST to {host}, {}, timeout {:?}, {retries})",
                sink.name, t.content_type, t.timeout
            )
        }
        SinkKind::RedisStream(t) => format!(
            "{} (redis-stream {:?} on {}, fenced, ids kept {:?}, {retries})",
            sink.name,
            t.stream,
            if t.url.is_some() {
                "its own server"
            } else {
                "the locker's connection"
            },
            t.duplicate_window
        ),
        SinkKind::Mqtt(t) => format!(
            "{} (mqtt QoS 1 to {}:{} topic {}{}, Idempotency-Key as a user property, timeout {:?}, {retries})",
            sink.name,
            t.host,
            t.port,
            t.topic,
            if t.tls.is_some() { " over TLS" } else { "" },
            t.timeout
        ),
        SinkKind::JetStream(t) => format!(
            "{} (nats-jetstream {}, Nats-Msg-Id, timeout {:?}, {retries})",
            sink.name, t.subject, t.timeout
        ),
    }
}

/// The port an `http://` or `https://` URL without one means.
fn default_port(uri: &hyper::Uri) -> u16 {
    if uri.scheme_str() == Some("https") {
        443
    } else {
        80
    }
}
