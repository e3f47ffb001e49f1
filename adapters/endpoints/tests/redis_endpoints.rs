//! The Redis endpoints on a real redis-server: a Pub/Sub endpoint elected
//! among three replicas, and stream consumer groups.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use futures_lite::future;
use guard_core::guard::{ActiveConfig, ActiveConfigError};
use guard_core::lock::Ttl;
use guard_core::retry::{Classifier, JitterNeedsRandom, RetryPolicy};
use guard_endpoints::Parameter;
use guard_endpoints::delivery::{Unhandled, UnhandledReason};
use guard_endpoints::link::Link;
use guard_endpoints::redis::{
    ConsumeStats, EndpointError, PubSubEndpoint, PubSubStats, StreamConsumer, StreamMessage,
    WhenFull,
};
use guard_redis::{RedisConnection, RedisGuardError, RedisLocker, StreamDlq, Topology};
use guard_smol::{RunHandle, RunnerError, control};
use guard_std::{GuardConfig, SharedLocker};
use guard_testkit::{RedisServer, free_port};

fn connect(server: &RedisServer) -> RedisConnection {
    smol::block_on(RedisConnection::connect(
        Topology::Standalone { url: server.url() },
        Duration::from_millis(500),
    ))
    .expect("connect")
}

fn sync_conn(server: &RedisServer) -> redis::Connection {
    redis::Client::open(server.url())
        .and_then(|c| c.get_connection())
        .expect("sync connection")
}

fn wait_until(limit: Duration, done: impl FnMut() -> bool) -> bool {
    guard_testkit::wait_until("condition", limit, done).is_ok()
}

// ---------------------------------------------------------------- Pub/Sub

/// Per replica: (payload, fence) in the order handled.
type Received = Arc<Mutex<Vec<Vec<(String, u64)>>>>;

/// A replica's Pub/Sub endpoint on its own thread, recording payloads.
fn pubsub_replica(
    server: &RedisServer,
    url: &str,
    id: usize,
    received: &Received,
) -> (RunHandle, thread::JoinHandle<()>) {
    pubsub_replica_on(
        server,
        url,
        id,
        received,
        Link::new(&format!("replica {id}")),
    )
}

/// A replica whose subscription reports to `link`.
fn pubsub_replica_on(
    server: &RedisServer,
    url: &str,
    id: usize,
    received: &Received,
    link: Link,
) -> (RunHandle, thread::JoinHandle<()>) {
    let config =
        GuardConfig::new().with_locker(SharedLocker::new(RedisLocker::new(connect(server))));
    let scope = config
        .scope("endpoint/redis")
        .and_then(|s| s.segment("node", "sensors-in"))
        .unwrap();
    let endpoint = PubSubEndpoint::new(url, &config, &scope, &["sensors.*"])
        .unwrap()
        .with_settings(
            ActiveConfig::new()
                .with_ttl(Ttl::new(Duration::from_millis(300)).unwrap())
                .with_interval(Duration::from_millis(100)),
        )
        .unwrap()
        .with_confirm_timeout(Duration::from_millis(500))
        .with_link(link);
    let received = received.clone();
    let (handle, ctl) = control();
    let thread = thread::spawn(move || {
        smol::block_on(endpoint.run(ctl, move |message| {
            let received = received.clone();
            async move {
                let payload = String::from_utf8(message.payload).unwrap();
                received.lock().unwrap()[id].push((payload, message.fence));
            }
        }));
    });
    (handle, thread)
}

fn pattern_subscribers(conn: &mut redis::Connection) -> i64 {
    redis::cmd("PUBSUB").arg("NUMPAT").query(conn).unwrap()
}

/// Publishes `payloads`, asserting each reached exactly one subscriber.
fn publish_all(conn: &mut redis::Connection, payloads: &[String]) {
    for payload in payloads {
        let receivers: i64 = redis::cmd("PUBLISH")
            .arg("sensors.temp")
            .arg(payload)
            .query(conn)
            .unwrap();
        assert_eq!(receivers, 1, "{payload} reached {receivers} subscribers");
    }
}

/// Which replica received `payloads`, each exactly once, and nobody else.
fn only_receiver(received: &Received, payloads: &[String]) -> usize {
    let received = received.lock().unwrap();
    let holders: Vec<usize> = (0..received.len())
        .filter(|&i| {
            payloads
                .iter()
                .any(|p| received[i].iter().any(|(r, _)| r == p))
        })
        .collect();
    assert_eq!(holders.len(), 1, "received by {holders:?}: {received:?}");
    let leader = holders[0];
    for payload in payloads {
        let copies = received[leader]
            .iter()
            .filter(|(r, _)| r == payload)
            .count();
        assert_eq!(copies, 1, "{payload} processed {copies} times");
    }
    leader
}

