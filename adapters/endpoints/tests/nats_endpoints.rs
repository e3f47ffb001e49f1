//! NATS endpoints on a real `nats-server` (with JetStream) started by each
//! test on a free loopback port.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use async_compat::Compat;
use futures_lite::StreamExt;
use guard_core::guard::ActiveConfig;
use guard_core::lock::Ttl;
use guard_core::retry::{Classifier, Jitter, RetryPolicy};
use guard_endpoints::Parameter;
use guard_endpoints::delivery::{Unhandled, UnhandledReason};
use guard_endpoints::nats::{
    ATTEMPTS, DELIVERIES, Delivery, ERROR, JetStreamConsumer, JetStreamStats, NatsError,
    NatsOptions, NatsStats, NatsSubscriber, ORIGIN_SEQUENCE, ORIGIN_STREAM, ORIGIN_SUBJECT,
};
use guard_smol::{RunHandle, control};
use guard_std::{GuardConfig, LocalLocker, SharedLocker};
use guard_testkit::nats::NatsServer;
use guard_testkit::{FaultyLocker, RenewFault};

/// Payload → the replicas that handled it, in order, with the fence each
/// was told.
type Seen = Arc<Mutex<BTreeMap<String, Vec<(usize, Option<u64>)>>>>;

fn wait_until(limit: Duration, done: impl FnMut() -> bool) -> bool {
    guard_testkit::wait_until("condition", limit, done).is_ok()
}

fn block_on<F: std::future::Future>(work: F) -> F::Output {
    futures_lite::future::block_on(Compat::new(work))
}

fn client(server: &NatsServer) -> async_nats::Client {
    block_on(async_nats::connect(server.url())).expect("connect")
}

/// Publishes `count` payloads `<prefix><i>` on `subject`, flushed.
fn publish(
    client: &async_nats::Client,
    subject: &str,
    prefix: &str,
    range: std::ops::Range<usize>,
) {
    block_on(async {
        for i in range {
            client
                .publish(subject.to_owned(), format!("{prefix}{i}").into())
                .await
                .unwrap();
        }
        client.flush().await.unwrap();
    });
}

/// Publishes to JetStream and waits for each to be stored.
fn publish_stored(client: &async_nats::Client, subject: &str, prefix: &str, count: usize) {
    let js = jetstream_context(client);
    block_on(async {
        for i in 0..count {
            js.publish(subject.to_owned(), format!("{prefix}{i}").into())
                .await
                .unwrap()
                .await
                .unwrap();
        }
    });
}

/// A JetStream context (it starts a task on tokio).
fn jetstream_context(client: &async_nats::Client) -> async_nats::jetstream::Context {
    block_on(async { async_nats::jetstream::new(client.clone()) })
}

fn options(server: &NatsServer) -> NatsOptions {
    NatsOptions::new(&server.url())
        .unwrap()
        .with_reconnect_delay(Duration::from_millis(100))
}

/// Records the payload under `id`, with the fence; fails on payloads
/// starting with `poison`.
fn recorder(
    seen: &Seen,
    id: usize,
) -> impl FnMut(String, Option<u64>) -> std::future::Ready<Result<(), String>> + use<> {
    let seen = seen.clone();
    move |payload, fence| {
        let poisoned = payload.starts_with("poison");
        seen.lock()
            .unwrap()
            .entry(payload.clone())
            .or_default()
            .push((id, fence));
        std::future::ready(if poisoned {
            Err(format!("cannot handle {payload}"))
        } else {
            Ok(())
        })
    }
}

fn run_subscriber(
    subscriber: NatsSubscriber,
    id: usize,
    seen: &Seen,
) -> (RunHandle, thread::JoinHandle<NatsStats>) {
    let mut record = recorder(seen, id);
    let (handle, ctl) = control();
    let thread = thread::spawn(move || {
        smol::block_on(subscriber.run(ctl, Classifier::retry_all(), move |m| {
            record(String::from_utf8(m.payload).unwrap(), m.fence)
        }))
    });
    (handle, thread)
}

