//! A fanout exchange: every bound queue gets every message. Each replica
//! binds an exclusive queue of its own, always (every replica sees every
//! message) or only while it holds the lease (one replica handles them);
//! a message whose handler gave up is dead-lettered from that queue to a
//! durable queue the replicas share.

use std::cell::RefCell;
use std::fmt;
use std::future::Future;
use std::sync::Arc;

use futures_lite::{StreamExt as _, future};
use guard_core::guard::ActiveConfig;
use guard_core::lock::Scope;
use guard_core::retry::{Classifier, RetryPolicy};
use guard_std::GuardConfig;
use guard_std::run::Control;
use lapin::Consumer;
use lapin::options::{BasicAckOptions, BasicNackOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable, ShortString};

use super::session::{self, Attempt, Session};
use super::{
    AmqpError, AmqpMessage, AmqpOptions, AmqpStats, Counters, DEFAULT_PREFETCH, checked_name,
    checked_prefetch, default_dead_letters, why_not_sent,
};
use crate::deliver;
use crate::delivery::{
    self, Delivered, ElectedLease, Unhandled, UnhandledFn, UnhandledReason, UnhandledSink,
};
use crate::elected;
use crate::parameter::Parameter;
use crate::runtime::ActiveRunner;

/// Deliveries handled between two yields to the caller's executor.
const HANDLE_BURST: u32 = 32;

/// A consumer of a fanout exchange; see the [module documentation](super)
/// for what it guarantees, and what is lost during a takeover.
///
/// [`run`](Self::run) declares, before consuming, the exchange, the
/// durable dead-letter queue (`<exchange>.dead-letters` unless set) and
/// the replica's exclusive queue, with `x-dead-letter-exchange` set to the
/// default exchange and `x-dead-letter-routing-key` to the dead-letter
/// queue. The replicas share the dead-letter queue and must declare it
/// alike (the broker refuses a declaration whose arguments differ, and
/// `run` returns that refusal).
///
/// ```no_run
/// # smol::block_on(async {
/// use std::time::Duration;
/// use guard_core::retry::{Classifier, RetryPolicy};
/// use guard_endpoints::amqp::{AmqpOptions, FanoutConsumer};
/// use guard_std::GuardConfig;
///
/// # let config = GuardConfig::new();
/// let scope = config.scope("endpoint/amqp")?.segment("exchange", "alarms")?;
/// let options = AmqpOptions::new("amqp://guest:guest@127.0.0.1:5672/%2f")?;
/// let consumer = FanoutConsumer::new(options, "alarms")?
///     .with_guard(&config, &scope)?
///     .with_retry(RetryPolicy::fixed_delay(2, Duration::from_millis(100)))?;
/// // Given up after 1 + 2 calls: moved to `alarms.dead-letters`.
/// assert_eq!(consumer.dead_letter_queue(), "alarms.dead-letters");
/// let (_handle, control) = guard_smol::control();
/// consumer
///     .run(control, Classifier::retry_all(), |message| async move {
///         // Every call, retries included, under this fence.
///         println!("{:?} under fence {:?}", message.payload, message.fence);
///         Ok::<(), String>(())
///     })
///     .await?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # });
/// ```
pub struct FanoutConsumer {
    options: AmqpOptions,
    exchange: ShortString,
    dead_letters: ShortString,
    prefetch: u16,
    retry: RetryPolicy,
    guard: Option<ActiveRunner>,
    counters: Arc<Counters>,
    unhandled: Option<UnhandledFn>,
}

impl fmt::Debug for FanoutConsumer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FanoutConsumer")
            .field("options", &self.options)
            .field("exchange", &self.exchange.as_str())
            .field("dead_letters", &self.dead_letters.as_str())
            .field("prefetch", &self.prefetch)
            .field("retry", &self.retry)
            .field("key", &self.key())
            .finish()
    }
}

