//! `kind = "redis-pubsub"` (one elected subscriber) and
//! `kind = "redis-stream"` (a consumer group).

use std::collections::BTreeMap;
use std::sync::Arc;

use guard_endpoints::redis::StreamConsumer;
use guard_redis::StreamDlq;

use super::{Assembly, Content, Event, Refused, Task, elected_scope, failed, never_invalid, text};
use crate::config::{PubSubSource, StreamSource};
use crate::error::GatewayError;

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
    let scope = |kind: &str| elected_scope(built, kind, &name);
    let scope = scope("redis")?;
    let endpoint = source
        .endpoint(&built.guards, &scope)
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
    Ok(Box::pin(async move {
        // An entry that can never be handled is not retried.
        let stats = consumer
            .run(control, never_invalid(), |message| {
                let (inbox, emit, name, fields) =
                    (inbox.clone(), emit.clone(), name.clone(), fields.clone());
                async move {
                    // A refusal fails the entry: it is retried
                    // (unless it can never pass), then dead-lettered
                    // with the reason or left pending, never dropped.
                    inbox.check_entry(&message, &fields).await?;
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
        log::info!("endpoint {name}: {stats:?}");
    }))
}
