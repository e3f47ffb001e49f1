//! Every sink passes guard-testkit's sink contract against its real
//! receiver: the HTTP sink against a scripted receiver on loopback (made
//! fenced for the fence rule), the Redis Stream sink against its own
//! `redis-server` (stopped and started again for the outage rule).

use std::cell::{Cell, RefCell};
use std::time::Duration;

use guard_endpoints::sink::redis_stream::RedisStreamSink;
use guard_endpoints::sink::{MessageSink, Outgoing, SinkError};
use guard_redis::{RedisConnection, Topology};
use guard_testkit::sinks::{self, Answered, Sent, SinkUnderTest};
use guard_testkit::{HttpReceiver, Received, RedisServer};

/// `message` through `sink`, its answer as the suite judges it.
async fn send_through(sink: &dyn MessageSink, message: &Sent) -> Answered {
    let outgoing = Outgoing {
        id: &message.id,
        origin: &message.origin,
        fence: message.fence,
        payload: &message.payload,
    };
    match sink.send(&outgoing).await {
        Ok(()) => Answered::Delivered,
        Err(SinkError::Transient { reason, .. } | SinkError::HeldBack { reason }) => {
            Answered::Transient(reason)
        }
        Err(SinkError::Permanent { reason }) => Answered::Permanent(reason),
        Err(SinkError::StaleFence { fence, highest }) => Answered::StaleFence { fence, highest },
        Err(e @ SinkError::LeaseEnded { .. }) => {
            panic!("a sink answered what only deliver() makes: {e}")
        }
    }
}

#[cfg(feature = "http")]
mod http {
    use guard_endpoints::sink::http::HttpSink;

    use super::*;

    /// The HTTP sink and its receiver, which an outage stops and brings
    /// back on the same port.
    struct HttpUnderTest {
        sink: HttpSink,
        receiver: RefCell<Option<HttpReceiver>>,
        port: u16,
        /// What receivers stopped by an outage had recorded.
        earlier: RefCell<Vec<Received>>,
        fenced: Cell<bool>,
    }

    impl SinkUnderTest for HttpUnderTest {
        async fn send(&self, message: &Sent) -> Answered {
            send_through(&self.sink, message).await
        }
        fn taken(&self) -> Vec<Sent> {
            let mut all = self.earlier.borrow().clone();
            if let Some(receiver) = &*self.receiver.borrow() {
                all.extend(receiver.requests());
            }
            all.into_iter()
                .filter(|r| (200..300).contains(&r.status))
                .map(|r| Sent {
                    id: r.header("idempotency-key").unwrap_or_default().to_owned(),
                    origin: r.header("guard-origin").unwrap_or_default().to_owned(),
                    fence: r.header("guard-fence").and_then(|f| f.parse().ok()),
                    payload: r.body,
                })
                .collect()
        }
        fn set_down(&self, down: bool) {
            let mut receiver = self.receiver.borrow_mut();
            if down {
                if let Some(stopped) = receiver.take() {
                    self.earlier.borrow_mut().extend(stopped.stop());
                }
            } else {
                let back = HttpReceiver::start_on(self.port).expect("the receiver back");
                if self.fenced.get() {
                    back.fenced();
                }
                *receiver = Some(back);
            }
        }
        fn deduplicates(&self) -> bool {
            false
        }
        fn fence_receiver(&self) -> bool {
            self.fenced.set(true);
            if let Some(receiver) = &*self.receiver.borrow() {
                receiver.fenced();
            }
            true
        }
    }

    #[test]
    fn the_http_sink_keeps_the_sink_contract() {
        let receiver = HttpReceiver::start().expect("receiver");
        let sink = HttpSink::new(&receiver.url("/in"))
            .unwrap()
            .with_timeout(Duration::from_secs(2))
            .unwrap();
        let under_test = HttpUnderTest {
            sink,
            port: receiver.port(),
            receiver: RefCell::new(Some(receiver)),
            earlier: RefCell::default(),
            fenced: Cell::new(false),
        };
        smol::block_on(sinks::run_all(&under_test, "http"));
    }
}