fn run_consumer(
    consumer: JetStreamConsumer,
    id: usize,
    seen: &Seen,
) -> (RunHandle, thread::JoinHandle<JetStreamStats>) {
    let mut record = recorder(seen, id);
    let (handle, ctl) = control();
    let thread = thread::spawn(move || {
        smol::block_on(consumer.run(ctl, Classifier::retry_all(), move |m| {
            record(String::from_utf8(m.payload).unwrap(), None)
        }))
    });
    (handle, thread)
}

fn stop<T>(replica: (RunHandle, thread::JoinHandle<T>)) -> T {
    replica.0.stop();
    replica.1.join().unwrap()
}

/// Waits until every one of `count` payloads `<prefix><i>` was handled,
/// then checks none was handled twice; returns the replicas that took
/// part.
fn handled_once(seen: &Seen, prefix: &str, count: usize) -> Vec<usize> {
    let of_prefix = |seen: &BTreeMap<String, Vec<(usize, Option<u64>)>>| {
        seen.keys().filter(|p| p.starts_with(prefix)).count()
    };
    assert!(
        wait_until(Duration::from_secs(10), || of_prefix(&seen.lock().unwrap())
            == count),
        "{} of {count} {prefix}* handled",
        of_prefix(&seen.lock().unwrap())
    );
    // Late duplicates would arrive within this wait.
    thread::sleep(Duration::from_millis(300));
    let seen = seen.lock().unwrap();
    let mut by: Vec<usize> = Vec::new();
    for (payload, handlers) in seen.iter().filter(|(p, _)| p.starts_with(prefix)) {
        assert_eq!(handlers.len(), 1, "{payload} handled by {handlers:?}");
        if !by.contains(&handlers[0].0) {
            by.push(handlers[0].0);
        }
    }
    by.sort_unstable();
    by
}

/// Publishes probes until one is handled: a subscription is in place.
/// Returns who handled it.
fn wait_for_subscriber(
    client: &async_nats::Client,
    subject: &str,
    seen: &Seen,
    round: &str,
) -> Vec<usize> {
    for i in 0..100 {
        let probe = format!("probe-{round}-{i}");
        block_on(async {
            client
                .publish(subject.to_owned(), probe.clone().into())
                .await
                .unwrap();
            client.flush().await.unwrap();
        });
        if wait_until(Duration::from_millis(100), || {
            seen.lock().unwrap().contains_key(&probe)
        }) {
            thread::sleep(Duration::from_millis(100));
            return seen.lock().unwrap()[&probe]
                .iter()
                .map(|(id, _)| *id)
                .collect();
        }
    }
    panic!("no replica subscribed");
}

#[test]
fn a_queue_group_delivers_each_message_to_one_of_three_replicas() {
    let server = NatsServer::start().expect("nats-server");
    let seen: Seen = Arc::default();
    let replicas: Vec<_> = (0..3)
        .map(|id| {
            let subscriber = NatsSubscriber::new(
                options(&server),
                "orders.created",
                Delivery::queue_group("billing").unwrap(),
            )
            .unwrap();
            run_subscriber(subscriber, id, &seen)
        })
        .collect();
    let publisher = client(&server);
    wait_for_subscriber(&publisher, "orders.created", &seen, "a");
    // Every member subscribes before the real messages.
    thread::sleep(Duration::from_millis(300));
    publish(&publisher, "orders.created", "m", 0..300);
    let by = handled_once(&seen, "m", 300);
    assert_eq!(by, vec![0, 1, 2], "the server spreads the group's messages");
    assert!(
        seen.lock().unwrap().values().all(|h| h[0].1.is_none()),
        "no lease, no fence"
    );
    let stats: Vec<NatsStats> = replicas.into_iter().map(stop).collect();
    let handled: u64 = stats.iter().map(|s| s.handled).sum();
    assert!(handled >= 300, "{stats:?}");
}

fn guarded(server: &NatsServer, config: &GuardConfig, ttl: Duration) -> NatsSubscriber {
    let scope = config
        .scope("endpoint/nats")
        .and_then(|s| s.segment("node", "alerts"))
        .unwrap();
    NatsSubscriber::new(options(server), "alerts.>", Delivery::Elected)
        .unwrap()
        .with_guard(config, &scope)
        .unwrap()
        .with_guard_settings(
            ActiveConfig::new()
                .with_ttl(Ttl::new(ttl).unwrap())
                .with_interval(ttl / 3),
        )
        .unwrap()
}

