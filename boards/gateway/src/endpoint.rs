//! `[[endpoints]]`: each configured source becomes a task of the replica
//! that reports every handled message as an [`Event::Received`], after
//! its limiter (if any) admitted it.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use guard_core::retry::Classifier;
use guard_endpoints::admission::{Admission, DEAD_LETTERS, Undelivered, Verdict};
use guard_endpoints::amqp::{AmqpOptions, FanoutConsumer, WorkQueueConsumer};
use guard_endpoints::config::{
    AmqpDelivery, BinlogStart, Config, Endpoint, LimitKey, MqttDelivery, NatsDelivery, Source,
};
use guard_endpoints::delivery::{ElectedLease, Unhandled, UnhandledReason};
use guard_endpoints::mqtt::{MqttEndpoint, Subscription};
use guard_endpoints::mysql::{BinlogReader, ColumnValue, Start, json_array};
use guard_endpoints::nats::{Delivery, JetStreamConsumer, NatsOptions, NatsSubscriber};
use guard_endpoints::postgres::PgQueue;
use guard_endpoints::redis::{StreamConsumer, StreamMessage};
use guard_redis::StreamDlq;
use guard_smol::Control;
use guard_std::metered::MeteredDeadLetterQueue;
use guard_std::{Clock, SystemClock, Throttle};

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

/// Why a message is not handed to the handler.
#[derive(Debug)]
enum Refused {
    /// The limiter refused it: retried under the endpoint's policy.
    Limited(String),
    /// It can never be handled (too large, a field missing): dead-lettered
    /// at once, with no retry.
    Invalid(String),
    /// The lease it was read under ended while it waited (for the
    /// limiter): no effect under it; the endpoint's delivery path hands
    /// it to the dead letters, or leaves it to a source that keeps it.
    LeaseLost,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refused::Limited(why) | Refused::Invalid(why) => f.write_str(why),
            Refused::LeaseLost => f.write_str(LEASE_LOST_WAITING),
        }
    }
}

/// Why a message whose lease ended while it waited is not handled.
const LEASE_LOST_WAITING: &str =
    "the lease it was read under ended while it waited for the limiter";

/// What every message of one endpoint passes before its handler: the
/// size bound, for a stream entry its required fields, and the limiter,
/// if any; and where a broadcast message that cannot pass goes (the
/// source keeps nothing itself).
struct Inbox {
    name: String,
    max_payload: usize,
    limit: Option<(Admission, LimitKey)>,
    dead_letters: Arc<MeteredDeadLetterQueue<Undelivered, String, DEAD_LETTERS>>,
    clock: SystemClock,
    /// A flood of refusals is logged once per interval.
    warnings: Throttle,
    /// A flood of drops (the dead-letter queue full) likewise, apart from
    /// the refusals so that a drop is never hidden behind them.
    drops: Throttle,
}

impl Inbox {
    fn new(built: &Built, entry: &Endpoint) -> Result<Self, GatewayError> {
        let limit = match &entry.limit {
            Some(limit) => Some((
                Admission::new(limiter(built, &limit.limiter)?, limit.when_limited),
                limit.key.clone(),
            )),
            None => None,
        };
        Ok(Inbox {
            name: entry.name.clone(),
            max_payload: entry.max_payload_bytes,
            limit,
            dead_letters: Arc::new(MeteredDeadLetterQueue::new(&entry.name)),
            clock: SystemClock::new(),
            warnings: Throttle::new(),
            drops: Throttle::new(),
        })
    }

