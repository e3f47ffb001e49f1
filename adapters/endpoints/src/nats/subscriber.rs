//! A core NATS subscriber: a queue group member, a broadcast subscriber,
//! or the elected one.

use std::cell::{Cell, RefCell};
use std::fmt;
use std::future::Future;

use futures_lite::{StreamExt, future};
use guard_core::guard::ActiveConfig;
use guard_core::lock::Scope;
use guard_core::retry::{Classifier, RetryPolicy};
use guard_std::GuardConfig;
use guard_std::run::Control;

use super::connection::{connect_until_stopped, on_tokio};
use super::{
    ATTEMPTS, Delivery, ERROR, NatsError, NatsMessage, NatsOptions, ORIGIN_SUBJECT,
    checked_subject, header_value,
};
use crate::deliver::{self, GaveUp};
use crate::delivery::{
    self, Delivered, ElectedLease, InHand, Unhandled, UnhandledFn, UnhandledReason, UnhandledSink,
};
use crate::elected::serve_while_leading;
use crate::link::Link;
use crate::parameter::Parameter;
use crate::runtime::ActiveRunner;

/// What a subscriber did, counted from its start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NatsStats {
    /// Messages the handler took.
    pub handled: u64,
    /// Messages whose retries were spent, published to the dead-letter
    /// subject.
    pub dead_lettered: u64,
    /// Messages whose retries were spent and that no dead-letter subject
    /// took (none configured, or the publish failed): handed to the
    /// unhandled sink ([`with_unhandled`](NatsSubscriber::with_unhandled)).
    pub given_up: u64,
    /// Messages an elected subscriber refused because its lease was past
    /// its renew deadline or gone (a paused or demoted leader): the
    /// handler never saw them; handed to the unhandled sink.
    pub refused_late: u64,
    /// Messages of an elected subscriber whose lease ended while they
    /// were handled (between retries, or before the dead letter could be
    /// published under it): neither handled nor dead-lettered, handed to
    /// the unhandled sink.
    pub lease_lost: u64,
}

/// [`NatsStats`] as the serving code counts them.
#[derive(Default)]
struct Counters {
    handled: Cell<u64>,
    dead_lettered: Cell<u64>,
    given_up: Cell<u64>,
    refused_late: Cell<u64>,
    lease_lost: Cell<u64>,
}

impl Counters {
    fn add(counter: &Cell<u64>) {
        counter.set(counter.get() + 1);
    }

    fn stats(&self) -> NatsStats {
        NatsStats {
            handled: self.handled.get(),
            dead_lettered: self.dead_lettered.get(),
            given_up: self.given_up.get(),
            refused_late: self.refused_late.get(),
            lease_lost: self.lease_lost.get(),
        }
    }
}

/// One subscription to a core NATS subject; see the
/// [module documentation](super) for which [`Delivery`] to use.
pub struct NatsSubscriber {
    options: NatsOptions,
    subject: String,
    delivery: Delivery,
    retry: RetryPolicy,
    dead_letters: Option<String>,
    guard: Option<ActiveRunner>,
    unhandled: Option<UnhandledFn>,
    link: Option<Link>,
}

impl fmt::Debug for NatsSubscriber {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NatsSubscriber")
            .field("server", &self.options.server())
            .field("subject", &self.subject)
            .field("delivery", &self.delivery)
            .field("dead_letters", &self.dead_letters)
            .finish()
    }
}

impl NatsSubscriber {
    /// A subscriber of `subject` (wildcards allowed) with `delivery`, the
    /// original's retry policy and no dead-letter subject. An
    /// [`Delivery::Elected`] subscriber needs [`with_guard`](Self::with_guard)
    /// before it runs.
    pub fn new(options: NatsOptions, subject: &str, delivery: Delivery) -> Result<Self, NatsError> {
        Ok(NatsSubscriber {
            options,
            subject: checked_subject(Parameter::Subject, subject, true)?,
            delivery,
            retry: RetryPolicy::new(),
            dead_letters: None,
            guard: None,
            unhandled: None,
            link: None,
        })
    }

    /// Subscribes only while this replica holds the lease of `scope`
    /// under `config`'s locker (no locker: always). Only for
    /// [`Delivery::Elected`]: a queue group is delivered once already,
    /// and a broadcast is meant for every replica.
    pub fn with_guard(mut self, config: &GuardConfig, scope: &Scope) -> Result<Self, NatsError> {
        if self.delivery != Delivery::Elected {
            return Err(NatsError::invalid(
                Parameter::GuardedSubscription,
                format!("{:?}", self.delivery),
                "only an elected subscriber takes a guard (a queue group delivers once already)",
            ));
        }
        self.guard = Some(ActiveRunner::new(config, scope).map_err(NatsError::Guard)?);
        Ok(self)
    }

    /// Lease timing of an elected subscriber; validated.
    pub fn with_guard_settings(mut self, settings: ActiveConfig) -> Result<Self, NatsError> {
        let Some(runner) = self.guard.take() else {
            return Err(NatsError::invalid(
                Parameter::LeaseTiming,
                "",
                "given to a subscriber without a guard",
            ));
        };
        self.guard = Some(runner.with_settings(settings).map_err(NatsError::Guard)?);
        Ok(self)
    }