#[test]
fn an_elected_subscriber_is_the_only_one_that_handles_and_a_standby_takes_over() {
    let server = NatsServer::start().expect("nats-server");
    let seen: Seen = Arc::default();
    // One locker shared by the replicas, as one Redis would be.
    let config = GuardConfig::new().with_locker(SharedLocker::new(LocalLocker::new()));
    let ttl = Duration::from_millis(600);
    let mut replicas: Vec<_> = (0..3)
        .map(|id| Some(run_subscriber(guarded(&server, &config, ttl), id, &seen)))
        .collect();
    let publisher = client(&server);
    let first = wait_for_subscriber(&publisher, "alerts.disk", &seen, "a");
    assert_eq!(first.len(), 1, "probe handled by {first:?}");
    publish(&publisher, "alerts.disk", "a", 0..100);
    let leader = handled_once(&seen, "a", 100);
    assert_eq!(leader, first, "only the leader handles");

    // The leader stops: a standby subscribes within ttl + interval and
    // handles what is published after.
    let stopped_at = Instant::now();
    stop(replicas[leader[0]].take().unwrap());
    let next = wait_for_subscriber(&publisher, "alerts.disk", &seen, "b");
    let takeover = stopped_at.elapsed();
    assert_eq!(next.len(), 1);
    assert_ne!(next, leader);
    assert!(
        takeover < ttl + ttl / 3 + Duration::from_millis(500),
        "took {takeover:?}"
    );
    publish(&publisher, "alerts.disk", "b", 0..100);
    assert_eq!(handled_once(&seen, "b", 100), next);

    // Fences grow with each leader.
    let fence = |prefix: &str| {
        seen.lock()
            .unwrap()
            .iter()
            .find(|(p, _)| p.starts_with(prefix))
            .unwrap()
            .1[0]
            .1
            .unwrap()
    };
    assert!(fence("b") > fence("a"));
    // Probes published while nobody led reached nobody: counted, not
    // handled twice.
    let lost = seen
        .lock()
        .unwrap()
        .keys()
        .filter(|p| p.starts_with("probe-b"))
        .count();
    println!("takeover {takeover:?}; the probe that found the new leader was the {lost}th");
    for replica in replicas.into_iter().flatten() {
        stop(replica);
    }
}

#[test]
fn a_leader_past_its_renew_deadline_hands_nothing_it_finds_buffered_to_the_handler() {
    for (renew, expect_all) in [(RenewFault::NeverAnswers, false), (RenewFault::None, true)] {
        let server = NatsServer::start().expect("nats-server");
        let config = FaultyLocker::new(LocalLocker::new(), renew, false).config();
        let ttl = Duration::from_millis(400);
        let subscriber = guarded(&server, &config, ttl);
        let calls = Arc::new(Mutex::new(Vec::<String>::new()));
        let (handle, ctl) = control();
        let recorded = calls.clone();
        let runner = thread::spawn(move || {
            smol::block_on(subscriber.run(ctl, Classifier::retry_all(), move |m| {
                let payload = String::from_utf8(m.payload).unwrap();
                let first = payload == "block";
                recorded.lock().unwrap().push(payload);
                if first {
                    // The whole replica stalls (a pause, a blocking
                    // call) for twice the lease while messages queue.
                    thread::sleep(ttl * 2);
                }
                std::future::ready(Ok::<(), String>(()))
            }))
        });
        let publisher = client(&server);
        // Wait for the subscription: the first message blocks.
        assert!(wait_until(Duration::from_secs(5), || {
            publish(&publisher, "alerts.disk", "", 0..0);
            block_on(async {
                publisher
                    .publish("alerts.disk", "block".into())
                    .await
                    .unwrap();
                publisher.flush().await.unwrap();
            });
            thread::sleep(Duration::from_millis(50));
            !calls.lock().unwrap().is_empty()
        }));
        publish(&publisher, "alerts.disk", "late", 0..10);
        thread::sleep(ttl * 3);
        handle.stop();
        let stats = runner.join().unwrap();
        let calls = calls.lock().unwrap().clone();
        let late = calls.iter().filter(|p| p.starts_with("late")).count();
        if expect_all {
            // A lease that keeps renewing keeps handling: the check above
            // refuses because of the deadline, not the stall.
            assert_eq!(late, 10, "{calls:?} {stats:?}");
        } else {
            assert_eq!(late, 0, "handled past the renew deadline: {calls:?}");
            println!("stale leader: {stats:?}");
        }
    }
}