/// The Redis Stream sink and its server, which an outage stops and
/// starts again (empty: the suite's outage rule runs last).
struct RedisUnderTest {
    sink: RedisStreamSink,
    server: RefCell<RedisServer>,
}

impl SinkUnderTest for RedisUnderTest {
    async fn send(&self, message: &Sent) -> Answered {
        send_through(&self.sink, message).await
    }
    fn taken(&self) -> Vec<Sent> {
        let url = self.server.borrow().url();
        let mut conn = redis::Client::open(url).unwrap().get_connection().unwrap();
        let reply: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
            .arg(self.sink.stream())
            .arg("-")
            .arg("+")
            .query(&mut conn)
            .unwrap();
        reply
            .ids
            .into_iter()
            .map(|entry| {
                let text = |field: &str| entry.get::<String>(field).unwrap_or_default();
                Sent {
                    id: text("id"),
                    origin: text("origin"),
                    fence: entry.get::<String>("fence").and_then(|f| f.parse().ok()),
                    payload: entry.get::<Vec<u8>>("payload").unwrap_or_default(),
                }
            })
            .collect()
    }
    fn set_down(&self, down: bool) {
        let mut server = self.server.borrow_mut();
        if down {
            server.stop();
        } else {
            server.restart().expect("redis-server back");
        }
    }
    fn deduplicates(&self) -> bool {
        true
    }
    fn fence_receiver(&self) -> bool {
        true
    }
}

#[test]
fn the_redis_stream_sink_keeps_the_sink_contract() {
    let server = RedisServer::start().expect("redis-server");
    let conn = smol::block_on(RedisConnection::connect(
        Topology::Standalone { url: server.url() },
        Duration::from_millis(500),
    ))
    .expect("connect");
    let under_test = RedisUnderTest {
        sink: RedisStreamSink::new(conn, "uplink").unwrap(),
        server: RefCell::new(server),
    };
    smol::block_on(sinks::run_all(&under_test, "redis"));
}

/// What the Redis Stream sink keeps: the highest fence under its key, an
/// id for the duplicate window only, and `WRONGTYPE` as a refusal for
/// good.
#[test]
fn the_redis_stream_sink_forgets_ids_after_its_window_and_refuses_a_key_of_another_type() {
    let server = RedisServer::start().expect("redis-server");
    let conn = smol::block_on(RedisConnection::connect(
        Topology::Standalone { url: server.url() },
        Duration::from_millis(500),
    ))
    .expect("connect");
    let sink = RedisStreamSink::new(conn.clone(), "short")
        .unwrap()
        .with_duplicate_window(Duration::from_millis(200))
        .unwrap();
    let message = Sent::new("again").under(9);
    smol::block_on(async {
        assert_eq!(send_through(&sink, &message).await, Answered::Delivered);
        assert_eq!(send_through(&sink, &message).await, Answered::Delivered);
        async_io::Timer::after(Duration::from_millis(400)).await;
        assert_eq!(send_through(&sink, &message).await, Answered::Delivered);
    });
    assert_eq!(
        server.command("XLEN short").unwrap().trim_end(),
        ":2",
        "once within the window, again after it"
    );
    assert_eq!(
        server
            .command("EXISTS short:guard:fence")
            .unwrap()
            .trim_end(),
        ":1"
    );
    server.command("SET taken-by-a-string x").unwrap();
    let wrong = RedisStreamSink::new(conn, "taken-by-a-string").unwrap();
    let answered = smol::block_on(send_through(&wrong, &Sent::new("x")));
    assert!(
        matches!(&answered, Answered::Permanent(reason) if reason.contains("WRONGTYPE")),
        "{answered:?}"
    );
    assert!(
        RedisStreamSink::new(
            smol::block_on(RedisConnection::connect(
                Topology::Standalone { url: server.url() },
                Duration::from_millis(500),
            ))
            .unwrap(),
            ""
        )
        .is_err()
    );
}

#[cfg(feature = "nats")]
mod jetstream {
    use async_compat::Compat;
    use guard_endpoints::nats::NatsOptions;
    use guard_endpoints::sink::jetstream::JetStreamSink;
    use guard_testkit::nats::NatsServer;

    use super::*;

    fn block_on<F: std::future::Future>(work: F) -> F::Output {
        futures_lite::future::block_on(Compat::new(work))
    }