impl FanoutConsumer {
    /// A consumer of the fanout exchange `exchange` (declared durable if
    /// missing) that every replica runs: each gets every message. Give it
    /// a guard ([`with_guard`](Self::with_guard)) for work that must
    /// happen once. The defaults: dead letters in
    /// `<exchange>.dead-letters`, a prefetch of [`DEFAULT_PREFETCH`], the
    /// original's retry policy (3 retries from 100 ms, doubling).
    ///
    /// `exchange` is 1 to 242 bytes (its dead-letter queue's name must
    /// fit in 255), outside the broker's reserved `amq.` names.
    pub fn new(options: AmqpOptions, exchange: &str) -> Result<Self, AmqpError> {
        let name = checked_name(Parameter::Exchange, exchange)?;
        let dead_letters = default_dead_letters(Parameter::Exchange, exchange, "<exchange>")?;
        Ok(FanoutConsumer {
            options,
            exchange: name,
            dead_letters,
            prefetch: DEFAULT_PREFETCH,
            retry: RetryPolicy::new(),
            guard: None,
            counters: Arc::default(),
            unhandled: None,
        })
    }

    /// Hands every message read and not handled (its lease ended, it was
    /// buffered or in hand when the connection closed) to `to`, with its
    /// content, routing key and reason; see [`crate::delivery`]. Without
    /// it they are counted and logged only. A message whose rejection
    /// could not be sent is counted in `unacknowledged` and handed here too.
    pub fn with_unhandled(mut self, to: impl Fn(Unhandled) + Send + Sync + 'static) -> Self {
        self.unhandled = Some(Arc::new(to));
        self
    }

    /// The sink of what this consumer reads and does not handle.
    fn unhandled_sink(&self, label: &str) -> UnhandledSink {
        let key = self.key().unwrap_or(self.exchange.as_str());
        let sink = UnhandledSink::new(&format!("AMQP {label}"), key, self.unhandled.clone());
        sink.register();
        sink
    }

    /// Consumes only while this replica holds the lease of `scope` under
    /// `config`'s locker (no locker: always), with the
    /// [`ActiveRunner`](guard_std::run::ActiveRunner)'s default timing.
    pub fn with_guard(mut self, config: &GuardConfig, scope: &Scope) -> Result<Self, AmqpError> {
        self.guard = Some(ActiveRunner::new(config, scope)?);
        Ok(self)
    }

    /// Lease timing of a guarded consumer; validated.
    pub fn with_guard_settings(mut self, settings: ActiveConfig) -> Result<Self, AmqpError> {
        let Some(runner) = self.guard.take() else {
            return Err(AmqpError::invalid(
                Parameter::LeaseTiming,
                "",
                "given to a consumer without a guard",
            ));
        };
        self.guard = Some(runner.with_settings(settings)?);
        Ok(self)
    }

    /// Messages the broker sends before any is acknowledged (at least
    /// 1): what a demotion or a failure can find buffered, and lose.
    pub fn with_prefetch(mut self, prefetch: u16) -> Result<Self, AmqpError> {
        self.prefetch = checked_prefetch(prefetch)?;
        Ok(self)
    }

    /// How a failing message is retried before it is given up and
    /// dead-lettered. The consumer draws no random bits, so a policy with
    /// jitter is refused. A message being retried holds its place: the
    /// others wait behind it, in the prefetch window and then in the
    /// exclusive queue, and are lost with it if leadership ends meanwhile;
    /// keep the retries' total short beside the lease's ttl. Past the
    /// broker's `consumer_timeout` (30 minutes by default) the broker
    /// closes the channel, and the exclusive queue goes with it.
    pub fn with_retry(mut self, policy: RetryPolicy) -> Result<Self, AmqpError> {
        self.retry = deliver::checked(policy).map_err(AmqpError::InvalidInput)?;
        Ok(self)
    }

    /// Where the broker moves the messages given up: the queue `name`,
    /// declared durable (and not exclusive: every replica's queue
    /// dead-letters to it, and it outlives them). It cannot be a
    /// replica's own queue: those are named `amq.gen-…` by the broker, a
    /// namespace no name given here may use.
    pub fn with_dead_letter_queue(mut self, name: &str) -> Result<Self, AmqpError> {
        self.dead_letters = checked_name(Parameter::AmqpQueue, name)?;
        Ok(self)
    }

    /// The exchange.
    pub fn exchange(&self) -> &str {
        self.exchange.as_str()
    }

    /// The dead-letter queue.
    pub fn dead_letter_queue(&self) -> &str {
        self.dead_letters.as_str()
    }

    /// The lease key of a guarded consumer.
    pub fn key(&self) -> Option<&str> {
        self.guard.as_ref().map(ActiveRunner::key)
    }

    /// What the consumer has done so far.
    pub fn stats(&self) -> AmqpStats {
        self.counters.snapshot()
    }

