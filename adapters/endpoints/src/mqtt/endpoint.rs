//! The endpoint: subscribe always (shared or broadcast), or only while
//! this replica holds the lease (guarded plain subscription).

use guard_std::run::CallerRuntime;
use guard_std::run::Runtime as _;
use std::future::Future;

use std::cell::RefCell;
use std::fmt;

use futures_lite::future;
use guard_core::guard::{ActiveConfig, DemoteReason};
use guard_core::lock::Scope;
use guard_core::retry::{Classifier, RetryPolicy};
use guard_std::run::Control;

use crate::runtime::ActiveRunner;
use guard_std::GuardConfig;

use super::connection::Connection;
use super::{MqttError, MqttMessage, MqttOptions, Subscription};
use crate::deliver;
use crate::delivery::{
    self, Delivered, ElectedLease, Unhandled, UnhandledFn, UnhandledReason, UnhandledSink,
};
use crate::lease_thread::{self, StopOnDrop};
use crate::link::Link;
use crate::parameter::Parameter;

/// An MQTT subscription served by one replica; see the crate
/// documentation for which kind to use.
pub struct MqttEndpoint {
    options: MqttOptions,
    subscription: Subscription,
    guard: Option<ActiveRunner>,
    retry: RetryPolicy,
    unhandled: Option<UnhandledFn>,
    /// Made at the run unless given: a link publishes its metrics when
    /// made, and one replaced by [`with_link`](Self::with_link) would
    /// leave a stale series.
    link: Option<Link>,
}

impl std::fmt::Debug for MqttEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MqttEndpoint")
            .field("options", &self.options)
            .field("subscription", &self.subscription)
            .field("guard", &self.guard)
            .field("retry", &self.retry)
            .field("unhandled", &self.unhandled.is_some())
            .field("link", &self.link)
            .finish()
    }
}

/// What woke the serving side of a guarded endpoint.
enum Next {
    Ended(super::connection::Ended),
    Command(Result<Option<Promotion>, async_channel::RecvError>),
}

/// A connection opened on promotion, the lease's fence, and where to
/// confirm its subscription.
type Promotion = (
    Box<Connection>,
    u64,
    async_channel::Sender<Result<(), MqttError>>,
);

impl MqttEndpoint {
    /// An endpoint that always subscribes, with the original's retry
    /// policy for [`try_run`](Self::try_run).
    pub fn new(options: MqttOptions, subscription: Subscription) -> Self {
        MqttEndpoint {
            options,
            subscription,
            guard: None,
            retry: RetryPolicy::new(),
            unhandled: None,
            link: None,
        }
    }

    /// Reports the connection to `link` (see [`crate::link`]): down from
    /// a failed connect, a refused subscription or a connection that
    /// ended, up again at the next confirmed subscription.
    pub fn with_link(mut self, link: Link) -> Self {
        self.link = Some(link);
        self
    }

    /// The link given, or one of this run's own named after the filter.
    fn link(&self) -> Link {
        self.link
            .clone()
            .unwrap_or_else(|| Link::new(&format!("MQTT {}", self.subscription.topic_filter())))
    }

    /// How [`try_run`](Self::try_run) retries a failing handler before the
    /// message is given up. Endpoints draw no random bits, so a policy
    /// with jitter is refused.
    pub fn with_retry(mut self, policy: RetryPolicy) -> Result<Self, MqttError> {
        self.retry = deliver::checked(policy).map_err(MqttError::InvalidInput)?;
        Ok(self)
    }

    /// Hands every message the endpoint reads and does not handle to `to`,
    /// with its content, topic and reason (see [`crate::delivery`]): a
    /// guarded endpoint's whose lease was past its renew deadline or
    /// gone, and under [`try_run`](Self::try_run) one whose retries were
    /// spent. It is handed over before the message is acknowledged: MQTT
    /// keeps no dead letters, so this is the endpoint's dead-letter
    /// destination. Without it they are counted and logged only.
    pub fn with_unhandled(mut self, to: impl Fn(Unhandled) + Send + Sync + 'static) -> Self {
        self.unhandled = Some(std::sync::Arc::new(to));
        self
    }

    /// Subscribes only while this replica holds the lease of `scope` under
    /// `config`'s locker (no locker: always). Only for a plain
    /// subscription: a shared one is delivered once already.
    pub fn with_guard(mut self, config: &GuardConfig, scope: &Scope) -> Result<Self, MqttError> {
        if let Subscription::Shared { .. } = &self.subscription {
            return Err(MqttError::invalid(
                Parameter::GuardedSubscription,
                self.subscription.topic_filter(),
                "a shared subscription is delivered to one member already; it takes no guard",
            ));
        }
        let runner = ActiveRunner::new(config, scope).map_err(MqttError::Guard)?;
        self.guard = Some(runner);
        Ok(self)
    }

