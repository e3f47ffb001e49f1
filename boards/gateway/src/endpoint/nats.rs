//! `kind = "nats"` (a queue group, a broadcast or an elected subscriber)
//! and `kind = "nats-jetstream"` (a durable consumer), in one module:
//! the `[[endpoints]]` entry as written, its check with the same rules as
//! [`guard_endpoints::nats`]'s builders (so a configuration that loads
//! builds its endpoint), the validated source, what `check` prints of it
//! and its assembly. Without the `nats` feature both kinds are read,
//! then refused, naming the feature.

use std::time::Duration;

use guard_core::retry::RetryPolicy;
use serde::Deserialize;

#[cfg(feature = "nats")]
use super::retrying::Report;
#[cfg(feature = "nats")]
use super::{Assembly, Task, elected_scope, failed, never_invalid};
use crate::config::check::{Env, MAX_BATCH, MAX_TIMEOUT_MS, bounded, expand, refused, retry};
use crate::config::raw;
use crate::config::{ConfigError, RedactedUrl, Source, invalid};
#[cfg(feature = "nats")]
use crate::error::GatewayError;
#[cfg(feature = "nats")]
use guard_endpoints::nats::{Delivery, JetStreamConsumer, NatsOptions, NatsSubscriber};

/// `kind = "nats"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NatsSource {
    /// The server.
    pub url: RedactedUrl,
    /// The subject (wildcards allowed).
    pub subject: String,
    /// Who receives each message.
    pub delivery: NatsDelivery,
    /// Retries of a failing message.
    pub retry: RetryPolicy,
    /// Where given-up messages are published; without one they are
    /// counted and logged as lost.
    pub dead_letter_subject: Option<String>,
}

/// How a NATS endpoint subscribes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NatsDelivery {
    /// A queue group: the server gives each message to one member; no
    /// guard.
    QueueGroup(String),
    /// A plain subscription on every replica: a broadcast.
    Broadcast,
    /// A plain subscription on the elected replica only.
    Elected,
}

/// `kind = "nats-jetstream"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JetStreamSource {
    /// The server.
    pub url: RedactedUrl,
    /// The stream.
    pub stream: String,
    /// Subjects of a stream to create if it does not exist (empty: it
    /// must exist).
    pub subjects: Vec<String>,
    /// The durable consumer, the same on every replica.
    pub durable: String,
    /// How long the server waits for an acknowledgement.
    pub ack_wait: Duration,
    /// Deliveries before a failing message is dead-lettered.
    pub max_deliver: u32,
    /// Messages pulled per request.
    pub batch: usize,
    /// Retries of a failing message within one delivery.
    pub retry: RetryPolicy,
    /// Where dead letters go (`dead-letters.<stream>` unless given).
    pub dead_letter_subject: Option<String>,
}

/// A `kind = "nats"` entry of `[[endpoints]]` as written (an unknown key
/// is refused).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct NatsEntry {
    pub name: String,
    pub url: String,
    pub subject: String,
    pub queue_group: Option<String>,
    #[serde(default)]
    pub guard: bool,
    pub retries: Option<u32>,
    pub retry_delay_ms: Option<u64>,
    pub dead_letter_subject: Option<String>,
    pub limit: Option<String>,
    pub limit_key: Option<String>,
    pub when_limited: Option<raw::WhenLimited>,
    pub max_wait_ms: Option<u64>,
    pub max_payload_bytes: Option<u64>,
}

/// A `kind = "nats-jetstream"` entry of `[[endpoints]]` as written (an unknown key
/// is refused).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct JetStreamEntry {
    pub name: String,
    pub url: String,
    pub stream: String,
    pub subjects: Option<Vec<String>>,
    pub durable: String,
    pub ack_wait_ms: Option<u64>,
    pub max_deliver: Option<u32>,
    pub batch: Option<u64>,
    pub retries: Option<u32>,
    pub retry_delay_ms: Option<u64>,
    pub dead_letter_subject: Option<String>,
    pub limit: Option<String>,
    pub limit_key: Option<String>,
    pub when_limited: Option<raw::WhenLimited>,
    pub max_wait_ms: Option<u64>,
    pub max_payload_bytes: Option<u64>,
}

/// The longest ack wait: an hour.
const MAX_ACK_WAIT_MS: u64 = MAX_TIMEOUT_MS;

/// The server's URL, expanded and checked; refused as written, its
/// password or token hidden.
#[cfg(feature = "nats")]
pub(crate) fn url(
    value: &str,
    key: &dyn Fn(&str) -> String,
    env: Env<'_>,
) -> Result<RedactedUrl, ConfigError> {
    let url = RedactedUrl::new(expand(&key("url"), value, env)?, value);
    guard_endpoints::nats::NatsOptions::new(&url)
        .map_err(|e| crate::config::check::refused_url(key, &url, value, &e))?;
    Ok(url)
}

