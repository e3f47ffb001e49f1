//! Messages per second through each endpoint on one replica, beside a
//! plain client loop on the same server in the same run, with a trivial
//! handler:
//!
//! - Redis Stream: a plain redis-rs `XREADGROUP COUNT 10` / multi-id
//!   `XACK` loop on a multiplexed connection, beside `StreamConsumer` with
//!   the gateway's defaults (batch 10), through a non-binding limiter
//!   (the `Admission` an endpoint names: its cost, not its effect), and
//!   with a handler that waits 1 ms at concurrency 1 and 16;
//! - Redis Pub/Sub: a plain redis-rs blocking `get_message` loop beside
//!   `PubSubEndpoint` (no locker: the lease check still runs per message),
//!   while one client publishes pipelined;
//! - MQTT: a plain rumqttc loop on a shared subscription beside
//!   `MqttEndpoint` on the same subscription, QoS 1, while one client
//!   publishes.
//!
//! The endpoint's queue is as deep as the run (Pub/Sub), so nothing is
//! dropped and the figure is throughput, not loss. Each pair runs in turn,
//! three rounds, and each keeps its best, so that a slow moment of the
//! machine does not decide the ratio.
//!
//! `cargo bench -p guard-benches --bench endpoints [-- MESSAGES]`
//! (`--test` runs a short smoke pass). Starts its own `redis-server` and
//! Mosquitto.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use futures_lite::future;
use guard_core::limit::{FullPolicy, Rate, TokenBucket};
use guard_core::retry::Classifier;
use guard_endpoints::admission::{Admission, Verdict};
use guard_endpoints::config::WhenLimited;
use guard_endpoints::mqtt::{MqttEndpoint, MqttOptions, Subscription};
use guard_endpoints::redis::{PubSubEndpoint, StreamConsumer, WhenFull};
use guard_redis::{RedisConnection, Topology};
use guard_std::GuardConfig;
use guard_std::ratelimit::{MemoryLimiter, NamedRateLimiter};
use guard_testkit::{Mosquitto, RedisServer};

/// Adds `n` entries to `stream`, pipelined in chunks.
fn fill(server: &RedisServer, stream: &str, n: u64) {
    let mut conn = redis::Client::open(server.url())
        .and_then(|c| c.get_connection())
        .expect("connect");
    for chunk in 0..n.div_ceil(1_000) {
        let mut pipe = redis::pipe();
        for i in chunk * 1_000..((chunk + 1) * 1_000).min(n) {
            pipe.cmd("XADD")
                .arg(stream)
                .arg("*")
                .arg("payload")
                .arg(format!("e{i}"))
                .arg("device")
                .arg(format!("d{}", i % 100))
                .ignore();
        }
        let () = pipe.query(&mut conn).expect("XADD");
    }
}

/// Waits (on the caller's executor) until `count` reaches `n`.
async fn reach(count: &AtomicU64, n: u64) {
    while count.load(Ordering::Relaxed) < n {
        async_io::Timer::after(Duration::from_millis(1)).await;
    }
}

/// A plain redis-rs consumer-group loop: `XREADGROUP COUNT 10`, the
/// handler, one `XACK` for the batch. Entries per second.
fn stream_plain(server: &RedisServer, name: &str, n: u64) -> f64 {
    fill(server, name, n);
    smol::block_on(async {
        let client = redis::Client::open(server.url()).expect("client");
        let mut conn = client
            .get_multiplexed_async_connection()
            .await
            .expect("connect");
        let () = redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(name)
            .arg("bench")
            .arg("0")
            .query_async(&mut conn)
            .await
            .expect("XGROUP");
        let started = Instant::now();
        let mut handled = 0;
        while handled < n {
            let reply: redis::streams::StreamReadReply = redis::cmd("XREADGROUP")
                .arg("GROUP")
                .arg("bench")
                .arg("plain")
                .arg("COUNT")
                .arg(10)
                .arg("STREAMS")
                .arg(name)
                .arg(">")
                .query_async(&mut conn)
                .await
                .expect("XREADGROUP");
            let ids: Vec<String> = reply
                .keys
                .into_iter()
                .flat_map(|k| k.ids)
                .map(|entry| {
                    // The trivial handler: look at the payload.
                    std::hint::black_box(entry.map.get("payload"));
                    entry.id
                })
                .collect();
            handled += ids.len() as u64;
            let _: u64 = redis::cmd("XACK")
                .arg(name)
                .arg("bench")
                .arg(&ids)
                .query_async(&mut conn)
                .await
                .expect("XACK");
        }
        n as f64 / started.elapsed().as_secs_f64()
    })
}

