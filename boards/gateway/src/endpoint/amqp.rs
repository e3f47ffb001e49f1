//! `kind = "rabbitmq"`: a work queue (optionally the broker's single
//! active consumer), or a fanout exchange (a broadcast, optionally
//! elected).

use guard_endpoints::amqp::{AmqpOptions, FanoutConsumer, WorkQueueConsumer};

use super::retrying::Report;
use super::{Assembly, Task, elected_scope, failed, never_invalid};
use crate::config::{AmqpDelivery, AmqpSource};
use crate::error::GatewayError;

/// What `check` prints of a RabbitMQ source.
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
pub(super) fn start(cx: Assembly<'_>, source: &AmqpSource) -> Result<Task, GatewayError> {
    let (name, inbox, emit, control) = (cx.name, cx.inbox, cx.emit, cx.control);
    let (identity, built, timing) = (cx.identity, cx.built, cx.timing);
    let context = |source| failed(&name, source);
    let scope = |kind: &str| elected_scope(built, kind, &name);
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
                        report.payload(message.routing_key, message.payload, message.lease)
                    })
                    .await;
                match ran {
                    Ok(stats) => log::info!("endpoint {name}: {stats:?}"),
                    Err(e) => log::error!("endpoint {name}: {e}"),
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
                let scope = scope("amqp")?;
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
                        report.payload(message.routing_key, message.payload, message.lease)
                    })
                    .await;
                match ran {
                    Ok(stats) => log::info!("endpoint {name}: {stats:?}"),
                    Err(e) => log::error!("endpoint {name}: {e}"),
                }
            }))
        }
    }
}