#[test]
fn a_poisoned_message_is_retried_then_published_to_the_dead_letter_subject_with_its_origin() {
    let server = NatsServer::start().expect("nats-server");
    let seen: Seen = Arc::default();
    let subscriber = NatsSubscriber::new(
        options(&server),
        "orders.*",
        Delivery::queue_group("billing").unwrap(),
    )
    .unwrap()
    .with_retry(RetryPolicy::fixed_delay(2, Duration::from_millis(10)))
    .unwrap()
    .with_dead_letters("orders-dlq")
    .unwrap();
    let replica = run_subscriber(subscriber, 0, &seen);
    let publisher = client(&server);
    let mut dead = block_on(publisher.subscribe("orders-dlq")).unwrap();
    wait_for_subscriber(&publisher, "orders.created", &seen, "a");
    publish(&publisher, "orders.created", "poison", 0..1);
    let letter = block_on(async {
        futures_lite::future::or(async { dead.next().await }, async {
            async_io::Timer::after(Duration::from_secs(5)).await;
            None
        })
        .await
    })
    .expect("a dead letter");
    assert_eq!(&letter.payload[..], b"poison0");
    let headers = letter.headers.expect("headers");
    assert_eq!(
        headers.get(ORIGIN_SUBJECT).unwrap().as_str(),
        "orders.created"
    );
    assert_eq!(headers.get(ATTEMPTS).unwrap().as_str(), "3");
    assert!(
        headers
            .get(ERROR)
            .unwrap()
            .as_str()
            .contains("cannot handle poison0")
    );
    assert_eq!(
        seen.lock().unwrap()["poison0"].len(),
        3,
        "1 call + 2 retries"
    );
    // The letter can arrive here before the subscriber's flush returns
    // and its count is taken: a stop then would cut the count short.
    thread::sleep(Duration::from_millis(500));
    let stats = stop(replica);
    assert_eq!((stats.dead_lettered, stats.given_up), (1, 0), "{stats:?}");
}

/// Collects what a subscriber hands to its unhandled sink.
fn unhandled_sink() -> (
    Arc<Mutex<Vec<Unhandled>>>,
    impl Fn(Unhandled) + Send + Sync + 'static,
) {
    let kept = Arc::new(Mutex::new(Vec::new()));
    let into = kept.clone();
    (kept, move |message| into.lock().unwrap().push(message))
}