    /// The JetStream sink and its server (file storage: a restart keeps
    /// the stream and its duplicate window).
    struct JetStreamUnderTest {
        sink: JetStreamSink,
        server: RefCell<NatsServer>,
    }

    impl SinkUnderTest for JetStreamUnderTest {
        async fn send(&self, message: &Sent) -> Answered {
            send_through(&self.sink, message).await
        }
        fn taken(&self) -> Vec<Sent> {
            let url = self.server.borrow().url();
            block_on(async {
                let client = async_nats::connect(url).await.expect("connect");
                let js = async_nats::jetstream::new(client);
                let mut stream = js.get_stream("UPLINK").await.expect("the stream");
                let last = stream.info().await.expect("info").state.last_sequence;
                let mut taken = Vec::new();
                for sequence in 1..=last {
                    let Ok(message) = stream.get_raw_message(sequence).await else {
                        continue;
                    };
                    let header = |name: &str| {
                        message
                            .headers
                            .get(name)
                            .map(|v| v.as_str().to_owned())
                            .unwrap_or_default()
                    };
                    taken.push(Sent {
                        id: header("Nats-Msg-Id"),
                        origin: header("Guard-Origin"),
                        fence: header("Guard-Fence").parse().ok(),
                        payload: message.payload.to_vec(),
                    });
                }
                taken
            })
        }
        fn set_down(&self, down: bool) {
            let mut server = self.server.borrow_mut();
            if down {
                server.stop();
            } else {
                server.restart().expect("nats-server back");
            }
        }
        fn deduplicates(&self) -> bool {
            true
        }
        fn fence_receiver(&self) -> bool {
            false
        }
    }

    #[test]
    fn the_jetstream_sink_keeps_the_sink_contract() {
        let server = NatsServer::start().expect("nats-server");
        block_on(async {
            let client = async_nats::connect(server.url()).await.expect("connect");
            async_nats::jetstream::new(client)
                .create_stream(async_nats::jetstream::stream::Config {
                    name: "UPLINK".into(),
                    subjects: vec!["uplink.>".into()],
                    ..Default::default()
                })
                .await
                .expect("the stream");
        });
        let options = NatsOptions::new(&server.url())
            .unwrap()
            .with_reconnect_delay(Duration::from_millis(100));
        let under_test = JetStreamUnderTest {
            sink: JetStreamSink::new(options, "uplink.alerts")
                .unwrap()
                .with_timeout(Duration::from_secs(2))
                .unwrap(),
            server: RefCell::new(server),
        };
        smol::block_on(sinks::run_all(&under_test, "jetstream"));
    }
}

mod mqtt {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::{Arc, Mutex};

    use guard_endpoints::mqtt::MqttOptions;
    use guard_endpoints::sink::mqtt::MqttSink;
    use guard_testkit::Mosquitto;
    use rumqttc::v5::mqttbytes::QoS;
    use rumqttc::v5::mqttbytes::v5::Packet;
    use rumqttc::v5::{AsyncClient, Event, MqttOptions as Options};

    use super::*;

    const TOPIC: &str = "uplink/alerts";

    /// What a subscriber of the broker saw: messages with their user
    /// properties, markers (published without them), subscriptions made.
    #[derive(Default)]
    struct Seen {
        taken: Mutex<Vec<Sent>>,
        markers: AtomicU64,
        subscribed: AtomicU64,
        stop: AtomicBool,
    }