    /// How a failing handler is retried before the message is given up.
    /// Endpoints draw no random bits, so a policy with jitter is refused.
    pub fn with_retry(mut self, policy: RetryPolicy) -> Result<Self, NatsError> {
        self.retry = deliver::checked(policy).map_err(NatsError::InvalidInput)?;
        Ok(self)
    }

    /// Publishes given-up messages to `subject` (no wildcards), with the
    /// headers [`ORIGIN_SUBJECT`], [`ERROR`] and [`ATTEMPTS`]. Core NATS
    /// keeps nothing: let a JetStream stream capture the subject.
    pub fn with_dead_letters(mut self, subject: &str) -> Result<Self, NatsError> {
        self.dead_letters = Some(checked_subject(
            Parameter::DeadLetterSubject,
            subject,
            false,
        )?);
        Ok(self)
    }

    /// Hands every message read and not handled (its lease ended, its
    /// retries were spent with no dead-letter subject to take it) to
    /// `to`, with its content, subject and reason; see
    /// [`crate::delivery`]. Without it they are counted and logged only.
    pub fn with_unhandled(mut self, to: impl Fn(Unhandled) + Send + Sync + 'static) -> Self {
        self.unhandled = Some(std::sync::Arc::new(to));
        self
    }

    /// Reports the connection to `link` (see [`crate::link`]): down from
    /// a failed connect or a disconnection, up again when connected.
    pub fn with_link(mut self, link: Link) -> Self {
        self.link = Some(link);
        self
    }

    /// The subject.
    pub fn subject(&self) -> &str {
        &self.subject
    }

    /// The lease key of an elected subscriber.
    pub fn key(&self) -> Option<&str> {
        self.guard.as_ref().map(ActiveRunner::key)
    }

    /// Runs until `control` stops it, calling `handler` for each message,
    /// one at a time, in the order received; retried under the policy,
    /// then dead-lettered. Returns what it did.
    ///
    /// An elected subscriber without a guard is refused at once (logged,
    /// nothing counted): it would subscribe on every replica.
    pub async fn run<F, Fut, E>(
        &self,
        control: Control,
        classifier: Classifier<E>,
        handler: F,
    ) -> NatsStats
    where
        F: FnMut(NatsMessage) -> Fut,
        Fut: Future<Output = Result<(), E>>,
        E: fmt::Display,
    {
        let counters = Counters::default();
        let handler = RefCell::new(handler);
        let what = format!("nats {}", self.subject);
        let unhandled = UnhandledSink::new(
            &what,
            self.key().unwrap_or(&self.subject),
            self.unhandled.clone(),
        );
        unhandled.register();
        let unhandled = &unhandled;
        let link = self.link.clone().unwrap_or_else(|| Link::new(&what));
        let Some(client) = connect_until_stopped(&self.options, &control, &link).await else {
            return counters.stats();
        };
        match (&self.delivery, &self.guard) {
            (Delivery::Elected, None) => {
                link.stopped(&"an elected subscriber needs with_guard; not subscribing");
            }
            (Delivery::Elected, Some(runner)) => {
                let (subject, opener) = (self.subject.clone(), client.clone());
                let open = move |_fence| {
                    let (client, subject) = (opener.clone(), subject.clone());
                    on_tokio(async move {
                        let subscriber = client
                            .subscribe(subject.clone())
                            .await
                            .map_err(|e| NatsError::server(format!("subscribe {subject}"), e))?;
                        // The server has the subscription once it answered
                        // the PING that follows it: only then does the
                        // promotion count.
                        client
                            .flush()
                            .await
                            .map_err(|e| NatsError::server(format!("subscribe {subject}"), e))?;
                        Ok::<_, NatsError>(subscriber)
                    })
                };
                let (client, handler, counters) = (&client, &handler, &counters);
                let serve = move |subscriber, lease| {
                    self.serve(
                        client,
                        subscriber,
                        Some(lease),
                        classifier,
                        handler,
                        counters,
                        unhandled,
                    )
                };
                serve_while_leading(runner, control, &what, &link, open, serve).await;
            }
            (delivery, _) => {
                let subscribed = on_tokio(async {
                    let subscriber = match delivery {
                        Delivery::QueueGroup(group) => {
                            client
                                .queue_subscribe(self.subject.clone(), group.clone())
                                .await
                        }
                        _ => client.subscribe(self.subject.clone()).await,
                    };
                    subscriber.map_err(|e| NatsError::server(format!("subscribe {what}"), e))
                })
                .await;
                match subscribed {
                    Ok(subscriber) => {
                        let serve = self.serve(
                            &client, subscriber, None, classifier, &handler, &counters, unhandled,
                        );
                        future::or(control.stopped(), serve).await;
                    }
                    Err(e) => link.stopped(&e),
                }
            }
        }
        counters.stats()
    }