#[test]
fn an_elected_subscriber_whose_lease_ends_during_the_retries_publishes_no_dead_letter() {
    let server = NatsServer::start().expect("nats-server");
    // Renewals never answer: the 1 s lease ends at its renew deadline
    // while the handler's retries go on.
    let config = FaultyLocker::new(LocalLocker::new(), RenewFault::NeverAnswers, false).config();
    let ttl = Duration::from_secs(1);
    let (kept, sink) = unhandled_sink();
    let subscriber = guarded(&server, &config, ttl)
        .with_retry(RetryPolicy::fixed_delay(50, Duration::from_millis(100)))
        .unwrap()
        .with_dead_letters("alerts-dlq")
        .unwrap()
        .with_unhandled(sink);
    let calls = Arc::new(Mutex::new(Vec::<Option<u64>>::new()));
    let recorded = calls.clone();
    let (handle, ctl) = control();
    let runner = thread::spawn(move || {
        smol::block_on(subscriber.run(ctl, Classifier::retry_all(), move |m| {
            recorded.lock().unwrap().push(m.fence);
            std::future::ready(Err::<(), _>("always fails"))
        }))
    });
    let publisher = client(&server);
    let mut dead = block_on(publisher.subscribe("alerts-dlq")).unwrap();
    block_on(publisher.flush()).unwrap();
    assert!(
        wait_until(Duration::from_secs(5), || {
            publish(&publisher, "alerts.disk", "poison", 0..1);
            thread::sleep(Duration::from_millis(50));
            !calls.lock().unwrap().is_empty()
        }),
        "the subscriber never subscribed"
    );
    // The lease ends within a second; the retries would have gone on
    // for five.
    assert!(
        wait_until(Duration::from_secs(4), || !kept.lock().unwrap().is_empty()),
        "nothing handed to the unhandled sink; calls {:?}",
        calls.lock().unwrap()
    );
    let letter = block_on(async {
        futures_lite::future::or(async { dead.next().await }, async {
            async_io::Timer::after(Duration::from_millis(500)).await;
            None
        })
        .await
    });
    handle.stop();
    let stats = runner.join().unwrap();
    assert!(
        letter.is_none(),
        "a dead letter published after the lease ended: {letter:?}"
    );
    let calls = calls.lock().unwrap().clone();
    assert!(calls.len() < 20, "{} calls", calls.len());
    let kept = kept.lock().unwrap().clone();
    let first = &kept[0];
    assert!(first.payload.starts_with(b"poison"), "{first:?}");
    assert_eq!(first.origin, "alerts.disk");
    assert_eq!(first.fence, calls[0]);
    assert!(
        matches!(first.reason, UnhandledReason::LeaseLost { .. }),
        "{first:?}"
    );
    assert_eq!(stats.dead_lettered, 0, "{stats:?}");
    assert!(stats.lease_lost >= 1, "{stats:?}");
    // Every message read is accounted for: handled, dead-lettered or
    // handed over.
    assert_eq!(
        stats.handled
            + stats.dead_lettered
            + stats.lease_lost
            + stats.refused_late
            + stats.given_up,
        kept.len() as u64,
        "{stats:?} {kept:?}"
    );
}

#[test]
fn a_message_given_up_with_no_dead_letter_subject_is_handed_over_whole() {
    let server = NatsServer::start().expect("nats-server");
    let seen: Seen = Arc::default();
    let (kept, sink) = unhandled_sink();
    let subscriber = NatsSubscriber::new(
        options(&server),
        "orders.*",
        Delivery::queue_group("billing").unwrap(),
    )
    .unwrap()
    .with_retry(RetryPolicy::fixed_delay(1, Duration::from_millis(10)))
    .unwrap()
    .with_unhandled(sink);
    let replica = run_subscriber(subscriber, 0, &seen);
    let publisher = client(&server);
    wait_for_subscriber(&publisher, "orders.created", &seen, "a");
    publish(&publisher, "orders.created", "poison", 0..1);
    assert!(wait_until(Duration::from_secs(5), || !kept
        .lock()
        .unwrap()
        .is_empty()));
    let stats = stop(replica);
    let kept = kept.lock().unwrap().clone();
    assert_eq!(kept.len(), 1, "{kept:?}");
    assert_eq!(kept[0].payload, b"poison0");
    assert_eq!(kept[0].origin, "orders.created");
    assert!(
        matches!(&kept[0].reason, UnhandledReason::GaveUp { attempts: 2, error } if error.contains("cannot handle poison0")),
        "{kept:?}"
    );
    assert_eq!(stats.given_up, 1, "{stats:?}");
}

fn jetstream(server: &NatsServer, stream: &str) -> JetStreamConsumer {
    JetStreamConsumer::new(options(server), stream, "billing")
        .unwrap()
        .with_subjects(&["jobs.>"])
        .unwrap()
        .with_ack_wait(Duration::from_secs(1))
        .unwrap()
        .with_redelivery_delay(Duration::from_millis(50))
        .with_retry(RetryPolicy::no_retry())
        .unwrap()
}

/// Waits until the stream exists (a consumer created it).
fn wait_for_stream(client: &async_nats::Client, stream: &str) {
    let js = jetstream_context(client);
    assert!(wait_until(Duration::from_secs(5), || block_on(
        js.get_stream(stream)
    )
    .is_ok()));
}