#[test]
fn pubsub_three_replicas_one_subscriber_then_a_standby_takes_over() {
    let server = RedisServer::start().expect("redis-server");
    let mut publisher = sync_conn(&server);
    let received: Received = Arc::new(Mutex::new(vec![Vec::new(); 3]));
    let mut replicas: Vec<_> = (0..3)
        .map(|id| Some(pubsub_replica(&server, &server.url(), id, &received)))
        .collect();

    assert!(
        wait_until(Duration::from_secs(5), || pattern_subscribers(
            &mut publisher
        ) == 1),
        "no replica subscribed"
    );
    // Several lease intervals later there is still exactly one subscriber.
    thread::sleep(Duration::from_millis(400));
    assert_eq!(pattern_subscribers(&mut publisher), 1);

    let first: Vec<String> = (0..20).map(|i| format!("a{i}")).collect();
    publish_all(&mut publisher, &first);
    assert!(wait_until(Duration::from_secs(3), || {
        received.lock().unwrap().iter().map(Vec::len).sum::<usize>() == 20
    }));
    let leader = only_receiver(&received, &first);

    // The leader stops: it unsubscribes and releases; a standby subscribes.
    let (handle, thread) = replicas[leader].take().unwrap();
    handle.stop();
    thread.join().unwrap();
    // Probes until one reaches a standby: its subscription is in place
    // (the stopped leader's closing connection may still be counted).
    let standby = (0..100)
        .find_map(|i| {
            let probe = format!("probe{i}");
            redis::cmd("PUBLISH")
                .arg("sensors.temp")
                .arg(&probe)
                .query::<i64>(&mut publisher)
                .unwrap();
            thread::sleep(Duration::from_millis(50));
            let received = received.lock().unwrap();
            (0..3).find(|&id| id != leader && received[id].iter().any(|(p, _)| *p == probe))
        })
        .expect("no standby subscribed after the leader stopped");
    let second: Vec<String> = (0..20).map(|i| format!("b{i}")).collect();
    publish_all(&mut publisher, &second);
    assert!(wait_until(Duration::from_secs(3), || {
        let received = received.lock().unwrap();
        received
            .iter()
            .flatten()
            .filter(|(p, _)| p.starts_with('b'))
            .count()
            == 20
    }));
    let next = only_receiver(&received, &second);
    assert_eq!(next, standby);
    assert_ne!(next, leader);
    // Each leader's messages carry its lease's fence, the new one higher.
    let fence_of = |id: usize| {
        let fences: Vec<u64> = received.lock().unwrap()[id]
            .iter()
            .map(|(_, f)| *f)
            .collect();
        assert!(fences.windows(2).all(|w| w[0] == w[1]), "{fences:?}");
        fences[0]
    };
    assert!(fence_of(next) > fence_of(leader));

    for (handle, thread) in replicas.into_iter().flatten() {
        handle.stop();
        thread.join().unwrap();
    }
    // The server counts a closed connection once it has read the close.
    assert!(
        wait_until(Duration::from_secs(3), || pattern_subscribers(
            &mut publisher
        ) == 0),
        "a subscription outlived its replica"
    );
}

#[test]
fn pubsub_messages_queued_when_leadership_ends_are_handed_over_whole_with_their_origin() {
    let server = RedisServer::start().expect("redis-server");
    let config =
        GuardConfig::new().with_locker(SharedLocker::new(RedisLocker::new(connect(&server))));
    let scope = config.scope("endpoint/redis").unwrap();
    let kept = Arc::new(Mutex::new(Vec::<Unhandled>::new()));
    let into = kept.clone();
    let endpoint = PubSubEndpoint::new(&server.url(), &config, &scope, &["sensors.*"])
        .unwrap()
        .with_settings(
            ActiveConfig::new()
                .with_ttl(Ttl::new(Duration::from_millis(900)).unwrap())
                .with_interval(Duration::from_millis(300)),
        )
        .unwrap()
        .with_unhandled(move |message| into.lock().unwrap().push(message));
    let endpoint = Arc::new(endpoint);
    let handled = Arc::new(Mutex::new(Vec::<String>::new()));
    let (handle, ctl) = control();
    let consumer = {
        let (endpoint, handled) = (endpoint.clone(), handled.clone());
        thread::spawn(move || {
            smol::block_on(endpoint.run(ctl, move |message| {
                handled
                    .lock()
                    .unwrap()
                    .push(String::from_utf8(message.payload).unwrap());
                // A slow handler: the rest wait in the queue.
                async {
                    async_io::Timer::after(Duration::from_millis(20)).await;
                }
            }))
        })
    };
    let mut publisher = sync_conn(&server);
    assert!(
        wait_until(Duration::from_secs(5), || pattern_subscribers(
            &mut publisher
        ) == 1),
        "never subscribed"
    );
    let payloads: Vec<String> = (0..200)
        .map(|i| format!("reading-{i}-{}", "x".repeat(i)))
        .collect();
    publish_all(&mut publisher, &payloads);
    assert!(wait_until(Duration::from_secs(5), || handled
        .lock()
        .unwrap()
        .len()
        >= 5));
    // Leadership ends with most of them still queued.
    assert!(handle.demote());
    assert!(
        wait_until(Duration::from_secs(10), || {
            handled.lock().unwrap().len() + kept.lock().unwrap().len() >= payloads.len()
        }),
        "handled {} + handed over {} of {}",
        handled.lock().unwrap().len(),
        kept.lock().unwrap().len(),
        payloads.len()
    );
    handle.stop();
    let stats = consumer.join().unwrap();
    let (handled, kept) = (
        handled.lock().unwrap().clone(),
        kept.lock().unwrap().clone(),
    );
    assert!(
        kept.len() >= 100,
        "only {} handed over: {stats:?}",
        kept.len()
    );
    // Every message ends in exactly one place, whole.
    let mut all: Vec<String> = handled.clone();
    all.extend(
        kept.iter()
            .map(|m| String::from_utf8(m.payload.clone()).unwrap()),
    );
    all.sort();
    let mut expected = payloads.clone();
    expected.sort();
    assert_eq!(all, expected, "{stats:?}");
    for message in &kept {
        assert_eq!(message.origin, "sensors.temp");
        assert_eq!(message.reason, UnhandledReason::Demoted, "{message:?}");
        assert!(message.fence.is_some());
    }
    assert_eq!(stats.dropped_demoted, kept.len() as u64, "{stats:?}");
}