    /// Lease timing of a guarded endpoint; validated.
    pub fn with_guard_settings(mut self, settings: ActiveConfig) -> Result<Self, MqttError> {
        let Some(runner) = self.guard.take() else {
            return Err(MqttError::invalid(
                Parameter::LeaseTiming,
                "",
                "given to an endpoint without a guard",
            ));
        };
        let runner = runner.with_settings(settings).map_err(MqttError::Guard)?;
        self.guard = Some(runner);
        Ok(self)
    }

    /// The subscription.
    pub fn subscription(&self) -> &Subscription {
        &self.subscription
    }

    /// Runs until `control` stops it, calling `handler` for each message
    /// (one at a time; acknowledged when it returns). Stop closes the
    /// connection: a message being handled then is left unacknowledged.
    pub async fn run<H, F>(&self, control: Control, handler: H)
    where
        H: FnMut(MqttMessage) -> F,
        F: Future<Output = ()>,
    {
        match &self.guard {
            None => self.run_always(control, handler).await,
            Some(runner) => self.run_guarded(runner, control, handler).await,
        }
    }

    /// Like [`run`](Self::run), for a handler that can fail: a failing
    /// call is retried under the endpoint's policy
    /// ([`with_retry`](Self::with_retry)) while `classifier` allows, and
    /// a message whose retries are spent is handed whole to the
    /// [`with_unhandled`](Self::with_unhandled) function, with
    /// [`UnhandledReason::GaveUp`], before it is acknowledged. A guarded
    /// endpoint checks the lease before every call, as the elected
    /// delivery path does ([`crate::delivery`]).
    ///
    /// ```no_run
    /// # use guard_endpoints::mqtt::{MqttEndpoint, MqttOptions, Subscription};
    /// # use guard_core::retry::Classifier;
    /// # async fn example(control: guard_std::run::Control) -> Result<(), Box<dyn std::error::Error>> {
    /// let options = MqttOptions::new("127.0.0.1", 1883, "gateway-1")?;
    /// let endpoint = MqttEndpoint::new(options, Subscription::shared("gateways", "orders/#")?)
    ///     .with_unhandled(|given_up| eprintln!("dead letter from {}", given_up.origin));
    /// endpoint
    ///     .try_run(control, Classifier::retry_all(), |message| async move {
    ///         if message.payload.is_empty() { Err("empty order") } else { Ok(()) }
    ///     })
    ///     .await;
    /// # Ok(()) }
    /// ```
    pub async fn try_run<H, F, E>(&self, control: Control, classifier: Classifier<E>, handler: H)
    where
        H: FnMut(MqttMessage) -> F,
        F: Future<Output = Result<(), E>>,
        E: fmt::Display,
    {
        let filter = self.subscription.topic_filter();
        let key = self
            .guard
            .as_ref()
            .map_or(filter.as_str(), |runner| runner.key());
        let given_up = UnhandledSink::new(&format!("MQTT {filter}"), key, self.unhandled.clone());
        given_up.register();
        // Borrowed only to make each call's future, never across a wait.
        let handler = RefCell::new(handler);
        let (policy, handler, given_up) = (self.retry, &handler, &given_up);
        let label = filter.as_str();
        self.run(control, |message: MqttMessage| async move {
            let call = |m: MqttMessage| (handler.borrow_mut())(m);
            let lease = message.lease.clone();
            let delivered =
                delivery::deliver(policy, classifier, label, lease.as_ref(), &message, call).await;
            let reason = match delivered {
                Delivered::Handled => return,
                Delivered::GaveUp(gave_up) => UnhandledReason::GaveUp {
                    attempts: gave_up.attempts,
                    error: gave_up.error,
                },
                Delivered::Unhandled(reason) => reason,
            };
            given_up.hand(Unhandled {
                origin: message.topic,
                payload: message.payload,
                fence: message.fence,
                reason,
            });
        })
        .await;
    }

