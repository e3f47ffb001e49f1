//! A JetStream durable pull consumer: the server's single delivery, with
//! retries, redelivery and dead letters.
//!
//! Every replica pulls from the same durable consumer; the server
//! delivers each message to one of them and redelivers it when it is not
//! acknowledged within the consumer's `ack_wait`. Per delivery, the
//! handler is called and retried in process under the consumer's
//! [`RetryPolicy`]; then:
//!
//! - handled: acknowledged;
//! - given up on a delivery before the last (`max_deliver`): negatively
//!   acknowledged with a delay, so the server delivers it again, maybe to
//!   another replica;
//! - given up on its last delivery: published to the dead-letter subject
//!   (default `dead-letters.<stream>`, kept by a stream of its own that
//!   the consumer creates unless one already captures the subject) with
//!   its origin in headers ([`ORIGIN_STREAM`], [`ORIGIN_SEQUENCE`],
//!   [`ORIGIN_SUBJECT`], [`ERROR`], [`ATTEMPTS`], [`DELIVERIES`]), and
//!   only once the dead-letter stream has stored it, terminated (`+TERM`).
//!   If that publish fails, the message stays unacknowledged in its
//!   stream, counted in [`JetStreamStats::left_in_stream`] and logged with
//!   its sequence (the server's max-deliveries advisory names it too).
//!
//! While the handler runs, the consumer tells the server it is working
//! (`+WPI`) at least every third of `ack_wait` (one timer for the
//! consumer, not one a message), so a slow handler keeps its message.
//! Delivery is at least once: a message whose acknowledgement was lost,
//! whose replica paused past `ack_wait` mid-handler, or which waited in
//! the pulled batch behind slow handlers for longer than `ack_wait`, is
//! delivered again (choose the batch so that a batch's handling fits in
//! `ack_wait`).

use std::cell::{Cell, RefCell};
use std::fmt;
use std::future::Future;
use std::rc::Rc;
use std::time::Duration;

use async_nats::jetstream::consumer::{AckPolicy, pull};
use async_nats::jetstream::{self as js, AckKind};
use futures_lite::{StreamExt, future};
use guard_core::retry::{Classifier, RetryPolicy};
use guard_std::run::CallerRuntime;
use guard_std::run::{Control, Runtime as _};

use super::connection::{connect_until_stopped, on_tokio};
use super::{
    ATTEMPTS, DELIVERIES, ERROR, NatsError, NatsOptions, ORIGIN_SEQUENCE, ORIGIN_STREAM,
    ORIGIN_SUBJECT, checked_subject, header_value,
};
use crate::deliver::{self, GaveUp};
use crate::link::Link;
use crate::parameter::Parameter;

/// How long the server waits for an acknowledgement before it delivers a
/// message again, unless configured.
pub const DEFAULT_ACK_WAIT: Duration = Duration::from_secs(30);
/// How often a message is delivered before it is dead-lettered, unless
/// configured.
pub const DEFAULT_MAX_DELIVER: u32 = 5;
/// Messages pulled per request, unless configured.
pub const DEFAULT_BATCH: usize = 64;
/// The wait before the server delivers a given-up message again, unless
/// configured.
pub const DEFAULT_REDELIVERY_DELAY: Duration = Duration::from_secs(1);

/// One message of the stream, as the handler sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JetStreamMessage {
    /// The subject it was published on.
    pub subject: String,
    /// Its payload.
    pub payload: Vec<u8>,
    /// Its sequence number in the stream.
    pub sequence: u64,
    /// How often the server has delivered it, this delivery included.
    pub deliveries: u64,
}

/// What a consumer did, counted from its start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct JetStreamStats {
    /// Messages handled and acknowledged.
    pub handled: u64,
    /// Deliveries given up before the last one: the server delivers them
    /// again.
    pub redelivery_requested: u64,
    /// Messages given up on their last delivery, stored in the
    /// dead-letter stream and terminated.
    pub dead_lettered: u64,
    /// Messages given up on their last delivery that the dead-letter
    /// stream did not take: still in their stream, unacknowledged.
    pub left_in_stream: u64,
    /// Deliveries that were redeliveries (the server's count above 1).
    pub redelivered: u64,
}

/// [`JetStreamStats`] as the serving code counts them.
#[derive(Default)]
struct Counters {
    handled: Cell<u64>,
    redelivery_requested: Cell<u64>,
    dead_lettered: Cell<u64>,
    left_in_stream: Cell<u64>,
    redelivered: Cell<u64>,
}