#[test]
fn pubsub_a_replica_that_cannot_subscribe_releases_the_lease() {
    let server = RedisServer::start().expect("redis-server");
    let mut publisher = sync_conn(&server);
    let received: Received = Arc::new(Mutex::new(vec![Vec::new(); 2]));
    // Replica 0 locks on the real server but subscribes on a closed port.
    let dead_url = format!("redis://127.0.0.1:{}/", free_port().unwrap());
    let (broken_link, healthy_link) = (Link::new("broken"), Link::new("healthy"));
    let broken = pubsub_replica_on(&server, &dead_url, 0, &received, broken_link.clone());
    // Alone, it takes the lease (and fails to subscribe) several times,
    // each a failed connection of its source.
    assert!(
        wait_until(Duration::from_secs(5), || broken_link.failure().is_some()),
        "{broken_link:?}"
    );
    thread::sleep(Duration::from_millis(300));
    let healthy = pubsub_replica_on(&server, &server.url(), 1, &received, healthy_link.clone());
    assert!(
        wait_until(Duration::from_secs(5), || pattern_subscribers(
            &mut publisher
        ) == 1),
        "the healthy replica never subscribed: the broken one kept the lease"
    );
    let payloads: Vec<String> = (0..5).map(|i| format!("m{i}")).collect();
    publish_all(&mut publisher, &payloads);
    assert!(wait_until(Duration::from_secs(3), || {
        received.lock().unwrap()[1].len() == 5
    }));
    assert_eq!(only_receiver(&received, &payloads), 1);
    assert!(healthy_link.is_up(), "{healthy_link:?}");
    assert!(
        !broken_link.is_up(),
        "its last attempt failed: {broken_link:?}"
    );
    for (handle, thread) in [broken, healthy] {
        handle.stop();
        thread.join().unwrap();
    }
}

#[test]
fn pubsub_endpoint_rejects_bad_input() {
    let config = GuardConfig::new();
    let scope = config.scope("endpoint/redis").unwrap();
    let err = PubSubEndpoint::new("redis://127.0.0.1:1/", &config, &scope, &[]).unwrap_err();
    assert!(err.to_string().contains("patterns"), "{err}");
    assert!(
        matches!(
            err,
            EndpointError::InvalidInput(guard_endpoints::InvalidInput {
                parameter: Parameter::Patterns,
                ..
            })
        ),
        "{err}"
    );
    let err = PubSubEndpoint::new("nonsense://x", &config, &scope, &["a"]).unwrap_err();
    assert!(err.to_string().contains("redis"), "{err}");
    let source = std::error::Error::source(&err).expect("the backend's error");
    assert!(
        matches!(
            source.downcast_ref::<RedisGuardError>(),
            Some(RedisGuardError::Redis(_))
        ),
        "{source:?}"
    );
    // A drift margin longer than the lease leaves no time to renew.
    let err = PubSubEndpoint::new("redis://127.0.0.1:1/", &config, &scope, &["a"])
        .unwrap()
        .with_settings(ActiveConfig::new().with_drift(Duration::from_secs(60)))
        .unwrap_err();
    let timing = RunnerError::Timing(ActiveConfigError::DriftNotBelowTtl);
    assert!(
        matches!(err, EndpointError::Guard(e) if e == timing),
        "{err}"
    );
    let source = std::error::Error::source(&err).expect("the runner's error");
    assert_eq!(source.downcast_ref::<RunnerError>(), Some(&timing));
}

/// Publishes to `channel` at `rate` per second for `duration`, in batches
/// every 10 ms; returns how many copies reached a subscriber, and how
/// many publications reached none.
fn flood(server: &RedisServer, channel: &str, rate: u64, duration: Duration) -> (u64, u64) {
    let mut conn = sync_conn(server);
    let batch = (rate / 100).max(1);
    let start = std::time::Instant::now();
    let (mut delivered, mut missed) = (0_u64, 0_u64);
    let mut round = 0_u32;
    while start.elapsed() < duration {
        let mut pipe = redis::pipe();
        for i in 0..batch {
            pipe.cmd("PUBLISH")
                .arg(channel)
                .arg(format!("m{round}-{i}"));
        }
        let receivers: Vec<i64> = pipe.query(&mut conn).unwrap();
        delivered += receivers.iter().map(|&r| r as u64).sum::<u64>();
        missed += receivers.iter().filter(|&&r| r == 0).count() as u64;
        round += 1;
        if let Some(rest) = (Duration::from_millis(10) * round).checked_sub(start.elapsed()) {
            thread::sleep(rest);
        }
    }
    (delivered, missed)
}

/// What a leader did while `publish` flooded it.
struct Flooded {
    published: u64,
    stats: PubSubStats,
    /// Fences the handler saw.
    fences: BTreeSet<u64>,
}

