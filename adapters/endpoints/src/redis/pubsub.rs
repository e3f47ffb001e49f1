//! A Redis Pub/Sub endpoint with one active subscriber across replicas.
//!
//! Pub/Sub broadcasts: every subscribed replica gets every message. The
//! endpoint therefore subscribes only while its replica holds the
//! endpoint's lease (an [`ActiveRunner`]): promotion subscribes to every
//! pattern and waits for the confirmations; demotion closes the
//! subscription; a subscription that cannot be confirmed fails the
//! promotion, which releases the lease so another replica can take over;
//! a subscription that dies while the lease still renews demotes.
//!
//! Every message is checked against the lease immediately before the
//! handler is called ([`guard_smol::LeaseCheck`]): after a pause, messages
//! buffered on the socket are refused (counted, logged) once the renew
//! deadline has passed on this replica's monotonic clock, even before the
//! runner has noticed and demoted. The standby that took over handles its
//! own copy of them.
//!
//! Pub/Sub keeps nothing: messages published while no replica is
//! subscribed (a failover, a restart) are lost. The guard removes
//! duplicate consumption; it does not make Pub/Sub at-least-once. Use a
//! stream and [`super::StreamConsumer`] where messages must not be lost.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use futures_lite::{StreamExt, future};
use guard_core::guard::ActiveConfig;
use guard_core::lock::Scope;
use guard_smol::{ActiveRunner, Control};
use guard_std::GuardConfig;
use redis::aio::PubSubStream;

use guard_redis::RedisGuardError;

use super::EndpointError;
use crate::parameter::Parameter;

/// The original's limit on waiting for the subscription confirmations.
pub const DEFAULT_CONFIRM_TIMEOUT: Duration = Duration::from_secs(3);

/// One message, as the handler sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PubSubMessage {
    /// The channel it was published on.
    pub channel: String,
    /// The pattern that matched it.
    pub pattern: Option<String>,
    /// Its payload.
    pub payload: Vec<u8>,
    /// The fence of the lease, checked valid immediately before the
    /// handler was called (0 without a locker): pass it to a resource
    /// that refuses stale leaders.
    pub fence: u64,
}

/// A Pub/Sub subscriber elected among replicas; see the module
/// documentation.
///
/// ```no_run
/// # smol::block_on(async {
/// use guard_endpoints::redis::PubSubEndpoint;
/// use guard_std::GuardConfig;
///
/// # let config = GuardConfig::new();
/// let scope = config.scope("endpoint/redis")?.segment("node", "sensors-in")?;
/// let endpoint = PubSubEndpoint::new("redis://127.0.0.1:6379/", &config, &scope, &["sensors.*"])?;
/// let (_handle, control) = guard_smol::control();
/// endpoint
///     .run(control, |message| async move { println!("{}: {:?}", message.channel, message.payload) })
///     .await;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # });
/// ```
pub struct PubSubEndpoint {
    client: redis::Client,
    patterns: Vec<String>,
    runner: ActiveRunner,
    confirm_timeout: Duration,
}

impl fmt::Debug for PubSubEndpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PubSubEndpoint")
            .field("patterns", &self.patterns)
            .field("key", &self.runner.key())
            .finish()
    }
}

/// What woke the consuming side.
enum Next {
    Message(Option<redis::Msg>),
    Subscription(Result<Option<PubSubStream>, async_channel::RecvError>),
}

impl PubSubEndpoint {
    /// An endpoint on the server at `url` for `patterns` (`PSUBSCRIBE`
    /// syntax), elected under `scope` with `config`'s locker (no locker:
    /// it always subscribes). The default lease timing is the
    /// [`ActiveRunner`]'s.
    pub fn new(
        url: &str,
        config: &GuardConfig,
        scope: &Scope,
        patterns: &[&str],
    ) -> Result<Self, EndpointError> {
        if patterns.is_empty() || patterns.iter().any(|p| p.is_empty()) {
            return Err(EndpointError::invalid(
                Parameter::Patterns,
                format!("{patterns:?}"),
                "must be at least one, none empty",
            ));
        }
        let client = redis::Client::open(url)?;
        let runner = ActiveRunner::new(config, scope)?;
        Ok(PubSubEndpoint {
            client,
            patterns: patterns.iter().map(|p| (*p).to_owned()).collect(),
            runner,
            confirm_timeout: DEFAULT_CONFIRM_TIMEOUT,
        })
    }

