//! `kind = "redis-pubsub"` (one elected subscriber) and
//! `kind = "redis-stream"` (a consumer group), in one module: the
//! `[[endpoints]]` entries as written, their checks, the validated
//! sources, what `check` prints of them, what they connect to and their
//! assembly.

use std::time::Duration;

use guard_core::lock::Scope;
use guard_core::retry::RetryPolicy;
use guard_endpoints::redis::{EndpointError, PubSubEndpoint};
use guard_redis::{RedisConnection, RedisGuardError, Topology};
use guard_std::GuardConfig;
use serde::Deserialize;

use super::{Assembly, Content, Event, Refused, Task, elected_scope, failed, never_invalid, text};
use crate::config::check::{
    Env, MAX_BATCH, MAX_LEASE_MS, bounded, no_tls_without_url, non_empty, redis_tls, redis_url,
    retry,
};
use crate::config::raw;
use crate::config::tls::{TlsFiles, TlsKeys};
use crate::config::{ConfigError, RedactedUrl, Source, invalid};
use crate::error::GatewayError;
use guard_endpoints::redis::StreamConsumer;
use guard_redis::StreamDlq;
use std::collections::BTreeMap;
use std::sync::Arc;

/// The stream consumer's default claim idle (the original's).
const DEFAULT_CLAIM_IDLE: Duration = Duration::from_secs(30);
const MAX_QUEUE: u64 = 1 << 20; // messages; a GiB at a KiB each

/// `kind = "redis-pubsub"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PubSubSource {
    /// The server (the locker's URL unless given).
    pub url: RedactedUrl,
    /// TLS, when the URL is `rediss://`: the `tls_*` files (the locker's
    /// when its URL is shared).
    pub tls: Option<TlsFiles>,
    /// Channel patterns (`PSUBSCRIBE` syntax), at least one.
    pub patterns: Vec<String>,
    /// Messages that may wait for the handler
    /// ([`DEFAULT_QUEUE`](guard_endpoints::queue::DEFAULT_QUEUE) unless configured).
    pub queue: usize,
    /// Which message a full queue drops.
    pub when_full: guard_endpoints::queue::WhenFull,
}

/// `kind = "redis-stream"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamSource {
    /// The server; `None`: the locker's connection.
    pub url: Option<RedactedUrl>,
    /// TLS, when the URL is `rediss://`: the `tls_*` files.
    pub tls: Option<TlsFiles>,
    /// The stream key.
    pub stream: String,
    /// The consumer group, the same on every replica.
    pub group: String,
    /// Entries idle this long on a dead consumer are taken over.
    pub claim_idle: Duration,
    /// Retries of a failing entry.
    pub retry: RetryPolicy,
    /// Dead-letter topic for entries whose retries are spent; without
    /// one they stay pending.
    pub dead_letter_topic: Option<String>,
    /// Fields every entry must have (`["payload"]` unless configured); an
    /// entry without one is dead-lettered, never handled as empty.
    pub fields: Vec<String>,
    /// Entries read per round ([`DEFAULT_BATCH`](guard_endpoints::redis::DEFAULT_BATCH)
    /// unless configured).
    pub batch: usize,
    /// Entries in the handler at once (1 unless configured; at most the
    /// batch): see [`StreamConsumer`](guard_endpoints::redis::StreamConsumer) for
    /// the order this gives.
    pub concurrency: usize,
}

/// A `kind = "redis-pubsub"` entry of `[[endpoints]]` as written (an unknown key
/// is refused).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PubSubEntry {
    pub name: String,
    pub url: Option<String>,
    #[serde(default)]
    pub patterns: Vec<String>,
    pub limit: Option<String>,
    pub limit_key: Option<String>,
    pub when_limited: Option<raw::WhenLimited>,
    pub max_wait_ms: Option<u64>,
    pub max_payload_bytes: Option<u64>,
    pub queue: Option<u64>,
    pub when_full: Option<raw::WhenFull>,
    pub tls_ca: Option<String>,
    pub tls_cert: Option<String>,
    pub tls_key: Option<String>,
}