/// Runs one elected endpoint (lease 1.5 s: a renewal that waits behind
/// the handler for that long loses it) whose handler is `handler`, floods
/// it with `publish` (which returns copies delivered and publications no
/// subscriber received), and asserts what must hold under any flood: the
/// subscription never lapsed, the lease in Redis never changed while the
/// flood ran, and once the queue drained every message was handled or
/// counted as dropped.
fn lead_through_a_flood(
    handler: fn(),
    publish: impl FnOnce(&RedisServer) -> (u64, u64),
) -> Flooded {
    let server = RedisServer::start().expect("redis-server");
    let mut publisher = sync_conn(&server);
    // Half a million messages is about Redis's default limit for a
    // subscriber's output buffer (32 MiB); on a loaded machine the reader
    // can fall that far behind, and the server's disconnect (counted, but
    // what it discards cannot be) would hide what this measures. That
    // case has a test of its own (`CLIENT KILL`).
    let () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("client-output-buffer-limit")
        .arg("pubsub 512mb 512mb 0")
        .query(&mut publisher)
        .unwrap();
    let config =
        GuardConfig::new().with_locker(SharedLocker::new(RedisLocker::new(connect(&server))));
    let scope = config.scope("endpoint/redis").unwrap();
    let endpoint = PubSubEndpoint::new(&server.url(), &config, &scope, &["flood.*"])
        .unwrap()
        .with_settings(
            ActiveConfig::new()
                .with_ttl(Ttl::new(Duration::from_millis(1500)).unwrap())
                .with_interval(Duration::from_millis(300)),
        )
        .unwrap()
        .with_queue(512, WhenFull::DropNewest)
        .unwrap();
    let endpoint = Arc::new(endpoint);
    // Where the locker keeps the lease.
    let key = guard_core::lock::redis::RedisKeys::new("", endpoint.key())
        .unwrap()
        .lock()
        .to_string();
    let fences = Arc::new(Mutex::new(BTreeSet::new()));
    let (handle, ctl) = control();
    let consumer = {
        let (endpoint, fences) = (endpoint.clone(), fences.clone());
        thread::spawn(move || {
            smol::block_on(endpoint.run(ctl, move |message| {
                handler();
                fences.lock().unwrap().insert(message.fence);
                async {}
            }))
        })
    };
    assert!(
        wait_until(Duration::from_secs(5), || pattern_subscribers(
            &mut publisher
        ) == 1),
        "never subscribed"
    );
    let lease: String = redis::cmd("GET").arg(&key).query(&mut publisher).unwrap();
    // The lease is watched from outside while the flood runs.
    let flooding = Arc::new(AtomicBool::new(true));
    let watcher = {
        let (flooding, key) = (flooding.clone(), key.clone());
        let mut conn = sync_conn(&server);
        thread::spawn(move || {
            let mut seen = Vec::new();
            while flooding.load(Ordering::Relaxed) {
                let now: Option<String> = redis::cmd("GET").arg(&key).query(&mut conn).unwrap();
                seen.push(now);
                thread::sleep(Duration::from_millis(100));
            }
            seen
        })
    };
    let (published, missed) = publish(&server);
    flooding.store(false, Ordering::Relaxed);
    let seen = watcher.join().unwrap();
    assert_eq!(
        missed,
        0,
        "the subscription lapsed during the flood (published {published}): {:?}; lease {:?}",
        endpoint.stats(),
        seen.iter()
            .filter(|v| v.as_deref() != Some(lease.as_str()))
            .count()
    );
    let changed: Vec<_> = seen
        .iter()
        .filter(|v| v.as_deref() != Some(lease.as_str()))
        .collect();
    assert!(
        changed.is_empty(),
        "the leader lost its lease during the flood: {} of {} reads saw {:?}",
        changed.len(),
        seen.len(),
        changed.first()
    );
    // What is queued drains; then every message is handled or counted.
    let accounted = || {
        let stats = endpoint.stats();
        stats.handled + stats.dropped_full
    };
    assert!(
        wait_until(Duration::from_secs(60), || accounted() == published),
        "published {published}: {:?}",
        endpoint.stats()
    );
    let stats = endpoint.stats();
    assert_eq!(stats.received, published, "{stats:?}");
    assert_eq!(
        (stats.refused_late, stats.dropped_demoted, stats.disconnects),
        (0, 0, 0),
        "{stats:?}"
    );
    handle.stop();
    let last = consumer.join().unwrap();
    assert_eq!(last.handled, stats.handled);
    let fences = fences.lock().unwrap().clone();
    Flooded {
        published,
        stats,
        fences,
    }
}

#[test]
fn pubsub_a_flood_at_ten_times_the_handlers_speed_keeps_the_lease_and_counts_every_drop() {
    // The worst handler: it blocks its thread for 1 ms a message, about
    // 1,000 a second; the flood is ten times that, for 30 s.
    let flooded = lead_through_a_flood(
        || thread::sleep(Duration::from_millis(1)),
        |server| flood(server, "flood.a", 10_000, Duration::from_secs(30)),
    );
    let stats = flooded.stats;
    // The handler ran at its own speed throughout, under one lease, and
    // the rest was dropped and counted.
    assert!(stats.handled > 15_000, "{stats:?}");
    assert!(stats.dropped_full > flooded.published / 2, "{stats:?}");
    assert_eq!(flooded.fences.len(), 1, "{:?}", flooded.fences);
}

#[test]
fn pubsub_half_a_million_messages_as_fast_as_redis_takes_them_keep_the_lease() {
    // The observation: 500,000 messages published as fast as the server
    // accepts them (pipelined), a trivial handler.
    let flooded = lead_through_a_flood(
        || {},
        |server| {
            let mut conn = sync_conn(server);
            let (mut delivered, mut missed) = (0_u64, 0_u64);
            for round in 0..500 {
                let mut pipe = redis::pipe();
                for i in 0..1000 {
                    pipe.cmd("PUBLISH")
                        .arg("flood.b")
                        .arg(format!("m{round}-{i}"));
                }
                let receivers: Vec<i64> = pipe.query(&mut conn).unwrap();
                delivered += receivers.iter().map(|&r| r as u64).sum::<u64>();
                missed += receivers.iter().filter(|&&r| r == 0).count() as u64;
            }
            (delivered, missed)
        },
    );
    assert_eq!(flooded.published, 500_000);
    assert!(flooded.stats.handled > 0, "{:?}", flooded.stats);
    assert_eq!(flooded.fences.len(), 1, "{:?}", flooded.fences);
}

