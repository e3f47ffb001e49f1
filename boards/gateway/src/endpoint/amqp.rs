//! `kind = "rabbitmq"`: a work queue (optionally the broker's single
//! active consumer), or a fanout exchange (a broadcast, optionally
//! elected), in one module: the `[[endpoints]]` entry as written, its
//! check with [`guard_endpoints::amqp`]'s own rules (so a configuration
//! that loads builds its consumer), the validated source, what `check`
//! prints of it and its assembly. Refused, naming the feature, in a
//! build without `amqp`.

use guard_core::retry::RetryPolicy;
use serde::Deserialize;

#[cfg(feature = "amqp")]
use super::retrying::Report;
#[cfg(feature = "amqp")]
use super::{Assembly, Task, elected_scope, failed, never_invalid};
use crate::config::check::{Env, expand, retry};
use crate::config::raw;
use crate::config::{ConfigError, RedactedUrl, Source, invalid};
#[cfg(feature = "amqp")]
use crate::error::GatewayError;
#[cfg(feature = "amqp")]
use guard_endpoints::amqp::{AmqpOptions, FanoutConsumer, WorkQueueConsumer};

/// `kind = "rabbitmq"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AmqpSource {
    /// The broker (`amqp://user:password@host:port/vhost`).
    pub url: RedactedUrl,
    /// What is consumed, and who receives each message.
    pub delivery: AmqpDelivery,
    /// Messages delivered before any is acknowledged.
    pub prefetch: u16,
    /// Retries of a failing message.
    pub retry: RetryPolicy,
    /// Where given-up messages go (`<queue or exchange>.dead-letters`
    /// unless given).
    pub dead_letter_queue: Option<String>,
}

/// What a RabbitMQ endpoint consumes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AmqpDelivery {
    /// A queue every replica consumes: the broker delivers each message to
    /// one of them; no guard.
    WorkQueue {
        /// The queue.
        queue: String,
        /// The broker's single-active-consumer queue: one replica at a
        /// time receives.
        single_active: bool,
    },
    /// A fanout exchange: every bound queue gets every message.
    Fanout {
        /// The exchange.
        exchange: String,
        /// Only the elected replica binds a queue (`guard = true`).
        elected: bool,
    },
}

/// A `kind = "rabbitmq"` entry of `[[endpoints]]` as written (an unknown key
/// is refused).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RabbitmqEntry {
    pub name: String,
    pub url: String,
    pub queue: Option<String>,
    pub exchange: Option<String>,
    #[serde(default)]
    pub guard: bool,
    #[serde(default)]
    pub single_active: bool,
    pub prefetch: Option<u16>,
    pub retries: Option<u32>,
    pub retry_delay_ms: Option<u64>,
    pub dead_letter_queue: Option<String>,
    pub limit: Option<String>,
    pub limit_key: Option<String>,
    pub when_limited: Option<raw::WhenLimited>,
    pub max_wait_ms: Option<u64>,
    pub max_payload_bytes: Option<u64>,
}

/// `kind = "rabbitmq"`.
#[cfg(feature = "amqp")]
pub(crate) fn resolve(
    r: &RabbitmqEntry,
    key: &dyn Fn(&str) -> String,
    env: Env<'_>,
) -> Result<Source, ConfigError> {
    use guard_endpoints::amqp::{
        AmqpError, AmqpOptions, DEFAULT_PREFETCH, FanoutConsumer, WorkQueueConsumer,
    };
    let refused = |field: &str, e: AmqpError| crate::config::check::refused(field, key, &e);
    let url = RedactedUrl::new(expand(&key("url"), &r.url, env)?, &r.url);
    let options = AmqpOptions::new(&url)
        .map_err(|e| crate::config::check::refused_url(key, &url, &r.url, &e))?;
    let delivery = match (&r.queue, &r.exchange) {
        (Some(queue), None) => {
            if r.guard {
                return Err(invalid(
                    key("guard"),
                    true,
                    "no guard with `queue`: the broker delivers each message to one consumer already (for one consumer at a time: `single_active = true`)",
                ));
            }
            WorkQueueConsumer::new(options.clone(), queue).map_err(|e| refused("queue", e))?;
            AmqpDelivery::WorkQueue {
                queue: queue.clone(),
                single_active: r.single_active,
            }
        }
        (None, Some(exchange)) => {
            if r.single_active {
                return Err(invalid(
                    key("single_active"),
                    true,
                    "a queue's setting: with `exchange`, use `guard = true` for one consumer",
                ));
            }
            FanoutConsumer::new(options.clone(), exchange).map_err(|e| refused("exchange", e))?;
            AmqpDelivery::Fanout {
                exchange: exchange.clone(),
                elected: r.guard,
            }
        }
        (Some(_), Some(_)) => {
            return Err(invalid(
                key("exchange"),
                "set",
                "either `queue` (a work queue) or `exchange` (a fanout exchange), not both",
            ));
        }
        (None, None) => {
            return Err(invalid(
                key("queue"),
                "missing",
                "`queue` (a work queue) or `exchange` (a fanout exchange)",
            ));
        }
    };
    let prefetch = r.prefetch.unwrap_or(DEFAULT_PREFETCH);
    if prefetch == 0 {
        return Err(invalid(key("prefetch"), 0, "from 1 to 65535"));
    }
    if let Some(name) = &r.dead_letter_queue {
        match &delivery {
            AmqpDelivery::WorkQueue { queue, .. } => WorkQueueConsumer::new(options, queue)
                .and_then(|c| c.with_dead_letter_queue(name))
                .map(drop),
            AmqpDelivery::Fanout { exchange, .. } => FanoutConsumer::new(options, exchange)
                .and_then(|c| c.with_dead_letter_queue(name))
                .map(drop),
        }
        .map_err(|e| refused("dead_letter_queue", e))?;
    }
    Ok(Source::Rabbitmq(AmqpSource {
        url,
        delivery,
        prefetch,
        retry: retry(r.retries, r.retry_delay_ms, key)?,
        dead_letter_queue: r.dead_letter_queue.clone(),
    }))
}