impl Counters {
    fn add(counter: &Cell<u64>) {
        counter.set(counter.get() + 1);
    }

    fn stats(&self) -> JetStreamStats {
        JetStreamStats {
            handled: self.handled.get(),
            redelivery_requested: self.redelivery_requested.get(),
            dead_lettered: self.dead_lettered.get(),
            left_in_stream: self.left_in_stream.get(),
            redelivered: self.redelivered.get(),
        }
    }
}

/// A stream or consumer name: non-empty, without whitespace, `.`, `*`,
/// `>`, `/` or `\` (the server's rule).
fn checked_name(parameter: Parameter, name: &str) -> Result<String, NatsError> {
    if name.is_empty()
        || name.contains(char::is_whitespace)
        || name.contains(['.', '*', '>', '/', '\\'])
    {
        return Err(NatsError::invalid(
            parameter,
            name,
            "must be non-empty without whitespace, '.', '*', '>', '/' or '\\'",
        ));
    }
    Ok(name.to_owned())
}

/// One puller of a durable consumer; see the module documentation.
///
/// ```no_run
/// # smol::block_on(async {
/// use guard_core::retry::Classifier;
/// use guard_endpoints::nats::{JetStreamConsumer, NatsOptions};
///
/// let options = NatsOptions::new("nats://127.0.0.1:4222")?;
/// let consumer = JetStreamConsumer::new(options, "ORDERS", "billing")?
///     .with_subjects(&["orders.>"])?
///     .with_max_deliver(3)?;
/// let (_handle, control) = guard_smol::control();
/// consumer
///     .run(control, Classifier::retry_all(), |message| async move {
///         println!("#{} {:?}", message.sequence, message.payload);
///         Ok::<(), String>(())
///     })
///     .await;
/// # Ok::<(), guard_endpoints::nats::NatsError>(())
/// # });
/// ```
pub struct JetStreamConsumer {
    options: NatsOptions,
    stream: String,
    subjects: Vec<String>,
    durable: String,
    ack_wait: Duration,
    max_deliver: u32,
    batch: usize,
    redelivery_delay: Duration,
    retry: RetryPolicy,
    dead_letters: String,
    link: Option<Link>,
}

impl fmt::Debug for JetStreamConsumer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JetStreamConsumer")
            .field("server", &self.options.server())
            .field("stream", &self.stream)
            .field("durable", &self.durable)
            .field("max_deliver", &self.max_deliver)
            .field("dead_letters", &self.dead_letters)
            .finish()
    }
}

impl JetStreamConsumer {
    /// A puller of the durable consumer `durable` of `stream`, with the
    /// defaults: the stream must exist (or see
    /// [`with_subjects`](Self::with_subjects)), 30 s ack wait, 5
    /// deliveries, 64 messages a pull, 1 s before a redelivery, the
    /// original's retry policy, dead letters on `dead-letters.<stream>`.
    /// The consumer is created on first use; every replica names the
    /// same one.
    pub fn new(options: NatsOptions, stream: &str, durable: &str) -> Result<Self, NatsError> {
        let stream = checked_name(Parameter::StreamName, stream)?;
        Ok(JetStreamConsumer {
            options,
            dead_letters: format!("dead-letters.{stream}"),
            link: None,
            stream,
            subjects: Vec::new(),
            durable: checked_name(Parameter::DurableName, durable)?,
            ack_wait: DEFAULT_ACK_WAIT,
            max_deliver: DEFAULT_MAX_DELIVER,
            batch: DEFAULT_BATCH,
            redelivery_delay: DEFAULT_REDELIVERY_DELAY,
            retry: RetryPolicy::new(),
        })
    }

    /// Creates the stream with these subjects if it does not exist (an
    /// existing stream is used as it is).
    pub fn with_subjects(mut self, subjects: &[&str]) -> Result<Self, NatsError> {
        self.subjects = subjects
            .iter()
            .map(|s| checked_subject(Parameter::Subject, s, true))
            .collect::<Result<_, _>>()?;
        Ok(self)
    }

    /// How long the server waits for an acknowledgement before it
    /// delivers again (at least 100 ms). A created consumer keeps the
    /// value it was created with.
    pub fn with_ack_wait(mut self, ack_wait: Duration) -> Result<Self, NatsError> {
        if ack_wait < Duration::from_millis(100) {
            return Err(NatsError::invalid(
                Parameter::AckWait,
                format!("{ack_wait:?}"),
                "must be at least 100 ms",
            ));
        }
        self.ack_wait = ack_wait;
        Ok(self)
    }

