//! A work queue: every replica consumes, the broker delivers each message
//! to one of them; acknowledged after the handler, retried in process,
//! dead-lettered by the broker once given up.

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use futures_lite::{StreamExt as _, future};
use guard_core::retry::{Classifier, RetryPolicy};
use guard_std::run::Control;
use lapin::options::{BasicAckOptions, BasicNackOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{Channel, Consumer};

use super::session::{self, Attempt, Session};
use super::{
    AmqpError, AmqpMessage, AmqpOptions, AmqpStats, Counters, DEFAULT_PREFETCH, checked_name,
    checked_prefetch, default_dead_letters, why_not_sent,
};
use crate::deliver;
use crate::parameter::Parameter;

/// A consumer of a durable work queue; see the [module
/// documentation](super) for what it guarantees.
///
/// Each replica runs one (each [`run`](Self::run) opens a connection of
/// its own). [`run`](Self::run) declares, before consuming, the
/// dead-letter queue and then the queue, with `x-dead-letter-exchange`
/// set to the default exchange and `x-dead-letter-routing-key` to the
/// dead-letter queue; every replica must declare them alike (the broker
/// refuses a declaration whose arguments differ, and `run` returns that
/// refusal).
pub struct WorkQueueConsumer {
    options: AmqpOptions,
    queue: ShortString,
    dead_letters: ShortString,
    prefetch: u16,
    retry: RetryPolicy,
    single_active: bool,
    counters: Arc<Counters>,
}

impl fmt::Debug for WorkQueueConsumer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkQueueConsumer")
            .field("options", &self.options)
            .field("queue", &self.queue.as_str())
            .field("dead_letters", &self.dead_letters.as_str())
            .field("prefetch", &self.prefetch)
            .field("retry", &self.retry)
            .field("single_active", &self.single_active)
            .finish()
    }
}

impl WorkQueueConsumer {
    /// A consumer of `queue` on the broker of `options`, with the
    /// defaults: dead letters in `<queue>.dead-letters`, a prefetch of
    /// [`DEFAULT_PREFETCH`], the original's retry policy (3 retries from
    /// 100 ms, doubling), every replica consuming.
    ///
    /// `queue` is 1 to 242 bytes (its dead-letter queue's name must fit
    /// in 255), outside the broker's reserved `amq.` names.
    pub fn new(options: AmqpOptions, queue: &str) -> Result<Self, AmqpError> {
        let name = checked_name(Parameter::AmqpQueue, queue)?;
        let dead_letters = default_dead_letters(Parameter::AmqpQueue, queue, "<queue>")?;
        Ok(WorkQueueConsumer {
            options,
            queue: name,
            dead_letters,
            prefetch: DEFAULT_PREFETCH,
            retry: RetryPolicy::new(),
            single_active: false,
            counters: Arc::default(),
        })
    }

    /// Where the broker moves the messages given up: the queue `name`,
    /// declared durable by the consumer. Not the queue itself (the broker
    /// drops a message dead-lettered in a cycle).
    pub fn with_dead_letter_queue(mut self, name: &str) -> Result<Self, AmqpError> {
        let name = checked_name(Parameter::AmqpQueue, name)?;
        if name == self.queue {
            return Err(AmqpError::invalid(
                Parameter::AmqpQueue,
                name.as_str(),
                "a dead-letter queue must differ from the queue it serves",
            ));
        }
        self.dead_letters = name;
        Ok(self)
    }

    /// Messages the broker sends before any is acknowledged (at least 1):
    /// more keeps a fast handler busy; fewer leaves more to the other
    /// replicas and redelivers less when this one fails.
    pub fn with_prefetch(mut self, prefetch: u16) -> Result<Self, AmqpError> {
        self.prefetch = checked_prefetch(prefetch)?;
        Ok(self)
    }

    /// How a failing message is retried before it is given up and
    /// dead-lettered. The consumer draws no random bits, so a policy with
    /// jitter is refused; a message being retried holds its place, and
    /// the others of the prefetch window wait behind it. Keep the retries'
    /// total well under the broker's `consumer_timeout` (30 minutes by
    /// default): past it, the broker closes the channel of a consumer that
    /// holds a delivery unacknowledged, and delivers the message again.
    pub fn with_retry(mut self, policy: RetryPolicy) -> Result<Self, AmqpError> {
        self.retry = deliver::checked(policy).map_err(AmqpError::InvalidInput)?;
        Ok(self)
    }