/// How a `StreamConsumer` run is set up.
struct StreamRun {
    gate: Option<Arc<Admission>>,
    concurrency: usize,
    /// How long the handler waits (an I/O call it makes).
    wait: Option<Duration>,
}

/// `StreamConsumer` with the gateway's defaults. Entries per second.
fn stream_guard(
    server: &RedisServer,
    conn: &RedisConnection,
    name: &str,
    n: u64,
    run: &StreamRun,
) -> f64 {
    fill(server, name, n);
    let handled = Arc::new(AtomicU64::new(0));
    let batch = guard_endpoints::redis::DEFAULT_BATCH.max(run.concurrency);
    let consumer = StreamConsumer::new(conn.clone(), name, "bench", "consumer-1")
        .and_then(|c| c.with_batch(batch))
        .and_then(|c| c.with_concurrency(run.concurrency))
        .expect("consumer");
    let (handle, control) = guard_smol::control();
    let started = Instant::now();
    smol::block_on(async {
        let stop = async {
            reach(&handled, n).await;
            handle.stop();
        };
        let consume = consumer.run(control, Classifier::retry_all(), |message| {
            let (handled, gate, wait) = (handled.clone(), run.gate.clone(), run.wait);
            async move {
                if let Some(gate) = &gate {
                    let key = message
                        .field("device")
                        .and_then(|d| std::str::from_utf8(d).ok())
                        .unwrap_or("");
                    if let Verdict::Refused(why) = gate.admit(key).await {
                        return Err(why.to_string());
                    }
                }
                if let Some(wait) = wait {
                    async_io::Timer::after(wait).await;
                }
                handled.fetch_add(1, Ordering::Relaxed);
                Ok::<(), String>(())
            }
        });
        future::zip(consume, stop).await;
    });
    n as f64 / started.elapsed().as_secs_f64()
}

/// Publishes `n` messages on `channel` of the server at `url`,
/// pipelined, once a subscriber is in place.
fn publish_redis(url: &str, channel: &str, n: u64) {
    let mut conn = redis::Client::open(url)
        .and_then(|c| c.get_connection())
        .expect("connect");
    while redis::cmd("PUBSUB")
        .arg("NUMPAT")
        .query::<i64>(&mut conn)
        .expect("PUBSUB")
        == 0
    {
        thread::sleep(Duration::from_millis(5));
    }
    for chunk in 0..n.div_ceil(1_000) {
        let mut pipe = redis::pipe();
        for i in chunk * 1_000..((chunk + 1) * 1_000).min(n) {
            pipe.cmd("PUBLISH")
                .arg(channel)
                .arg(format!("m{i}"))
                .ignore();
        }
        let () = pipe.query(&mut conn).expect("PUBLISH");
    }
}

/// A plain redis-rs subscriber: a blocking connection, `get_message` in
/// a loop. Messages per second from the first to the last.
fn pubsub_plain(server: &RedisServer, n: u64) -> f64 {
    let client = redis::Client::open(server.url()).expect("client");
    let mut conn = client.get_connection().expect("connect");
    let mut pubsub = conn.as_pubsub();
    pubsub.psubscribe("plain.*").expect("PSUBSCRIBE");
    let publisher = {
        let url = server.url();
        thread::spawn(move || publish_redis(&url, "plain.a", n))
    };
    let first = pubsub.get_message().expect("message");
    std::hint::black_box(first.get_payload_bytes());
    let started = Instant::now();
    for _ in 1..n {
        let message = pubsub.get_message().expect("message");
        std::hint::black_box(message.get_payload_bytes());
    }
    let rate = (n - 1) as f64 / started.elapsed().as_secs_f64();
    publisher.join().expect("publisher");
    rate
}