/// A `kind = "redis-stream"` entry of `[[endpoints]]` as written (an unknown key
/// is refused).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct StreamEntry {
    pub name: String,
    pub url: Option<String>,
    pub stream: String,
    pub group: String,
    pub claim_idle_ms: Option<u64>,
    pub retries: Option<u32>,
    pub retry_delay_ms: Option<u64>,
    pub dead_letter_topic: Option<String>,
    pub fields: Option<Vec<String>>,
    pub batch: Option<u64>,
    pub concurrency: Option<u64>,
    pub limit: Option<String>,
    pub limit_key: Option<String>,
    pub when_limited: Option<raw::WhenLimited>,
    pub max_wait_ms: Option<u64>,
    pub max_payload_bytes: Option<u64>,
    pub tls_ca: Option<String>,
    pub tls_cert: Option<String>,
    pub tls_key: Option<String>,
}

/// `kind = "redis-pubsub"`: checked, its URL the locker's unless given.
pub(crate) fn resolve_pubsub(
    p: &PubSubEntry,
    key: &dyn Fn(&str) -> String,
    env: Env<'_>,
    locker_url: Option<&(RedactedUrl, Option<&TlsFiles>)>,
) -> Result<Source, ConfigError> {
    let keys = TlsKeys {
        ca: &p.tls_ca,
        cert: &p.tls_cert,
        key: &p.tls_key,
    };
    let (url, tls) = match (&p.url, locker_url) {
        (Some(url), _) => {
            let checked = redis_url(&key("url"), url, env)?;
            let tls = redis_tls(&[(key("url"), url, checked.clone())], &keys, key, env)?;
            (RedactedUrl::new(checked, url), tls)
        }
        (None, Some((url, tls))) => {
            no_tls_without_url(&keys, key)?;
            (url.clone(), tls.cloned())
        }
        (None, None) => {
            return Err(invalid(
                key("url"),
                "missing",
                "a Redis URL (or a standalone Redis [locker] to share)",
            ));
        }
    };
    if p.patterns.is_empty() || p.patterns.iter().any(String::is_empty) {
        return Err(invalid(
            key("patterns"),
            format!("{:?}", p.patterns),
            "at least one channel pattern, none empty",
        ));
    }
    let queue = match p.queue {
        None => guard_endpoints::queue::DEFAULT_QUEUE,
        Some(n) => {
            usize::try_from(bounded(&key("queue"), n, MAX_QUEUE, "messages")?).unwrap_or(usize::MAX)
        }
    };
    let source = Source::RedisPubsub(PubSubSource {
        url,
        tls,
        patterns: p.patterns.clone(),
        queue,
        when_full: match p.when_full {
            None => guard_endpoints::queue::WhenFull::default(),
            Some(raw::WhenFull::DropNewest) => guard_endpoints::queue::WhenFull::DropNewest,
            Some(raw::WhenFull::DropOldest) => guard_endpoints::queue::WhenFull::DropOldest,
        },
    });
    Ok(source)
}

