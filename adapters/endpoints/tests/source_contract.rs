//! The elected-source contract (`guard_testkit::sources`) on each elected
//! source, against its real server: the lease ending while a message
//! waits in the handler, between its retries and in the source's queue
//! gives no effect or call under the ended lease, no shared dead letter,
//! and every message read ends somewhere.

use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use async_compat::Compat;
use futures_lite::StreamExt;
use guard_core::guard::ActiveConfig;
use guard_core::lock::Ttl;
use guard_core::retry::{Classifier, RetryPolicy};
use guard_endpoints::delivery::{ElectedLease, Unhandled};
use guard_endpoints::mqtt::{MqttEndpoint, MqttOptions, Subscription};
use guard_endpoints::nats::{Delivery as NatsDelivery, NatsOptions, NatsSubscriber};
use guard_endpoints::redis::PubSubEndpoint;
use guard_smol::control;
use guard_std::GuardConfig;
use guard_testkit::nats::NatsServer;
use guard_testkit::sources::{self, Delivery, ElectedSource, Handler, Ledger, Stop};
use guard_testkit::{Mosquitto, RedisServer};

/// The lease timing the suite asks for.
fn timing(ttl: Duration) -> ActiveConfig {
    ActiveConfig::new()
        .with_ttl(Ttl::new(ttl).unwrap())
        .with_interval(ttl / 3)
}

/// The suite's view of a message read under `lease`.
fn delivery(payload: Vec<u8>, lease: Option<ElectedLease>) -> Delivery {
    Delivery {
        payload,
        fence: lease.as_ref().map(ElectedLease::fence),
        valid: Box::new(move || lease.as_ref().is_some_and(ElectedLease::is_valid)),
    }
}

/// The unhandled sink of replica `id`: the suite's ledger.
fn sink(ledger: &Ledger, id: usize) -> impl Fn(Unhandled) + Send + Sync + 'static {
    let ledger = ledger.clone();
    move |message| ledger.unhandled(id, message.payload, message.reason)
}

// ---------------------------------------------------------------- Pub/Sub

struct PubSub {
    server: RedisServer,
    publisher: Mutex<redis::Connection>,
}

impl PubSub {
    fn start() -> Self {
        let server = RedisServer::start().expect("redis-server");
        let publisher = redis::Client::open(server.url())
            .and_then(|c| c.get_connection())
            .expect("connect");
        PubSub {
            server,
            publisher: Mutex::new(publisher),
        }
    }
}

impl ElectedSource for PubSub {
    fn name(&self) -> &str {
        "redis-pubsub"
    }

    fn start(
        &self,
        id: usize,
        config: &GuardConfig,
        ttl: Duration,
        _retry: RetryPolicy,
        handler: Handler,
        ledger: &Ledger,
    ) -> Stop {
        let scope = config.scope("endpoint/redis").unwrap();
        let endpoint = PubSubEndpoint::new(&self.server.url(), config, &scope, &["contract.*"])
            .unwrap()
            .with_settings(timing(ttl))
            .unwrap()
            .with_unhandled(sink(ledger, id));
        let (handle, ctl) = control();
        let thread = thread::spawn(move || {
            smol::block_on(endpoint.run(ctl, move |message| {
                let call = handler(id, delivery(message.payload, Some(message.lease)));
                async move {
                    // No retries: a failed call is the handler's own.
                    let _ = call.await;
                }
            }));
        });
        Box::new(move || {
            handle.stop();
            thread.join().unwrap();
        })
    }

    fn publish(&self, payload: &[u8]) {
        let () = redis::cmd("PUBLISH")
            .arg("contract.readings")
            .arg(payload)
            .query::<i64>(&mut self.publisher.lock().unwrap())
            .map(|_| ())
            .unwrap();
    }

    fn retries(&self) -> bool {
        false
    }

    fn dead_letters(&self) -> Vec<Vec<u8>> {
        Vec::new()
    }
}

#[test]
fn redis_pubsub_keeps_the_elected_source_contract() {
    sources::run_all(&PubSub::start());
}

// ---------------------------------------------------------- MQTT, guarded

struct Mqtt {
    broker: Mosquitto,
}

impl ElectedSource for Mqtt {
    fn name(&self) -> &str {
        "mqtt (guarded plain subscription)"
    }