    /// Connects, declares the exchange and the dead-letter queue, and
    /// disconnects: for publishers that start before any consumer (a
    /// message published to an exchange that does not exist is refused).
    pub async fn declare(&self) -> Result<(), AmqpError> {
        let session = Session::open(&self.options).await?;
        let declared = session::within(self.options.connect_timeout, "declare", async {
            session::declare_fanout(&session.channel, &self.exchange).await?;
            declare_dead_letters(&session.channel, &self.dead_letters).await
        })
        .await;
        session.close().await;
        declared
    }

    /// Runs until `control` stops it, calling `handler` for each message,
    /// one at a time, in order, retried under the consumer's policy while
    /// `classifier` allows; acknowledges a handled message, rejects a
    /// given-up one (the broker dead-letters it). A guarded consumer
    /// consumes only while it leads, and calls the handler, retries
    /// included, only under the lease its first call was made under (see
    /// the [module documentation](super)); its stop closes the connection,
    /// so a message then in the handler or its retries is not finished
    /// (counted in [`AmqpStats::dropped_on_close`]). An unguarded one
    /// finishes the message in hand, its retries included.
    ///
    /// Returns what the consumer did, or the broker's refusal to declare
    /// the exchange or the dead-letter queue (an exchange of another type,
    /// a queue that exists with other arguments, a name this user may not
    /// use), which no reconnection fixes.
    pub async fn run<F, Fut, E>(
        &self,
        control: Control,
        classifier: Classifier<E>,
        handler: F,
    ) -> Result<AmqpStats, AmqpError>
    where
        F: FnMut(AmqpMessage) -> Fut,
        Fut: Future<Output = Result<(), E>>,
        E: fmt::Display,
    {
        match &self.guard {
            None => self.run_always(control, classifier, handler).await,
            Some(runner) => self.run_elected(runner, control, classifier, handler).await,
        }
    }

    /// Binds a queue and consumes it, for as long as the connection lasts;
    /// connects again after a failure.
    async fn run_always<F, Fut, E>(
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
        let label = format!("exchange {}", self.exchange);
        let unhandled = self.unhandled_sink(&label);
        let link = self.options.link(&label);
        metrics::counter!(guard_std::metrics::ENDPOINT_DISCONNECTS, "key" => label.clone())
            .increment(0);
        loop {
            let opened =
                session::until_done(&self.options, &control, &self.counters, &link, || {
                    subscribe(
                        &self.options,
                        &self.exchange,
                        &self.dead_letters,
                        self.prefetch,
                        &self.counters,
                        &label,
                        &unhandled,
                    )
                })
                .await?;
            let Attempt::Done(mut subscription) = opened else {
                break;
            };
            // Boxed: the handler's, the retries' and lapin's futures
            // nest deep, and a caller's future would carry them inline.
            let served = Box::pin(self.serve(
                &mut subscription,
                None,
                Some(&control),
                classifier,
                &mut handler,
            ))
            .await;
            subscription.close().await;
            match served {
                Ok(()) => break,
                Err(e) => {
                    self.counters.failed();
                    metrics::counter!(guard_std::metrics::ENDPOINT_DISCONNECTS, "key" => label.clone())
                        .increment(1);
                    let then = format!(
                        "what was published meanwhile is lost to this replica; reconnecting in {:?}",
                        self.options.reconnect_delay
                    );
                    link.down(&e, &then);
                    session::pause(&control, self.options.reconnect_delay).await;
                }
            }
        }
        Ok(self.stats())
    }