    /// Deliveries before a failing message is dead-lettered (at least 1).
    pub fn with_max_deliver(mut self, max_deliver: u32) -> Result<Self, NatsError> {
        if max_deliver == 0 || i64::from(max_deliver) > i64::from(i32::MAX) {
            return Err(NatsError::invalid(
                Parameter::MaxDeliver,
                max_deliver.to_string(),
                "must be from 1 to 2147483647",
            ));
        }
        self.max_deliver = max_deliver;
        Ok(self)
    }

    /// Messages pulled per request (at least 1).
    pub fn with_batch(mut self, batch: usize) -> Result<Self, NatsError> {
        if batch == 0 {
            return Err(NatsError::invalid(
                Parameter::Batch,
                "0",
                "must be at least 1",
            ));
        }
        self.batch = batch;
        Ok(self)
    }

    /// The wait the server is asked for before delivering a given-up
    /// message again.
    pub fn with_redelivery_delay(mut self, delay: Duration) -> Self {
        self.redelivery_delay = delay;
        self
    }

    /// How a failing handler is retried within one delivery. Endpoints
    /// draw no random bits, so a policy with jitter is refused.
    pub fn with_retry(mut self, policy: RetryPolicy) -> Result<Self, NatsError> {
        self.retry = deliver::checked(policy).map_err(NatsError::InvalidInput)?;
        Ok(self)
    }

    /// Reports the connection to `link` (see [`crate::link`]): down from
    /// a failed connect, pull or disconnection, up again when connected.
    pub fn with_link(mut self, link: Link) -> Self {
        self.link = Some(link);
        self
    }

    /// Dead letters go to `subject` (no wildcards, outside the stream's
    /// own subjects).
    pub fn with_dead_letters(mut self, subject: &str) -> Result<Self, NatsError> {
        self.dead_letters = checked_subject(Parameter::DeadLetterSubject, subject, false)?;
        Ok(self)
    }

    /// The dead-letter subject.
    pub fn dead_letter_subject(&self) -> &str {
        &self.dead_letters
    }

    /// The stream, the dead-letter stream and the consumer: created where
    /// missing.
    async fn prepare(
        &self,
        context: &js::Context,
    ) -> Result<js::consumer::Consumer<pull::Config>, NatsError> {
        let stream = if self.subjects.is_empty() {
            context
                .get_stream(&self.stream)
                .await
                .map_err(|e| NatsError::server(format!("stream {}", self.stream), e))?
        } else {
            let config = js::stream::Config {
                name: self.stream.clone(),
                subjects: self.subjects.clone(),
                ..Default::default()
            };
            context
                .get_or_create_stream(config)
                .await
                .map_err(|e| NatsError::server(format!("stream {}", self.stream), e))?
        };
        if context.stream_by_subject(&self.dead_letters).await.is_err() {
            let config = js::stream::Config {
                name: format!("{}-dead-letters", self.stream),
                subjects: vec![self.dead_letters.clone()],
                ..Default::default()
            };
            context.get_or_create_stream(config).await.map_err(|e| {
                NatsError::server(format!("dead-letter stream for {}", self.dead_letters), e)
            })?;
        }
        let config = pull::Config {
            durable_name: Some(self.durable.clone()),
            ack_policy: AckPolicy::Explicit,
            ack_wait: self.ack_wait,
            max_deliver: i64::from(self.max_deliver),
            ..Default::default()
        };
        stream
            .get_or_create_consumer(&self.durable, config)
            .await
            .map_err(|e| NatsError::server(format!("consumer {}", self.durable), e))
    }

