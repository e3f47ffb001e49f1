//! `kind = "rabbitmq"`: checked with [`guard_endpoints::amqp`]'s own rules, so a
//! configuration that loads builds its consumer. Refused, naming the
//! feature, in a build without `amqp`.

use super::check::{Env, expand, retry};
use super::raw;
use super::{AmqpDelivery, AmqpSource, ConfigError, RedactedUrl, Source, invalid};

/// `kind = "rabbitmq"`.
#[cfg(feature = "amqp")]
pub(super) fn source(
    r: &raw::Rabbitmq,
    key: &dyn Fn(&str) -> String,
    env: Env<'_>,
) -> Result<Source, ConfigError> {
    use guard_endpoints::amqp::{
        AmqpError, AmqpOptions, DEFAULT_PREFETCH, FanoutConsumer, WorkQueueConsumer,
    };
    let refused = |field: &str, e: AmqpError| super::check::refused(field, key, &e);
    let url = RedactedUrl::new(expand(&key("url"), &r.url, env)?, &r.url);
    let options =
        AmqpOptions::new(&url).map_err(|e| super::check::refused_url(key, &url, &r.url, &e))?;
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
pub(super) fn source(
    r: &raw::Rabbitmq,
    key: &dyn Fn(&str) -> String,
    _env: Env<'_>,
) -> Result<Source, ConfigError> {
    retry(r.retries, r.retry_delay_ms, key)?;
    Err(super::check::unsupported("rabbitmq", "amqp", key))
}