    /// Declares the exchange and the dead-letter queue, then consumes
    /// while leading: each promotion binds a new exclusive queue on a new
    /// connection (on the lease task; a failure fails the promotion, which
    /// releases the lease), each demotion closes it.
    async fn run_elected<F, Fut, E>(
        &self,
        runner: &ActiveRunner,
        control: Control,
        classifier: Classifier<E>,
        handler: F,
    ) -> Result<AmqpStats, AmqpError>
    where
        F: FnMut(AmqpMessage) -> Fut,
        Fut: Future<Output = Result<(), E>>,
        E: fmt::Display,
    {
        let key = runner.key().to_owned();
        let label = format!("exchange {} (lease {key})", self.exchange);
        // Declared before the election, so a refusal is returned rather
        // than failing every promotion.
        let link = self.options.link(&label);
        let declared = session::until_done(&self.options, &control, &self.counters, &link, || {
            self.declare()
        })
        .await?;
        if let Attempt::Stopped = declared {
            return Ok(self.stats());
        }
        metrics::counter!(guard_std::metrics::ENDPOINT_DISCONNECTS, "key" => key.clone())
            .increment(0);
        let unhandled = self.unhandled_sink(&label);
        let open = {
            let unhandled = unhandled.clone();
            let (options, exchange) = (self.options.clone(), self.exchange.clone());
            let dead_letters = self.dead_letters.clone();
            let (prefetch, counters, label) = (self.prefetch, self.counters.clone(), label.clone());
            // The fence reaches the handler through the lease check, with
            // every message.
            move |_fence| {
                let (options, exchange) = (options.clone(), exchange.clone());
                let dead_letters = dead_letters.clone();
                let (counters, label) = (counters.clone(), label.clone());
                let unhandled = unhandled.clone();
                async move {
                    let subscribed = subscribe(
                        &options,
                        &exchange,
                        &dead_letters,
                        prefetch,
                        &counters,
                        &label,
                        &unhandled,
                    )
                    .await;
                    // The link logs the connection coming back, once.
                    if subscribed.is_ok() {
                        counters.connected();
                    } else {
                        counters.failed();
                    }
                    subscribed
                }
            }
        };
        // One subscription is served at a time (the previous one's future
        // is dropped before the next starts), so the handler is borrowed
        // by one at a time.
        let handler = RefCell::new(handler);
        let (handler, counters, key, label) = (&handler, &*self.counters, key.as_str(), &label);
        // Held across the serving's awaits on purpose: that is the one
        // borrow, released when the serving ends or is dropped.
        #[allow(clippy::await_holding_refcell_ref)]
        let serve_one = move |mut subscription: Subscription, lease: ElectedLease| async move {
            let Ok(mut handler) = handler.try_borrow_mut() else {
                tracing::error!("AMQP {label}: two subscriptions served at once; closing this one");
                return;
            };
            let served = Box::pin(self.serve(
                &mut subscription,
                Some(&lease),
                None,
                classifier,
                &mut *handler,
            ))
            .await;
            if let Err(e) = served {
                counters.failed();
                metrics::counter!(guard_std::metrics::ENDPOINT_DISCONNECTS, "key" => key.to_owned())
                    .increment(1);
                tracing::warn!("AMQP {label}: {e}; what it held is lost");
            }
            // Returning steps down, which releases the lease.
        };
        elected::serve_while_leading(
            runner,
            control,
            &format!("AMQP {label}"),
            &link,
            open,
            serve_one,
        )
        .await;
        Ok(self.stats())
    }

