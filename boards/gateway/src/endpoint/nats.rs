//! `kind = "nats"` (a queue group, a broadcast or an elected subscriber)
//! and `kind = "nats-jetstream"` (a durable consumer).

use guard_endpoints::nats::{Delivery, JetStreamConsumer, NatsOptions, NatsSubscriber};

use super::retrying::Report;
use super::{Assembly, Task, elected_scope, failed, never_invalid};
use crate::config::{JetStreamSource, NatsDelivery, NatsSource};
use crate::error::GatewayError;

/// What `check` prints of a core NATS source.
pub(super) fn describe_subject(source: &NatsSource) -> String {
    match &source.delivery {
        NatsDelivery::QueueGroup(group) => format!("nats, queue group {group}"),
        NatsDelivery::Broadcast => "nats, broadcast".to_owned(),
        NatsDelivery::Elected => "nats, elected subscriber".to_owned(),
    }
}

/// What `check` prints of a JetStream source.
pub(super) fn describe_jetstream(source: &JetStreamSource) -> String {
    format!("nats-jetstream, durable consumer {}", source.durable)
}

/// The subscriber of a core NATS subject.
pub(super) fn subject(cx: Assembly<'_>, source: &NatsSource) -> Result<Task, GatewayError> {
    let (name, inbox, emit, control) = (cx.name, cx.inbox, cx.emit, cx.control);
    let (identity, built, timing) = (cx.identity, cx.built, cx.timing);
    let context = |source| failed(&name, source);
    let scope = |kind: &str| elected_scope(built, kind, &name);
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
        let scope = scope("nats")?;
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
                report.payload(message.subject, message.payload, message.lease)
            })
            .await;
        log::info!("endpoint {name}: {stats:?}");
    }))
}

/// A JetStream durable consumer.
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
                Report::new(&inbox, &emit, &name).payload(from, message.payload, None)
            })
            .await;
        log::info!("endpoint {name}: {stats:?}");
    }))
}