#[test]
fn pubsub_a_subscription_the_server_closes_is_counted_and_the_leader_subscribes_again() {
    let server = RedisServer::start().expect("redis-server");
    let mut publisher = sync_conn(&server);
    let received: Received = Arc::new(Mutex::new(vec![Vec::new(); 1]));
    let config =
        GuardConfig::new().with_locker(SharedLocker::new(RedisLocker::new(connect(&server))));
    let scope = config.scope("endpoint/redis").unwrap();
    let endpoint = Arc::new(
        PubSubEndpoint::new(&server.url(), &config, &scope, &["sensors.*"])
            .unwrap()
            .with_settings(
                ActiveConfig::new()
                    .with_ttl(Ttl::new(Duration::from_millis(300)).unwrap())
                    .with_interval(Duration::from_millis(100)),
            )
            .unwrap(),
    );
    let (handle, ctl) = control();
    let consumer = {
        let (endpoint, received) = (endpoint.clone(), received.clone());
        thread::spawn(move || {
            smol::block_on(endpoint.run(ctl, move |message| {
                let payload = String::from_utf8(message.payload).unwrap();
                received.lock().unwrap()[0].push((payload, message.fence));
                async {}
            }))
        })
    };
    let subscribed = |publisher: &mut redis::Connection| {
        wait_until(Duration::from_secs(5), || {
            pattern_subscribers(publisher) == 1
        })
    };
    assert!(subscribed(&mut publisher), "never subscribed");
    // What a server does to a subscriber past its client-output-buffer-limit.
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query(&mut publisher)
        .unwrap();
    assert_eq!(killed, 1);
    assert!(
        wait_until(Duration::from_secs(3), || endpoint.stats().disconnects == 1),
        "{:?}",
        endpoint.stats()
    );
    // It stepped down; alone, it is elected again and subscribes again.
    assert!(subscribed(&mut publisher), "never subscribed again");
    let payloads: Vec<String> = (0..5).map(|i| format!("after{i}")).collect();
    publish_all(&mut publisher, &payloads);
    assert!(wait_until(Duration::from_secs(3), || {
        received.lock().unwrap()[0].len() == 5
    }));
    handle.stop();
    let stats = consumer.join().unwrap();
    assert_eq!((stats.disconnects, stats.handled), (1, 5), "{stats:?}");
}

// ---------------------------------------------------------------- Streams

type Seen = Arc<Mutex<BTreeMap<String, Vec<usize>>>>;

fn add_entries(conn: &mut redis::Connection, stream: &str, payloads: impl Iterator<Item = String>) {
    let mut pipe = redis::pipe();
    for payload in payloads {
        pipe.cmd("XADD")
            .arg(stream)
            .arg("*")
            .arg("payload")
            .arg(payload)
            .ignore();
    }
    pipe.query::<()>(conn).unwrap();
}

fn pending(conn: &mut redis::Connection, stream: &str, group: &str) -> i64 {
    let reply: Vec<redis::Value> = redis::cmd("XPENDING")
        .arg(stream)
        .arg(group)
        .query(conn)
        .unwrap();
    match reply.first() {
        Some(redis::Value::Int(n)) => *n,
        other => panic!("XPENDING summary: {other:?}"),
    }
}

fn consumer(server: &RedisServer, name: &str) -> StreamConsumer {
    StreamConsumer::new(connect(server), "orders", "billing", name)
        .unwrap()
        .with_poll_interval(Duration::from_millis(20))
        .with_claim_idle(Duration::from_millis(300))
        .unwrap()
}

/// A consumer on its own thread that records which payloads it handled.
fn run_consumer(
    consumer: StreamConsumer,
    id: usize,
    seen: &Seen,
) -> (RunHandle, thread::JoinHandle<ConsumeStats>) {
    let seen = seen.clone();
    let (handle, ctl) = control();
    let thread = thread::spawn(move || {
        smol::block_on(consumer.run(ctl, Classifier::retry_all(), move |message| {
            let seen = seen.clone();
            async move {
                let payload = String::from_utf8(message.payload().unwrap().to_vec()).unwrap();
                seen.lock().unwrap().entry(payload).or_default().push(id);
                Ok::<(), String>(())
            }
        }))
    });
    (handle, thread)
}

/// Waits until `count` distinct entries were handled, stops the consumers,
/// checks each entry was handled once and none is pending, and returns
/// the consumers' counts.
fn finish(
    consumers: Vec<(RunHandle, thread::JoinHandle<ConsumeStats>)>,
    seen: &Seen,
    count: usize,
    conn: &mut redis::Connection,
) -> Vec<ConsumeStats> {
    let limit = Duration::from_secs(20);
    let all_seen = wait_until(limit, || seen.lock().unwrap().len() == count);
    let stats = consumers
        .into_iter()
        .map(|(handle, thread)| {
            handle.stop();
            thread.join().unwrap()
        })
        .collect();
    assert!(
        all_seen,
        "only {} of {count} handled",
        seen.lock().unwrap().len()
    );
    assert_each_once(seen, count);
    assert_eq!(pending(conn, "orders", "billing"), 0);
    stats
}

fn assert_each_once(seen: &Seen, count: usize) {
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), count, "distinct entries handled");
    for (payload, by) in seen.iter() {
        assert_eq!(by.len(), 1, "{payload} handled by {by:?}");
    }
}

#[test]
fn streams_three_consumers_handle_a_thousand_entries_exactly_once() {
    let server = RedisServer::start().expect("redis-server");
    let mut conn = sync_conn(&server);
    let seen: Seen = Arc::default();
    let consumers: Vec<_> = (0..3)
        .map(|id| run_consumer(consumer(&server, &format!("c{id}")), id, &seen))
        .collect();
    thread::sleep(Duration::from_millis(200));
    add_entries(&mut conn, "orders", (0..1000).map(|i| format!("p{i}")));
    let stats = finish(consumers, &seen, 1000, &mut conn);
    assert_eq!(
        stats.iter().map(|s| s.acked).sum::<u64>(),
        1000,
        "{stats:?}"
    );
}

#[test]
fn streams_pending_entries_of_a_killed_consumer_are_claimed_by_another() {
    let server = RedisServer::start().expect("redis-server");
    let mut conn = sync_conn(&server);
    add_entries(&mut conn, "orders", (0..100).map(|i| format!("p{i}")));
    // The doomed consumer reads a batch, hangs on its first entry and is
    // killed (its future dropped) with the batch still pending on it.
    let doomed = consumer(&server, "doomed");
    let started = Arc::new(Mutex::new(0usize));
    smol::block_on(future::or(
        async {
            let (_handle, ctl) = control();
            let started = started.clone();
            doomed
                .run(ctl, Classifier::retry_all(), move |_message| {
                    *started.lock().unwrap() += 1;
                    future::pending::<Result<(), String>>()
                })
                .await;
        },
        async {
            async_io::Timer::after(Duration::from_millis(300)).await;
        },
    ));
    drop(doomed);
    assert_eq!(
        *started.lock().unwrap(),
        1,
        "the doomed consumer started one entry"
    );
    assert_eq!(
        pending(&mut conn, "orders", "billing"),
        10,
        "its batch is pending"
    );

    let seen: Seen = Arc::default();
    let live: Vec<_> = (0..2)
        .map(|id| run_consumer(consumer(&server, &format!("live{id}")), id, &seen))
        .collect();
    let stats = finish(live, &seen, 100, &mut conn);
    assert_eq!(
        stats.iter().map(|s| s.claimed).sum::<u64>(),
        10,
        "{stats:?}"
    );
}

