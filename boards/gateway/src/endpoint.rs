//! `[[endpoints]]`: each configured source becomes a task of the replica
//! that reports every handled message as an [`Event::Received`], after
//! its limiter (if any) admitted it.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use guard_core::retry::Classifier;
use guard_endpoints::admission::{Admission, DEAD_LETTERS, Undelivered, Verdict};
use guard_endpoints::config::{Config, Endpoint, EndpointLimit, LimitKey, MqttDelivery, Source};
use guard_endpoints::mqtt::{MqttEndpoint, MqttOptions, Subscription};
use guard_endpoints::redis::{PubSubEndpoint, StreamConsumer, StreamMessage};
use guard_redis::{RedisConnection, StreamDlq, Topology};
use guard_smol::Control;
use guard_std::metered::MeteredDeadLetterQueue;
use guard_std::{Clock, SystemClock};

use crate::built::{Built, limiter};
use crate::error::GatewayError;
use crate::event::{Content, Event};

/// A task of the replica.
pub(crate) type Task = Pin<Box<dyn Future<Output = ()>>>;

type Emit = Arc<dyn Fn(Event) + Send + Sync>;

/// Text of bytes, invalid UTF-8 replaced.
fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// One endpoint's limiter, with the key it limits by, and where the
/// messages it refuses go when the source keeps nothing itself.
struct Gate {
    admission: Admission,
    key: LimitKey,
    name: String,
    dead_letters: Arc<MeteredDeadLetterQueue<Undelivered, String, DEAD_LETTERS>>,
    clock: SystemClock,
}

impl Gate {
    fn new(built: &Built, name: &str, limit: &EndpointLimit) -> Result<Self, GatewayError> {
        Ok(Gate {
            admission: Admission::new(limiter(built, &limit.limiter)?, limit.when_limited),
            key: limit.key.clone(),
            name: name.to_owned(),
            dead_letters: Arc::new(MeteredDeadLetterQueue::new(name)),
            clock: SystemClock::new(),
        })
    }

    /// The limiter key of a message from `from` (its channel or topic),
    /// or, for a stream entry, with its `fields`.
    fn key_of<'a>(&'a self, from: &'a str, fields: Option<&'a StreamMessage>) -> &'a str {
        match &self.key {
            LimitKey::Source => &self.name,
            LimitKey::Topic => from,
            LimitKey::Field(field) => fields
                .and_then(|m| m.field(field))
                .and_then(|v| std::str::from_utf8(v).ok())
                .unwrap_or(""),
        }
    }

    /// Admits a broadcast message or keeps it as a dead letter: true when
    /// the handler may run. A full dead-letter queue hands the message
    /// back, and then it waits for the limiter however long that takes
    /// (back-pressure), so nothing is lost here.
    async fn pass(&self, from: &str, payload: &[u8], emit: &Emit) -> bool {
        let why = match self.admission.admit(self.key_of(from, None)).await {
            Verdict::Admitted => return true,
            Verdict::Refused(why) => why,
        };
        let message = Undelivered {
            from: from.to_owned(),
            payload: payload.to_vec(),
        };
        match self
            .dead_letters
            .add(message, Some(why.to_string()), 1, self.clock.now())
        {
            Ok(()) => {
                log::warn!("endpoint {}: {from}: {why}; dead-lettered", self.name);
                emit(Event::DeadLettered {
                    endpoint: self.name.clone(),
                    from: from.to_owned(),
                    reason: why.to_string(),
                });
                false
            }
            Err(_) => {
                log::warn!(
                    "endpoint {}: {from}: {why}; the dead-letter queue is full, waiting for the limiter",
                    self.name
                );
                match self
                    .admission
                    .admit_eventually(self.key_of(from, None))
                    .await
                {
                    Ok(()) => true,
                    Err(failed) => {
                        // Nowhere left to keep it: said loudly and counted.
                        log::error!("endpoint {}: {from}: {failed}; message dropped", self.name);
                        metrics::counter!(guard_std::metrics::SINK_DROPPED, "name" => self.name.clone())
                            .increment(1);
                        false
                    }
                }
            }
        }
    }
}

