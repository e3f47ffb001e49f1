//! `kind = "nats"` and `kind = "nats-jetstream"`: checked with the same
//! rules as [`guard_endpoints::nats`]'s builders, so a configuration that loads
//! builds its endpoint. Without the `nats` feature both kinds are
//! refused, naming the feature.

use std::time::Duration;

use super::check::{Env, MAX_BATCH, MAX_TIMEOUT_MS, bounded, expand, refused, retry};
use super::raw;
use super::{ConfigError, JetStreamSource, NatsDelivery, NatsSource, RedactedUrl, Source, invalid};

/// The longest ack wait: an hour.
const MAX_ACK_WAIT_MS: u64 = MAX_TIMEOUT_MS;

/// The server's URL, expanded and checked; refused as written, its
/// password or token hidden.
#[cfg(feature = "nats")]
fn url(
    value: &str,
    key: &dyn Fn(&str) -> String,
    env: Env<'_>,
) -> Result<RedactedUrl, ConfigError> {
    let url = RedactedUrl::new(expand(&key("url"), value, env)?, value);
    guard_endpoints::nats::NatsOptions::new(&url)
        .map_err(|e| super::check::refused_url(key, &url, value, &e))?;
    Ok(url)
}

#[cfg(feature = "nats")]
fn subject_of(
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
pub(super) fn subject(
    n: &raw::Nats,
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
pub(super) fn jetstream(
    j: &raw::NatsJetStream,
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
pub(super) fn subject(
    n: &raw::Nats,
    key: &dyn Fn(&str) -> String,
    _env: Env<'_>,
) -> Result<Source, ConfigError> {
    retry(n.retries, n.retry_delay_ms, key)?;
    Err(super::check::unsupported("nats", "nats", key))
}

/// `kind = "nats-jetstream"`: refused in this build.
#[cfg(not(feature = "nats"))]
pub(super) fn jetstream(
    j: &raw::NatsJetStream,
    key: &dyn Fn(&str) -> String,
    _env: Env<'_>,
) -> Result<Source, ConfigError> {
    retry(j.retries, j.retry_delay_ms, key)?;
    Err(super::check::unsupported("nats-jetstream", "nats", key))
}