    /// Lease timing; validated.
    pub fn with_settings(mut self, settings: ActiveConfig) -> Result<Self, EndpointError> {
        self.runner = self.runner.with_settings(settings)?;
        Ok(self)
    }

    /// How long connecting and confirming the subscriptions may take.
    pub fn with_confirm_timeout(mut self, timeout: Duration) -> Self {
        self.confirm_timeout = timeout;
        self
    }

    /// The lease key.
    pub fn key(&self) -> &str {
        self.runner.key()
    }

    /// Connects and subscribes to every pattern, each confirmed, within
    /// the confirm timeout.
    async fn subscribe(&self) -> Result<PubSubStream, RedisGuardError> {
        let subscribe = async {
            let mut pubsub = self.client.get_async_pubsub().await?;
            // The sink waits for each confirmation.
            pubsub.psubscribe(&self.patterns).await?;
            Ok(pubsub.into_on_message())
        };
        future::or(subscribe, async {
            async_io::Timer::after(self.confirm_timeout).await;
            Err(RedisGuardError::Timeout(self.confirm_timeout))
        })
        .await
    }

    /// Runs until `control` stops it: subscribes while this replica leads
    /// and calls `handler` for each message, one at a time.
    pub async fn run<H, F>(&self, control: Control, mut handler: H)
    where
        H: FnMut(PubSubMessage) -> F,
        F: Future<Output = ()>,
    {
        // Our own handle demotes the runner when the subscription dies.
        let (own, linked) = control.linked();
        let lease = self.runner.lease_check();
        let (tx, rx) = async_channel::unbounded::<Option<PubSubStream>>();
        let elect = async move {
            let (promoted, demoted) = (tx.clone(), tx);
            self.runner
                .run(
                    linked,
                    move |_fence| {
                        let tx = promoted.clone();
                        async move {
                            let stream = self.subscribe().await?;
                            log::info!("Pub/Sub {:?} subscribed", self.patterns);
                            // The receiver lives until the runner returns.
                            tx.send(Some(stream)).await.ok();
                            Ok::<(), RedisGuardError>(())
                        }
                    },
                    move |_reason| {
                        let tx = demoted.clone();
                        async move {
                            tx.send(None).await.ok();
                        }
                    },
                )
                .await;
            // Both senders drop with the callbacks: the consumer ends.
        };
        let consume = async {
            let mut current: Option<PubSubStream> = None;
            let mut refused_since_promotion = 0_u64;
            loop {
                let next = match current.as_mut() {
                    None => Next::Subscription(rx.recv().await),
                    Some(stream) => {
                        future::or(async { Next::Message(stream.next().await) }, async {
                            Next::Subscription(rx.recv().await)
                        })
                        .await
                    }
                };
                match next {
                    Next::Subscription(Ok(subscription)) => {
                        current = subscription;
                        refused_since_promotion = 0;
                    }
                    Next::Subscription(Err(_)) => return,
                    Next::Message(Some(msg)) => {
                        // The lease is checked where the side effect
                        // happens: nothing is handled past the deadline.
                        let Some(fence) = lease.fence() else {
                            refused_since_promotion += 1;
                            guard_std::metrics::record_refused_late(self.runner.key());
                            if refused_since_promotion == 1 {
                                log::warn!(
                                    "Pub/Sub {:?}: lease {} past its renew deadline; refusing messages until demoted",
                                    self.patterns,
                                    self.runner.key()
                                );
                            }
                            continue;
                        };
                        handler(PubSubMessage {
                            channel: msg.get_channel_name().to_owned(),
                            pattern: msg.get_pattern().ok(),
                            payload: msg.get_payload_bytes().to_vec(),
                            fence,
                        })
                        .await;
                    }
                    Next::Message(None) => {
                        log::warn!(
                            "Pub/Sub {:?}: subscription closed while leading; stepping down",
                            self.patterns
                        );
                        current = None;
                        own.demote();
                    }
                }
            }
        };
        future::zip(elect, consume).await;
    }
}