/// Runs `consumer` until it has read a batch and hangs in its first
/// entry, then drops it there: killed with the batch pending on its name.
fn killed_mid_batch(consumer: StreamConsumer) {
    smol::block_on(future::or(
        async {
            let (_handle, ctl) = control();
            consumer
                .run(ctl, Classifier::retry_all(), |_message| {
                    future::pending::<Result<(), String>>()
                })
                .await;
        },
        async {
            async_io::Timer::after(Duration::from_millis(300)).await;
        },
    ));
}

/// A consumer killed with a batch pending on it and started again under
/// its name takes that batch first, before anything newer: the stream's
/// order holds across the restart, without waiting for the claim idle
/// time; an entry of that batch trimmed meanwhile is let go.
#[test]
fn streams_a_restarted_consumer_takes_its_own_pending_entries_first_in_stream_order() {
    let server = RedisServer::start().expect("redis-server");
    let mut conn = sync_conn(&server);
    add_entries(&mut conn, "orders", (0..100).map(|i| format!("p{i}")));
    let named = || {
        consumer(&server, "replica-1")
            .with_claim_idle(Duration::from_secs(60))
            .unwrap()
    };
    killed_mid_batch(named());
    assert_eq!(pending(&mut conn, "orders", "billing"), 10, "its batch");
    // One entry of that batch is deleted meanwhile (a trim): nothing is
    // left to hand on, and it must not hold the rest back.
    let ids: Vec<String> = redis::cmd("XRANGE")
        .arg("orders")
        .arg("-")
        .arg("+")
        .arg("COUNT")
        .arg(4)
        .query::<redis::streams::StreamRangeReply>(&mut conn)
        .unwrap()
        .ids
        .into_iter()
        .map(|e| e.id)
        .collect();
    let _: u64 = redis::cmd("XDEL")
        .arg("orders")
        .arg(&ids[3])
        .query(&mut conn)
        .unwrap();

    let order: Arc<Mutex<Vec<String>>> = Arc::default();
    let (handle, ctl) = control();
    let restarted = named();
    let thread = thread::spawn({
        let order = order.clone();
        move || {
            smol::block_on(restarted.run(ctl, Classifier::retry_all(), move |message| {
                let payload = String::from_utf8(message.payload().unwrap().to_vec()).unwrap();
                order.lock().unwrap().push(payload);
                future::ready(Ok::<(), String>(()))
            }))
        }
    });
    let all = wait_until(Duration::from_secs(10), || {
        order.lock().unwrap().len() >= 99
    });
    handle.stop();
    let stats = thread.join().unwrap();
    assert!(all, "{} of 99 handled", order.lock().unwrap().len());
    let expected: Vec<String> = (0..100)
        .filter(|&i| i != 3)
        .map(|i| format!("p{i}"))
        .collect();
    assert_eq!(
        *order.lock().unwrap(),
        expected,
        "in stream order, once each"
    );
    assert_eq!(stats.resumed, 9, "{stats:?}");
    assert_eq!(stats.claimed, 0, "{stats:?}");
    assert_eq!(pending(&mut conn, "orders", "billing"), 0);
}

/// A restarted consumer whose first round of its history fails at Redis
/// (its `XACK` refused) reads that history again first, rather than
/// leaving it to the claim behind newer entries.
#[test]
fn streams_a_history_round_that_fails_at_redis_is_read_again_first() {
    let server = RedisServer::start().expect("redis-server");
    let mut conn = sync_conn(&server);
    add_entries(&mut conn, "orders", (0..30).map(|i| format!("p{i}")));
    // The consumer's user may not XACK until the test allows it.
    let _: () = redis::cmd("ACL")
        .arg(
            &[
                "SETUSER", "reader", "on", ">pw", "~*", "&*", "+@all", "-xack",
            ][..],
        )
        .query(&mut conn)
        .unwrap();
    let url = server.url().replace("redis://", "redis://reader:pw@");
    let named = || {
        let conn = smol::block_on(RedisConnection::connect(
            Topology::Standalone { url: url.clone() },
            Duration::from_millis(500),
        ))
        .expect("connect");
        StreamConsumer::new(conn, "orders", "billing", "replica-1")
            .unwrap()
            .with_poll_interval(Duration::from_millis(20))
            .with_claim_idle(Duration::from_secs(60))
            .unwrap()
    };
    killed_mid_batch(named());
    assert_eq!(pending(&mut conn, "orders", "billing"), 10, "its batch");

    let order: Arc<Mutex<Vec<String>>> = Arc::default();
    let (handle, ctl) = control();
    let restarted = named();
    let thread = thread::spawn({
        let order = order.clone();
        let mut admin = sync_conn(&server);
        move || {
            smol::block_on(restarted.run(ctl, Classifier::retry_all(), move |message| {
                let payload = String::from_utf8(message.payload().unwrap().to_vec()).unwrap();
                let mut order = order.lock().unwrap();
                // Seen again: the failed round's history is read again;
                // from now on its XACK goes through.
                if order.contains(&payload) {
                    let _: () = redis::cmd("ACL")
                        .arg(&["SETUSER", "reader", "+xack"][..])
                        .query(&mut admin)
                        .unwrap();
                }
                order.push(payload);
                future::ready(Ok::<(), String>(()))
            }))
        }
    });
    let all = wait_until(Duration::from_secs(10), || {
        order.lock().unwrap().iter().collect::<BTreeSet<_>>().len() >= 30
            && pending(&mut sync_conn(&server), "orders", "billing") == 0
    });
    handle.stop();
    thread.join().unwrap();
    let order = order.lock().unwrap().clone();
    assert!(all, "all handled and acknowledged: {order:?}");
    let mut first = Vec::new();
    for p in &order {
        if !first.contains(p) {
            first.push(p.clone());
        }
    }
    let expected: Vec<String> = (0..30).map(|i| format!("p{i}")).collect();
    assert_eq!(
        first, expected,
        "first handlings in stream order: {order:?}"
    );
    assert_eq!(
        &order[..10],
        &order[10..20],
        "the history twice, then the rest"
    );
}