    /// Declares the queue with `x-single-active-consumer`: the broker
    /// delivers to one consumer at a time, in order, and moves on to the
    /// next when its channel closes. See the [module
    /// documentation](super) for how this compares with a lease. A queue
    /// that exists without the argument cannot be given it (the broker
    /// refuses the declaration): delete it first, or use a new one.
    pub fn with_single_active_consumer(mut self) -> Self {
        self.single_active = true;
        self
    }

    /// The queue.
    pub fn queue(&self) -> &str {
        self.queue.as_str()
    }

    /// The dead-letter queue.
    pub fn dead_letter_queue(&self) -> &str {
        self.dead_letters.as_str()
    }

    /// What the consumer has done so far.
    pub fn stats(&self) -> AmqpStats {
        self.counters.snapshot()
    }

    /// Connects, declares the dead-letter queue and the queue, and
    /// disconnects: for publishers that must not publish before the queue
    /// exists (the default exchange drops a message for a queue that does
    /// not).
    pub async fn declare(&self) -> Result<(), AmqpError> {
        let session = Session::open(&self.options).await?;
        let declared = session::within(
            self.options.connect_timeout,
            "declare",
            self.declare_on(&session.channel),
        )
        .await;
        session.close().await;
        declared
    }

    /// The queue's arguments: where the broker dead-letters, and whether
    /// it delivers to a single active consumer.
    fn arguments(&self) -> FieldTable {
        let mut arguments = FieldTable::default();
        // The default exchange routes by queue name: no exchange or
        // binding to keep in step with the dead-letter queue.
        arguments.insert(
            "x-dead-letter-exchange".into(),
            AMQPValue::LongString("".into()),
        );
        arguments.insert(
            "x-dead-letter-routing-key".into(),
            AMQPValue::LongString(self.dead_letters.as_str().into()),
        );
        if self.single_active {
            arguments.insert("x-single-active-consumer".into(), AMQPValue::Boolean(true));
        }
        arguments
    }

    /// The dead-letter queue first, so that no message can be
    /// dead-lettered before it exists (the broker would drop it).
    async fn declare_on(&self, channel: &Channel) -> Result<(), AmqpError> {
        let durable = QueueDeclareOptions {
            durable: true,
            ..QueueDeclareOptions::default()
        };
        session::declare_queue(
            channel,
            "dead-letter queue",
            &self.dead_letters,
            durable,
            FieldTable::default(),
        )
        .await?;
        session::declare_queue(channel, "queue", &self.queue, durable, self.arguments()).await?;
        Ok(())
    }

    /// A connection that consumes the queue, everything declared.
    async fn open(&self) -> Result<(Session, Consumer), AmqpError> {
        let session = Session::open(&self.options).await?;
        let consumer = session::within(self.options.connect_timeout, "declare", async {
            self.declare_on(&session.channel).await?;
            session::limit(&session.channel, self.prefetch, self.queue.as_str()).await?;
            session::consume(&session.channel, &self.queue).await
        })
        .await?;
        Ok((session, consumer))
    }