#[test]
fn three_jetstream_pullers_handle_every_message_once() {
    let server = NatsServer::start().expect("nats-server");
    let seen: Seen = Arc::default();
    let replicas: Vec<_> = (0..3)
        .map(|id| run_consumer(jetstream(&server, "JOBS"), id, &seen))
        .collect();
    let publisher = client(&server);
    wait_for_stream(&publisher, "JOBS");
    publish_stored(&publisher, "jobs.new", "m", 300);
    let by = handled_once(&seen, "m", 300);
    assert!(by.len() >= 2, "the consumer's pulls are spread: {by:?}");
    let stats: Vec<JetStreamStats> = replicas.into_iter().map(stop).collect();
    assert_eq!(
        stats.iter().map(|s| s.handled).sum::<u64>(),
        300,
        "{stats:?}"
    );
}

#[test]
fn a_jetstream_message_that_fails_every_delivery_is_dead_lettered_with_its_origin() {
    let server = NatsServer::start().expect("nats-server");
    let seen: Seen = Arc::default();
    let consumer = jetstream(&server, "JOBS").with_max_deliver(3).unwrap();
    let replica = run_consumer(consumer, 0, &seen);
    let publisher = client(&server);
    wait_for_stream(&publisher, "JOBS");
    publish_stored(&publisher, "jobs.new", "poison", 1);
    publish_stored(&publisher, "jobs.new", "fine", 1);
    let js = jetstream_context(&publisher);
    let letter = block_on(async {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(dlq) = js.get_stream("JOBS-dead-letters").await
                && let Ok(message) = dlq.get_raw_message(1).await
            {
                return message;
            }
            assert!(Instant::now() < deadline, "no dead letter");
            async_io::Timer::after(Duration::from_millis(50)).await;
        }
    });
    assert_eq!(&letter.payload[..], b"poison0");
    let headers = letter.headers;
    assert_eq!(headers.get(ORIGIN_STREAM).unwrap().as_str(), "JOBS");
    assert_eq!(headers.get(ORIGIN_SEQUENCE).unwrap().as_str(), "1");
    assert_eq!(headers.get(ORIGIN_SUBJECT).unwrap().as_str(), "jobs.new");
    assert_eq!(headers.get(DELIVERIES).unwrap().as_str(), "3");
    assert!(
        headers
            .get(ERROR)
            .unwrap()
            .as_str()
            .contains("cannot handle poison0")
    );
    assert_eq!(
        seen.lock().unwrap()["poison0"].len(),
        3,
        "one call a delivery"
    );
    assert!(wait_until(Duration::from_secs(5), || seen
        .lock()
        .unwrap()
        .contains_key("fine0")));
    let stats = stop(replica);
    assert_eq!(
        (
            stats.dead_lettered,
            stats.redelivery_requested,
            stats.redelivered,
            stats.left_in_stream
        ),
        (1, 2, 2, 0),
        "{stats:?}"
    );
}

#[test]
fn a_jetstream_message_left_unacknowledged_by_a_dead_puller_goes_to_another() {
    let server = NatsServer::start().expect("nats-server");
    let seen: Seen = Arc::default();
    // The first puller hangs in its handler forever, then is dropped with
    // its thread blocked: as a killed process, it never acknowledges.
    let hung = jetstream(&server, "JOBS");
    let (_hung_handle, ctl) = control();
    let hung_seen = seen.clone();
    thread::spawn(move || {
        smol::block_on(hung.run(ctl, Classifier::retry_all(), move |m| {
            hung_seen
                .lock()
                .unwrap()
                .entry(String::from_utf8(m.payload).unwrap())
                .or_default()
                .push((0, None));
            // Stalls the thread: no progress reaches the server.
            thread::sleep(Duration::from_secs(3600));
            std::future::ready(Ok::<(), String>(()))
        }))
    });
    let publisher = client(&server);
    wait_for_stream(&publisher, "JOBS");
    publish_stored(&publisher, "jobs.new", "m", 1);
    assert!(wait_until(Duration::from_secs(5), || seen
        .lock()
        .unwrap()
        .contains_key("m0")));
    let started = Instant::now();
    let other = run_consumer(jetstream(&server, "JOBS"), 1, &seen);
    assert!(
        wait_until(Duration::from_secs(5), || seen.lock().unwrap()["m0"].len()
            == 2),
        "not redelivered"
    );
    assert_eq!(seen.lock().unwrap()["m0"][1].0, 1);
    println!(
        "redelivered to another puller after {:?} (ack wait 1 s)",
        started.elapsed()
    );
    let stats = stop(other);
    assert_eq!((stats.handled, stats.redelivered), (1, 1), "{stats:?}");
}