    /// Runs until `control` stops it, handling one message at a time in
    /// the order pulled. Server failures are logged and the consumer
    /// pulls again after the reconnect delay; a message being handled
    /// when stop comes is finished first. Returns what it did.
    pub async fn run<F, Fut, E>(
        &self,
        control: Control,
        classifier: Classifier<E>,
        handler: F,
    ) -> JetStreamStats
    where
        F: FnMut(JetStreamMessage) -> Fut,
        Fut: Future<Output = Result<(), E>>,
        E: fmt::Display,
    {
        let counters = Counters::default();
        let handler = RefCell::new(handler);
        let what = format!("jetstream {}/{}", self.stream, self.durable);
        let link = self.link.clone().unwrap_or_else(|| Link::new(&what));
        let Some(client) = connect_until_stopped(&self.options, &control, &link).await else {
            return counters.stats();
        };
        // The context starts a task of its own, on tokio.
        let context = on_tokio(async { js::new(client) }).await;
        // The delivery in the handler, for the progress reports.
        let in_flight: RefCell<Option<Rc<js::Message>>> = RefCell::new(None);
        let consume = async {
            while !control.is_stopped() {
                let pulled = on_tokio(async {
                    let consumer = self.prepare(&context).await?;
                    consumer
                        .stream()
                        .max_messages_per_batch(self.batch)
                        .messages()
                        .await
                        .map_err(|e| NatsError::server(format!("pull {what}"), e))
                })
                .await;
                let mut messages = match pulled {
                    Ok(messages) => {
                        link.up();
                        messages
                    }
                    Err(e) => {
                        let then = format!("trying again in {:?}", self.options.reconnect_delay);
                        link.down(&e, &then);
                        future::or(control.stopped(), async {
                            CallerRuntime.sleep(self.options.reconnect_delay).await;
                        })
                        .await;
                        continue;
                    }
                };
                loop {
                    let next =
                        future::or(async { on_tokio(messages.next()).await.map(Some) }, async {
                            control.stopped().await;
                            Some(None)
                        })
                        .await;
                    match next {
                        // Stopped.
                        Some(None) => return,
                        Some(Some(Ok(message))) => {
                            // A pull that failed before has recovered.
                            link.up();
                            let delivered = Rc::new(message);
                            *in_flight.borrow_mut() = Some(Rc::clone(&delivered));
                            let handled =
                                self.handle(&context, &delivered, classifier, &handler, &counters);
                            // Boxed: the handler's and the retries' futures
                            // are deep.
                            Box::pin(handled).await;
                            in_flight.borrow_mut().take();
                        }
                        Some(Some(Err(e))) => {
                            // Missed heartbeats (a server restarting) and
                            // failed pulls: the pull stream asks again by
                            // itself; a deleted consumer needs preparing.
                            link.down(&e, "the pull asks again by itself");
                            if matches!(e.kind(), pull::MessagesErrorKind::ConsumerDeleted) {
                                break;
                            }
                        }
                        // The pull stream ended: prepare and pull again.
                        None => break,
                    }
                }
            }
        };
        // One timer for the consumer's life, not one a message (each
        // timer is a wake-up of the reactor when it is set): a report is
        // due within a third of the ack wait of the handler's start and
        // of the last report, which this tick keeps.
        let progress = async {
            loop {
                CallerRuntime.sleep(self.ack_wait / 3).await;
                let current = in_flight.borrow().clone();
                if let Some(delivered) = current
                    && let Err(e) = on_tokio(delivered.ack_with(AckKind::Progress)).await
                {
                    tracing::warn!("{what}: progress: {e}");
                }
            }
        };
        future::or(consume, progress).await;
        counters.stats()
    }