    /// Connects, subscribes and serves; reconnects after a failure.
    async fn run_always<H, F>(&self, control: Control, mut handler: H)
    where
        H: FnMut(MqttMessage) -> F,
        F: Future<Output = ()>,
    {
        let filter = self.subscription.topic_filter();
        let link = self.link();
        while !control.is_stopped() {
            let attempt = async {
                let connection = Connection::open(&self.options).await?;
                let (subscribed, _) = async_channel::bounded(1);
                Err::<(), _>(
                    connection
                        .serve(&filter, None, &link, &mut handler, subscribed)
                        .await
                        .error,
                )
            };
            let stopped = async {
                control.stopped().await;
                Ok(())
            };
            if let Err(e) = future::or(stopped, attempt).await {
                let then = format!("reconnecting in {:?}", self.options.reconnect_delay);
                link.down(&e, &then);
                future::or(control.stopped(), async {
                    CallerRuntime.sleep(self.options.reconnect_delay).await;
                })
                .await;
            }
        }
    }

    /// Subscribes while leading: promotion connects and waits for the
    /// SUBACK (a refusal or time-out fails the promotion, which releases
    /// the lease); demotion drops the connection; a connection that ends
    /// while leading demotes. The runner keeps the lease on a thread of
    /// its own (see [`crate::lease_thread`]): a handler that blocks delays
    /// the messages behind it, never a renewal.
    async fn run_guarded<H, F>(&self, runner: &ActiveRunner, control: Control, mut handler: H)
    where
        H: FnMut(MqttMessage) -> F,
        F: Future<Output = ()>,
    {
        let filter = self.subscription.topic_filter();
        let (own, linked) = control.linked();
        let _stop = StopOnDrop(own.clone());
        // A clone runs on the lease thread; its lease view is the one
        // checked here.
        let runner = runner.clone();
        let lease = runner.lease_check();
        let key = runner.key().to_owned();
        let unhandled = UnhandledSink::new(&format!("MQTT {filter}"), &key, self.unhandled.clone());
        unhandled.register();
        let options = self.options.clone();
        let link = self.link();
        let lease_link = link.clone();
        let (tx, rx) = async_channel::unbounded::<Option<Promotion>>();
        let elect = move || async move {
            let (promoted, demoted) = (tx.clone(), tx);
            let (options, link) = (&options, &lease_link);
            runner
                .run(
                    linked,
                    move |fence| {
                        let tx = promoted.clone();
                        async move {
                            let connection = Connection::open(options).await.inspect_err(|e| {
                                link.down(e, "the promotion fails, the lease is released");
                            })?;
                            let (confirm, confirmed) = async_channel::bounded(1);
                            // The receiver lives until the runner returns.
                            tx.send(Some((Box::new(connection), fence, confirm)))
                                .await
                                .ok();
                            let answer = async {
                                confirmed
                                    .recv()
                                    .await
                                    .unwrap_or(Err(MqttError::Closed(None)))
                            };
                            future::or(answer, async {
                                CallerRuntime.sleep(options.connect_timeout).await;
                                Err(MqttError::Timeout(options.connect_timeout))
                            })
                            .await
                        }
                    },
                    move |reason| {
                        let tx = demoted.clone();
                        // A standby connects to nothing: not failing,
                        // unless its last attempt (this promotion) failed.
                        if reason != DemoteReason::PromoteFailed {
                            link.up();
                        }
                        async move {
                            tx.send(None).await.ok();
                        }
                    },
                )
                .await;
            // Both senders drop with the callbacks: serving ends.
        };
        let thread = match lease_thread::spawn("mqtt-lease", elect) {
            Ok(thread) => thread,
            Err(e) => {
                tracing::error!("MQTT {filter}: cannot start its lease thread: {e}");
                return;
            }
        };
        let mut next_connection: Option<Promotion> = None;
        loop {
            let (connection, fence, confirm) = match next_connection.take() {
                Some(promotion) => promotion,
                None => match rx.recv().await {
                    Ok(Some(promotion)) => promotion,
                    Ok(None) => continue,
                    Err(_) => break,
                },
            };
            let next = future::or(
                async {
                    Next::Ended(
                        (*connection)
                            .serve(
                                &filter,
                                Some((&ElectedLease::new(lease.clone(), fence, &key), &unhandled)),
                                &link,
                                &mut handler,
                                confirm,
                            )
                            .await,
                    )
                },
                async { Next::Command(rx.recv().await) },
            )
            .await;
            match next {
                Next::Ended(ended) => {
                    link.down(&ended.error, "stepping down");
                    // An unconfirmed subscription failed the promotion
                    // already; a confirmed one that ended steps down.
                    if ended.confirmed {
                        own.demote();
                    }
                }
                Next::Command(Ok(promotion)) => next_connection = promotion,
                Next::Command(Err(_)) => break,
            }
        }
        // The runner has returned once the channel closed.
        if !thread.join().await {
            tracing::error!("MQTT {filter}: its lease thread panicked");
        }
    }
}