    /// Hands each delivery to `handler`, retried under the consumer's
    /// policy, and acknowledges it or, given up, rejects it (the broker
    /// dead-letters it), until the consumer ends (`Err`) or `control`
    /// stops (`Ok`, between messages). With a `lease` (an elected
    /// consumer), each delivery goes through the one elected delivery path
    /// ([`crate::delivery`]): handed over only if the lease is valid
    /// immediately before, every retry only while it still holds the same
    /// fence, and rejected (dead-lettered) only while it does; a delivery
    /// refused, or whose retries the lease's end cut short, stays
    /// unacknowledged (the queue goes with the demotion that follows) and
    /// is handed to the unhandled sink with its content.
    async fn serve<F, Fut, E>(
        &self,
        subscription: &mut Subscription,
        lease: Option<&ElectedLease>,
        control: Option<&Control>,
        classifier: Classifier<E>,
        handler: &mut F,
    ) -> Result<(), AmqpError>
    where
        F: FnMut(AmqpMessage) -> Fut,
        Fut: Future<Output = Result<(), E>>,
        E: fmt::Display,
    {
        let counters = subscription.counters.clone();
        let unhandled = subscription.unhandled.clone();
        let exchange = self.exchange.as_str();
        let mut refused = 0_u64;
        let mut burst = 0_u32;
        loop {
            let next = async { Some(subscription.consumer.next().await) };
            let next = match control {
                Some(control) => {
                    future::or(
                        async {
                            control.stopped().await;
                            None
                        },
                        next,
                    )
                    .await
                }
                None => next.await,
            };
            let mut delivery = match next {
                None => return Ok(()),
                Some(Some(Ok(delivery))) => delivery,
                Some(Some(Err(e))) => {
                    return Err(AmqpError::Consume {
                        queue: subscription.queue.to_string(),
                        source: Some(Arc::new(e)),
                    });
                }
                Some(None) => {
                    return Err(AmqpError::Consume {
                        queue: subscription.queue.to_string(),
                        source: None,
                    });
                }
            };
            if delivery.redelivered {
                Counters::add(&counters.redelivered, 1);
            }
            let label = subscription.label.as_str();
            let message = AmqpMessage::take(&mut delivery, lease);
            // From here until it is settled, a demotion or a stop that
            // drops this serving loses the message with the queue: counted
            // and handed to the unhandled sink.
            let mut in_hand = InHand {
                counters: &counters,
                label,
                message: &message,
                unhandled: &unhandled,
                settled: false,
            };
            let delivered = delivery::deliver(
                self.retry,
                classifier,
                exchange,
                lease,
                &message,
                &mut *handler,
            )
            .await;
            match delivered {
                Delivered::Handled => {
                    refused = 0;
                    // Sent, not waited for: the queue is exclusive, so a
                    // closed channel takes it and the message with it, and
                    // a confirmation would change nothing. Not waiting
                    // also means that no wait lies between one delivery's
                    // check and the next one's, so what a stale replica
                    // finds buffered is refused, not handed over.
                    match future::poll_once(delivery.acker.ack(BasicAckOptions::default())).await {
                        None | Some(Ok(true)) => Counters::add(&counters.handled, 1),
                        Some(Ok(false) | Err(_)) => Counters::add(&counters.unacknowledged, 1),
                    }
                }
                Delivered::Unhandled(reason) => {
                    // Left unacknowledged rather than requeued: the broker
                    // would hand a requeued message straight back to this
                    // consumer, to be refused again. The demotion that
                    // follows closes the connection, and the exclusive
                    // queue is deleted with it (deletion dead-letters
                    // nothing): the content goes to the unhandled sink.
                    Counters::add(&counters.refused_late, 1);
                    refused += 1;
                    if refused == 1 {
                        tracing::warn!(
                            "AMQP {label}: lease no longer valid ({reason}); refusing messages until the connection closes"
                        );
                    }
                    in_hand.hand(reason);
                }
                // Rejected without requeueing, with no wait since the
                // lease was found valid: the broker moves it to the
                // dead-letter queue, with its origin (this replica's
                // queue, the exchange) in `x-death`.
                Delivered::GaveUp(gave_up) => {
                    let reject = BasicNackOptions {
                        multiple: false,
                        requeue: false,
                    };
                    match delivery.acker.nack(reject).await {
                        Ok(true) => {
                            Counters::add(&counters.dead_lettered, 1);
                            tracing::warn!(
                                "AMQP {label}: message given up after {} call(s): {gave_up}; dead-lettered to {}",
                                gave_up.attempts,
                                self.dead_letters
                            );
                        }
                        sent => {
                            Counters::add(&counters.unacknowledged, 1);
                            in_hand.hand(UnhandledReason::GaveUp {
                                attempts: gave_up.attempts,
                                error: format!(
                                    "{}; its rejection could not be sent ({})",
                                    gave_up.error,
                                    why_not_sent(&sent)
                                ),
                            });
                        }
                    }
                }
            }
            in_hand.settled = true;
            // A flood never starves the caller's other tasks.
            burst += 1;
            if burst == HANDLE_BURST {
                burst = 0;
                future::yield_now().await;
            }
        }
    }
}

/// The message being handled (or between its retries): if the serving is
/// dropped before it is settled (a demotion, an elected consumer's stop),
/// the connection closes and the message goes with the exclusive queue;
/// it is counted in `dropped_on_close` and handed to the unhandled sink,
/// never lost silently.
struct InHand<'a> {
    counters: &'a Counters,
    label: &'a str,
    message: &'a AmqpMessage,
    unhandled: &'a UnhandledSink,
    settled: bool,
}

impl InHand<'_> {
    /// Hands the message to the unhandled sink for `reason`; settled.
    fn hand(&mut self, reason: UnhandledReason) {
        self.settled = true;
        self.unhandled.hand(unhandled(self.message, reason));
    }
}

impl Drop for InHand<'_> {
    fn drop(&mut self) {
        if !self.settled {
            Counters::add(&self.counters.dropped_on_close, 1);
            tracing::warn!(
                "AMQP {}: the connection closed while a message was in the handler or its retries; lost to this replica",
                self.label
            );
            self.unhandled
                .hand(unhandled(self.message, UnhandledReason::Demoted));
        }
    }
}