/// `kind = "rabbitmq"`: refused in this build.
#[cfg(not(feature = "amqp"))]
pub(crate) fn resolve(
    r: &RabbitmqEntry,
    key: &dyn Fn(&str) -> String,
    _env: Env<'_>,
) -> Result<Source, ConfigError> {
    retry(r.retries, r.retry_delay_ms, key)?;
    Err(crate::config::check::unsupported("rabbitmq", "amqp", key))
}

/// What `check` prints of a RabbitMQ source.
#[cfg(feature = "amqp")]
pub(super) fn describe(source: &AmqpSource) -> String {
    match &source.delivery {
        AmqpDelivery::WorkQueue {
            queue,
            single_active: false,
        } => format!("rabbitmq, work queue {queue}"),
        AmqpDelivery::WorkQueue { queue, .. } => {
            format!("rabbitmq, single-active-consumer queue {queue}")
        }
        AmqpDelivery::Fanout {
            exchange,
            elected: true,
        } => format!("rabbitmq, elected consumer of fanout {exchange}"),
        AmqpDelivery::Fanout { exchange, .. } => {
            format!("rabbitmq, broadcast from fanout {exchange}")
        }
    }
}

/// The consumer of a RabbitMQ endpoint.
#[cfg(feature = "amqp")]
pub(super) fn start(cx: Assembly<'_>, source: &AmqpSource) -> Result<Task, GatewayError> {
    let (name, inbox, emit, control) = (cx.name, cx.inbox, cx.emit, cx.control);
    let (identity, built, timing) = (cx.identity, cx.built, cx.timing);
    let context = |source| failed(&name, source);
    let ready = cx.ready;
    let scope = |kind: &str| elected_scope(built, ready, kind, &name);
    let options = AmqpOptions::new(&source.url)
        .map_err(|e| context(e.into()))?
        .with_connection_name(&format!("{name}-{identity}"))
        .with_link(cx.link);
    match &source.delivery {
        AmqpDelivery::WorkQueue {
            queue,
            single_active,
        } => {
            let mut consumer = WorkQueueConsumer::new(options, queue)
                .and_then(|c| c.with_prefetch(source.prefetch))
                .and_then(|c| c.with_retry(source.retry))
                .map_err(|e| context(e.into()))?;
            if let Some(dead_letters) = &source.dead_letter_queue {
                consumer = consumer
                    .with_dead_letter_queue(dead_letters)
                    .map_err(|e| context(e.into()))?;
            }
            if *single_active {
                consumer = consumer.with_single_active_consumer();
            }
            Ok(Box::pin(async move {
                let ran = consumer
                    .run(control, never_invalid(), |message| {
                        let report = Report::new(&inbox, &emit, &name);
                        report.payload(message.routing_key, message.payload, message.lease, None)
                    })
                    .await;
                match ran {
                    Ok(stats) => tracing::info!("endpoint {name}: {stats:?}"),
                    Err(e) => tracing::error!("endpoint {name}: {e}"),
                }
            }))
        }
        AmqpDelivery::Fanout { exchange, elected } => {
            let mut consumer = FanoutConsumer::new(options, exchange)
                .and_then(|c| c.with_prefetch(source.prefetch))
                .and_then(|c| c.with_retry(source.retry))
                .map_err(|e| context(e.into()))?;
            if let Some(dead_letters) = &source.dead_letter_queue {
                consumer = consumer
                    .with_dead_letter_queue(dead_letters)
                    .map_err(|e| context(e.into()))?;
            }
            if *elected {
                let scope = scope(super::kind::AMQP)?;
                consumer = consumer
                    .with_guard(&built.guards, &scope)
                    .and_then(|c| c.with_guard_settings(timing))
                    .map_err(|e| context(e.into()))?;
            }
            let consumer = consumer.with_unhandled(inbox.unhandled_to(&emit));
            Ok(Box::pin(async move {
                let ran = consumer
                    .run(control, never_invalid(), |message| {
                        let report = Report::new(&inbox, &emit, &name);
                        report.payload(message.routing_key, message.payload, message.lease, None)
                    })
                    .await;
                match ran {
                    Ok(stats) => tracing::info!("endpoint {name}: {stats:?}"),
                    Err(e) => tracing::error!("endpoint {name}: {e}"),
                }
            }))
        }
    }
}
