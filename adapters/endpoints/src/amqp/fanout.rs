//! A fanout exchange: every bound queue gets every message. Each replica
//! binds an exclusive queue of its own, always (every replica sees every
//! message) or only while it holds the lease (one replica handles them).

use std::cell::RefCell;
use std::fmt;
use std::future::Future;
use std::sync::Arc;

use futures_lite::{StreamExt as _, future};
use guard_core::guard::ActiveConfig;
use guard_core::lock::Scope;
use guard_std::run::{Control, LeaseState};
use guard_std::{GuardConfig, Throttle};
use lapin::Consumer;
use lapin::options::{BasicAckOptions, QueueDeclareOptions};
use lapin::types::{FieldTable, ShortString};

use super::session::{self, Attempt, Session};
use super::{
    AmqpError, AmqpMessage, AmqpOptions, AmqpStats, Counters, DEFAULT_PREFETCH, checked_name,
    checked_prefetch,
};
use crate::elected;
use crate::parameter::Parameter;
use crate::runtime::{ActiveRunner, LeaseCheck};

/// Deliveries handled between two yields to the caller's executor.
const HANDLE_BURST: u32 = 32;

/// A consumer of a fanout exchange; see the [module documentation](super)
/// for what it guarantees, and what is lost during a takeover.
///
/// ```no_run
/// # smol::block_on(async {
/// use guard_endpoints::amqp::{AmqpOptions, FanoutConsumer};
/// use guard_std::GuardConfig;
///
/// # let config = GuardConfig::new();
/// let scope = config.scope("endpoint/amqp")?.segment("exchange", "alarms")?;
/// let options = AmqpOptions::new("amqp://guest:guest@127.0.0.1:5672/%2f")?;
/// let consumer = FanoutConsumer::new(options, "alarms")?.with_guard(&config, &scope)?;
/// let (_handle, control) = guard_smol::control();
/// consumer
///     .run(control, |message| async move {
///         println!("{:?} under fence {:?}", message.payload, message.fence);
///     })
///     .await?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # });
/// ```
pub struct FanoutConsumer {
    options: AmqpOptions,
    exchange: ShortString,
    prefetch: u16,
    guard: Option<ActiveRunner>,
    counters: Arc<Counters>,
}

impl fmt::Debug for FanoutConsumer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FanoutConsumer")
            .field("options", &self.options)
            .field("exchange", &self.exchange.as_str())
            .field("prefetch", &self.prefetch)
            .field("key", &self.key())
            .finish()
    }
}