    /// Consumes until `control` stops it, calling `handler` for each
    /// message, one at a time, retried under the consumer's policy while
    /// `classifier` allows; acknowledges a handled message, rejects a
    /// given-up one (the broker dead-letters it). Reconnects after a
    /// failure, declaring again. A message in the handler when stop comes
    /// is finished first (its retries included); the ones buffered behind
    /// it go back to the queue when the connection closes.
    ///
    /// Returns what the consumer did, or the broker's refusal of a
    /// declaration (a queue that exists with other arguments, a name
    /// this user may not use), which no reconnection fixes.
    pub async fn run<F, Fut, E>(
        &self,
        control: Control,
        classifier: Classifier<E>,
        mut handler: F,
    ) -> Result<AmqpStats, AmqpError>
    where
        F: FnMut(AmqpMessage) -> Fut,
        Fut: Future<Output = Result<(), E>>,
        E: fmt::Display,
    {
        let label = format!("queue {}", self.queue);
        let link = self.options.link(&label);
        metrics::counter!(guard_std::metrics::ENDPOINT_DISCONNECTS, "key" => self.queue.to_string())
            .increment(0);
        loop {
            let opened =
                session::until_done(&self.options, &control, &self.counters, &link, || {
                    self.open()
                })
                .await?;
            let Attempt::Done((session, mut consumer)) = opened else {
                break;
            };
            // Boxed: the handler's, the retries' and lapin's futures
            // nest deep, and a caller's future would carry them inline.
            let served =
                Box::pin(self.serve(&mut consumer, &control, classifier, &mut handler)).await;
            drop(consumer);
            session.close().await;
            match served {
                Ok(()) => break,
                Err(e) => {
                    self.counters.failed();
                    metrics::counter!(guard_std::metrics::ENDPOINT_DISCONNECTS, "key" => self.queue.to_string())
                        .increment(1);
                    let then = format!(
                        "unacknowledged messages go back to the queue; reconnecting in {:?}",
                        self.options.reconnect_delay
                    );
                    link.down(&e, &then);
                    session::pause(&control, self.options.reconnect_delay).await;
                }
            }
        }
        Ok(self.stats())
    }

    /// Serves one connection's consumer until `control` stops (`Ok`) or
    /// the consumer ends (the connection failed, the broker cancelled it).
    async fn serve<F, Fut, E>(
        &self,
        consumer: &mut Consumer,
        control: &Control,
        classifier: Classifier<E>,
        handler: &mut F,
    ) -> Result<(), AmqpError>
    where
        F: FnMut(AmqpMessage) -> Fut,
        Fut: Future<Output = Result<(), E>>,
        E: fmt::Display,
    {
        let queue = self.queue.as_str();
        loop {
            // Stop is heard only between messages: one being handled is
            // finished and acknowledged.
            let next = future::or(
                async {
                    control.stopped().await;
                    None
                },
                async { Some(consumer.next().await) },
            )
            .await;
            let mut delivery = match next {
                None => return Ok(()),
                Some(Some(Ok(delivery))) => delivery,
                Some(Some(Err(e))) => {
                    return Err(AmqpError::Consume {
                        queue: queue.to_owned(),
                        source: Some(Arc::new(e)),
                    });
                }
                Some(None) => {
                    return Err(AmqpError::Consume {
                        queue: queue.to_owned(),
                        source: None,
                    });
                }
            };
            if delivery.redelivered {
                Counters::add(&self.counters.redelivered, 1);
            }
            let message = AmqpMessage::take(&mut delivery, None);
            let outcome =
                deliver::handle(self.retry, classifier, queue, &message, &mut *handler).await;
            match outcome {
                // Acknowledged only now: a failure before this leaves the
                // message to the broker, which delivers it again.
                Ok(()) => match delivery.acker.ack(BasicAckOptions::default()).await {
                    Ok(true) => Counters::add(&self.counters.handled, 1),
                    sent => {
                        Counters::add(&self.counters.unacknowledged, 1);
                        tracing::warn!(
                            "AMQP queue {queue}: a handled message could not be acknowledged ({}); the broker will deliver it again",
                            why_not_sent(&sent)
                        );
                    }
                },
                // Rejected without requeueing: the broker moves it to the
                // dead-letter queue, with its origin in `x-death`.
                Err(gave_up) => {
                    let reject = BasicNackOptions {
                        multiple: false,
                        requeue: false,
                    };
                    match delivery.acker.nack(reject).await {
                        Ok(true) => {
                            Counters::add(&self.counters.dead_lettered, 1);
                            tracing::warn!(
                                "AMQP queue {queue}: message given up after {} call(s): {gave_up}; dead-lettered to {}",
                                gave_up.attempts,
                                self.dead_letters
                            );
                        }
                        sent => {
                            Counters::add(&self.counters.unacknowledged, 1);
                            tracing::error!(
                                "AMQP queue {queue}: message given up after {} call(s): {gave_up}; its rejection could not be sent ({}), so the broker will deliver it again",
                                gave_up.attempts,
                                why_not_sent(&sent)
                            );
                        }
                    }
                }
            }
        }
    }
}