#[cfg(feature = "nats")]
pub(crate) fn subject_of(
    field: &str,
    value: &str,
    wildcards: bool,
    key: &dyn Fn(&str) -> String,
) -> Result<String, ConfigError> {
    use guard_endpoints::Parameter;
    let parameter = if wildcards {
        Parameter::Subject
    } else {
        Parameter::DeadLetterSubject
    };
    guard_endpoints::nats::checked_subject(parameter, value, wildcards)
        .map_err(|e| refused(field, key, &e))
}

/// `kind = "nats"`.
#[cfg(feature = "nats")]
pub(crate) fn resolve_subject(
    n: &NatsEntry,
    key: &dyn Fn(&str) -> String,
    env: Env<'_>,
) -> Result<Source, ConfigError> {
    let delivery = match (&n.queue_group, n.guard) {
        (Some(_), true) => {
            return Err(invalid(
                key("guard"),
                true,
                "no guard with `queue_group`: the server delivers each message to one member already",
            ));
        }
        (Some(group), false) => match guard_endpoints::nats::Delivery::queue_group(group) {
            Ok(_) => NatsDelivery::QueueGroup(group.clone()),
            Err(e) => return Err(refused("queue_group", key, &e)),
        },
        (None, true) => NatsDelivery::Elected,
        (None, false) => NatsDelivery::Broadcast,
    };
    Ok(Source::Nats(NatsSource {
        url: url(&n.url, key, env)?,
        subject: subject_of("subject", &n.subject, true, key)?,
        delivery,
        retry: retry(n.retries, n.retry_delay_ms, key)?,
        dead_letter_subject: n
            .dead_letter_subject
            .as_deref()
            .map(|s| subject_of("dead_letter_subject", s, false, key))
            .transpose()?,
    }))
}

/// `kind = "nats-jetstream"`.
#[cfg(feature = "nats")]
pub(crate) fn resolve_jetstream(
    j: &JetStreamEntry,
    key: &dyn Fn(&str) -> String,
    env: Env<'_>,
) -> Result<Source, ConfigError> {
    use guard_endpoints::nats::{
        DEFAULT_ACK_WAIT, DEFAULT_BATCH, DEFAULT_MAX_DELIVER, JetStreamConsumer,
    };
    let url = url(&j.url, key, env)?;
    let options =
        guard_endpoints::nats::NatsOptions::new(&url).map_err(|e| refused("url", key, &e))?;
    // The builder checks the names as the server would.
    let consumer = JetStreamConsumer::new(options.clone(), &j.stream, "durable")
        .map_err(|e| refused("stream", key, &e))?;
    JetStreamConsumer::new(options, &j.stream, &j.durable)
        .map_err(|e| refused("durable", key, &e))?;
    let subjects = match &j.subjects {
        None => Vec::new(),
        Some(subjects) if subjects.is_empty() => {
            return Err(invalid(
                key("subjects"),
                "[]",
                "at least one subject (or leave `subjects` out: the stream must exist)",
            ));
        }
        Some(subjects) => subjects
            .iter()
            .map(|s| subject_of("subjects", s, true, key))
            .collect::<Result<_, _>>()?,
    };
    let ack_wait = match j.ack_wait_ms {
        None => DEFAULT_ACK_WAIT,
        Some(ms) => {
            let ms = bounded(&key("ack_wait_ms"), ms, MAX_ACK_WAIT_MS, "milliseconds")?;
            let ack_wait = Duration::from_millis(ms);
            consumer
                .with_ack_wait(ack_wait)
                .map_err(|e| refused("ack_wait_ms", key, &e))?;
            ack_wait
        }
    };
    let max_deliver = match j.max_deliver {
        None => DEFAULT_MAX_DELIVER,
        Some(n) => u32::try_from(bounded(
            &key("max_deliver"),
            u64::from(n),
            i32::MAX as u64,
            "deliveries",
        )?)
        .unwrap_or(u32::MAX),
    };
    let batch = match j.batch {
        None => DEFAULT_BATCH,
        Some(n) => {
            usize::try_from(bounded(&key("batch"), n, MAX_BATCH, "messages")?).unwrap_or(usize::MAX)
        }
    };
    Ok(Source::NatsJetStream(JetStreamSource {
        url,
        stream: j.stream.clone(),
        subjects,
        durable: j.durable.clone(),
        ack_wait,
        max_deliver,
        batch,
        retry: retry(j.retries, j.retry_delay_ms, key)?,
        dead_letter_subject: j
            .dead_letter_subject
            .as_deref()
            .map(|s| subject_of("dead_letter_subject", s, false, key))
            .transpose()?,
    }))
}

/// `kind = "nats"`: refused in this build.
#[cfg(not(feature = "nats"))]
pub(crate) fn resolve_subject(
    n: &NatsEntry,
    key: &dyn Fn(&str) -> String,
    _env: Env<'_>,
) -> Result<Source, ConfigError> {
    retry(n.retries, n.retry_delay_ms, key)?;
    Err(crate::config::check::unsupported("nats", "nats", key))
}

