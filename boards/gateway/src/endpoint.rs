//! `[[endpoints]]`: each configured source becomes a task of the replica
//! that reports every handled message as an [`Event::Received`].

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use guard_core::retry::{Classifier, RetryPolicy};
use guard_endpoints::config::{EndpointConfig, EndpointKind, FileConfig};
use guard_endpoints::mqtt::{MqttEndpoint, MqttOptions, Subscription};
use guard_endpoints::redis::{PubSubEndpoint, StreamConsumer};
use guard_redis::{RedisConnection, StreamDlq, Topology};
use guard_smol::Control;

use crate::replica::{Built, Event, GatewayError, error};

/// A task of the replica.
pub(crate) type Task = Pin<Box<dyn Future<Output = ()>>>;

/// The default MQTT port.
const MQTT_PORT: u16 = 1883;

/// Reports a handled message of endpoint `name` as an event.
fn reporter(
    emit: Arc<dyn Fn(Event) + Send + Sync>,
    name: String,
) -> impl Fn(String, Option<u64>, &[u8]) {
    move |from, fence, payload| {
        emit(Event::Received {
            endpoint: name.clone(),
            from,
            fence,
            payload: String::from_utf8_lossy(payload).into_owned(),
        });
    }
}

/// Builds the task of `entry`. Only the stream endpoint connects here
/// (a URL of its own); the others connect when they subscribe.
pub(crate) async fn start(
    entry: &EndpointConfig,
    built: &Built,
    config: &FileConfig,
    identity: &str,
    control: Control,
    emit: Arc<dyn Fn(Event) + Send + Sync>,
) -> Result<Task, GatewayError> {
    let name = entry.name.clone();
    let report = reporter(emit, name.clone());
    let context = |e: &dyn std::fmt::Display| error(format!("endpoint {name}: {e}"));
    let timing = config.guards.active().map_err(|e| context(&e))?;
    let redis_url = || {
        entry
            .url
            .clone()
            .or_else(|| config.locker.url.clone())
            .unwrap_or_default()
    };
    match entry.kind {
        EndpointKind::RedisPubsub => {
            let scope = built
                .guards
                .scope("endpoint/redis")
                .and_then(|s| s.segment("node", &entry.name))
                .map_err(|e| context(&e))?;
            let patterns: Vec<&str> = entry.patterns.iter().map(String::as_str).collect();
            let endpoint = PubSubEndpoint::new(&redis_url(), &built.guards, &scope, &patterns)
                .and_then(|e| e.with_settings(timing))
                .map_err(|e| context(&e))?;
            Ok(Box::pin(async move {
                endpoint
                    .run(control, |message| {
                        report(message.channel, Some(message.fence), &message.payload);
                        async {}
                    })
                    .await;
            }))
        }
        EndpointKind::RedisStream => {
            let conn = match (&entry.url, &built.redis) {
                (None, Some(shared)) => shared.clone(),
                _ => RedisConnection::connect(
                    Topology::Standalone { url: redis_url() },
                    Duration::from_millis(config.locker.request_timeout_ms),
                )
                .await
                .map_err(|e| context(&e))?,
            };
            let mut retry = RetryPolicy::new();
            if let Some(retries) = entry.retries {
                retry = retry.with_max_attempts(retries);
            }
            if let Some(ms) = entry.retry_delay_ms {
                retry = retry.with_initial_delay(Duration::from_millis(ms));
            }
            let stream = entry.stream.clone().unwrap_or_default();
            let group = entry.group.clone().unwrap_or_default();
            let mut consumer = StreamConsumer::new(conn.clone(), &stream, &group, identity)
                .map_err(|e| context(&e))?
                .with_retry(retry)
                .map_err(|e| context(&e))?;
            if let Some(ms) = entry.claim_idle_ms {
                consumer = consumer
                    .with_claim_idle(Duration::from_millis(ms))
                    .map_err(|e| context(&e))?;
            }
            if let Some(topic) = &entry.dead_letter_topic {
                consumer = consumer
                    .with_dead_letters(StreamDlq::new(conn), topic)
                    .map_err(|e| context(&e))?;
            }
            Ok(Box::pin(async move {
                let stats = consumer
                    .run(control, Classifier::retry_all(), |message| {
                        report(
                            message.id.clone(),
                            None,
                            message.payload().unwrap_or_default(),
                        );
                        async { Ok::<(), String>(()) }
                    })
                    .await;
                log::info!("endpoint {name}: {stats:?}");
            }))
        }
        EndpointKind::Mqtt => {
            let client_id = format!("{}-{identity}", entry.name);
            let options = MqttOptions::new(
                entry.host.as_deref().unwrap_or_default(),
                entry.port.unwrap_or(MQTT_PORT),
                &client_id,
            )
            .map_err(|e| context(&e))?;
            let filter = entry.filter.as_deref().unwrap_or_default();
            let subscription = match &entry.share_group {
                Some(group) => Subscription::shared(group, filter),
                None => Subscription::plain(filter),
            }
            .map_err(|e| context(&e))?;
            let mut endpoint = MqttEndpoint::new(options, subscription);
            if entry.guard {
                let scope = built
                    .guards
                    .scope("endpoint/mqtt")
                    .and_then(|s| s.segment("node", &entry.name))
                    .map_err(|e| context(&e))?;
                endpoint = endpoint
                    .with_guard(&built.guards, &scope)
                    .and_then(|e| e.with_guard_settings(timing))
                    .map_err(|e| context(&e))?;
            }
            Ok(Box::pin(async move {
                endpoint
                    .run(control, |message| {
                        report(message.topic, message.fence, &message.payload);
                        async {}
                    })
                    .await;
            }))
        }
    }
}