#[test]
fn streams_failures_are_retried_then_dead_lettered_and_acknowledged() {
    let server = RedisServer::start().expect("redis-server");
    let mut conn = sync_conn(&server);
    add_entries(
        &mut conn,
        "orders",
        ["ok1", "bad", "ok2"].map(String::from).into_iter(),
    );
    let dlq = StreamDlq::new(connect(&server));
    let with_dlq = consumer(&server, "c1")
        .with_retry(RetryPolicy::fixed_delay(2, Duration::from_millis(10)))
        .unwrap()
        .with_dead_letters(StreamDlq::new(connect(&server)), "orders")
        .unwrap();
    let calls: Arc<Mutex<BTreeMap<String, u32>>> = Arc::default();
    let mut handler = {
        let calls = calls.clone();
        move |message: StreamMessage| {
            let payload = String::from_utf8(message.payload().unwrap().to_vec()).unwrap();
            *calls.lock().unwrap().entry(payload.clone()).or_default() += 1;
            async move {
                if payload == "bad" {
                    Err(format!("cannot bill {payload}"))
                } else {
                    Ok(())
                }
            }
        }
    };
    let mut stats = ConsumeStats::default();
    smol::block_on(async {
        with_dlq.create_group().await.unwrap();
        with_dlq
            .poll(Classifier::retry_all(), &mut handler, &mut stats)
            .await
            .unwrap();
    });
    assert_eq!(calls.lock().unwrap()["bad"], 3, "one call and two retries");
    assert_eq!(calls.lock().unwrap()["ok1"], 1);
    assert_eq!((stats.acked, stats.dead_lettered), (2, 1), "{stats:?}");
    assert_eq!(pending(&mut conn, "orders", "billing"), 0);
    let letters = smol::block_on(dlq.range("orders", "-", 10)).unwrap();
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].payload, b"bad");
    assert_eq!(letters[0].attempts, 3);
    assert_eq!(letters[0].origin_stream.as_deref(), Some("orders"));
    assert!(
        letters[0].error.contains("cannot bill bad"),
        "{}",
        letters[0].error
    );

    // Without a dead-letter queue the failed entry stays pending.
    add_entries(&mut conn, "orders", std::iter::once("bad".to_owned()));
    let without = consumer(&server, "c2")
        .with_retry(RetryPolicy::no_retry())
        .unwrap();
    let mut stats = ConsumeStats::default();
    smol::block_on(without.poll(Classifier::retry_all(), &mut handler, &mut stats)).unwrap();
    assert_eq!(stats.left_pending, 1, "{stats:?}");
    assert_eq!(pending(&mut conn, "orders", "billing"), 1);
}

/// A stream entry's fields, as `XRANGE` gives them.
type Fields = Vec<(String, Vec<u8>)>;

#[test]
fn streams_a_dead_letter_keeps_every_field_of_its_entry_after_the_origin_is_gone() {
    let server = RedisServer::start().expect("redis-server");
    let mut conn = sync_conn(&server);
    // No `payload` field: the entry's content is in its other fields, one
    // of them binary and one empty.
    let fields: [(&str, &[u8]); 4] = [
        ("device", b"d7"),
        ("raw", b"\x00\xff"),
        ("reading", b"21.5"),
        ("unit", b""),
    ];
    let mut xadd = redis::cmd("XADD");
    xadd.arg("orders").arg("*");
    for (name, value) in fields {
        xadd.arg(name).arg(value);
    }
    let origin_id: String = xadd.query(&mut conn).unwrap();
    let dlq = StreamDlq::new(connect(&server));
    let failing = consumer(&server, "c1")
        .with_retry(RetryPolicy::no_retry())
        .unwrap()
        .with_dead_letters(StreamDlq::new(connect(&server)), "orders")
        .unwrap();
    let mut stats = ConsumeStats::default();
    smol::block_on(async {
        failing.create_group().await.unwrap();
        failing
            .poll(
                Classifier::retry_all(),
                &mut |_| async { Err::<(), _>("refused") },
                &mut stats,
            )
            .await
            .unwrap();
    });
    assert_eq!(stats.dead_lettered, 1, "{stats:?}");

    // The origin stream is trimmed away: the dead letter alone holds the
    // entry, and a replay gives it back whole.
    let _: i64 = redis::cmd("DEL").arg("orders").query(&mut conn).unwrap();
    let letters = smol::block_on(dlq.range("orders", "-", 10)).unwrap();
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].origin_id.as_deref(), Some(origin_id.as_str()));
    let recorded: Vec<(&str, &[u8])> = letters[0]
        .fields
        .iter()
        .map(|(name, value)| (name.as_str(), value.as_slice()))
        .collect();
    assert_eq!(recorded, fields, "every field, sorted by name");
    let replayed = smol::block_on(dlq.replay_to_origin("orders", &letters[0].id)).unwrap();
    assert!(
        matches!(replayed, guard_redis::ReplayOutcome::Replayed(Some(_))),
        "{replayed:?}"
    );
    let entries: Vec<(String, Fields)> = redis::cmd("XRANGE")
        .arg("orders")
        .arg("-")
        .arg("+")
        .query(&mut conn)
        .unwrap();
    assert_eq!(entries.len(), 1, "{entries:?}");
    let mut back = entries[0].1.clone();
    back.sort();
    let mut expected: Fields = fields
        .iter()
        .map(|(name, value)| ((*name).to_owned(), value.to_vec()))
        .collect();
    expected.push((
        "replayed_from".to_owned(),
        letters[0].id.clone().into_bytes(),
    ));
    expected.sort();
    assert_eq!(back, expected);
}

