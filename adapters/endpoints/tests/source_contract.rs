//! The elected-source contract (`guard_testkit::sources`) on each elected
//! source, against its real server: the lease ending while a message
//! waits in the handler, between its retries and in the source's queue
//! gives no effect or call under the ended lease, no shared dead letter,
//! and every message read ends somewhere; on each source that delivers
//! once, every message ends handled or dead-lettered whole, and a server
//! restart loses nothing the source stored; on every source, a URL's
//! password is never printed.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use async_compat::Compat;
use futures_lite::StreamExt;
use guard_core::guard::ActiveConfig;
use guard_core::lock::Ttl;
use guard_core::retry::{Classifier, RetryPolicy};
use guard_endpoints::amqp::{AmqpOptions, DEFAULT_PREFETCH, FanoutConsumer, WorkQueueConsumer};
use guard_endpoints::delivery::{ElectedLease, Unhandled};
use guard_endpoints::mqtt::{MqttEndpoint, MqttOptions, Subscription};
use guard_endpoints::mysql::BinlogReader;
use guard_endpoints::nats::{
    Delivery as NatsDelivery, JetStreamConsumer, NatsOptions, NatsSubscriber,
};
use guard_endpoints::postgres::PgQueue;
use guard_endpoints::redis::{PubSubEndpoint, StreamConsumer};
use guard_redis::{RedisConnection, StreamDlq, Topology};
use guard_std::GuardConfig;
use guard_testkit::mariadb::MariaDb;
use guard_testkit::nats::NatsServer;
use guard_testkit::postgres::PgServer;
use guard_testkit::rabbitmq::{RabbitNode, Vhost};
use guard_testkit::sources::{self, Delivery, ElectedSource, Handler, Ledger, SharedSource, Stop};
use guard_testkit::{Mosquitto, RedisServer};
use lapin::options::{
    BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, ExchangeKind};

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
        sources::replica_thread(move |ctl| {
            smol::block_on(endpoint.run(ctl, move |message| {
                let call = handler(id, delivery(message.payload, Some(message.lease)));
                async move {
                    // No retries: a failed call is the handler's own.
                    let _ = call.await;
                }
            }));
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
        retry: RetryPolicy,
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
            .and_then(|e| e.with_retry(retry))
            .unwrap()
            .with_unhandled(sink(ledger, id));
        sources::replica_thread(move |ctl| {
            smol::block_on(
                endpoint.try_run(ctl, Classifier::retry_all(), move |message| {
                    handler(id, delivery(message.payload, message.lease))
                }),
            );
        })
    }

    fn publish(&self, payload: &[u8]) {
        self.publish_all(&[payload.to_vec()]);
    }

    fn publish_all(&self, payloads: &[Vec<u8>]) {
        self.broker.publish("contract/readings", payloads).unwrap();
    }

    fn retries(&self) -> bool {
        true
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
        Nats::start_with_dead_letters(NATS_DEAD_LETTERS)
    }

    /// A server, and a client collecting what reaches `dead_letters`.
    fn start_with_dead_letters(dead_letters: &'static str) -> Self {
        let server = NatsServer::start().expect("nats-server");
        let client = futures_lite::future::block_on(Compat::new(async_nats::connect(server.url())))
            .expect("connect");
        let mut letters = futures_lite::future::block_on(Compat::new(async {
            let subscriber = client.subscribe(dead_letters).await?;
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
        sources::replica_thread(move |ctl| {
            smol::block_on(
                subscriber.run(ctl, Classifier::retry_all(), move |message| {
                    handler(id, delivery(message.payload, message.lease))
                }),
            );
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

// ------------------------------------------------- RabbitMQ fanout, elected

/// The exchange and its dead-letter queue (the consumer's default name).
const FANOUT: &str = "contract";
const FANOUT_DEAD_LETTERS: &str = "contract.dead-letters";

struct Fanout {
    vhost: Vhost,
    channel: lapin::Channel,
    _connection: lapin::Connection,
    /// Dead letters taken from their queue so far.
    dead: Mutex<Vec<Vec<u8>>>,
}

impl Fanout {
    fn start() -> Self {
        let vhost = Vhost::create().expect("a test vhost on the machine's broker");
        let (connection, channel) = smol::block_on(async {
            let connection =
                lapin::Connection::connect(&vhost.url(), lapin::ConnectionProperties::default())
                    .await?;
            let channel = connection.create_channel().await?;
            channel
                .confirm_select(ConfirmSelectOptions::default())
                .await?;
            // Declared here as the consumers declare it, so that a
            // publish before the first replica's is routed.
            channel
                .exchange_declare(
                    FANOUT.into(),
                    ExchangeKind::Fanout,
                    ExchangeDeclareOptions {
                        durable: true,
                        ..ExchangeDeclareOptions::default()
                    },
                    FieldTable::default(),
                )
                .await?;
            Ok::<_, lapin::Error>((connection, channel))
        })
        .expect("connect to the test vhost");
        Fanout {
            vhost,
            channel,
            _connection: connection,
            dead: Mutex::default(),
        }
    }
}

impl ElectedSource for Fanout {
    fn name(&self) -> &str {
        "rabbitmq (elected fanout consumer)"
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
        let scope = config.scope("endpoint/amqp").unwrap();
        let options = AmqpOptions::new(&self.vhost.url())
            .unwrap()
            .with_reconnect_delay(Duration::from_millis(200));
        let consumer = FanoutConsumer::new(options, FANOUT)
            .and_then(|c| c.with_guard(config, &scope))
            .and_then(|c| c.with_guard_settings(timing(ttl)))
            .and_then(|c| c.with_retry(retry))
            .unwrap()
            .with_unhandled(sink(ledger, id));
        sources::replica_thread(move |ctl| {
            smol::block_on(consumer.run(ctl, Classifier::retry_all(), move |message| {
                handler(id, delivery(message.payload, message.lease))
            }))
            .expect("the consumer ran");
        })
    }

    fn publish(&self, payload: &[u8]) {
        self.publish_all(&[payload.to_vec()]);
    }

    fn publish_all(&self, payloads: &[Vec<u8>]) {
        smol::block_on(async {
            for payload in payloads {
                self.channel
                    .basic_publish(
                        FANOUT.into(),
                        "".into(),
                        BasicPublishOptions::default(),
                        payload,
                        BasicProperties::default(),
                    )
                    .await
                    .expect("publish");
            }
            self.channel.wait_for_confirms().await.expect("confirmed");
        });
    }

    fn retries(&self) -> bool {
        true
    }

    /// The broker sends a consumer its prefetch ahead of the
    /// acknowledgements; the rest waits in the replica's exclusive queue,
    /// unread, and is deleted with it at a demotion.
    fn in_flight(&self) -> Option<usize> {
        Some(usize::from(DEFAULT_PREFETCH))
    }

    fn dead_letters(&self) -> Vec<Vec<u8>> {
        let mut dead = self.dead.lock().unwrap();
        // The queue exists once a replica has declared it.
        while let Ok(Some(letter)) = smol::block_on(
            self.channel
                .basic_get(FANOUT_DEAD_LETTERS.into(), BasicGetOptions { no_ack: true }),
        ) {
            dead.push(letter.delivery.data);
        }
        dead.clone()
    }
}

#[test]
fn an_elected_rabbitmq_fanout_consumer_keeps_the_elected_source_contract() {
    sources::run_all(&Fanout::start());
}

// ------------------------------------------------------ the binlog reader

struct Binlog {
    server: MariaDb,
}

impl Binlog {
    fn start() -> Self {
        let server = MariaDb::start().expect("mariadbd");
        server
            .execute(
                "CREATE DATABASE app; \
                 CREATE TABLE app.readings (id INT AUTO_INCREMENT PRIMARY KEY, payload VARCHAR(64))",
            )
            .unwrap();
        Binlog { server }
    }
}

impl ElectedSource for Binlog {
    fn name(&self) -> &str {
        "mysql-binlog (elected reader)"
    }

    /// A change the reader does not handle stays in the binlog past the
    /// checkpoint, for the next leader: nothing goes to `ledger`.
    fn start(
        &self,
        id: usize,
        config: &GuardConfig,
        ttl: Duration,
        retry: RetryPolicy,
        handler: Handler,
        _ledger: &Ledger,
    ) -> Stop {
        let scope = config.scope("endpoint/binlog").unwrap();
        let reader = BinlogReader::new(&self.server.url("app"), "contract", config, &scope)
            .and_then(|r| r.with_guard_settings(timing(ttl)))
            .and_then(|r| r.with_retry(retry))
            .unwrap();
        sources::replica_thread(move |ctl| {
            smol::block_on(reader.run(ctl, Classifier::retry_all(), move |change| {
                let payload = change
                    .after
                    .as_ref()
                    .and_then(|row| row.get(1).cloned().flatten())
                    .unwrap_or_default();
                handler(id, delivery(payload, change.lease))
            }));
        })
    }

    fn publish(&self, payload: &[u8]) {
        self.publish_all(&[payload.to_vec()]);
    }

    /// One transaction each, in one client call.
    fn publish_all(&self, payloads: &[Vec<u8>]) {
        let sql: String = payloads
            .iter()
            .map(|p| {
                format!(
                    "INSERT INTO app.readings (payload) VALUES ('{}');",
                    String::from_utf8_lossy(p)
                )
            })
            .collect();
        self.server.execute(&sql).unwrap();
    }

    fn retries(&self) -> bool {
        true
    }

    fn dead_letters(&self) -> Vec<Vec<u8>> {
        // Each row's values as a JSON array of strings: the payload is
        // the second.
        self.server
            .execute("SELECT row_values FROM app.guard_binlog_dead_letters")
            .map(|rows| {
                rows.lines()
                    .filter_map(|row| row.split('"').nth(3).map(|p| p.as_bytes().to_vec()))
                    .collect()
            })
            .unwrap_or_default()
    }
}

#[test]
fn the_binlog_reader_keeps_the_elected_source_contract() {
    sources::run_all(&Binlog::start());
}

// ------------------------------------------------- no secret, every source

/// The password of every URL below.
const SECRET: &str = "TopSecret42";

/// What a constructor's outcome prints: its error's texts, or its
/// `Debug`.
fn printed<T: std::fmt::Debug, E: std::error::Error + 'static>(made: Result<T, E>) -> Vec<String> {
    match made {
        Ok(made) => vec![format!("{made:?}")],
        Err(e) => sources::error_texts(&e),
    }
}

#[test]
fn no_source_prints_the_password_of_its_url() {
    let config = GuardConfig::new();
    let scope = config.scope("endpoint/contract").unwrap();
    let mut texts = Vec::new();
    for url in [
        format!("redis://user:{SECRET}@127.0.0.1:6379/"),
        format!("redis://user:{SECRET}@127.0.0.1:6379/x"),
    ] {
        texts.extend(printed(PubSubEndpoint::new(
            &url,
            &config,
            &scope,
            &["contract.*"],
        )));
    }
    for url in [
        format!("nats://user:{SECRET}@127.0.0.1:4222"),
        format!("nats://user:{SECRET}@"),
        format!("http://user:{SECRET}@127.0.0.1:4222"),
    ] {
        texts.extend(printed(NatsOptions::new(&url)));
    }
    for url in [
        format!("amqp://guest:{SECRET}@127.0.0.1:5672/%2f"),
        format!("amqp://guest:{SECRET}@"),
        format!("amqps://guest:{SECRET}@127.0.0.1:5672/%2f?bad=1"),
    ] {
        texts.extend(printed(AmqpOptions::new(&url)));
    }
    for url in [
        format!("mysql://root:{SECRET}@db.example:3306"),
        format!("mysql://root:{SECRET}@db.example:3306/app"),
    ] {
        texts.extend(printed(BinlogReader::new(
            &url, "contract", &config, &scope,
        )));
    }
    for url in [
        format!("postgres://app:{SECRET}@db.example/app"),
        format!("postgres://app:{SECRET}@db.example:99999/app"),
        format!("host=db.example user=app password={SECRET} dbname=app"),
    ] {
        texts.extend(printed(guard_endpoints::postgres::PgQueue::new(
            &url, "jobs",
        )));
    }
    if let Err(violation) = sources::check_secret_hidden(&texts, SECRET) {
        panic!("{violation}");
    }
}

// ------------------------------------------- shared sources: Redis Streams

/// The suite's view of a message from a source that delivers once.
fn shared_delivery(payload: Vec<u8>) -> Delivery {
    Delivery {
        payload,
        fence: None,
        valid: Box::new(|| true),
    }
}

/// Shows a subscription in place on a source that delivers only to
/// present subscribers: probes, answered before the suite's handler,
/// which never sees them.
#[derive(Clone, Default)]
struct Probe(Arc<AtomicBool>);

impl Probe {
    const PAYLOAD: &[u8] = b"contract-probe";

    /// Consumer `id`'s handler of a payload: `handler`, or the answer to
    /// a probe.
    fn answering(
        &self,
        id: usize,
        handler: Handler,
    ) -> impl Fn(Vec<u8>) -> sources::HandlerFuture + 'static {
        let seen = self.0.clone();
        move |payload| {
            if payload.starts_with(Self::PAYLOAD) {
                seen.store(true, Ordering::Relaxed);
                return Box::pin(async { Ok(()) });
            }
            handler(id, shared_delivery(payload))
        }
    }

    /// Publishes probes until one was answered.
    fn wait(&self, what: &str, publish_all: impl Fn(&[Vec<u8>])) {
        let started = std::time::Instant::now();
        while !self.0.load(Ordering::Relaxed) {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "{what} was never in place"
            );
            publish_all(&[Self::PAYLOAD.to_vec()]);
            thread::sleep(Duration::from_millis(50));
        }
    }
}

const STREAM_DEAD_LETTERS: &str = "contract-dead-letters";

struct Stream {
    server: Mutex<RedisServer>,
}

impl Stream {
    fn start() -> Self {
        // Appended and synced on every write: a restart keeps the stream.
        let server = RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "always"])
            .expect("redis-server");
        Stream {
            server: Mutex::new(server),
        }
    }

    fn connection(&self) -> RedisConnection {
        let url = self.server.lock().unwrap().url();
        smol::block_on(RedisConnection::connect(
            Topology::Standalone { url },
            Duration::from_millis(500),
        ))
        .expect("connect")
    }

    fn sync_connection(&self) -> redis::Connection {
        let url = self.server.lock().unwrap().url();
        redis::Client::open(url)
            .and_then(|c| c.get_connection())
            .expect("connect")
    }
}

impl SharedSource for Stream {
    fn name(&self) -> &str {
        "redis-stream (consumer group)"
    }

    fn start(&self, id: usize, retry: RetryPolicy, handler: Handler) -> Stop {
        let conn = self.connection();
        let consumer = StreamConsumer::new(conn.clone(), "contract", "workers", &format!("c{id}"))
            .unwrap()
            .with_poll_interval(Duration::from_millis(20))
            .with_retry(retry)
            .unwrap()
            .with_dead_letters(StreamDlq::new(conn), STREAM_DEAD_LETTERS)
            .unwrap();
        sources::replica_thread(move |ctl| {
            smol::block_on(consumer.run(ctl, Classifier::retry_all(), move |message| {
                handler(
                    id,
                    shared_delivery(message.payload().unwrap_or_default().to_vec()),
                )
            }));
        })
    }

    fn publish_all(&self, payloads: &[Vec<u8>]) {
        let mut conn = self.sync_connection();
        for payload in payloads {
            let _: String = redis::cmd("XADD")
                .arg("contract")
                .arg("*")
                .arg("payload")
                .arg(payload)
                .query(&mut conn)
                .unwrap();
        }
    }

    fn dead_letters(&self) -> Vec<Vec<u8>> {
        let dlq = StreamDlq::new(self.connection());
        smol::block_on(dlq.range(STREAM_DEAD_LETTERS, "-", 1_000))
            .map(|entries| entries.into_iter().map(|e| e.payload).collect())
            .unwrap_or_default()
    }

    fn restart_server(&self) {
        self.server.lock().unwrap().restart().expect("restart");
    }
}

#[test]
fn a_redis_stream_consumer_group_keeps_the_shared_source_contract() {
    sources::run_all_shared(&Stream::start());
}

// --------------------------------------- shared sources: JetStream consumer

const JETSTREAM: &str = "CONTRACT";

struct JetStream {
    server: Mutex<NatsServer>,
    client: async_nats::Client,
}

impl JetStream {
    fn start() -> Self {
        let server = NatsServer::start().expect("nats-server");
        let client = futures_lite::future::block_on(Compat::new(async_nats::connect(server.url())))
            .expect("connect");
        JetStream {
            server: Mutex::new(server),
            client,
        }
    }
}

impl SharedSource for JetStream {
    fn name(&self) -> &str {
        "nats-jetstream (durable consumer)"
    }

    fn start(&self, id: usize, retry: RetryPolicy, handler: Handler) -> Stop {
        let options = NatsOptions::new(&self.server.lock().unwrap().url())
            .unwrap()
            .with_reconnect_delay(Duration::from_millis(100));
        // Each delivery's retries, then JetStream's next delivery; the
        // message is dead-lettered after its second.
        let consumer = JetStreamConsumer::new(options, JETSTREAM, "workers")
            .and_then(|c| c.with_subjects(&["contract.>"]))
            .and_then(|c| c.with_ack_wait(Duration::from_secs(1)))
            .map(|c| c.with_redelivery_delay(Duration::from_millis(50)))
            .and_then(|c| c.with_max_deliver(2))
            .and_then(|c| c.with_retry(retry))
            .unwrap();
        sources::replica_thread(move |ctl| {
            smol::block_on(consumer.run(ctl, Classifier::retry_all(), move |message| {
                handler(id, shared_delivery(message.payload))
            }));
        })
    }

    /// Each stored when this returns; retried while the stream is not
    /// there yet (its first consumer creates it) or the server restarts.
    fn publish_all(&self, payloads: &[Vec<u8>]) {
        for payload in payloads {
            let started = std::time::Instant::now();
            loop {
                let stored = futures_lite::future::block_on(Compat::new(async {
                    let js = async_nats::jetstream::new(self.client.clone());
                    js.publish("contract.jobs", payload.clone().into())
                        .await
                        .map_err(|e| e.to_string())?
                        .await
                        .map_err(|e| e.to_string())
                }));
                match stored {
                    Ok(_) => break,
                    Err(e) if started.elapsed() > Duration::from_secs(20) => {
                        panic!("publish to JetStream: {e}")
                    }
                    Err(_) => thread::sleep(Duration::from_millis(100)),
                }
            }
        }
    }

    fn dead_letters(&self) -> Vec<Vec<u8>> {
        futures_lite::future::block_on(Compat::new(async {
            let js = async_nats::jetstream::new(self.client.clone());
            let mut letters = Vec::new();
            if let Ok(stream) = js.get_stream(format!("{JETSTREAM}-dead-letters")).await {
                let mut sequence = 1;
                while let Ok(message) = stream.get_raw_message(sequence).await {
                    letters.push(message.payload.to_vec());
                    sequence += 1;
                }
            }
            letters
        }))
    }

    fn restart_server(&self) {
        self.server.lock().unwrap().restart().expect("restart");
    }
}

#[test]
fn a_jetstream_durable_consumer_keeps_the_shared_source_contract() {
    sources::run_all_shared(&JetStream::start());
}

// --------------------------------------- shared sources: a table of work

struct PgWork {
    server: Mutex<PgServer>,
}

impl PgWork {
    fn start() -> Self {
        PgWork {
            server: Mutex::new(PgServer::start().expect("a private PostgreSQL server")),
        }
    }

    fn queue(&self) -> PgQueue {
        let url = self.server.lock().unwrap().url();
        let queue = PgQueue::new(&url, "jobs")
            .unwrap()
            .with_poll_interval(Duration::from_millis(20))
            .with_reconnect_delay(Duration::from_millis(100));
        smol::block_on(queue.create_tables()).expect("create tables");
        queue
    }
}

impl SharedSource for PgWork {
    fn name(&self) -> &str {
        "postgres-queue (rows claimed under a lease)"
    }

    fn start(&self, id: usize, retry: RetryPolicy, handler: Handler) -> Stop {
        let queue = self
            .queue()
            .with_consumer_name(&format!("c{id}"))
            .and_then(|q| q.with_retry(retry))
            .unwrap();
        sources::replica_thread(move |ctl| {
            smol::block_on(queue.run(ctl, Classifier::retry_all(), move |row| {
                handler(id, shared_delivery(row.payload))
            }));
        })
    }

    fn publish_all(&self, payloads: &[Vec<u8>]) {
        smol::block_on(self.queue().push_batch(payloads)).expect("push");
    }

    fn dead_letters(&self) -> Vec<Vec<u8>> {
        self.server
            .lock()
            .unwrap()
            .query("SELECT convert_from(payload, 'UTF8') FROM jobs_dead_letters ORDER BY id")
            .map(|rows| rows.lines().map(|l| l.as_bytes().to_vec()).collect())
            .unwrap_or_default()
    }

    fn restart_server(&self) {
        let mut server = self.server.lock().unwrap();
        server.stop();
        server.start_again().expect("the same server again");
    }
}

#[test]
fn a_postgres_table_of_work_keeps_the_shared_source_contract() {
    sources::run_all_shared(&PgWork::start());
}

// --------------------------------------- shared sources: a NATS queue group

const QUEUE_GROUP_DEAD_LETTERS: &str = "contract-group-dead-letters";

/// Core NATS keeps nothing for a consumer that is not running: only the
/// dead-letter scenario applies.
struct QueueGroup {
    nats: Nats,
}

impl SharedSource for QueueGroup {
    fn name(&self) -> &str {
        "nats (queue group)"
    }

    fn start(&self, id: usize, retry: RetryPolicy, handler: Handler) -> Stop {
        let options = NatsOptions::new(&self.nats.server.url())
            .unwrap()
            .with_reconnect_delay(Duration::from_millis(100));
        let subscriber = NatsSubscriber::new(
            options,
            "contract.>",
            NatsDelivery::queue_group("workers").unwrap(),
        )
        .and_then(|s| s.with_retry(retry))
        .and_then(|s| s.with_dead_letters(QUEUE_GROUP_DEAD_LETTERS))
        .unwrap();
        // Core NATS delivers only to present subscribers.
        let probe = Probe::default();
        let handle = probe.answering(id, handler);
        let stop = sources::replica_thread(move |ctl| {
            smol::block_on(
                subscriber.run(ctl, Classifier::retry_all(), move |message| {
                    handle(message.payload)
                }),
            );
        });
        probe.wait("the queue group", |probes| self.nats.publish_all(probes));
        stop
    }

    fn publish_all(&self, payloads: &[Vec<u8>]) {
        self.nats.publish_all(payloads);
    }

    fn dead_letters(&self) -> Vec<Vec<u8>> {
        self.nats.dead_letters()
    }

    fn restart_server(&self) {}

    fn keeps_messages(&self) -> bool {
        false
    }
}

#[test]
fn a_nats_queue_group_keeps_the_shared_source_contract() {
    sources::run_all_shared(&QueueGroup {
        nats: Nats::start_with_dead_letters(QUEUE_GROUP_DEAD_LETTERS),
    });
}

// --------------------------------- shared sources: an MQTT shared subscription

/// Mosquitto with clean sessions keeps nothing for a member that is not
/// connected: only the dead-letter scenario applies. MQTT has no dead
/// letters of its own; the endpoint's unhandled function is its
/// destination (the gateway's dead letters).
struct MqttShared {
    broker: Mosquitto,
    dead: Arc<Mutex<Vec<Vec<u8>>>>,
}

impl SharedSource for MqttShared {
    fn name(&self) -> &str {
        "mqtt (shared subscription)"
    }

    fn start(&self, id: usize, retry: RetryPolicy, handler: Handler) -> Stop {
        let options = MqttOptions::new("127.0.0.1", self.broker.port(), &format!("shared-{id}"))
            .unwrap()
            .with_reconnect_delay(Duration::from_millis(100));
        let dead = self.dead.clone();
        let endpoint = MqttEndpoint::new(
            options,
            Subscription::shared("workers", "contract/#").unwrap(),
        )
        .with_retry(retry)
        .unwrap()
        .with_unhandled(move |given_up| dead.lock().unwrap().push(given_up.payload));
        // A shared subscription delivers only to present members.
        let probe = Probe::default();
        let handle = probe.answering(id, handler);
        let stop = sources::replica_thread(move |ctl| {
            smol::block_on(
                endpoint.try_run(ctl, Classifier::retry_all(), move |message| {
                    handle(message.payload)
                }),
            );
        });
        probe.wait("the shared subscription", |probes| self.publish_all(probes));
        stop
    }

    fn publish_all(&self, payloads: &[Vec<u8>]) {
        self.broker.publish("contract/readings", payloads).unwrap();
    }

    fn dead_letters(&self) -> Vec<Vec<u8>> {
        self.dead.lock().unwrap().clone()
    }

    fn restart_server(&self) {}

    fn keeps_messages(&self) -> bool {
        false
    }
}

#[test]
fn an_mqtt_shared_subscription_keeps_the_shared_source_contract() {
    sources::run_all_shared(&MqttShared {
        broker: Mosquitto::start().expect("mosquitto"),
        dead: Arc::default(),
    });
}

// ------------------------------------- shared sources: a RabbitMQ work queue

const WORK_QUEUE: &str = "contract-jobs";
const WORK_DEAD_LETTERS: &str = "contract-jobs.dead-letters";

/// A private broker node, which the restart scenario restarts.
struct WorkQueue {
    node: Mutex<RabbitNode>,
}

impl WorkQueue {
    fn start() -> Self {
        WorkQueue {
            node: Mutex::new(RabbitNode::start().expect("a private rabbitmq-server")),
        }
    }

    /// A channel with publisher confirms, connected within a few seconds
    /// (a node that has just opened its port may not take connections).
    fn channel(&self) -> (lapin::Connection, lapin::Channel) {
        let url = self.node.lock().unwrap().url();
        let started = std::time::Instant::now();
        loop {
            let connected = smol::block_on(async {
                let connection =
                    lapin::Connection::connect(&url, lapin::ConnectionProperties::default())
                        .await?;
                let channel = connection.create_channel().await?;
                channel
                    .confirm_select(ConfirmSelectOptions::default())
                    .await?;
                Ok::<_, lapin::Error>((connection, channel))
            });
            match connected {
                Ok(connected) => return connected,
                Err(e) if started.elapsed() > Duration::from_secs(20) => {
                    panic!("cannot connect to the node: {e}")
                }
                Err(_) => thread::sleep(Duration::from_millis(100)),
            }
        }
    }
}

impl SharedSource for WorkQueue {
    fn name(&self) -> &str {
        "rabbitmq (work queue)"
    }

    fn start(&self, id: usize, retry: RetryPolicy, handler: Handler) -> Stop {
        let options = AmqpOptions::new(&self.node.lock().unwrap().url())
            .unwrap()
            .with_reconnect_delay(Duration::from_millis(200));
        let consumer = WorkQueueConsumer::new(options, WORK_QUEUE)
            .and_then(|c| c.with_retry(retry))
            .unwrap();
        // Declared before consuming, so a publish right after is kept.
        smol::block_on(consumer.declare()).expect("declared");
        sources::replica_thread(move |ctl| {
            smol::block_on(consumer.run(ctl, Classifier::retry_all(), move |message| {
                handler(id, shared_delivery(message.payload))
            }))
            .expect("the consumer ran");
        })
    }

    /// Persistent messages, each confirmed by the broker.
    fn publish_all(&self, payloads: &[Vec<u8>]) {
        let (_connection, channel) = self.channel();
        smol::block_on(async {
            for payload in payloads {
                channel
                    .basic_publish(
                        "".into(),
                        WORK_QUEUE.into(),
                        BasicPublishOptions::default(),
                        payload,
                        BasicProperties::default().with_delivery_mode(2),
                    )
                    .await
                    .expect("publish");
            }
            channel.wait_for_confirms().await.expect("confirmed");
        });
    }

    fn dead_letters(&self) -> Vec<Vec<u8>> {
        let (_connection, channel) = self.channel();
        let mut letters = Vec::new();
        // Read without taking: each is requeued when the channel closes.
        while let Ok(Some(letter)) = smol::block_on(
            channel.basic_get(WORK_DEAD_LETTERS.into(), BasicGetOptions { no_ack: false }),
        ) {
            letters.push(letter.delivery.data);
        }
        letters
    }

    fn restart_server(&self) {
        self.node.lock().unwrap().restart().expect("restarted");
    }
}

#[test]
fn a_rabbitmq_work_queue_keeps_the_shared_source_contract() {
    sources::run_all_shared(&WorkQueue::start());
}