/// `message`, not handled for `reason`.
fn unhandled(message: &AmqpMessage, reason: UnhandledReason) -> Unhandled {
    Unhandled {
        origin: format!("{}/{}", message.exchange, message.routing_key),
        payload: message.payload.clone(),
        fence: message.fence,
        reason,
    }
}

/// An exclusive queue bound to the exchange, consumed on a connection of
/// its own. Dropping it closes the connection, and the broker deletes the
/// queue with what it still holds; the deliveries already buffered here
/// are counted in `dropped_on_close` first.
struct Subscription {
    consumer: Consumer,
    queue: ShortString,
    session: Option<Session>,
    counters: Arc<Counters>,
    label: String,
    unhandled: UnhandledSink,
}

impl Subscription {
    /// Counts what is buffered, then closes the connection and waits for
    /// the broker's answer.
    async fn close(mut self) {
        self.count_buffered();
        if let Some(session) = self.session.take() {
            session.close().await;
        }
    }

    /// Counts (and takes) the deliveries buffered but not handed over.
    fn count_buffered(&mut self) {
        let mut dropped = 0_u64;
        // Never waits: only what has arrived is taken.
        while let Some(Some(Ok(mut delivery))) =
            future::block_on(future::poll_once(self.consumer.next()))
        {
            dropped += 1;
            let message = AmqpMessage::take(&mut delivery, None);
            self.unhandled
                .hand(unhandled(&message, UnhandledReason::Demoted));
        }
        if dropped > 0 {
            Counters::add(&self.counters.dropped_on_close, dropped);
            tracing::warn!(
                "AMQP {}: {dropped} message(s) buffered when queue {} closed, not handled by this replica",
                self.label,
                self.queue
            );
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        // A demotion drops the subscription mid-serve: count what it held.
        self.count_buffered();
    }
}

/// Declares the durable dead-letter queue `name`: not exclusive, so
/// every replica's queue can dead-letter to it and it outlives them.
async fn declare_dead_letters(
    channel: &lapin::Channel,
    name: &ShortString,
) -> Result<(), AmqpError> {
    let durable = QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    };
    session::declare_queue(
        channel,
        "dead-letter queue",
        name,
        durable,
        FieldTable::default(),
    )
    .await?;
    Ok(())
}

/// Connects, declares the exchange, the dead-letter queue and an
/// exclusive auto-delete queue bound to the exchange that dead-letters to
/// it, and starts consuming, within the connect timeout.
async fn subscribe(
    options: &AmqpOptions,
    exchange: &ShortString,
    dead_letters: &ShortString,
    prefetch: u16,
    counters: &Arc<Counters>,
    label: &str,
    unhandled: &UnhandledSink,
) -> Result<Subscription, AmqpError> {
    let session = Session::open(options).await?;
    let channel = &session.channel;
    let (queue, consumer) = session::within(options.connect_timeout, "subscribe", async {
        session::declare_fanout(channel, exchange).await?;
        // First, so that no message is dead-lettered before it exists
        // (the broker would drop it).
        declare_dead_letters(channel, dead_letters).await?;
        let mut arguments = FieldTable::default();
        // The default exchange routes by queue name: no exchange or
        // binding to keep in step with the dead-letter queue.
        arguments.insert(
            "x-dead-letter-exchange".into(),
            AMQPValue::LongString("".into()),
        );
        arguments.insert(
            "x-dead-letter-routing-key".into(),
            AMQPValue::LongString(dead_letters.as_str().into()),
        );
        // Named by the broker; gone with the connection (exclusive) or
        // its consumer (auto-delete), so no replica leaves one behind.
        let queue = session::declare_queue(
            channel,
            "queue",
            &ShortString::default(),
            QueueDeclareOptions {
                exclusive: true,
                auto_delete: true,
                ..QueueDeclareOptions::default()
            },
            arguments,
        )
        .await?;
        session::bind(channel, &queue, exchange).await?;
        session::limit(channel, prefetch, exchange.as_str()).await?;
        let consumer = session::consume(channel, &queue).await?;
        Ok((queue, consumer))
    })
    .await?;
    Ok(Subscription {
        consumer,
        queue,
        session: Some(session),
        counters: counters.clone(),
        label: label.to_owned(),
        unhandled: unhandled.clone(),
    })
}