    /// A subscriber on a thread of its own that subscribes again after
    /// every reconnection (the broker restarted keeps no session).
    fn subscribe(port: u16, seen: Arc<Seen>) -> std::thread::JoinHandle<()> {
        std::thread::spawn(move || {
            let mut options = Options::new("contract-subscriber", "127.0.0.1", port);
            options.set_clean_start(true);
            let (client, mut events) = AsyncClient::new(options, 16);
            futures_lite::future::block_on(async_compat::Compat::new(async {
                while !seen.stop.load(Ordering::Relaxed) {
                    match events.poll().await {
                        Ok(Event::Incoming(Packet::ConnAck(_))) => {
                            client.subscribe(TOPIC, QoS::AtLeastOnce).await.unwrap();
                        }
                        Ok(Event::Incoming(Packet::SubAck(_))) => {
                            seen.subscribed.fetch_add(1, Ordering::SeqCst);
                        }
                        Ok(Event::Incoming(Packet::Publish(p))) => {
                            let properties =
                                p.properties.map(|p| p.user_properties).unwrap_or_default();
                            let property = |name: &str| {
                                properties
                                    .iter()
                                    .find(|(k, _)| k == name)
                                    .map(|(_, v)| v.clone())
                            };
                            match property("Idempotency-Key") {
                                None => {
                                    seen.markers.fetch_add(1, Ordering::SeqCst);
                                }
                                Some(id) => seen.taken.lock().unwrap().push(Sent {
                                    id,
                                    origin: property("Guard-Origin").unwrap_or_default(),
                                    fence: property("Guard-Fence").and_then(|f| f.parse().ok()),
                                    payload: p.payload.to_vec(),
                                }),
                            }
                        }
                        Ok(_) => {}
                        Err(_) => std::thread::sleep(Duration::from_millis(50)),
                    }
                }
            }));
        })
    }

    fn wait_until(what: &str, done: impl Fn() -> bool) {
        let started = std::time::Instant::now();
        while !done() {
            assert!(started.elapsed() < Duration::from_secs(30), "never: {what}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The MQTT sink and its broker, which an outage stops and starts
    /// again on the same port.
    struct MqttUnderTest {
        sink: MqttSink,
        broker: RefCell<Mosquitto>,
        seen: Arc<Seen>,
    }

    impl SinkUnderTest for MqttUnderTest {
        async fn send(&self, message: &Sent) -> Answered {
            send_through(&self.sink, message).await
        }
        fn taken(&self) -> Vec<Sent> {
            // A marker published after the sink's PUBACK arrives after
            // everything the broker took before it.
            let markers = self.seen.markers.load(Ordering::SeqCst);
            self.broker
                .borrow()
                .publish(TOPIC, &[b"marker".to_vec()])
                .expect("marker");
            wait_until("the marker arrived", || {
                self.seen.markers.load(Ordering::SeqCst) > markers
            });
            self.seen.taken.lock().unwrap().clone()
        }
        fn set_down(&self, down: bool) {
            let mut broker = self.broker.borrow_mut();
            if down {
                broker.stop();
            } else {
                let subscribed = self.seen.subscribed.load(Ordering::SeqCst);
                *broker = Mosquitto::start_on(broker.port()).expect("mosquitto back");
                wait_until("subscribed again", || {
                    self.seen.subscribed.load(Ordering::SeqCst) > subscribed
                });
            }
        }
        fn deduplicates(&self) -> bool {
            false
        }
        fn fence_receiver(&self) -> bool {
            false
        }
    }

    #[test]
    fn the_mqtt_sink_keeps_the_sink_contract() {
        let broker = Mosquitto::start().expect("mosquitto");
        let seen = Arc::new(Seen::default());
        let subscriber = subscribe(broker.port(), seen.clone());
        wait_until("subscribed", || seen.subscribed.load(Ordering::SeqCst) > 0);
        let options = MqttOptions::new("127.0.0.1", broker.port(), "contract-sink")
            .unwrap()
            .with_connect_timeout(Duration::from_secs(2));
        let under_test = MqttUnderTest {
            sink: MqttSink::new(options, TOPIC)
                .unwrap()
                .with_timeout(Duration::from_secs(2))
                .unwrap(),
            broker: RefCell::new(broker),
            seen: seen.clone(),
        };
        smol::block_on(sinks::run_all(&under_test, "mqtt"));
        seen.stop.store(true, Ordering::Relaxed);
        // The subscriber's next poll ends it (a ping at the latest).
        drop(under_test);
        let _ = subscriber;
    }

    #[test]
    fn a_topic_with_a_wildcard_or_nothing_is_refused() {
        let options = MqttOptions::new("127.0.0.1", 1883, "c").unwrap();
        for topic in ["", "a/+", "a/#"] {
            let refused = MqttSink::new(options.clone(), topic).err().expect(topic);
            assert!(refused.to_string().contains("topic"), "{refused}");
        }
    }
}