    /// Serves one subscription until it ends: for an elected subscriber,
    /// each message through the one elected delivery path
    /// ([`crate::delivery`]) under `lease`.
    #[allow(clippy::too_many_arguments)]
    async fn serve<F, Fut, E>(
        &self,
        client: &async_nats::Client,
        subscriber: async_nats::Subscriber,
        lease: Option<ElectedLease>,
        classifier: Classifier<E>,
        handler: &RefCell<F>,
        counters: &Counters,
        unhandled: &UnhandledSink,
    ) where
        F: FnMut(NatsMessage) -> Fut,
        Fut: Future<Output = Result<(), E>>,
        E: fmt::Display,
    {
        let mut late = 0_u64;
        // A demotion drops this serving: what the subscription holds then
        // is handed over, never dropped with it.
        let mut served = Served {
            subscriber,
            unhandled,
            fence: lease.as_ref().map(ElectedLease::fence),
            counters,
        };
        // Ends when the subscription closes (the client was closed).
        while let Some(message) = on_tokio(served.subscriber.next()).await {
            let message = NatsMessage {
                subject: message.subject.to_string(),
                payload: message.payload.to_vec(),
                fence: lease.as_ref().map(ElectedLease::fence),
                lease: lease.clone(),
            };
            // A demotion drops this serving, maybe between two calls: what
            // is in hand then is handed over, counted.
            let in_hand = InHand::new(
                unhandled,
                &message,
                lease.as_ref(),
                |m: &NatsMessage| (m.subject.clone(), m.payload.clone(), m.fence),
                || Counters::add(&counters.lease_lost),
            );
            let delivered = delivery::deliver(
                self.retry,
                classifier,
                &self.subject,
                lease.as_ref(),
                &message,
                |m| {
                    // Borrowed only to make the call's future.
                    (handler.borrow_mut())(m)
                },
            )
            .await;
            in_hand.settle();
            let reason = match delivered {
                Delivered::Handled => {
                    late = 0;
                    Counters::add(&counters.handled);
                    continue;
                }
                // Written at once: the lease was valid when this was decided.
                Delivered::GaveUp(gave_up) => {
                    match self.dead_letter(client, &message, &gave_up).await {
                        Ok(()) => {
                            Counters::add(&counters.dead_lettered);
                            continue;
                        }
                        Err(reason) => {
                            Counters::add(&counters.given_up);
                            reason
                        }
                    }
                }
                Delivered::Unhandled(reason) => {
                    match reason {
                        UnhandledReason::LeaseLost { .. } => Counters::add(&counters.lease_lost),
                        _ => Counters::add(&counters.refused_late),
                    }
                    late += 1;
                    if late == 1 {
                        tracing::warn!(
                            "nats {}: lease no longer valid ({reason}); refusing messages until demoted",
                            self.subject
                        );
                    }
                    reason
                }
            };
            unhandled.hand(Unhandled {
                origin: message.subject,
                payload: message.payload,
                fence: message.fence,
                reason,
            });
        }
    }

    /// Publishes a given-up message to the dead-letter subject; the
    /// reason to hand it to the unhandled sink when there is none or the
    /// publish failed.
    async fn dead_letter(
        &self,
        client: &async_nats::Client,
        message: &NatsMessage,
        gave_up: &GaveUp,
    ) -> Result<(), UnhandledReason> {
        let Some(subject) = &self.dead_letters else {
            return Err(UnhandledReason::GaveUp {
                attempts: gave_up.attempts,
                error: gave_up.error.clone(),
            });
        };
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(ORIGIN_SUBJECT, header_value(&message.subject).as_str());
        headers.insert(ERROR, header_value(&gave_up.error).as_str());
        headers.insert(ATTEMPTS, gave_up.attempts.to_string().as_str());
        let payload = message.payload.clone().into();
        let published = on_tokio(async {
            client
                .publish_with_headers(subject.clone(), headers, payload)
                .await
                .map_err(|e| e.to_string())?;
            client.flush().await.map_err(|e| e.to_string())
        })
        .await;
        match published {
            Ok(()) => {
                tracing::warn!(
                    "nats {}: {gave_up}; published to {subject}",
                    message.subject
                );
                Ok(())
            }
            Err(e) => Err(UnhandledReason::GaveUp {
                attempts: gave_up.attempts,
                error: format!(
                    "{}; dead-letter subject {subject} failed: {e}",
                    gave_up.error
                ),
            }),
        }
    }
}

/// A subscription being served. Dropped (a demotion drops the serving),
/// it hands what it has received and not yet served to the unhandled
/// sink, counted as refused: those messages were read by this replica
/// and reach no other.
struct Served<'a> {
    subscriber: async_nats::Subscriber,
    unhandled: &'a UnhandledSink,
    fence: Option<u64>,
    counters: &'a Counters,
}

impl Drop for Served<'_> {
    fn drop(&mut self) {
        // Never waits: only what has arrived is taken.
        while let Some(Some(message)) =
            future::block_on(on_tokio(future::poll_once(self.subscriber.next())))
        {
            Counters::add(&self.counters.refused_late);
            self.unhandled.hand(Unhandled {
                origin: message.subject.to_string(),
                payload: message.payload.to_vec(),
                fence: self.fence,
                reason: UnhandledReason::Demoted,
            });
        }
    }
}