#[test]
fn streams_concurrent_handlers_start_in_stream_order_never_more_than_the_bound() {
    let server = RedisServer::start().expect("redis-server");
    let mut conn = sync_conn(&server);
    add_entries(&mut conn, "orders", (0..40).map(|i| format!("{i:02}")));
    let consumer = consumer(&server, "c1")
        .with_batch(16)
        .unwrap()
        .with_concurrency(8)
        .unwrap();
    // (started in this order, in flight now, most in flight at once)
    let started = Arc::new(Mutex::new(Vec::new()));
    let (now, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (handle, ctl) = control();
    let run = {
        let (started, now, most) = (started.clone(), now.clone(), most.clone());
        thread::spawn(move || {
            smol::block_on(consumer.run(ctl, Classifier::retry_all(), move |message| {
                let (now, most) = (now.clone(), most.clone());
                started
                    .lock()
                    .unwrap()
                    .push(String::from_utf8(message.payload().unwrap().to_vec()).unwrap());
                async move {
                    let inside = now.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(inside, Ordering::SeqCst);
                    async_io::Timer::after(Duration::from_millis(30)).await;
                    now.fetch_sub(1, Ordering::SeqCst);
                    Ok::<(), String>(())
                }
            }))
        })
    };
    assert!(wait_until(Duration::from_secs(10), || started
        .lock()
        .unwrap()
        .len()
        == 40));
    assert!(wait_until(Duration::from_secs(5), || pending(
        &mut conn, "orders", "billing"
    ) == 0));
    handle.stop();
    let stats = run.join().unwrap();
    assert_eq!(stats.acked, 40, "{stats:?}");
    assert_eq!(most.load(Ordering::SeqCst), 8, "the bound, and reached");
    let expected: Vec<String> = (0..40).map(|i| format!("{i:02}")).collect();
    assert_eq!(
        *started.lock().unwrap(),
        expected,
        "started in stream order"
    );
}

#[test]
fn streams_a_consumer_recreates_its_group_after_redis_lost_its_data() {
    // A restart without persistence (or a failover to a replica that
    // missed it) loses the group: every read then fails with NOGROUP.
    let server = RedisServer::start().expect("redis-server");
    let mut conn = sync_conn(&server);
    add_entries(&mut conn, "orders", (0..5).map(|i| format!("a{i}")));
    let seen: Seen = Arc::default();
    let running = run_consumer(consumer(&server, "c1"), 0, &seen);
    assert!(wait_until(Duration::from_secs(5), || seen
        .lock()
        .unwrap()
        .len()
        == 5));
    let () = redis::cmd("FLUSHALL").query(&mut conn).unwrap();
    add_entries(&mut conn, "orders", (0..5).map(|i| format!("b{i}")));
    let recovered = wait_until(Duration::from_secs(5), || seen.lock().unwrap().len() == 10);
    let (handle, thread) = running;
    handle.stop();
    thread.join().unwrap();
    assert!(recovered, "{:?}", seen.lock().unwrap().keys());
    assert_each_once(&seen, 10);
}

#[test]
fn stream_consumer_rejects_bad_input() {
    let server = RedisServer::start().expect("redis-server");
    let conn = connect(&server);
    let err = StreamConsumer::new(conn.clone(), "", "g", "c").unwrap_err();
    assert!(
        err.to_string().contains("stream \"\": must not be empty"),
        "{err}"
    );
    assert!(
        matches!(
            err,
            EndpointError::InvalidInput(guard_endpoints::InvalidInput {
                parameter: Parameter::Stream,
                ..
            })
        ),
        "{err}"
    );
    let err = StreamConsumer::new(conn.clone(), "s", "g", "c")
        .unwrap()
        .with_batch(0)
        .unwrap_err();
    assert!(err.to_string().contains("batch"), "{err}");
    for concurrency in [0, 11] {
        let err = StreamConsumer::new(conn.clone(), "s", "g", "c")
            .unwrap()
            .with_concurrency(concurrency)
            .unwrap_err();
        assert!(
            err.to_string().contains(&format!(
                "concurrency {concurrency}: must be from 1 to the batch (10)"
            )),
            "{err}"
        );
    }
    let jittery = RetryPolicy::new().with_jitter(guard_core::retry::Jitter::Full);
    let err = StreamConsumer::new(conn.clone(), "s", "g", "c")
        .unwrap()
        .with_retry(jittery)
        .unwrap_err();
    assert!(err.to_string().contains("jitter"), "{err}");
    let source = std::error::Error::source(&err).expect("guard-core's refusal");
    assert_eq!(
        source.downcast_ref::<JitterNeedsRandom>(),
        Some(&JitterNeedsRandom)
    );
    let err = StreamConsumer::new(conn.clone(), "s", "g", "c")
        .unwrap()
        .with_dead_letters(StreamDlq::new(conn), "bad{topic}")
        .unwrap_err();
    assert!(err.to_string().contains("topic"), "{err}");
    let source = std::error::Error::source(&err).expect("the dead-letter queue's refusal");
    assert!(
        matches!(
            source.downcast_ref::<RedisGuardError>(),
            Some(RedisGuardError::InvalidInput {
                parameter: guard_redis::Parameter::DeadLetterTopic,
                ..
            })
        ),
        "{source:?}"
    );
}