    /// The limiter key of a message from `from` (its channel or topic),
    /// or, for a stream entry, with its `fields`.
    fn key_of<'a>(
        &'a self,
        key: &'a LimitKey,
        from: &'a str,
        fields: Option<&'a StreamMessage>,
    ) -> &'a str {
        match key {
            LimitKey::Source => &self.name,
            LimitKey::Topic => from,
            LimitKey::Field(field) => fields
                .and_then(|m| m.field(field))
                .and_then(|v| std::str::from_utf8(v).ok())
                .unwrap_or(""),
        }
    }

    fn too_large(&self, size: usize) -> Option<String> {
        (size > self.max_payload).then(|| {
            format!(
                "payload of {size} bytes over max_payload_bytes = {}",
                self.max_payload
            )
        })
    }

    /// Passes a stream entry: `Ok` when the handler may run.
    async fn check_entry(&self, message: &StreamMessage, fields: &[String]) -> Result<(), Refused> {
        let size = message.fields.values().map(Vec::len).sum();
        if let Some(why) = self.too_large(size) {
            return Err(Refused::Invalid(why));
        }
        let missing: Vec<&str> = fields
            .iter()
            .filter(|f| message.field(f).is_none())
            .map(String::as_str)
            .collect();
        if !missing.is_empty() {
            return Err(Refused::Invalid(format!(
                "entry without the field(s) {missing:?}"
            )));
        }
        if let Some((admission, key)) = &self.limit
            && let Verdict::Refused(why) = admission
                .admit(self.key_of(key, &message.id, Some(message)))
                .await
        {
            return Err(Refused::Limited(why.to_string()));
        }
        Ok(())
    }

    /// Passes a message of `size` bytes from a source that retries and
    /// dead-letters by itself (NATS, RabbitMQ, PostgreSQL, the binlog),
    /// read under `lease` if elected: `Ok` when the handler may make its
    /// effect, at once (the lease is checked last, after any wait).
    async fn check_message(
        &self,
        from: &str,
        size: usize,
        lease: Option<&ElectedLease>,
    ) -> Result<(), Refused> {
        if let Some(why) = self.too_large(size) {
            return Err(Refused::Invalid(why));
        }
        if let Some((admission, key)) = &self.limit
            && let Verdict::Refused(why) = admission.admit(self.key_of(key, from, None)).await
        {
            return Err(Refused::Limited(why.to_string()));
        }
        if lease.is_some_and(|lease| !lease.is_valid()) {
            return Err(Refused::LeaseLost);
        }
        Ok(())
    }

    /// Keeps a message this endpoint did not handle in its dead letters
    /// with `why` and the calls made, and reports it; `false` when the
    /// dead-letter queue is full (nothing kept).
    fn keep(&self, from: &str, payload: &[u8], why: String, attempts: u32, emit: &Emit) -> bool {
        let message = Undelivered {
            from: from.to_owned(),
            payload: payload.to_vec(),
        };
        if self
            .dead_letters
            .add(message, Some(why.clone()), attempts, self.clock.now())
            .is_err()
        {
            return false;
        }
        if let Some(held) = self.warnings.admit() {
            log::warn!(
                "endpoint {}: {from}: {why}; dead-lettered ({held} more not logged)",
                self.name
            );
        }
        emit(Event::DeadLettered {
            endpoint: self.name.clone(),
            from: from.to_owned(),
            reason: why,
        });
        true
    }

    /// What an elected source read and did not handle, kept in the
    /// dead letters; a full queue counts it as dropped, loudly.
    fn keep_unhandled(&self, message: Unhandled, emit: &Emit) {
        let why = message.reason.to_string();
        let attempts = message.reason.attempts();
        if !self.keep(
            &message.origin,
            &message.payload,
            why.clone(),
            attempts,
            emit,
        ) {
            self.dropped(
                &message.origin,
                &format!("{why}; the dead-letter queue is full"),
            );
        }
    }

    /// A message with nowhere left to go: counted in
    /// `guard_sink_dropped_total` each time, logged at error level once
    /// per interval with the count held back.
    fn dropped(&self, from: &str, why: &str) {
        metrics::counter!(guard_std::metrics::SINK_DROPPED, "name" => self.name.clone())
            .increment(1);
        if let Some(held) = self.drops.admit() {
            log::error!(
                "endpoint {}: {from}: {why}; message dropped ({held} more dropped, not logged)",
                self.name
            );
        }
    }

    /// The unhandled sink of an elected source: its dead letters.
    fn unhandled_to(self: &Arc<Self>, emit: &Emit) -> impl Fn(Unhandled) + Send + Sync + 'static {
        let (inbox, emit) = (self.clone(), emit.clone());
        move |message| inbox.keep_unhandled(message, &emit)
    }

    /// Passes a broadcast message read under `lease` or keeps it as a
    /// dead letter: true when the handler may make its effect, at once
    /// (the lease is checked last, after any wait). A message refused by
    /// the limiter whose dead-letter queue is full waits for the limiter
    /// however long that takes (back-pressure), so nothing is lost here;
    /// one that can never be handled (too large) and finds the queue full
    /// is dropped, logged and counted in `guard_sink_dropped_total`.
    async fn pass(
        &self,
        from: &str,
        payload: &[u8],
        lease: Option<&ElectedLease>,
        emit: &Emit,
    ) -> bool {
        let passed = self.pass_limits(from, payload, emit).await;
        // The limiter may have waited past the lease: no effect under it.
        if passed && lease.is_some_and(|lease| !lease.is_valid()) {
            self.keep_unhandled(
                Unhandled {
                    origin: from.to_owned(),
                    payload: payload.to_vec(),
                    fence: lease.map(ElectedLease::fence),
                    reason: UnhandledReason::LeaseLost {
                        attempts: 1,
                        error: LEASE_LOST_WAITING.to_owned(),
                    },
                },
                emit,
            );
            return false;
        }
        passed
    }

    /// [`pass`](Self::pass)'s size bound and limiter.
    async fn pass_limits(&self, from: &str, payload: &[u8], emit: &Emit) -> bool {
        let why = match self.too_large(payload.len()) {
            Some(why) => why,
            None => match &self.limit {
                None => return true,
                Some((admission, key)) => match admission.admit(self.key_of(key, from, None)).await
                {
                    Verdict::Admitted => return true,
                    Verdict::Refused(why) => why.to_string(),
                },
            },
        };
        if self.keep(from, payload, why.clone(), 1, emit) {
            return false;
        }
        let waited = match &self.limit {
            Some((admission, key)) if self.too_large(payload.len()).is_none() => {
                if let Some(held) = self.warnings.admit() {
                    log::warn!(
                        "endpoint {}: {from}: {why}; the dead-letter queue is full, waiting for the limiter ({held} more not logged)",
                        self.name
                    );
                }
                admission
                    .admit_eventually(self.key_of(key, from, None))
                    .await
                    .map_err(|failed| failed.to_string())
            }
            _ => Err(why),
        };
        match waited {
            Ok(()) => true,
            Err(why) => {
                // Nowhere left to keep it: said loudly and counted.
                self.dropped(from, &why);
                false
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
    let inbox = Arc::new(Inbox::new(built, entry)?);
    let timing = config.guards.active;
    // An elected endpoint's lease scope: its kind and its name.
    let scope = |kind: &str| {
        built
            .guards
            .scope(&format!("endpoint/{kind}"))
            .and_then(|s| s.segment("node", &name))
            .map_err(|e| context(e.into()))
    };
    match &entry.source {
        Source::RedisPubsub(source) => {
            let scope = scope("redis")?;
            let endpoint = source
                .endpoint(&built.guards, &scope)
                .and_then(|e| e.with_settings(timing))
                .map_err(|e| context(e.into()))?
                .with_unhandled(inbox.unhandled_to(&emit));
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
        Source::RedisStream(source) => {
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
            let mut consumer =
                StreamConsumer::new(conn.clone(), &source.stream, &source.group, identity)
                    .map_err(|e| context(e.into()))?
                    .with_retry(source.retry)
                    .map_err(|e| context(e.into()))?
                    .with_claim_idle(source.claim_idle)
                    .and_then(|c| c.with_batch(source.batch))
                    .and_then(|c| c.with_concurrency(source.concurrency))
                    .map_err(|e| context(e.into()))?;
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
                            Ok::<(), Refused>(())
                        }
                    })
                    .await;
                log::info!("endpoint {name}: {stats:?}");
            }))
        }
        Source::Mqtt(source) => {
            let client_id = format!("{name}-{identity}");
            let options = source.options(&client_id).map_err(|e| context(e.into()))?;
            let subscription = match &source.delivery {
                MqttDelivery::Shared(group) => Subscription::shared(group, &source.filter),
                MqttDelivery::Broadcast | MqttDelivery::Elected => {
                    Subscription::plain(&source.filter)
                }
            }
            .map_err(|e| context(e.into()))?;
            let mut endpoint = MqttEndpoint::new(options, subscription);
            if source.delivery == MqttDelivery::Elected {
                let scope = scope("mqtt")?;
                endpoint = endpoint
                    .with_guard(&built.guards, &scope)
                    .and_then(|e| e.with_guard_settings(timing))
                    .map_err(|e| context(e.into()))?
                    .with_unhandled(inbox.unhandled_to(&emit));
            }
            Ok(Box::pin(async move {
                endpoint
                    .run(control, |message| {
                        let (inbox, emit, name) = (inbox.clone(), emit.clone(), name.clone());
                        async move {
                            let lease = message.lease.as_ref();
                            if !inbox
                                .pass(&message.topic, &message.payload, lease, &emit)
                                .await
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
        Source::Nats(source) => {
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
                .map_err(|e| context(e.into()))?;
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
        Source::NatsJetStream(source) => {
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
                .map_err(|e| context(e.into()))?;
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
        Source::Rabbitmq(source) => {
            let options = AmqpOptions::new(&source.url)
                .map_err(|e| context(e.into()))?
                .with_connection_name(&format!("{name}-{identity}"));
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
        Source::PostgresQueue(source) => {
            let mut queue = PgQueue::new(&source.url, &source.table)
                .and_then(|q| q.with_batch(source.batch))
                .and_then(|q| q.with_claim_lease(source.claim_lease))
                .and_then(|q| q.with_max_deliveries(source.max_deliveries))
                .and_then(|q| q.with_retry(source.retry))
                .and_then(|q| q.with_consumer_name(&format!("{name}-{identity}")))
                .map_err(|e| context(e.into()))?
                .with_poll_interval(source.poll_interval);
            if let Some(table) = &source.dead_letter_table {
                queue = queue
                    .with_dead_letter_table(table)
                    .map_err(|e| context(e.into()))?;
            }
            queue.create_tables().await.map_err(|e| context(e.into()))?;
            let table = source.table.clone();
            Ok(Box::pin(async move {
                let stats = queue
                    .run(control, never_invalid(), |message| {
                        let from = format!("{table}#{}", message.id);
                        Report::new(&inbox, &emit, &name).payload(from, message.payload, None)
                    })
                    .await;
                log::info!("endpoint {name}: {stats:?}");
            }))
        }
        Source::MysqlBinlog(source) => {
            let scope = scope("binlog")?;
            let mut reader = BinlogReader::new(&source.url, &name, &built.guards, &scope)
                .and_then(|r| r.with_lock_service(&built.lock_service))
                .and_then(|r| r.with_guard_settings(timing))
                .and_then(|r| r.with_checkpoint_every(source.checkpoint_every))
                .and_then(|r| r.with_retry(source.retry))
                .map_err(|e| context(e.into()))?
                .with_start(match source.start {
                    BinlogStart::Current => Start::Current,
                    BinlogStart::Beginning => Start::Beginning,
                });
            if let Some(id) = source.server_id {
                reader = reader.with_server_id(id).map_err(|e| context(e.into()))?;
            }
            if let Some(table) = &source.checkpoint_table {
                reader = reader
                    .with_checkpoint_table(table)
                    .map_err(|e| context(e.into()))?;
            }
            if let Some(table) = &source.dead_letter_table {
                reader = reader
                    .with_dead_letter_table(table)
                    .map_err(|e| context(e.into()))?;
            }
            Ok(Box::pin(async move {
                let stats = reader
                    .run(control, never_invalid(), |change| {
                        let (inbox, emit, name) = (inbox.clone(), emit.clone(), name.clone());
                        async move {
                            let from = format!(
                                "{}.{}@{}#{}",
                                change.database, change.table, change.position, change.row
                            );
                            let image = |row: &Option<Vec<ColumnValue>>| {
                                row.as_deref().map_or_else(|| "-".to_owned(), json_array)
                            };
                            let (before, after) = (image(&change.before), image(&change.after));
                            inbox
                                .check_message(
                                    &from,
                                    before.len() + after.len(),
                                    change.lease.as_ref(),
                                )
                                .await?;
                            emit(Event::Received {
                                endpoint: name,
                                from,
                                fence: Some(change.fence),
                                content: Content::Fields(vec![
                                    ("kind".to_owned(), change.kind.name().to_owned()),
                                    ("before".to_owned(), before),
                                    ("after".to_owned(), after),
                                ]),
                            });
                            Ok::<(), Refused>(())
                        }
                    })
                    .await;
                log::info!("endpoint {name}: {stats:?}");
            }))
        }
        _ => Err(GatewayError::UnsupportedEndpoint { name }),
    }
}

/// The handler of a source that retries and dead-letters by itself: a
/// message passes the inbox (a refusal fails it: retried unless it can
/// never pass, then dead-lettered by the source), then is reported.
struct Report {
    inbox: Arc<Inbox>,
    emit: Emit,
    name: String,
}

impl Report {
    fn new(inbox: &Arc<Inbox>, emit: &Emit, name: &str) -> Self {
        Report {
            inbox: inbox.clone(),
            emit: emit.clone(),
            name: name.to_owned(),
        }
    }

    /// `payload`, received from `from` under `lease` if elected.
    async fn payload(
        self,
        from: String,
        payload: Vec<u8>,
        lease: Option<ElectedLease>,
    ) -> Result<(), Refused> {
        self.inbox
            .check_message(&from, payload.len(), lease.as_ref())
            .await?;
        let fence = lease.as_ref().map(ElectedLease::fence);
        (self.emit)(Event::Received {
            endpoint: self.name,
            from,
            fence,
            content: Content::Payload(text(&payload)),
        });
        Ok(())
    }
}

/// Retries every refusal but one that can never pass (too large, a field
/// missing).
fn never_invalid() -> Classifier<Refused> {
    Classifier::retry_all().never(|e: &Refused| matches!(e, Refused::Invalid(_)))
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use guard_endpoints::delivery::UnhandledReason;

    use super::*;

    /// The lines logged at `warn` and above in this test binary.
    struct Logged(Mutex<Vec<String>>);

    impl log::Log for Logged {
        fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
            metadata.level() <= log::Level::Warn
        }
        fn log(&self, record: &log::Record<'_>) {
            self.0.lock().unwrap().push(record.args().to_string());
        }
        fn flush(&self) {}
    }

    static LOGGED: Logged = Logged(Mutex::new(Vec::new()));

    #[test]
    fn a_full_dead_letter_queue_logs_what_it_drops_once_per_interval() {
        log::set_logger(&LOGGED).unwrap();
        log::set_max_level(log::LevelFilter::Warn);
        let inbox = Inbox {
            name: "alerts".into(),
            max_payload: 1024,
            limit: None,
            dead_letters: Arc::new(MeteredDeadLetterQueue::new("alerts")),
            clock: SystemClock::new(),
            warnings: Throttle::new(),
            drops: Throttle::new(),
        };
        let emit: Emit = Arc::new(|_| {});
        for n in 0..DEAD_LETTERS + 500 {
            inbox.keep_unhandled(
                Unhandled {
                    origin: "alerts.fire".into(),
                    payload: n.to_string().into_bytes(),
                    fence: Some(7),
                    reason: UnhandledReason::Demoted,
                },
                &emit,
            );
        }
        let logged = LOGGED.0.lock().unwrap();
        let dropped: Vec<_> = logged.iter().filter(|l| l.contains("dropped")).collect();
        assert_eq!(dropped.len(), 1, "one line for 500 drops: {dropped:#?}");
        assert_eq!(inbox.dead_letters.len(), DEAD_LETTERS, "the queue is full");
    }
}