    fn start(
        &self,
        id: usize,
        config: &GuardConfig,
        ttl: Duration,
        _retry: RetryPolicy,
        handler: Handler,
        ledger: &Ledger,
    ) -> Stop {
        let scope = config.scope("endpoint/mqtt").unwrap();
        let options = MqttOptions::new("127.0.0.1", self.broker.port(), &format!("contract-{id}"))
            .unwrap()
            .with_reconnect_delay(Duration::from_millis(100));
        let endpoint = MqttEndpoint::new(options, Subscription::plain("contract/#").unwrap())
            .with_guard(config, &scope)
            .and_then(|e| e.with_guard_settings(timing(ttl)))
            .unwrap()
            .with_unhandled(sink(ledger, id));
        let (handle, ctl) = control();
        let thread = thread::spawn(move || {
            smol::block_on(endpoint.run(ctl, move |message| {
                let call = handler(id, delivery(message.payload, message.lease));
                async move {
                    let _ = call.await;
                }
            }));
        });
        Box::new(move || {
            handle.stop();
            thread.join().unwrap();
        })
    }

    fn publish(&self, payload: &[u8]) {
        self.publish_all(&[payload.to_vec()]);
    }

    fn publish_all(&self, payloads: &[Vec<u8>]) {
        self.broker.publish("contract/readings", payloads).unwrap();
    }

    fn retries(&self) -> bool {
        false
    }

    /// Mosquitto sends at most 20 QoS 1 messages ahead of their PUBACKs
    /// (`max_inflight_messages`); the rest wait in the broker, unread, and
    /// a clean session's are dropped with its connection at a demotion.
    fn in_flight(&self) -> Option<usize> {
        Some(20)
    }

    fn dead_letters(&self) -> Vec<Vec<u8>> {
        Vec::new()
    }
}

#[test]
fn a_guarded_mqtt_subscription_keeps_the_elected_source_contract() {
    let broker = Mosquitto::start().expect("mosquitto");
    sources::run_all(&Mqtt { broker });
}

// -------------------------------------------------------- NATS, elected

struct Nats {
    server: NatsServer,
    client: async_nats::Client,
    dead: Arc<Mutex<Vec<Vec<u8>>>>,
}

const NATS_DEAD_LETTERS: &str = "contract-dead-letters";

impl Nats {
    fn start() -> Self {
        let server = NatsServer::start().expect("nats-server");
        let client = futures_lite::future::block_on(Compat::new(async_nats::connect(server.url())))
            .expect("connect");
        let mut letters = futures_lite::future::block_on(Compat::new(async {
            let subscriber = client.subscribe(NATS_DEAD_LETTERS).await?;
            client
                .flush()
                .await
                .map(|()| subscriber)
                .map_err(Into::into)
        }))
        .map_err(|e: Box<dyn std::error::Error + Send + Sync>| e.to_string())
        .expect("subscribe to the dead letters");
        let dead = Arc::new(Mutex::new(Vec::new()));
        let into = dead.clone();
        thread::spawn(move || {
            futures_lite::future::block_on(Compat::new(async {
                while let Some(letter) = letters.next().await {
                    into.lock().unwrap().push(letter.payload.to_vec());
                }
            }));
        });
        Nats {
            server,
            client,
            dead,
        }
    }
}

impl ElectedSource for Nats {
    fn name(&self) -> &str {
        "nats (elected subscriber)"
    }

    fn start(
        &self,
        id: usize,
        config: &GuardConfig,
        ttl: Duration,
        retry: RetryPolicy,
        handler: Handler,
        ledger: &Ledger,
    ) -> Stop {
        let scope = config.scope("endpoint/nats").unwrap();
        let options = NatsOptions::new(&self.server.url())
            .unwrap()
            .with_reconnect_delay(Duration::from_millis(100));
        let subscriber = NatsSubscriber::new(options, "contract.>", NatsDelivery::Elected)
            .and_then(|s| s.with_guard(config, &scope))
            .and_then(|s| s.with_guard_settings(timing(ttl)))
            .and_then(|s| s.with_retry(retry))
            .and_then(|s| s.with_dead_letters(NATS_DEAD_LETTERS))
            .unwrap()
            .with_unhandled(sink(ledger, id));
        let (handle, ctl) = control();
        let thread = thread::spawn(move || {
            smol::block_on(
                subscriber.run(ctl, Classifier::retry_all(), move |message| {
                    handler(id, delivery(message.payload, message.lease))
                }),
            );
        });
        Box::new(move || {
            handle.stop();
            thread.join().unwrap();
        })
    }

    fn publish(&self, payload: &[u8]) {
        self.publish_all(&[payload.to_vec()]);
    }

    fn publish_all(&self, payloads: &[Vec<u8>]) {
        futures_lite::future::block_on(Compat::new(async {
            for payload in payloads {
                self.client
                    .publish("contract.readings", payload.clone().into())
                    .await
                    .unwrap();
            }
            self.client.flush().await.unwrap();
        }));
    }

    fn retries(&self) -> bool {
        true
    }

    fn dead_letters(&self) -> Vec<Vec<u8>> {
        self.dead.lock().unwrap().clone()
    }
}

#[test]
fn an_elected_nats_subscriber_keeps_the_elected_source_contract() {
    sources::run_all(&Nats::start());
}