/// `kind = "redis-stream"`: checked, its URL the locker's connection
/// unless given (`has_redis`: there is a Redis locker to share).
pub(crate) fn resolve_stream(
    s: &StreamEntry,
    key: &dyn Fn(&str) -> String,
    env: Env<'_>,
    has_redis: bool,
) -> Result<Source, ConfigError> {
    let keys = TlsKeys {
        ca: &s.tls_ca,
        cert: &s.tls_cert,
        key: &s.tls_key,
    };
    let mut tls = None;
    let url = match &s.url {
        Some(url) => {
            let checked = redis_url(&key("url"), url, env)?;
            tls = redis_tls(&[(key("url"), url, checked.clone())], &keys, key, env)?;
            Some(RedactedUrl::new(checked, url))
        }
        None if has_redis => {
            no_tls_without_url(&keys, key)?;
            None
        }
        None => {
            return Err(invalid(
                key("url"),
                "missing",
                "a Redis URL (or a Redis [locker] to share)",
            ));
        }
    };
    if let Some(ms) = s.claim_idle_ms {
        bounded(&key("claim_idle_ms"), ms, MAX_LEASE_MS, "milliseconds")?;
    }
    if let Some(topic) = &s.dead_letter_topic
        && (topic.is_empty()
            || topic.contains(['{', '}', '*', '?', '[', ']'])
            || topic.chars().any(char::is_control))
    {
        return Err(invalid(
            key("dead_letter_topic"),
            format!("{topic:?}"),
            "a non-empty topic without braces, glob or control characters",
        ));
    }
    let retry = retry(s.retries, s.retry_delay_ms, key)?;
    let batch = match s.batch {
        None => guard_endpoints::redis::DEFAULT_BATCH,
        Some(n) => {
            usize::try_from(bounded(&key("batch"), n, MAX_BATCH, "entries")?).unwrap_or(usize::MAX)
        }
    };
    let concurrency = match s.concurrency {
        None => 1,
        Some(n) if n == 0 || n > batch as u64 => {
            return Err(invalid(
                key("concurrency"),
                n,
                format!("from 1 to the batch ({batch}): a round holds at most a batch"),
            ));
        }
        Some(n) => usize::try_from(n).unwrap_or(usize::MAX),
    };
    let source = Source::RedisStream(StreamSource {
        url,
        tls,
        batch,
        concurrency,
        stream: non_empty(key, "stream", &s.stream, "the stream key")?,
        group: non_empty(
            key,
            "group",
            &s.group,
            "the consumer group, the same on every replica",
        )?,
        claim_idle: s
            .claim_idle_ms
            .map_or(DEFAULT_CLAIM_IDLE, Duration::from_millis),
        retry,
        dead_letter_topic: s.dead_letter_topic.clone(),
        fields: match &s.fields {
            None => vec!["payload".to_owned()],
            Some(fields) if fields.iter().any(String::is_empty) => {
                return Err(invalid(
                    key("fields"),
                    format!("{fields:?}"),
                    "field names, none empty (or [] to require none)",
                ));
            }
            Some(fields) => fields.clone(),
        },
    });
    Ok(source)
}

impl StreamSource {
    /// Connects to the stream's own server (its `url`, over TLS for a
    /// `rediss://` one), each request bounded by `timeout`. A stream
    /// without a URL of its own uses the locker's connection instead.
    pub async fn connect(&self, timeout: Duration) -> Result<RedisConnection, RedisGuardError> {
        let url = self
            .url
            .as_ref()
            .map_or_else(String::new, |url| url.as_str().to_owned());
        crate::config::connect::connect(Topology::Standalone { url }, timeout, self.tls.as_ref())
            .await
    }
}

impl PubSubSource {
    /// The endpoint of this source: its URL (over TLS for a `rediss://`
    /// one), patterns and handler queue, elected under `scope` with
    /// `config`'s locker.
    pub fn endpoint(
        &self,
        config: &GuardConfig,
        scope: &Scope,
    ) -> Result<PubSubEndpoint, EndpointError> {
        let patterns: Vec<&str> = self.patterns.iter().map(String::as_str).collect();
        let endpoint = PubSubEndpoint::new(&self.url, config, scope, &patterns)?
            .with_queue(self.queue, self.when_full)?;
        #[cfg(feature = "tls")]
        if let Some(tls) = &self.tls {
            return endpoint.with_tls(tls.redis());
        }
        Ok(endpoint)
    }
}

/// What `check` prints of a Pub/Sub source.
pub(super) fn describe_pubsub(_source: &PubSubSource) -> String {
    "redis-pubsub, elected subscriber".to_owned()
}

/// What `check` prints of a stream source.
pub(super) fn describe_stream(source: &StreamSource) -> String {
    format!("redis-stream, consumer group {}", source.group)
}