/// `kind = "nats-jetstream"`: refused in this build.
#[cfg(not(feature = "nats"))]
pub(crate) fn resolve_jetstream(
    j: &JetStreamEntry,
    key: &dyn Fn(&str) -> String,
    _env: Env<'_>,
) -> Result<Source, ConfigError> {
    retry(j.retries, j.retry_delay_ms, key)?;
    Err(crate::config::check::unsupported(
        "nats-jetstream",
        "nats",
        key,
    ))
}

/// What `check` prints of a core NATS source.
#[cfg(feature = "nats")]
pub(super) fn describe_subject(source: &NatsSource) -> String {
    match &source.delivery {
        NatsDelivery::QueueGroup(group) => format!("nats, queue group {group}"),
        NatsDelivery::Broadcast => "nats, broadcast".to_owned(),
        NatsDelivery::Elected => "nats, elected subscriber".to_owned(),
    }
}

/// What `check` prints of a JetStream source.
#[cfg(feature = "nats")]
pub(super) fn describe_jetstream(source: &JetStreamSource) -> String {
    format!("nats-jetstream, durable consumer {}", source.durable)
}

/// The subscriber of a core NATS subject.
#[cfg(feature = "nats")]
pub(super) fn subject(cx: Assembly<'_>, source: &NatsSource) -> Result<Task, GatewayError> {
    let (name, inbox, emit, control) = (cx.name, cx.inbox, cx.emit, cx.control);
    let (identity, built, timing) = (cx.identity, cx.built, cx.timing);
    let context = |source| failed(&name, source);
    let ready = cx.ready;
    let scope = |kind: &str| elected_scope(built, ready, kind, &name);
    let options = NatsOptions::new(&source.url)
        .map_err(|e| context(e.into()))?
        .with_name(&format!("{name}-{identity}"));
    let delivery = match &source.delivery {
        NatsDelivery::QueueGroup(group) => {
            Delivery::queue_group(group).map_err(|e| context(e.into()))?
        }
        NatsDelivery::Broadcast => Delivery::Broadcast,
        NatsDelivery::Elected => Delivery::Elected,
    };
    let mut subscriber = NatsSubscriber::new(options, &source.subject, delivery)
        .and_then(|s| s.with_retry(source.retry))
        .map_err(|e| context(e.into()))?
        .with_link(cx.link);
    if let Some(subject) = &source.dead_letter_subject {
        subscriber = subscriber
            .with_dead_letters(subject)
            .map_err(|e| context(e.into()))?;
    }
    if source.delivery == NatsDelivery::Elected {
        let scope = scope(super::kind::NATS)?;
        subscriber = subscriber
            .with_guard(&built.guards, &scope)
            .and_then(|s| s.with_guard_settings(timing))
            .map_err(|e| context(e.into()))?;
    }
    // Every subscriber hands what it gave up with no dead-letter
    // subject to take it, and an elected one what its lease's end
    // left unhandled, to the endpoint's dead letters.
    subscriber = subscriber.with_unhandled(inbox.unhandled_to(&emit));
    Ok(Box::pin(async move {
        let stats = subscriber
            .run(control, never_invalid(), |message| {
                let report = Report::new(&inbox, &emit, &name);
                report.payload(message.subject, message.payload, message.lease, None)
            })
            .await;
        tracing::info!("endpoint {name}: {stats:?}");
    }))
}

/// A JetStream durable consumer.
#[cfg(feature = "nats")]
pub(super) fn jetstream(cx: Assembly<'_>, source: &JetStreamSource) -> Result<Task, GatewayError> {
    let (name, inbox, emit, control) = (cx.name, cx.inbox, cx.emit, cx.control);
    let identity = cx.identity;
    let context = |source| failed(&name, source);
    let options = NatsOptions::new(&source.url)
        .map_err(|e| context(e.into()))?
        .with_name(&format!("{name}-{identity}"));
    let subjects: Vec<&str> = source.subjects.iter().map(String::as_str).collect();
    let mut consumer = JetStreamConsumer::new(options, &source.stream, &source.durable)
        .and_then(|c| c.with_subjects(&subjects))
        .and_then(|c| c.with_ack_wait(source.ack_wait))
        .and_then(|c| c.with_max_deliver(source.max_deliver))
        .and_then(|c| c.with_batch(source.batch))
        .and_then(|c| c.with_retry(source.retry))
        .map_err(|e| context(e.into()))?
        .with_link(cx.link);
    if let Some(subject) = &source.dead_letter_subject {
        consumer = consumer
            .with_dead_letters(subject)
            .map_err(|e| context(e.into()))?;
    }
    Ok(Box::pin(async move {
        let stats = consumer
            .run(control, never_invalid(), |message| {
                let from = format!("{}#{}", message.subject, message.sequence);
                Report::new(&inbox, &emit, &name).kept(from, message.payload)
            })
            .await;
        tracing::info!("endpoint {name}: {stats:?}");
    }))
}