    /// Handles one delivery, then acknowledges, asks for a redelivery or
    /// dead-letters it.
    async fn handle<F, Fut, E>(
        &self,
        context: &js::Context,
        delivered: &js::Message,
        classifier: Classifier<E>,
        handler: &RefCell<F>,
        counters: &Counters,
    ) where
        F: FnMut(JetStreamMessage) -> Fut,
        Fut: Future<Output = Result<(), E>>,
        E: fmt::Display,
    {
        let (sequence, deliveries) = match delivered.info() {
            Ok(info) => (
                info.stream_sequence,
                u64::try_from(info.delivered).unwrap_or(1),
            ),
            // Not a JetStream delivery (no ack subject): nothing to
            // acknowledge, so nothing the server would redeliver either.
            Err(e) => {
                tracing::error!(
                    "jetstream {}: a message without delivery information ({e}); not handled",
                    self.stream
                );
                Counters::add(&counters.left_in_stream);
                return;
            }
        };
        if deliveries > 1 {
            Counters::add(&counters.redelivered);
        }
        let message = JetStreamMessage {
            subject: delivered.subject.to_string(),
            payload: delivered.payload.to_vec(),
            sequence,
            deliveries,
        };
        // The run's progress tick keeps the message while the handler
        // works: the server restarts its ack wait at each +WPI.
        let handled = deliver::handle(self.retry, classifier, &self.stream, &message, |m| {
            // Borrowed only to make the call's future.
            (handler.borrow_mut())(m)
        })
        .await;
        let gave_up = match handled {
            Ok(()) => {
                // A lost acknowledgement means one more delivery (at least
                // once), never a loss.
                if let Err(e) = on_tokio(delivered.ack()).await {
                    tracing::warn!("jetstream {} #{sequence}: ack: {e}", self.stream);
                }
                Counters::add(&counters.handled);
                return;
            }
            Err(gave_up) => gave_up,
        };
        if deliveries < u64::from(self.max_deliver) {
            Counters::add(&counters.redelivery_requested);
            tracing::warn!(
                "jetstream {} #{sequence}: {gave_up}; delivery {deliveries} of {}, delivered again",
                self.stream,
                self.max_deliver
            );
            let nak = AckKind::Nak(Some(self.redelivery_delay));
            if let Err(e) = on_tokio(delivered.ack_with(nak)).await {
                // Redelivered after the ack wait instead.
                tracing::warn!("jetstream {} #{sequence}: nak: {e}", self.stream);
            }
            return;
        }
        match self.dead_letter(context, &message, &gave_up).await {
            Ok(()) => {
                if let Err(e) = on_tokio(delivered.ack_with(AckKind::Term)).await {
                    tracing::warn!("jetstream {} #{sequence}: term: {e}", self.stream);
                }
                Counters::add(&counters.dead_lettered);
                tracing::warn!(
                    "jetstream {} #{sequence}: {gave_up}; dead letter on {}",
                    self.stream,
                    self.dead_letters
                );
            }
            Err(e) => {
                Counters::add(&counters.left_in_stream);
                tracing::error!(
                    "jetstream {} #{sequence}: {gave_up}; the dead-letter stream refused it ({e}): left unacknowledged in the stream",
                    self.stream
                );
            }
        }
    }

    /// Publishes `message` to the dead-letter subject and waits until a
    /// stream has stored it.
    async fn dead_letter(
        &self,
        context: &js::Context,
        message: &JetStreamMessage,
        gave_up: &GaveUp,
    ) -> Result<(), NatsError> {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(ORIGIN_STREAM, self.stream.as_str());
        headers.insert(ORIGIN_SEQUENCE, message.sequence.to_string().as_str());
        headers.insert(ORIGIN_SUBJECT, header_value(&message.subject).as_str());
        headers.insert(ERROR, header_value(&gave_up.error).as_str());
        headers.insert(ATTEMPTS, gave_up.attempts.to_string().as_str());
        headers.insert(DELIVERIES, message.deliveries.to_string().as_str());
        let what = format!("dead letter to {}", self.dead_letters);
        on_tokio(async {
            let stored = context
                .publish_with_headers(
                    self.dead_letters.clone(),
                    headers,
                    message.payload.clone().into(),
                )
                .await
                .map_err(|e| NatsError::server(what.clone(), e))?;
            stored
                .await
                .map(drop)
                .map_err(|e| NatsError::server(what.clone(), e))
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options() -> NatsOptions {
        NatsOptions::new("nats://127.0.0.1:4222").unwrap()
    }

    #[test]
    fn names_and_limits_are_checked() {
        for (stream, durable) in [("", "d"), ("a.b", "d"), ("s", "a b"), ("s", "x>")] {
            let err = JetStreamConsumer::new(options(), stream, durable).unwrap_err();
            assert!(err.to_string().contains("must be non-empty"), "{err}");
        }
        let consumer = JetStreamConsumer::new(options(), "ORDERS", "billing").unwrap();
        assert_eq!(consumer.dead_letter_subject(), "dead-letters.ORDERS");
        let consumer = JetStreamConsumer::new(options(), "ORDERS", "billing").unwrap();
        let err = consumer.with_max_deliver(0).unwrap_err();
        assert!(err.to_string().contains("max deliveries 0"), "{err}");
        let consumer = JetStreamConsumer::new(options(), "ORDERS", "billing").unwrap();
        let err = consumer
            .with_ack_wait(Duration::from_millis(5))
            .unwrap_err();
        assert!(err.to_string().contains("ack wait 5ms"), "{err}");
        let consumer = JetStreamConsumer::new(options(), "ORDERS", "billing").unwrap();
        let err = consumer.with_dead_letters("dlq.>").unwrap_err();
        assert!(
            err.to_string().contains("dead-letter subject \"dlq.>\""),
            "{err}"
        );
    }
}