/// The elected subscriber of a Pub/Sub endpoint.
pub(super) fn pubsub(cx: Assembly<'_>, source: &PubSubSource) -> Result<Task, GatewayError> {
    let (name, inbox, emit, control) = (cx.name, cx.inbox, cx.emit, cx.control);
    let (built, timing) = (cx.built, cx.timing);
    let context = |source| failed(&name, source);
    let ready = cx.ready;
    let scope = |kind: &str| elected_scope(built, ready, kind, &name);
    let scope = scope(super::kind::REDIS)?;
    let endpoint = source
        .endpoint(&built.guards, &scope)
        .and_then(|e| e.with_queue_bytes(super::memory_bytes(inbox.max_payload)))
        .and_then(|e| e.with_settings(timing))
        .map_err(|e| context(e.into()))?
        .with_unhandled(inbox.unhandled_to(&emit))
        .with_link(cx.link);
    Ok(Box::pin(async move {
        endpoint
            .run(control, |message| {
                let (inbox, emit, name) = (inbox.clone(), emit.clone(), name.clone());
                async move {
                    let lease = Some(&message.lease);
                    if !inbox
                        .pass(&message.channel, &message.payload, lease, &emit)
                        .await
                        || !inbox
                            .forward_or_keep(&message.channel, &message.payload, lease, &emit)
                            .await
                    {
                        return;
                    }
                    emit(Event::Received {
                        endpoint: name,
                        from: message.channel,
                        fence: Some(message.fence),
                        content: Content::Payload(text(&message.payload)),
                    });
                }
            })
            .await;
    }))
}

/// A consumer of a stream's group: the only endpoint that connects
/// here (a URL of its own, or the locker's connection).
pub(super) async fn stream(cx: Assembly<'_>, source: &StreamSource) -> Result<Task, GatewayError> {
    let (name, inbox, emit, control) = (cx.name, cx.inbox, cx.emit, cx.control);
    let (identity, built, config) = (cx.identity, cx.built, cx.config);
    let context = |source| failed(&name, source);
    let conn = match (&source.url, &built.redis) {
        (None, Some(shared)) => shared.clone(),
        _ => source
            .connect(
                config
                    .redis_locker()
                    .map_or(std::time::Duration::from_millis(500), |l| l.request_timeout),
            )
            .await
            .map_err(|e| context(e.into()))?,
    };
    let mut consumer = StreamConsumer::new(conn.clone(), &source.stream, &source.group, identity)
        .map_err(|e| context(e.into()))?
        .with_retry(source.retry)
        .map_err(|e| context(e.into()))?
        .with_claim_idle(source.claim_idle)
        .and_then(|c| c.with_batch(source.batch))
        .and_then(|c| c.with_concurrency(source.concurrency))
        .map_err(|e| context(e.into()))?
        .with_link(cx.link);
    if let Some(topic) = &source.dead_letter_topic {
        consumer = consumer
            .with_dead_letters(StreamDlq::new(conn), topic)
            .map_err(|e| context(e.into()))?;
    }
    let fields = Arc::new(source.fields.clone());
    let stream: Arc<str> = source.stream.as_str().into();
    Ok(Box::pin(async move {
        // An entry that can never be handled is not retried.
        let stats = consumer
            .run(control, never_invalid(), |message| {
                let (inbox, emit, name, fields, stream) = (
                    inbox.clone(),
                    emit.clone(),
                    name.clone(),
                    fields.clone(),
                    stream.clone(),
                );
                async move {
                    // A refusal fails the entry: it is retried
                    // (unless it can never pass), then dead-lettered
                    // with the reason or left pending, never dropped.
                    inbox.check_entry(&message, &fields).await?;
                    inbox
                        .forward(
                            Some(&message.id),
                            &stream,
                            &super::forward::entry_payload(&message),
                            None,
                        )
                        .await?;
                    let fields: BTreeMap<&String, &Vec<u8>> = message.fields.iter().collect();
                    emit(Event::Received {
                        endpoint: name,
                        from: message.id.clone(),
                        fence: None,
                        content: Content::Fields(
                            fields
                                .into_iter()
                                .map(|(k, v)| (k.clone(), text(v)))
                                .collect(),
                        ),
                    });
                    Ok::<(), Refused>(())
                }
            })
            .await;
        tracing::info!("endpoint {name}: {stats:?}");
    }))
}