/// `PubSubEndpoint` with no locker. Messages per second from the first
/// to the last.
fn pubsub_guard(server: &RedisServer, n: u64) -> f64 {
    let config = GuardConfig::new();
    let scope = config.scope("bench").expect("scope");
    let endpoint = PubSubEndpoint::new(&server.url(), &config, &scope, &["guard.*"])
        .and_then(|e| e.with_queue(n as usize, WhenFull::DropNewest))
        .expect("endpoint");
    let publisher = {
        let url = server.url();
        thread::spawn(move || publish_redis(&url, "guard.a", n))
    };
    let handled = AtomicU64::new(0);
    // (first handled, last handled)
    let times = std::sync::Mutex::new((None::<Instant>, Instant::now()));
    let (handle, control) = guard_smol::control();
    smol::block_on(async {
        let stop = async {
            reach(&handled, n).await;
            handle.stop();
        };
        let consume = endpoint.run(control, |message| {
            std::hint::black_box(message.payload);
            handled.fetch_add(1, Ordering::Relaxed);
            let mut times = times.lock().unwrap();
            times.0.get_or_insert_with(Instant::now);
            times.1 = Instant::now();
            async {}
        });
        future::zip(consume, stop).await;
    });
    publisher.join().expect("publisher");
    let (first, last) = *times.lock().unwrap();
    (n - 1) as f64 / (last - first.expect("a message")).as_secs_f64()
}

/// Publishes `n` messages (`m0`, `m1`, ...) to `topic` at QoS 1 from a
/// client of its own on a thread, and waits for the broker's
/// acknowledgements there.
fn publish_mqtt(broker: &Mosquitto, topic: &str, n: u64) -> thread::JoinHandle<()> {
    use rumqttc::{AsyncClient, Event, Incoming, MqttOptions, QoS};
    let options = MqttOptions::new(format!("bench-pub-{topic}"), "127.0.0.1", broker.port());
    let topic = topic.to_owned();
    thread::spawn(move || {
        let (client, mut events) = AsyncClient::new(options, 1_000);
        future::block_on(async_compat::Compat::new(async {
            let send = async {
                for i in 0..n {
                    client
                        .publish(&topic, QoS::AtLeastOnce, false, format!("m{i}"))
                        .await
                        .expect("publish");
                }
            };
            let acked = async {
                let mut acked = 0;
                while acked < n {
                    if let Event::Incoming(Incoming::PubAck(_)) = events.poll().await.expect("poll")
                    {
                        acked += 1;
                    }
                }
            };
            future::zip(send, acked).await;
        }));
    })
}