#[test]
fn a_handler_that_outlives_the_ack_wait_keeps_its_message() {
    let server = NatsServer::start().expect("nats-server");
    let seen: Seen = Arc::default();
    // The handler takes 2.5 ack waits: without the consumer's progress
    // reports the server would deliver the message again, to the idle
    // puller, before the first one acknowledged it. (One message: a
    // second, buffered behind a slow first, would wait past its own ack
    // wait and be delivered again, which is at least once.)
    let slow = |id: usize| {
        let seen = seen.clone();
        let consumer = jetstream(&server, "JOBS");
        let (handle, ctl) = control();
        let thread = thread::spawn(move || {
            smol::block_on(consumer.run(ctl, Classifier::retry_all(), move |m| {
                let seen = seen.clone();
                async move {
                    seen.lock()
                        .unwrap()
                        .entry(String::from_utf8(m.payload).unwrap())
                        .or_default()
                        .push((id, None));
                    async_io::Timer::after(Duration::from_millis(2_500)).await;
                    Ok::<(), String>(())
                }
            }))
        });
        (handle, thread)
    };
    let replicas = [slow(0), slow(1)];
    let publisher = client(&server);
    wait_for_stream(&publisher, "JOBS");
    publish_stored(&publisher, "jobs.new", "slow", 1);
    assert!(wait_until(Duration::from_secs(10), || seen
        .lock()
        .unwrap()
        .contains_key("slow0")));
    // Handled; a redelivery would come within the handler's time.
    thread::sleep(Duration::from_millis(3_500));
    let stats: Vec<JetStreamStats> = replicas.into_iter().map(stop).collect();
    for (payload, handlers) in seen.lock().unwrap().iter() {
        assert_eq!(handlers.len(), 1, "{payload} handled by {handlers:?}");
    }
    assert_eq!(
        stats
            .iter()
            .map(|s| (s.handled, s.redelivered))
            .fold((0, 0), |a, s| (a.0 + s.0, a.1 + s.1)),
        (1, 0),
        "{stats:?}"
    );
}

#[test]
fn queue_groups_and_jetstream_pullers_carry_on_after_the_server_restarts() {
    let mut server = NatsServer::start().expect("nats-server");
    let seen: Seen = Arc::default();
    let subscriber = NatsSubscriber::new(
        options(&server),
        "orders.created",
        Delivery::queue_group("billing").unwrap(),
    )
    .unwrap();
    let core = run_subscriber(subscriber, 0, &seen);
    let pulled = run_consumer(jetstream(&server, "JOBS"), 1, &seen);
    let publisher = client(&server);
    wait_for_subscriber(&publisher, "orders.created", &seen, "a");
    wait_for_stream(&publisher, "JOBS");
    publish_stored(&publisher, "jobs.new", "before", 10);
    handled_once(&seen, "before", 10);

    server.restart().expect("restart");
    let publisher = client(&server);
    // Both subscribe again by themselves.
    wait_for_subscriber(&publisher, "orders.created", &seen, "b");
    publish(&publisher, "orders.created", "core", 0..20);
    publish_stored(&publisher, "jobs.new", "after", 20);
    assert_eq!(handled_once(&seen, "core", 20), vec![0]);
    assert_eq!(handled_once(&seen, "after", 20), vec![1]);
    stop(core);
    stop(pulled);
}