/// Builds the task of `entry`. Only the stream endpoint connects here
/// (a URL of its own, or the locker's connection); the others connect
/// when they subscribe.
pub(crate) async fn start(
    entry: &Endpoint,
    built: &Built,
    config: &Config,
    identity: &str,
    control: Control,
    emit: Emit,
) -> Result<Task, GatewayError> {
    let name = entry.name.clone();
    let context = |source: Box<dyn std::error::Error + Send + Sync>| GatewayError::Endpoint {
        name: name.clone(),
        source,
    };
    let gate = match &entry.limit {
        Some(limit) => Some(Arc::new(Gate::new(built, &name, limit)?)),
        None => None,
    };
    let timing = config.guards.active;
    match &entry.source {
        Source::RedisPubsub(source) => {
            let scope = built
                .guards
                .scope("endpoint/redis")
                .and_then(|s| s.segment("node", &name))
                .map_err(|e| context(e.into()))?;
            let patterns: Vec<&str> = source.patterns.iter().map(String::as_str).collect();
            let endpoint = PubSubEndpoint::new(&source.url, &built.guards, &scope, &patterns)
                .and_then(|e| e.with_settings(timing))
                .map_err(|e| context(e.into()))?;
            Ok(Box::pin(async move {
                endpoint
                    .run(control, |message| {
                        let (gate, emit, name) = (gate.clone(), emit.clone(), name.clone());
                        async move {
                            if let Some(gate) = &gate
                                && !gate.pass(&message.channel, &message.payload, &emit).await
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
        Source::RedisStream(source) => {
            let conn = match (&source.url, &built.redis) {
                (None, Some(shared)) => shared.clone(),
                (url, _) => RedisConnection::connect(
                    Topology::Standalone {
                        url: url.clone().unwrap_or_default(),
                    },
                    config
                        .redis_locker()
                        .map_or(std::time::Duration::from_millis(500), |l| l.request_timeout),
                )
                .await
                .map_err(|e| context(e.into()))?,
            };
            let mut consumer =
                StreamConsumer::new(conn.clone(), &source.stream, &source.group, identity)
                    .map_err(|e| context(e.into()))?
                    .with_retry(source.retry)
                    .map_err(|e| context(e.into()))?
                    .with_claim_idle(source.claim_idle)
                    .map_err(|e| context(e.into()))?;
            if let Some(topic) = &source.dead_letter_topic {
                consumer = consumer
                    .with_dead_letters(StreamDlq::new(conn), topic)
                    .map_err(|e| context(e.into()))?;
            }
            Ok(Box::pin(async move {
                let stats = consumer
                    .run(control, Classifier::retry_all(), |message| {
                        let (gate, emit, name) = (gate.clone(), emit.clone(), name.clone());
                        async move {
                            // A refusal fails the entry: it is retried,
                            // then dead-lettered or left pending, never
                            // dropped.
                            if let Some(gate) = &gate
                                && let Verdict::Refused(why) = gate
                                    .admission
                                    .admit(gate.key_of(&message.id, Some(&message)))
                                    .await
                            {
                                return Err(why.to_string());
                            }
                            let fields: BTreeMap<&String, &Vec<u8>> =
                                message.fields.iter().collect();
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
                            Ok::<(), String>(())
                        }
                    })
                    .await;
                log::info!("endpoint {name}: {stats:?}");
            }))
        }
        Source::Mqtt(source) => {
            let client_id = format!("{name}-{identity}");
            let options = MqttOptions::new(&source.host, source.port, &client_id)
                .map_err(|e| context(e.into()))?;
            let subscription = match &source.delivery {
                MqttDelivery::Shared(group) => Subscription::shared(group, &source.filter),
                MqttDelivery::Broadcast | MqttDelivery::Elected => {
                    Subscription::plain(&source.filter)
                }
            }
            .map_err(|e| context(e.into()))?;
            let mut endpoint = MqttEndpoint::new(options, subscription);
            if source.delivery == MqttDelivery::Elected {
                let scope = built
                    .guards
                    .scope("endpoint/mqtt")
                    .and_then(|s| s.segment("node", &name))
                    .map_err(|e| context(e.into()))?;
                endpoint = endpoint
                    .with_guard(&built.guards, &scope)
                    .and_then(|e| e.with_guard_settings(timing))
                    .map_err(|e| context(e.into()))?;
            }
            Ok(Box::pin(async move {
                endpoint
                    .run(control, |message| {
                        let (gate, emit, name) = (gate.clone(), emit.clone(), name.clone());
                        async move {
                            if let Some(gate) = &gate
                                && !gate.pass(&message.topic, &message.payload, &emit).await
                            {
                                return;
                            }
                            emit(Event::Received {
                                endpoint: name,
                                from: message.topic,
                                fence: message.fence,
                                content: Content::Payload(text(&message.payload)),
                            });
                        }
                    })
                    .await;
            }))
        }
        _ => Err(GatewayError::UnsupportedEndpoint { name }),
    }
}