/// A plain rumqttc subscriber on a shared subscription, QoS 1. Messages
/// per second from the first to the last, and how many arrived (the
/// broker drops what exceeds a subscriber's queue).
fn mqtt_plain(broker: &Mosquitto, n: u64) -> (f64, u64) {
    use rumqttc::{AsyncClient, Event, Incoming, MqttOptions, QoS};
    let options = MqttOptions::new("bench-plain", "127.0.0.1", broker.port());
    let (client, mut events) = AsyncClient::new(options, 1_000);
    future::block_on(async_compat::Compat::new(async {
        client
            .subscribe("$share/bench/plain/a", QoS::AtLeastOnce)
            .await
            .expect("subscribe");
        loop {
            if let Event::Incoming(Incoming::SubAck(_)) = events.poll().await.expect("poll") {
                break;
            }
        }
        let publisher = publish_mqtt(broker, "plain/a", n);
        let (mut received, mut first, mut last) = (0_u64, None, Instant::now());
        while received < n {
            let event = future::or(async { Some(events.poll().await) }, async {
                async_io::Timer::after(Duration::from_secs(2)).await;
                None
            })
            .await;
            match event {
                Some(Ok(Event::Incoming(Incoming::Publish(p)))) => {
                    std::hint::black_box(&p.payload);
                    first.get_or_insert_with(Instant::now);
                    last = Instant::now();
                    received += 1;
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => panic!("mqtt: {e}"),
                None => break,
            }
        }
        publisher.join().expect("publisher");
        let started = first.expect("a message");
        (
            received.saturating_sub(1) as f64 / (last - started).as_secs_f64(),
            received,
        )
    }))
}

/// `MqttEndpoint` on a shared subscription. Messages per second from the
/// first to the last, and how many arrived.
fn mqtt_guard(broker: &Mosquitto, n: u64) -> (f64, u64) {
    let options = MqttOptions::new("127.0.0.1", broker.port(), "bench-guard").expect("options");
    let endpoint = MqttEndpoint::new(
        options,
        Subscription::shared("bench", "guard/a").expect("subscription"),
    );
    // Probes (`p`) tell that the subscription is in place; the timed run
    // is the `m` messages.
    let (probes, received) = (AtomicU64::new(0), AtomicU64::new(0));
    let times = std::sync::Mutex::new((None::<Instant>, Instant::now()));
    let (handle, control) = guard_smol::control();
    smol::block_on(async {
        let stop = async {
            while probes.load(Ordering::Relaxed) == 0 {
                mqtt_probe(broker, "guard/a");
                async_io::Timer::after(Duration::from_millis(50)).await;
            }
            let publisher = publish_mqtt(broker, "guard/a", n);
            // Until all arrived, or none for 2 s (the broker dropped some).
            let mut seen = u64::MAX;
            loop {
                async_io::Timer::after(Duration::from_secs(2)).await;
                let now = received.load(Ordering::Relaxed);
                if now >= n || now == seen {
                    break;
                }
                seen = now;
            }
            handle.stop();
            publisher.join().expect("publisher");
        };
        let consume = endpoint.run(control, |message| {
            if message.payload.first() == Some(&b'm') {
                received.fetch_add(1, Ordering::Relaxed);
                let mut times = times.lock().unwrap();
                times.0.get_or_insert_with(Instant::now);
                times.1 = Instant::now();
            } else {
                probes.fetch_add(1, Ordering::Relaxed);
            }
            async {}
        });
        future::zip(consume, stop).await;
    });
    let (first, last) = *times.lock().unwrap();
    let received = received.load(Ordering::Relaxed);
    let elapsed = (last - first.expect("a message")).as_secs_f64();
    (received.saturating_sub(1) as f64 / elapsed, received)
}

/// One probe message (`p`) to `topic`.
fn mqtt_probe(broker: &Mosquitto, topic: &str) {
    broker.publish(topic, &[b"p".to_vec()]).expect("probe");
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let smoke = args.iter().any(|a| a == "--test");
    let n: u64 = args
        .iter()
        .filter_map(|a| a.parse().ok())
        .next()
        .unwrap_or(if smoke { 2_000 } else { 100_000 });
    // `stream`, `pubsub` or `mqtt` runs that source only.
    let only = ["stream", "pubsub", "mqtt"]
        .into_iter()
        .find(|s| args.iter().any(|a| a == s));
    let runs = |source: &str| only.is_none_or(|o| o == source);
    let server = RedisServer::start().expect("redis-server");
    let broker = Mosquitto::start().expect("mosquitto");
    let conn = smol::block_on(RedisConnection::connect(
        Topology::Standalone { url: server.url() },
        Duration::from_secs(2),
    ))
    .expect("connect");
    // A million a second per device, bursts of a million: never binding.
    let bucket = TokenBucket::new(1_000_000, Rate::per_second(1_000_000)).expect("bucket");
    let limiter = NamedRateLimiter::new(
        "bench",
        Arc::new(MemoryLimiter::new(bucket, 1_024, FullPolicy::DenyNewKeys)),
    );
    let gate = Arc::new(Admission::new(
        Arc::new(limiter),
        WhenLimited::Wait(Duration::from_secs(1)),
    ));
    let plain_run = StreamRun {
        gate: None,
        concurrency: 1,
        wait: None,
    };
    let limited_run = StreamRun {
        gate: Some(gate),
        concurrency: 1,
        wait: None,
    };
    let rounds = if smoke { 1 } else { 3 };
    let best = |f: &mut dyn FnMut(u32) -> f64| (0..rounds).map(f).fold(0.0, f64::max);
    let mut rows: Vec<(String, f64, f64)> = Vec::new();

    let mut waiting_rows: Vec<(usize, f64)> = Vec::new();
    if runs("stream") {
        let (mut plain, mut ours, mut limited) = (0.0_f64, 0.0_f64, 0.0_f64);
        for round in 0..rounds {
            plain = plain.max(stream_plain(&server, &format!("plain-{round}"), n));
            ours = ours.max(stream_guard(
                &server,
                &conn,
                &format!("guard-{round}"),
                n,
                &plain_run,
            ));
            limited = limited.max(stream_guard(
                &server,
                &conn,
                &format!("limited-{round}"),
                n,
                &limited_run,
            ));
        }
        rows.push(("Redis Stream, batch 10".into(), plain, ours));
        rows.push((
            "Redis Stream, batch 10, through a non-binding limiter".into(),
            plain,
            limited,
        ));
        // A handler that waits 1 ms: concurrency is what makes it fast.
        for concurrency in [1, 16] {
            let rate = best(&mut |round| {
                stream_guard(
                    &server,
                    &conn,
                    &format!("wait-{concurrency}-{round}"),
                    n.min(5_000),
                    &StreamRun {
                        gate: None,
                        concurrency,
                        wait: Some(Duration::from_millis(1)),
                    },
                )
            });
            waiting_rows.push((concurrency, rate));
        }
    }
    if runs("pubsub") {
        let (mut plain, mut ours) = (0.0_f64, 0.0_f64);
        for _ in 0..rounds {
            plain = plain.max(pubsub_plain(&server, n));
            ours = ours.max(pubsub_guard(&server, n));
        }
        rows.push((
            "Redis Pub/Sub, one publisher pipelining".into(),
            plain,
            ours,
        ));
    }
    if runs("mqtt") {
        let (mut plain, mut ours) = ((0.0_f64, 0), (0.0_f64, 0));
        let mqtt_n = n.min(20_000);
        for _ in 0..rounds {
            let p = mqtt_plain(&broker, mqtt_n);
            if p.0 > plain.0 {
                plain = p;
            }
            let o = mqtt_guard(&broker, mqtt_n);
            if o.0 > ours.0 {
                ours = o;
            }
        }
        rows.push((
            format!(
                "MQTT shared subscription, QoS 1 (received {} and {} of {mqtt_n})",
                plain.1, ours.1
            ),
            plain.0,
            ours.0,
        ));
    }

    let mut table = String::from(
        "| source, trivial handler | plain client loop /s | guard endpoint /s | guard / plain |\n|---|---|---|---|\n",
    );
    for (name, plain, ours) in &rows {
        table.push_str(&format!(
            "| {name} | {plain:.0} | {ours:.0} | {:.2} |\n",
            ours / plain
        ));
    }
    if !waiting_rows.is_empty() {
        table.push_str("\n| Redis Stream, handler waits 1 ms | entries/s |\n|---|---|\n");
        for (concurrency, rate) in waiting_rows {
            table.push_str(&format!(
                "| concurrency {concurrency} (batch {}) | {rate:.0} |\n",
                concurrency.max(10)
            ));
        }
    }
    // A smoke pass proves the benchmark runs; its figures are not kept.
    if smoke {
        print!("{table}");
    } else {
        guard_benches::publish("endpoints", &table);
    }
}