#[test]
fn bad_parameters_are_refused_naming_the_parameter_the_value_and_the_rule() {
    let options = NatsOptions::new("nats://127.0.0.1:4222").unwrap();
    let invalid = |e: NatsError| match e {
        NatsError::InvalidInput(guard_endpoints::InvalidInput {
            parameter,
            value,
            rule,
            ..
        }) => (parameter, value, rule),
        other => panic!("{other}"),
    };
    let (parameter, value, _) = invalid(NatsOptions::new("nats://[::1").unwrap_err());
    assert_eq!(
        (parameter, value.as_str()),
        (Parameter::ServerUrl, "nats://[::1")
    );
    let (parameter, value, _) =
        invalid(NatsSubscriber::new(options.clone(), "a..b", Delivery::Broadcast).unwrap_err());
    assert_eq!((parameter, value.as_str()), (Parameter::Subject, "a..b"));
    let subscriber = NatsSubscriber::new(options.clone(), "a", Delivery::Broadcast).unwrap();
    let (parameter, value, rule) = invalid(
        subscriber
            .with_retry(RetryPolicy::new().with_jitter(Jitter::Full))
            .unwrap_err(),
    );
    assert_eq!(
        (parameter, value.as_str()),
        (Parameter::RetryPolicy, "with Full jitter")
    );
    assert!(rule.contains("no jitter"), "{rule}");
    let config = GuardConfig::new().with_locker(SharedLocker::new(LocalLocker::new()));
    let scope = config.scope("endpoint/nats").unwrap();
    let subscriber =
        NatsSubscriber::new(options.clone(), "a", Delivery::queue_group("g").unwrap()).unwrap();
    let (parameter, _, rule) = invalid(subscriber.with_guard(&config, &scope).unwrap_err());
    assert_eq!(parameter, Parameter::GuardedSubscription);
    assert!(rule.contains("delivers once already"), "{rule}");
    let consumer = JetStreamConsumer::new(options.clone(), "JOBS", "billing").unwrap();
    let (parameter, value, _) = invalid(consumer.with_batch(0).unwrap_err());
    assert_eq!((parameter, value.as_str()), (Parameter::Batch, "0"));
}

/// The configuration-service pattern (`examples/config_subscription.rs`):
/// every replica must apply every change, so a broadcast subscription is
/// deliberately not deduplicated.
#[test]
fn a_broadcast_subject_gives_every_replica_every_change() {
    let server = NatsServer::start().expect("nats-server");
    let seen: Seen = Arc::default();
    let replicas: Vec<_> = (0..3)
        .map(|id| {
            let subscriber =
                NatsSubscriber::new(options(&server), "config.>", Delivery::Broadcast).unwrap();
            run_subscriber(subscriber, id, &seen)
        })
        .collect();
    let publisher = client(&server);
    // Every replica has subscribed once a probe reached all three.
    assert!(wait_until(Duration::from_secs(5), || {
        publish(&publisher, "config.probe", "p", 0..1);
        thread::sleep(Duration::from_millis(50));
        seen.lock().unwrap().get("p0").is_some_and(|h| {
            let mut ids: Vec<usize> = h.iter().map(|(id, _)| *id).collect();
            ids.sort_unstable();
            ids.dedup();
            ids.len() == 3
        })
    }));
    publish(&publisher, "config.limits", "change", 0..10);
    assert!(wait_until(Duration::from_secs(5), || {
        let seen = seen.lock().unwrap();
        (0..10).all(|i| {
            seen.get(&format!("change{i}"))
                .is_some_and(|h| h.len() == 3)
        })
    }));
    for replica in replicas {
        stop(replica);
    }
}

#[test]
fn a_password_or_token_never_shows_in_a_refused_url_or_a_debug_output() {
    for url in [
        "http://app:TopSecret42@nats.example:4222",
        "http://TopSecret42@nats.example:4222",
        "app:TopSecret42@nats.example:99999",
    ] {
        let err = NatsOptions::new(url).unwrap_err();
        for text in [err.to_string(), format!("{err:?}")] {
            assert!(!text.contains("TopSecret42"), "{text}");
            assert!(text.contains("***@nats.example"), "{text}");
        }
    }
    for url in [
        "nats://app:TopSecret42@nats.example:4222",
        "nats://TopSecret42@nats.example:4222",
    ] {
        let options = NatsOptions::new(url).unwrap();
        let subscriber =
            NatsSubscriber::new(options.clone(), "orders", Delivery::Broadcast).unwrap();
        let consumer = JetStreamConsumer::new(options.clone(), "ORDERS", "billing").unwrap();
        for debug in [
            format!("{options:?}"),
            format!("{subscriber:?}"),
            format!("{consumer:?}"),
        ] {
            assert!(!debug.contains("TopSecret42"), "{debug}");
            assert!(debug.contains("***@nats.example:4222"), "{debug}");
        }
    }
}