impl FanoutConsumer {
    /// A consumer of the fanout exchange `exchange` (declared durable if
    /// missing) that every replica runs: each gets every message. Give it
    /// a guard ([`with_guard`](Self::with_guard)) for work that must
    /// happen once.
    pub fn new(options: AmqpOptions, exchange: &str) -> Result<Self, AmqpError> {
        Ok(FanoutConsumer {
            options,
            exchange: checked_name(Parameter::Exchange, exchange)?,
            prefetch: DEFAULT_PREFETCH,
            guard: None,
            counters: Arc::default(),
        })
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

    /// The exchange.
    pub fn exchange(&self) -> &str {
        self.exchange.as_str()
    }

    /// The lease key of a guarded consumer.
    pub fn key(&self) -> Option<&str> {
        self.guard.as_ref().map(ActiveRunner::key)
    }

    /// What the consumer has done so far.
    pub fn stats(&self) -> AmqpStats {
        self.counters.snapshot()
    }

    /// Connects, declares the exchange and disconnects: for publishers
    /// that start before any consumer (a message published to an exchange
    /// that does not exist is refused).
    pub async fn declare(&self) -> Result<(), AmqpError> {
        let session = Session::open(&self.options).await?;
        let declared = session::within(
            self.options.connect_timeout,
            "declare",
            session::declare_fanout(&session.channel, &self.exchange),
        )
        .await;
        session.close().await;
        declared
    }

    /// Runs until `control` stops it, calling `handler` for each message,
    /// one at a time, in order, and acknowledging it when the handler
    /// returns. A guarded consumer consumes only while it leads (see the
    /// [module documentation](super)); its stop closes the connection, so
    /// a message then in the handler is not finished. An unguarded one
    /// finishes the message in hand.
    ///
    /// Returns what the consumer did, or the broker's refusal to declare
    /// the exchange (one of another type, a name this user may not use),
    /// which no reconnection fixes.
    pub async fn run<H, F>(&self, control: Control, handler: H) -> Result<AmqpStats, AmqpError>
    where
        H: FnMut(AmqpMessage) -> F,
        F: Future<Output = ()>,
    {
        match &self.guard {
            None => self.run_always(control, handler).await,
            Some(runner) => self.run_elected(runner, control, handler).await,
        }
    }

    /// Binds a queue and consumes it, for as long as the connection lasts;
    /// connects again after a failure.
    async fn run_always<H, F>(
        &self,
        control: Control,
        mut handler: H,
    ) -> Result<AmqpStats, AmqpError>
    where
        H: FnMut(AmqpMessage) -> F,
        F: Future<Output = ()>,
    {
        let label = format!("exchange {}", self.exchange);
        let failures = Throttle::new();
        metrics::counter!(guard_std::metrics::ENDPOINT_DISCONNECTS, "key" => label.clone())
            .increment(0);
        loop {
            let opened = session::until_done(
                &self.options,
                &control,
                &label,
                &self.counters,
                &failures,
                || {
                    subscribe(
                        &self.options,
                        &self.exchange,
                        self.prefetch,
                        &self.counters,
                        &label,
                    )
                },
            )
            .await?;
            let Attempt::Done(mut subscription) = opened else {
                break;
            };
            let served =
                Box::pin(serve(&mut subscription, None, Some(&control), &mut handler)).await;
            subscription.close().await;
            match served {
                Ok(()) => break,
                Err(e) => {
                    self.counters.failed();
                    metrics::counter!(guard_std::metrics::ENDPOINT_DISCONNECTS, "key" => label.clone())
                        .increment(1);
                    if let Some(held) = failures.admit() {
                        log::warn!(
                            "AMQP {label}: {e}; what was published meanwhile is lost to this replica; reconnecting in {:?} ({held} more failures not logged)",
                            self.options.reconnect_delay
                        );
                    }
                    session::pause(&control, self.options.reconnect_delay).await;
                }
            }
        }
        Ok(self.stats())
    }

    /// Declares the exchange, then consumes while leading: each promotion
    /// binds a new exclusive queue on a new connection (on the lease task;
    /// a failure fails the promotion, which releases the lease), each
    /// demotion closes it.
    async fn run_elected<H, F>(
        &self,
        runner: &ActiveRunner,
        control: Control,
        handler: H,
    ) -> Result<AmqpStats, AmqpError>
    where
        H: FnMut(AmqpMessage) -> F,
        F: Future<Output = ()>,
    {
        let key = runner.key().to_owned();
        let label = format!("exchange {} (lease {key})", self.exchange);
        // Declared before the election, so a refusal is returned rather
        // than failing every promotion.
        let declared = session::until_done(
            &self.options,
            &control,
            &label,
            &self.counters,
            &Throttle::new(),
            || self.declare(),
        )
        .await?;
        if let Attempt::Stopped = declared {
            return Ok(self.stats());
        }
        metrics::counter!(guard_std::metrics::ENDPOINT_DISCONNECTS, "key" => key.clone())
            .increment(0);
        let open = {
            let (options, exchange) = (self.options.clone(), self.exchange.clone());
            let (prefetch, counters, label) = (self.prefetch, self.counters.clone(), label.clone());
            // The fence reaches the handler through the lease check, with
            // every message.
            move |_fence| {
                let (options, exchange) = (options.clone(), exchange.clone());
                let (counters, label) = (counters.clone(), label.clone());
                async move {
                    let subscribed =
                        subscribe(&options, &exchange, prefetch, &counters, &label).await;
                    match &subscribed {
                        Ok(_) => {
                            if counters.connected() {
                                log::info!("AMQP {label}: connected again");
                            }
                        }
                        Err(_) => counters.failed(),
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
        let serve_one = move |mut subscription: Subscription, lease: LeaseCheck| async move {
            let Ok(mut handler) = handler.try_borrow_mut() else {
                log::error!("AMQP {label}: two subscriptions served at once; closing this one");
                return;
            };
            let lease = (&lease, key);
            if let Err(e) = serve(&mut subscription, Some(lease), None, &mut *handler).await {
                counters.failed();
                metrics::counter!(guard_std::metrics::ENDPOINT_DISCONNECTS, "key" => key.to_owned())
                    .increment(1);
                log::warn!("AMQP {label}: {e}; what it held is lost");
            }
            // Returning steps down, which releases the lease.
        };
        elected::serve_while_leading(runner, control, &format!("AMQP {label}"), open, serve_one)
            .await;
        Ok(self.stats())
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
        while let Some(Some(Ok(_))) = future::block_on(future::poll_once(self.consumer.next())) {
            dropped += 1;
        }
        if dropped > 0 {
            Counters::add(&self.counters.dropped_on_close, dropped);
            log::warn!(
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

/// Connects, declares the exchange and an exclusive auto-delete queue
/// bound to it, and starts consuming, within the connect timeout.
async fn subscribe(
    options: &AmqpOptions,
    exchange: &ShortString,
    prefetch: u16,
    counters: &Arc<Counters>,
    label: &str,
) -> Result<Subscription, AmqpError> {
    let session = Session::open(options).await?;
    let channel = &session.channel;
    let (queue, consumer) = session::within(options.connect_timeout, "subscribe", async {
        session::declare_fanout(channel, exchange).await?;
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
            FieldTable::default(),
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
    })
}

/// Hands each delivery to `handler` and acknowledges it, until the
/// consumer ends (`Err`) or `control` stops (`Ok`, between messages). With
/// a `lease` (an elected consumer: the check and its key), a delivery is
/// handed over only if the lease is valid immediately before, with its
/// fence; one refused stays unacknowledged (the queue, and it, go with
/// the demotion that follows).
async fn serve<H, F>(
    subscription: &mut Subscription,
    lease: Option<(&LeaseCheck, &str)>,
    control: Option<&Control>,
    handler: &mut H,
) -> Result<(), AmqpError>
where
    H: FnMut(AmqpMessage) -> F,
    F: Future<Output = ()>,
{
    let counters = subscription.counters.clone();
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
        let fence = match lease {
            None => None,
            // Checked where the side effect happens: nothing is handed
            // over past the renew deadline, or once leadership has ended.
            Some((check, key)) => match check.state() {
                LeaseState::Valid(fence) => {
                    refused = 0;
                    Some(fence)
                }
                LeaseState::PastDeadline | LeaseState::NotHeld => {
                    refused += 1;
                    Counters::add(&counters.refused_late, 1);
                    guard_std::metrics::record_refused_late(key);
                    if refused == 1 {
                        log::warn!(
                            "AMQP {}: lease {key} no longer valid; refusing messages until the connection closes",
                            subscription.label
                        );
                    }
                    continue;
                }
            },
        };
        handler(AmqpMessage::take(&mut delivery, fence)).await;
        Counters::add(&counters.handled, 1);
        // Sent, not waited for: the queue is exclusive, so a closed
        // channel takes it and the message with it, and a confirmation
        // would change nothing. Not waiting also means that no wait lies
        // between one delivery's check and the next one's, so what a
        // stale replica finds buffered is refused, not handed over.
        match future::poll_once(delivery.acker.ack(BasicAckOptions::default())).await {
            None | Some(Ok(true)) => {}
            Some(Ok(false) | Err(_)) => Counters::add(&counters.unacknowledged, 1),
        }
        // A flood never starves the caller's other tasks.
        burst += 1;
        if burst == HANDLE_BURST {
            burst = 0;
            future::yield_now().await;
        }
    }
}
