//! RabbitMQ endpoints on a real broker: the machine's (127.0.0.1:5672),
//! each test in a virtual host of its own that is deleted after it, and,
//! for the broker restart, a private node the test starts and restarts.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use guard_core::guard::ActiveConfig;
use guard_core::lock::Ttl;
use guard_core::retry::{Classifier, Jitter, RetryPolicy};
use guard_endpoints::Parameter;
use guard_endpoints::amqp::{
    AmqpError, AmqpMessage, AmqpOptions, AmqpStats, FanoutConsumer, WorkQueueConsumer,
};
use guard_smol::{RunHandle, control};
use guard_std::LocalLocker;
use guard_testkit::rabbitmq::{RabbitNode, Vhost};
use guard_testkit::{FaultyLocker, RenewFault};
use lapin::options::{
    BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions,
    QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Connection, ConnectionProperties, ExchangeKind};

/// Payload → who handled it, in order: the replica, the fence it was
/// told, and when its handler was entered.
type Seen = Arc<Mutex<BTreeMap<String, Vec<(usize, Option<u64>, Instant)>>>>;

type Replica = (RunHandle, thread::JoinHandle<Result<AmqpStats, AmqpError>>);

fn wait_until(limit: Duration, done: impl FnMut() -> bool) -> bool {
    guard_testkit::wait_until("condition", limit, done).is_ok()
}

fn options(url: &str) -> AmqpOptions {
    AmqpOptions::new(url)
        .unwrap()
        .with_reconnect_delay(Duration::from_millis(200))
}

fn payloads(prefix: &str, count: usize) -> Vec<Vec<u8>> {
    (0..count)
        .map(|i| format!("{prefix}{i}").into_bytes())
        .collect()
}

fn record(seen: &Seen, id: usize, message: &AmqpMessage) {
    let payload = String::from_utf8(message.payload.clone()).unwrap();
    seen.lock()
        .unwrap()
        .entry(payload)
        .or_default()
        .push((id, message.fence, Instant::now()));
}

/// Runs `consumer` on its own thread as replica `id`, recording what it
/// handles; a payload starting with `poison` always fails.
fn start_work(consumer: WorkQueueConsumer, id: usize, seen: &Seen) -> Replica {
    let seen = seen.clone();
    let (handle, ctl) = control();
    let thread = thread::spawn(move || {
        smol::block_on(consumer.run(ctl, Classifier::retry_all(), move |message| {
            record(&seen, id, &message);
            let poisoned = message.payload.starts_with(b"poison");
            async move { if poisoned { Err("poisoned") } else { Ok(()) } }
        }))
    });
    (handle, thread)
}

/// Runs `consumer` on its own thread as replica `id`; the handler records
/// the message; one whose payload starts with `poison` blocks its thread
/// for `poison_pause` and fails.
fn start_fanout(
    consumer: impl Into<Arc<FanoutConsumer>>,
    id: usize,
    seen: &Seen,
    poison_pause: Duration,
) -> Replica {
    let (consumer, seen) = (consumer.into(), seen.clone());
    let (handle, ctl) = control();
    let thread = thread::spawn(move || {
        smol::block_on(consumer.run(ctl, Classifier::retry_all(), move |message| {
            record(&seen, id, &message);
            let poisoned = message.payload.starts_with(b"poison");
            if poisoned {
                thread::sleep(poison_pause);
            }
            async move { if poisoned { Err("poisoned") } else { Ok(()) } }
        }))
    });
    (handle, thread)
}

fn stop(replica: Replica) -> AmqpStats {
    replica.0.stop();
    replica.1.join().unwrap().expect("the consumer ran")
}

/// A client of the test's own: publishes with confirms, inspects queues.
struct Client {
    _connection: Connection,
    channel: lapin::Channel,
}

impl Client {
    /// Connects, retrying for a few seconds (a node that has just opened
    /// its port may not take connections yet).
    fn connect(url: &str) -> Self {
        let started = Instant::now();
        loop {
            let connected = smol::block_on(async {
                let connection = Connection::connect(url, ConnectionProperties::default()).await?;
                let channel = connection.create_channel().await?;
                channel
                    .confirm_select(ConfirmSelectOptions::default())
                    .await?;
                Ok::<_, lapin::Error>(Client {
                    _connection: connection,
                    channel,
                })
            });
            match connected {
                Ok(client) => return client,
                Err(e) if started.elapsed() > Duration::from_secs(10) => {
                    panic!("cannot connect to {url}: {e}")
                }
                Err(_) => thread::sleep(Duration::from_millis(100)),
            }
        }
    }

    /// Publishes `payloads` in order and returns once the broker
    /// confirmed every one.
    fn publish(&self, exchange: &str, routing_key: &str, payloads: &[Vec<u8>]) {
        smol::block_on(async {
            for payload in payloads {
                self.channel
                    .basic_publish(
                        exchange.into(),
                        routing_key.into(),
                        BasicPublishOptions::default(),
                        payload,
                        BasicProperties::default().with_delivery_mode(2),
                    )
                    .await
                    .expect("publish");
            }
            self.channel.wait_for_confirms().await.expect("confirmed");
        });
    }

    /// The queue's ready messages and consumers (it must exist: the
    /// broker closes the channel of a passive declaration that fails).
    fn queue(&self, name: &str) -> (u32, u32) {
        let queue = smol::block_on(self.channel.queue_declare(
            name.into(),
            QueueDeclareOptions {
                passive: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        ))
        .expect("the queue exists");
        (queue.message_count(), queue.consumer_count())
    }
}

/// The replicas that handled the payloads starting with `prefix`, after
/// checking that each of `count` was handled exactly once.
fn handled_once(seen: &Seen, prefix: &str, count: usize) -> Vec<usize> {
    let handled = |seen: &Seen| {
        seen.lock()
            .unwrap()
            .keys()
            .filter(|p| p.starts_with(prefix))
            .count()
    };
    assert!(
        wait_until(Duration::from_secs(10), || handled(seen) == count),
        "{} of {count} {prefix}* messages handled",
        handled(seen)
    );
    // Late duplicates would arrive within this wait.
    thread::sleep(Duration::from_millis(200));
    let seen = seen.lock().unwrap();
    let mut by = BTreeSet::new();
    for (payload, handlers) in seen.iter().filter(|(p, _)| p.starts_with(prefix)) {
        assert_eq!(handlers.len(), 1, "{payload} handled by {handlers:?}");
        by.insert(handlers[0].0);
    }
    by.into_iter().collect()
}

/// Publishes probes to `exchange` until some replica handles one: a
/// queue is bound. Returns the replicas that handled the first probe seen.
fn wait_for_subscriber(client: &Client, exchange: &str, seen: &Seen, round: &str) -> Vec<usize> {
    for i in 0..100 {
        let probe = format!("probe-{round}-{i}");
        client.publish(exchange, "", &[probe.clone().into_bytes()]);
        let handled = wait_until(Duration::from_millis(100), || {
            seen.lock().unwrap().contains_key(&probe)
        });
        if handled {
            // Copies to other subscribers arrive at about the same time.
            thread::sleep(Duration::from_millis(200));
            return seen.lock().unwrap()[&probe]
                .iter()
                .map(|(id, _, _)| *id)
                .collect();
        }
    }
    panic!("no replica bound a queue to {exchange}");
}

fn lease_settings() -> ActiveConfig {
    ActiveConfig::new()
        .with_ttl(Ttl::new(Duration::from_secs(1)).unwrap())
        .with_interval(Duration::from_millis(200))
}

/// An AMQP value as text (strings as they are).
fn text(value: &AMQPValue) -> String {
    match value {
        AMQPValue::LongString(s) => String::from_utf8_lossy(s.as_bytes()).into_owned(),
        other => format!("{other:?}"),
    }
}

/// Takes the next message of `queue` (the get acknowledges it): its
/// payload, the text of each field of its first `x-death` entry, and the
/// number of messages left behind it.
fn take_dead_letter(client: &Client, queue: &str) -> (Vec<u8>, BTreeMap<String, String>, u32) {
    let letter = smol::block_on(
        client
            .channel
            .basic_get(queue.into(), BasicGetOptions { no_ack: true }),
    )
    .expect("basic.get")
    .expect("a dead letter");
    let headers = letter
        .delivery
        .properties
        .headers()
        .clone()
        .expect("headers");
    let deaths = headers
        .inner()
        .get("x-death")
        .and_then(AMQPValue::as_array)
        .expect("an x-death header");
    let death = deaths.as_slice()[0]
        .as_field_table()
        .expect("an x-death entry")
        .inner()
        .iter()
        .map(|(key, value)| (key.to_string(), text(value)))
        .collect();
    (letter.delivery.data, death, letter.message_count)
}

#[test]
fn a_work_queue_consumed_by_three_replicas_handles_each_of_300_messages_once() {
    let vhost = Vhost::create().expect("a test vhost on the machine's broker");
    let seen: Seen = Arc::default();
    let consumer = || WorkQueueConsumer::new(options(&vhost.url()), "orders").unwrap();
    smol::block_on(consumer().declare()).expect("declared");
    let replicas: Vec<_> = (0..3).map(|id| start_work(consumer(), id, &seen)).collect();
    let client = Client::connect(&vhost.url());
    assert!(
        wait_until(Duration::from_secs(10), || client.queue("orders").1 == 3),
        "three consumers on the queue"
    );
    client.publish("", "orders", &payloads("m", 300));
    // The broker delivers each message to one consumer, round robin.
    assert_eq!(handled_once(&seen, "m", 300), vec![0, 1, 2]);
    let stats: Vec<_> = replicas.into_iter().map(stop).collect();
    assert_eq!(
        stats.iter().map(|s| s.handled).sum::<u64>(),
        300,
        "{stats:?}"
    );
    assert!(
        stats
            .iter()
            .all(|s| s.redelivered == 0 && s.dead_lettered == 0 && s.unacknowledged == 0),
        "{stats:?}"
    );
    // Every message was acknowledged: none is left.
    assert_eq!(client.queue("orders"), (0, 0));
    // Nothing carries a fence without a lease.
    assert!(seen.lock().unwrap().values().all(|h| h[0].1.is_none()));
}

#[test]
fn an_elected_fanout_consumer_is_the_leader_only_and_a_standby_takes_over_when_it_dies() {
    let vhost = Vhost::create().expect("a test vhost on the machine's broker");
    let seen: Seen = Arc::default();
    // One locker for the replicas, as one Redis would be. Its unlock
    // fails, so a leader that stops leaves its lease to expire, as one
    // that dies would: the takeover waits for the ttl.
    let config = FaultyLocker::new(LocalLocker::new(), RenewFault::None, true).config();
    let scope = config
        .scope("endpoint/amqp")
        .and_then(|s| s.segment("exchange", "alarms"))
        .unwrap();
    let consumer = || {
        FanoutConsumer::new(options(&vhost.url()), "alarms")
            .unwrap()
            .with_guard(&config, &scope)
            .unwrap()
            .with_guard_settings(lease_settings())
            .unwrap()
    };
    smol::block_on(consumer().declare()).expect("declared");
    let mut replicas: Vec<_> = (0..3)
        .map(|id| Some(start_fanout(consumer(), id, &seen, Duration::ZERO)))
        .collect();
    let client = Client::connect(&vhost.url());
    let first = wait_for_subscriber(&client, "alarms", &seen, "a");
    assert_eq!(first.len(), 1, "probe handled by {first:?}");
    client.publish("alarms", "", &payloads("a", 30));
    let leader = handled_once(&seen, "a", 30);
    assert_eq!(leader, first, "only the leader handles messages");

    // Messages keep coming, one every 10 ms, while the leader dies.
    let publishing = Arc::new(AtomicBool::new(true));
    let sent = Arc::new(Mutex::new(Vec::<Instant>::new()));
    let publisher = {
        let (publishing, sent, url) = (publishing.clone(), sent.clone(), vhost.url());
        thread::spawn(move || {
            let client = Client::connect(&url);
            let mut i = 0;
            while publishing.load(Ordering::Relaxed) {
                client.publish("alarms", "", &[format!("t{i}").into_bytes()]);
                sent.lock().unwrap().push(Instant::now());
                i += 1;
                thread::sleep(Duration::from_millis(10));
            }
        })
    };
    thread::sleep(Duration::from_millis(300));
    let killed_at = Instant::now();
    let old = stop(replicas[leader[0]].take().unwrap());
    let new_leader = || {
        seen.lock()
            .unwrap()
            .iter()
            .filter(|(p, _)| p.starts_with('t'))
            .flat_map(|(_, h)| h.iter())
            .filter(|(id, _, _)| *id != leader[0])
            .map(|(id, _, at)| (*id, *at))
            .min_by_key(|(_, at)| *at)
    };
    assert!(
        wait_until(Duration::from_secs(5), || new_leader().is_some()),
        "no standby took over"
    );
    let (new_id, took_over_at) = new_leader().unwrap();
    thread::sleep(Duration::from_millis(500));
    publishing.store(false, Ordering::Relaxed);
    publisher.join().unwrap();
    thread::sleep(Duration::from_millis(300));

    // Within ttl + interval of the death, plus connecting and binding.
    let takeover = took_over_at - killed_at;
    assert!(
        takeover < Duration::from_millis(1_200 + 800),
        "took over after {takeover:?}"
    );
    let sent = sent.lock().unwrap().clone();
    let seen = seen.lock().unwrap().clone();
    for (payload, handlers) in &seen {
        assert_eq!(handlers.len(), 1, "{payload} handled by {handlers:?}");
    }
    let handled_by = |i: usize| seen.get(&format!("t{i}")).map(|h| h[0].0);
    // Everything published once the new leader had bound its queue was
    // handled, by it.
    let bound_from = sent
        .iter()
        .position(|at| *at > took_over_at)
        .expect("published after the takeover");
    for i in bound_from..sent.len() {
        assert_eq!(
            handled_by(i),
            Some(new_id),
            "t{i}, published after the takeover"
        );
    }
    // What nobody handled was published during the takeover.
    let lost: Vec<usize> = (0..sent.len())
        .filter(|i| handled_by(*i).is_none())
        .collect();
    assert!(lost.iter().all(|i| *i < bound_from), "lost {lost:?}");
    println!(
        "takeover after {takeover:?}: {} of the {} messages published around it reached nobody ({} of them were buffered in the old leader)",
        lost.len(),
        sent.len(),
        old.dropped_on_close
    );
    // The new leader's fence is higher.
    let fence_of = |id: usize| {
        seen.values()
            .find(|h| h[0].0 == id)
            .and_then(|h| h[0].1)
            .unwrap()
    };
    assert!(fence_of(new_id) > fence_of(leader[0]));
    replicas.into_iter().flatten().for_each(|r| {
        stop(r);
    });
}

#[test]
fn a_stale_leader_hands_nothing_over_past_its_renew_deadline() {
    let vhost = Vhost::create().expect("a test vhost on the machine's broker");
    let seen: Seen = Arc::default();
    // Renewals never answer: the lease's renew deadline (ttl 1 s - drift
    // 100 ms after the acquire was sent) passes while messages arrive.
    let config = FaultyLocker::new(LocalLocker::new(), RenewFault::NeverAnswers, false).config();
    let scope = config.scope("endpoint/amqp").unwrap();
    let consumer = FanoutConsumer::new(options(&vhost.url()), "readings")
        .unwrap()
        .with_guard(&config, &scope)
        .unwrap()
        .with_guard_settings(lease_settings())
        .unwrap();
    smol::block_on(consumer.declare()).expect("declared");
    let consumer = Arc::new(consumer);
    // A slow handler (150 ms a message, blocking its thread), ten times
    // slower than the messages come: the prefetch window stays full, and
    // the deadline passes while deliveries wait in it.
    let (handle, ctl) = control();
    let replica = {
        let (consumer, seen) = (consumer.clone(), seen.clone());
        thread::spawn(move || {
            smol::block_on(consumer.run(ctl, Classifier::retry_all(), move |message| {
                record(&seen, 0, &message);
                thread::sleep(Duration::from_millis(150));
                async { Ok::<(), String>(()) }
            }))
        })
    };
    let client = Client::connect(&vhost.url());
    let started = Instant::now();
    let mut i = 0;
    while started.elapsed() < Duration::from_millis(2_500) {
        client.publish("readings", "", &[format!("r{i}").into_bytes()]);
        i += 1;
        thread::sleep(Duration::from_millis(15));
    }
    handle.stop();
    let stats = replica.join().unwrap().expect("ran");
    let seen = seen.lock().unwrap().clone();
    // Each leadership's deadline is at most ttl - drift after its first
    // handler call (its acquire was sent before).
    let mut first_call: BTreeMap<u64, Instant> = BTreeMap::new();
    for (_, fence, at) in seen.values().flatten() {
        let first = first_call.entry(fence.expect("a fence")).or_insert(*at);
        *first = (*first).min(*at);
    }
    assert!(!first_call.is_empty(), "the leader handled nothing");
    for (payload, handlers) in &seen {
        for (_, fence, at) in handlers {
            let deadline = first_call[&fence.unwrap()] + Duration::from_millis(900);
            // 100 ms for the check to reach the handler on a busy machine;
            // a handler call past the deadline comes 150 ms after another.
            assert!(
                *at < deadline + Duration::from_millis(100),
                "{payload} handed over {:?} past the deadline of fence {fence:?}",
                *at - deadline
            );
        }
    }
    assert!(
        stats.refused_late > 0,
        "the deliveries found past the deadline are counted: {stats:?}"
    );
    println!(
        "{} leadership(s), {} handled, {stats:?}",
        first_call.len(),
        seen.len()
    );
}

#[test]
fn a_poisoned_message_is_dead_lettered_with_its_origin_after_one_plus_retries_calls() {
    let vhost = Vhost::create().expect("a test vhost on the machine's broker");
    let seen: Seen = Arc::default();
    let consumer = WorkQueueConsumer::new(options(&vhost.url()), "invoices")
        .unwrap()
        .with_retry(RetryPolicy::fixed_delay(2, Duration::from_millis(20)))
        .unwrap();
    assert_eq!(consumer.dead_letter_queue(), "invoices.dead-letters");
    smol::block_on(consumer.declare()).expect("declared");
    // Published to an exchange of its own, so the origin shows it.
    let client = Client::connect(&vhost.url());
    smol::block_on(async {
        client
            .channel
            .exchange_declare(
                "billing".into(),
                ExchangeKind::Direct,
                ExchangeDeclareOptions::default(),
                FieldTable::default(),
            )
            .await?;
        client
            .channel
            .queue_bind(
                "invoices".into(),
                "billing".into(),
                "new".into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
    })
    .expect("exchange and binding");
    let consumer = Arc::new(consumer);
    let (handle, ctl) = control();
    let replica = {
        let (consumer, seen) = (consumer.clone(), seen.clone());
        thread::spawn(move || {
            smol::block_on(consumer.run(ctl, Classifier::retry_all(), move |message| {
                record(&seen, 0, &message);
                let poisoned = message.payload.starts_with(b"poison");
                async move { if poisoned { Err("poisoned") } else { Ok(()) } }
            }))
        })
    };
    client.publish(
        "billing",
        "new",
        &[b"ok-1".to_vec(), b"poison".to_vec(), b"ok-2".to_vec()],
    );
    assert!(
        wait_until(Duration::from_secs(10), || {
            let stats = consumer.stats();
            stats.handled == 2 && stats.dead_lettered == 1
        }),
        "{:?}",
        consumer.stats()
    );
    handle.stop();
    let stats = replica.join().unwrap().expect("ran");
    assert_eq!((stats.handled, stats.dead_lettered), (2, 1), "{stats:?}");
    // 1 + 2 retries.
    assert_eq!(seen.lock().unwrap()["poison"].len(), 3);
    assert_eq!(seen.lock().unwrap()["ok-1"].len(), 1);

    // The broker moved it, with its origin in `x-death`.
    let letter = smol::block_on(client.channel.basic_get(
        "invoices.dead-letters".into(),
        BasicGetOptions { no_ack: true },
    ))
    .expect("basic.get")
    .expect("a dead letter");
    assert_eq!(letter.delivery.data, b"poison");
    assert_eq!(letter.message_count, 0, "only the poisoned message");
    let headers = letter
        .delivery
        .properties
        .headers()
        .clone()
        .expect("headers");
    let deaths = headers
        .inner()
        .get("x-death")
        .and_then(AMQPValue::as_array)
        .expect("an x-death header");
    let death = deaths.as_slice()[0]
        .as_field_table()
        .expect("an x-death entry")
        .inner()
        .clone();
    let text = |key: &str| -> String {
        match &death[key] {
            AMQPValue::LongString(s) => String::from_utf8_lossy(s.as_bytes()).into_owned(),
            other => format!("{other:?}"),
        }
    };
    assert_eq!(text("queue"), "invoices");
    assert_eq!(text("exchange"), "billing");
    assert_eq!(text("reason"), "rejected");
    let keys: Vec<String> = death["routing-keys"]
        .as_array()
        .expect("routing keys")
        .as_slice()
        .iter()
        .map(|k| match k {
            AMQPValue::LongString(s) => String::from_utf8_lossy(s.as_bytes()).into_owned(),
            other => format!("{other:?}"),
        })
        .collect();
    assert_eq!(keys, ["new"]);
    assert_eq!(client.queue("invoices").0, 0);
}

#[test]
fn a_single_active_consumer_queue_delivers_to_one_until_it_closes() {
    let vhost = Vhost::create().expect("a test vhost on the machine's broker");
    let seen: Seen = Arc::default();
    let consumer = || {
        WorkQueueConsumer::new(options(&vhost.url()), "ledger")
            .unwrap()
            .with_single_active_consumer()
    };
    smol::block_on(consumer().declare()).expect("declared");
    let client = Client::connect(&vhost.url());
    let mut replicas = vec![Some(start_work(consumer(), 0, &seen))];
    assert!(wait_until(Duration::from_secs(10), || client
        .queue("ledger")
        .1
        == 1));
    replicas.push(Some(start_work(consumer(), 1, &seen)));
    assert!(wait_until(Duration::from_secs(10), || client
        .queue("ledger")
        .1
        == 2));
    client.publish("", "ledger", &payloads("a", 40));
    // The first to consume is the active one; the other gets nothing.
    assert_eq!(handled_once(&seen, "a", 40), vec![0]);
    // In order.
    let order: Vec<usize> = {
        let seen = seen.lock().unwrap();
        let mut by_time: Vec<_> = seen
            .iter()
            .map(|(p, h)| (h[0].2, p[1..].parse::<usize>().unwrap()))
            .collect();
        by_time.sort();
        by_time.into_iter().map(|(_, n)| n).collect()
    };
    assert_eq!(order, (0..40).collect::<Vec<_>>());

    let first = stop(replicas[0].take().unwrap());
    assert_eq!(first.handled, 40);
    client.publish("", "ledger", &payloads("b", 40));
    assert_eq!(handled_once(&seen, "b", 40), vec![1]);
    let second = stop(replicas[1].take().unwrap());
    assert_eq!((second.handled, second.redelivered), (40, 0), "{second:?}");
}

#[test]
fn a_poisoned_message_under_an_elected_fanout_consumer_is_dead_lettered_after_one_plus_retries_calls()
 {
    let vhost = Vhost::create().expect("a test vhost on the machine's broker");
    let seen: Seen = Arc::default();
    let config = FaultyLocker::new(LocalLocker::new(), RenewFault::None, false).config();
    let scope = config.scope("endpoint/amqp").unwrap();
    let consumer = FanoutConsumer::new(options(&vhost.url()), "alerts")
        .unwrap()
        .with_guard(&config, &scope)
        .unwrap()
        .with_guard_settings(lease_settings())
        .unwrap()
        .with_retry(RetryPolicy::fixed_delay(2, Duration::from_millis(20)))
        .unwrap();
    assert_eq!(consumer.dead_letter_queue(), "alerts.dead-letters");
    smol::block_on(consumer.declare()).expect("declared");
    let consumer = Arc::new(consumer);
    let replica = start_fanout(consumer.clone(), 0, &seen, Duration::ZERO);
    let client = Client::connect(&vhost.url());
    wait_for_subscriber(&client, "alerts", &seen, "p");
    client.publish(
        "alerts",
        "",
        &[b"ok-1".to_vec(), b"poison".to_vec(), b"ok-2".to_vec()],
    );
    assert!(
        wait_until(Duration::from_secs(10), || {
            consumer.stats().dead_lettered == 1 && seen.lock().unwrap().contains_key("ok-2")
        }),
        "{:?}",
        consumer.stats()
    );
    let stats = stop(replica);
    assert_eq!(
        (stats.dead_lettered, stats.refused_late),
        (1, 0),
        "{stats:?}"
    );
    let seen = seen.lock().unwrap().clone();
    // 1 + 2 retries, every one under the lease of the first.
    let calls = &seen["poison"];
    assert_eq!(calls.len(), 3, "{calls:?}");
    assert!(calls[0].1.is_some(), "{calls:?}");
    assert!(
        calls.iter().all(|(_, fence, _)| *fence == calls[0].1),
        "{calls:?}"
    );
    // Retried in its place: the next message waited for it.
    assert!(seen["ok-2"][0].2 > calls[2].2);
    assert_eq!(seen["ok-1"].len(), 1);

    // The broker moved it from the leader's exclusive queue to the shared
    // dead-letter queue, with its origin in `x-death`.
    let (payload, death, left) = take_dead_letter(&client, "alerts.dead-letters");
    assert_eq!(payload, b"poison");
    assert_eq!(left, 0, "only the poisoned message");
    assert_eq!(death["exchange"], "alerts", "{death:?}");
    assert_eq!(death["reason"], "rejected", "{death:?}");
    assert!(death["queue"].starts_with("amq.gen-"), "{death:?}");
}

#[test]
fn a_leader_whose_lease_ends_during_the_retries_makes_no_further_call_and_dead_letters_nothing() {
    let vhost = Vhost::create().expect("a test vhost on the machine's broker");
    let seen: Seen = Arc::default();
    // Renewals never answer: each leadership's renew deadline (ttl 1 s -
    // drift 100 ms after its acquire was sent) passes while the poisoned
    // message is being retried.
    let config = FaultyLocker::new(LocalLocker::new(), RenewFault::NeverAnswers, false).config();
    let scope = config.scope("endpoint/amqp").unwrap();
    // 1 + 20 calls of 100 ms each (the handler blocks its thread) would
    // take 2.1 s, well past the deadline. No wait between them: nothing
    // but the lease check stands between a failed call and the next (the
    // blocked thread hears the demotion only once the retries are over).
    let consumer = FanoutConsumer::new(options(&vhost.url()), "meters")
        .unwrap()
        .with_guard(&config, &scope)
        .unwrap()
        .with_guard_settings(lease_settings())
        .unwrap()
        .with_retry(RetryPolicy::fixed_delay(20, Duration::ZERO))
        .unwrap();
    smol::block_on(consumer.declare()).expect("declared");
    let consumer = Arc::new(consumer);
    let replica = start_fanout(consumer.clone(), 0, &seen, Duration::from_millis(100));
    let client = Client::connect(&vhost.url());
    wait_for_subscriber(&client, "meters", &seen, "p");
    // Published until one reaches a leader (one published at the end of a
    // leadership is refused, or reaches nobody).
    let poison = (0..10)
        .map(|i| format!("poison-{i}"))
        .find(|payload| {
            client.publish("meters", "", &[payload.clone().into_bytes()]);
            wait_until(Duration::from_secs(2), || {
                seen.lock().unwrap().contains_key(payload)
            })
        })
        .expect("a poisoned message reached a leader");
    // Past that leadership's deadline, and its demotion.
    thread::sleep(Duration::from_millis(1_500));
    let stats = stop(replica);
    let seen = seen.lock().unwrap().clone();

    let calls = &seen[&poison];
    let fence = calls[0].1.expect("a fence");
    assert!(calls.iter().all(|(_, f, _)| *f == Some(fence)), "{calls:?}");
    // The lease was acquired before its first handler call, so its
    // deadline is at most ttl - drift after that call.
    let first_call = seen
        .values()
        .flatten()
        .filter(|(_, f, _)| *f == Some(fence))
        .map(|(_, _, at)| *at)
        .min()
        .unwrap();
    let deadline = first_call + Duration::from_millis(900);
    for (_, _, at) in calls {
        // 100 ms for the check to reach the handler on a busy machine; a
        // call made past the deadline comes 100 ms after another.
        assert!(
            *at < deadline + Duration::from_millis(100),
            "{poison} called {:?} past the deadline of fence {fence}",
            *at - deadline
        );
    }
    assert!(
        (2..21).contains(&calls.len()),
        "retried, and cut short: {} call(s)",
        calls.len()
    );
    // Not given up by its handler: not dead-lettered, counted as refused.
    assert_eq!(stats.dead_lettered, 0, "{stats:?}");
    assert_eq!(client.queue("meters.dead-letters").0, 0);
    assert!(stats.refused_late >= 1, "{stats:?}");
    println!(
        "{} call(s) of {poison} under fence {fence}, the last {:?} before the deadline; {stats:?}",
        calls.len(),
        deadline.saturating_duration_since(calls.last().unwrap().2)
    );
}

#[test]
fn a_message_between_its_retries_when_the_leader_is_demoted_is_counted_lost_not_dead_lettered() {
    let vhost = Vhost::create().expect("a test vhost on the machine's broker");
    let seen: Seen = Arc::default();
    // As above, but the handler fails at once and the retries wait 300 ms
    // each: the deadline passes during a wait, and the demotion that
    // follows closes the connection before the wait ends.
    let config = FaultyLocker::new(LocalLocker::new(), RenewFault::NeverAnswers, false).config();
    let scope = config.scope("endpoint/amqp").unwrap();
    let consumer = FanoutConsumer::new(options(&vhost.url()), "gauges")
        .unwrap()
        .with_guard(&config, &scope)
        .unwrap()
        .with_guard_settings(lease_settings())
        .unwrap()
        .with_retry(RetryPolicy::fixed_delay(20, Duration::from_millis(300)))
        .unwrap();
    smol::block_on(consumer.declare()).expect("declared");
    let consumer = Arc::new(consumer);
    let replica = start_fanout(consumer.clone(), 0, &seen, Duration::ZERO);
    let client = Client::connect(&vhost.url());
    wait_for_subscriber(&client, "gauges", &seen, "p");
    let poison = (0..10)
        .map(|i| format!("poison-{i}"))
        .find(|payload| {
            client.publish("gauges", "", &[payload.clone().into_bytes()]);
            wait_until(Duration::from_secs(2), || {
                seen.lock().unwrap().contains_key(payload)
            })
        })
        .expect("a poisoned message reached a leader");
    thread::sleep(Duration::from_millis(1_500));
    let stats = stop(replica);
    let calls = seen.lock().unwrap()[&poison].clone();
    assert!(calls.len() < 21, "cut short: {} call(s)", calls.len());
    assert_eq!(stats.dead_lettered, 0, "{stats:?}");
    assert_eq!(client.queue("gauges.dead-letters").0, 0);
    // Lost with the exclusive queue, and counted: dropped with the
    // connection (or, if a wait ended first, refused by the check).
    assert!(
        stats.dropped_on_close + stats.refused_late >= 1,
        "{stats:?}"
    );
    println!("{} call(s) of {poison}; {stats:?}", calls.len());
}

/// Restarts a private broker node (the machine's is left alone).
#[test]
fn a_work_queue_consumer_reconnects_after_the_broker_restarts() {
    let mut node = RabbitNode::start().expect("a private rabbitmq-server");
    let seen: Seen = Arc::default();
    let consumer = Arc::new(
        WorkQueueConsumer::new(options(&node.url()), "jobs")
            .unwrap()
            .with_retry(RetryPolicy::no_retry())
            .unwrap(),
    );
    smol::block_on(consumer.declare()).expect("declared");
    let (handle, ctl) = control();
    let replica = {
        let (consumer, seen) = (consumer.clone(), seen.clone());
        thread::spawn(move || {
            smol::block_on(consumer.run(ctl, Classifier::retry_all(), move |message| {
                record(&seen, 0, &message);
                async { Ok::<(), String>(()) }
            }))
        })
    };
    let client = Client::connect(&node.url());
    client.publish("", "jobs", &payloads("before", 10));
    handled_once(&seen, "before", 10);
    drop(client);

    let restarted = Instant::now();
    node.restart().expect("restarted");
    println!("the broker restarted in {:?}", restarted.elapsed());
    let client = Client::connect(&node.url());
    client.publish("", "jobs", &payloads("after", 10));
    handled_once(&seen, "after", 10);
    handle.stop();
    let stats = replica.join().unwrap().expect("ran");
    assert!(stats.reconnects >= 1, "{stats:?}");
    assert_eq!(stats.handled, 20, "{stats:?}");
}

#[test]
fn bad_parameters_are_refused_naming_the_parameter_the_value_and_the_rule() {
    fn refused(err: AmqpError) -> (Parameter, String, String, String) {
        let text = err.to_string();
        match err {
            AmqpError::InvalidInput(guard_endpoints::InvalidInput {
                parameter,
                value,
                rule,
                ..
            }) => (parameter, value, rule, text),
            other => panic!("not an invalid input: {other:?}"),
        }
    }
    let url = "amqp://guest:guest@127.0.0.1:5672/%2f";
    let cases = [
        (
            refused(AmqpOptions::new("not a url").unwrap_err()),
            Parameter::ServerUrl,
            "not a url",
        ),
        (
            refused(AmqpOptions::new("amqps://u:secret@broker:5671/%2f").unwrap_err()),
            Parameter::ServerUrl,
            "amqps://u:***@broker:5671/%2f",
        ),
        (
            refused(WorkQueueConsumer::new(options(url), "").unwrap_err()),
            Parameter::AmqpQueue,
            "",
        ),
        (
            refused(WorkQueueConsumer::new(options(url), "amq.jobs").unwrap_err()),
            Parameter::AmqpQueue,
            "amq.jobs",
        ),
        (
            refused(
                WorkQueueConsumer::new(options(url), "jobs")
                    .unwrap()
                    .with_prefetch(0)
                    .unwrap_err(),
            ),
            Parameter::Prefetch,
            "0",
        ),
        (
            refused(
                WorkQueueConsumer::new(options(url), "jobs")
                    .unwrap()
                    .with_retry(RetryPolicy::new().with_jitter(Jitter::Full))
                    .unwrap_err(),
            ),
            Parameter::RetryPolicy,
            "with Full jitter",
        ),
        (
            refused(
                WorkQueueConsumer::new(options(url), "jobs")
                    .unwrap()
                    .with_dead_letter_queue("jobs")
                    .unwrap_err(),
            ),
            Parameter::AmqpQueue,
            "jobs",
        ),
        (
            refused(FanoutConsumer::new(options(url), "").unwrap_err()),
            Parameter::Exchange,
            "",
        ),
        (
            refused(
                FanoutConsumer::new(options(url), "alarms")
                    .unwrap()
                    .with_guard_settings(lease_settings())
                    .unwrap_err(),
            ),
            Parameter::LeaseTiming,
            "",
        ),
        (
            refused(
                FanoutConsumer::new(options(url), "alarms")
                    .unwrap()
                    .with_retry(RetryPolicy::new().with_jitter(Jitter::Decorrelated))
                    .unwrap_err(),
            ),
            Parameter::RetryPolicy,
            "with Decorrelated jitter",
        ),
        (
            refused(
                FanoutConsumer::new(options(url), "alarms")
                    .unwrap()
                    .with_dead_letter_queue("amq.alarms")
                    .unwrap_err(),
            ),
            Parameter::AmqpQueue,
            "amq.alarms",
        ),
        (
            refused(
                FanoutConsumer::new(options(url), "alarms")
                    .unwrap()
                    .with_dead_letter_queue("")
                    .unwrap_err(),
            ),
            Parameter::AmqpQueue,
            "",
        ),
    ];
    for ((parameter, value, rule, text), expected, expected_value) in cases {
        assert_eq!(parameter, expected, "{text}");
        assert_eq!(value, expected_value, "{text}");
        assert!(!rule.is_empty(), "{text}");
        assert!(text.contains(&parameter.to_string()), "{text}");
        assert!(text.contains(&rule), "{text}");
        assert!(!text.contains("secret"), "{text}");
    }
    // The rules say why.
    let prefetch = WorkQueueConsumer::new(options(url), "jobs")
        .unwrap()
        .with_prefetch(0)
        .unwrap_err();
    assert_eq!(
        prefetch.to_string(),
        "invalid prefetch 0: must be at least 1 (0 means unlimited to the broker)"
    );
    let jitter = WorkQueueConsumer::new(options(url), "jobs")
        .unwrap()
        .with_retry(RetryPolicy::new().with_jitter(Jitter::Full))
        .unwrap_err();
    assert!(std::error::Error::source(&jitter).is_some(), "{jitter:?}");
    let long = WorkQueueConsumer::new(options(url), &"q".repeat(250)).unwrap_err();
    assert!(long.to_string().contains("255 bytes"), "{long}");
    // An exchange must leave room for its dead-letter queue's name.
    let long = FanoutConsumer::new(options(url), &"x".repeat(250)).unwrap_err();
    assert!(
        matches!(
            &long,
            AmqpError::InvalidInput(guard_endpoints::InvalidInput {
                parameter: Parameter::Exchange,
                ..
            })
        ),
        "{long:?}"
    );
    assert!(
        long.to_string().contains("<exchange>.dead-letters"),
        "{long}"
    );
    let fanout = FanoutConsumer::new(options(url), "alarms")
        .unwrap()
        .with_dead_letter_queue("alarms.failed")
        .unwrap();
    assert_eq!(fanout.dead_letter_queue(), "alarms.failed");
}

#[test]
fn a_declaration_that_conflicts_with_the_queue_is_an_error_naming_it() {
    let vhost = Vhost::create().expect("a test vhost on the machine's broker");
    let plain = WorkQueueConsumer::new(options(&vhost.url()), "payments").unwrap();
    smol::block_on(plain.declare()).expect("declared");
    // The same queue, now asked for a single active consumer: the broker
    // refuses arguments that differ from the queue's.
    let conflicting = WorkQueueConsumer::new(options(&vhost.url()), "payments")
        .unwrap()
        .with_single_active_consumer();
    let err = smol::block_on(conflicting.declare()).unwrap_err();
    assert!(
        matches!(&err, AmqpError::Declare { what: "queue", name, .. } if name == "payments"),
        "{err:?}"
    );
    assert_eq!(err.reply_code(), Some(406), "PRECONDITION_FAILED: {err}");
    assert!(err.to_string().contains("\"payments\""), "{err}");
    assert!(
        std::error::Error::source(&err)
            .and_then(|s| s.downcast_ref::<lapin::Error>())
            .is_some(),
        "{err:?}"
    );
    // `run` returns it rather than reconnecting forever.
    let (_handle, ctl) = control();
    let started = Instant::now();
    let ran = smol::block_on(conflicting.run(ctl, Classifier::retry_all(), |_| async {
        Ok::<(), String>(())
    }));
    assert!(matches!(ran, Err(AmqpError::Declare { .. })), "{ran:?}");
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[test]
fn an_unelected_fanout_consumer_gives_every_replica_every_message() {
    let vhost = Vhost::create().expect("a test vhost on the machine's broker");
    let seen: Seen = Arc::default();
    let consumer = || {
        FanoutConsumer::new(options(&vhost.url()), "config")
            .unwrap()
            .with_retry(RetryPolicy::fixed_delay(1, Duration::from_millis(10)))
            .unwrap()
    };
    smol::block_on(consumer().declare()).expect("declared");
    let replicas: Vec<_> = (0..2)
        .map(|id| start_fanout(consumer(), id, &seen, Duration::ZERO))
        .collect();
    let client = Client::connect(&vhost.url());
    // Both are bound once a probe reaches both.
    let mut round = 0;
    while wait_for_subscriber(&client, "config", &seen, &round.to_string()).len() < 2 {
        round += 1;
        assert!(round < 20, "the replicas never both bound a queue");
    }
    client.publish("config", "", &payloads("c", 20));
    assert!(
        wait_until(Duration::from_secs(10), || {
            seen.lock()
                .unwrap()
                .iter()
                .filter(|(p, h)| p.starts_with('c') && h.len() == 2)
                .count()
                == 20
        }),
        "{:?}",
        seen.lock().unwrap()
    );
    // Each replica retries its own copy, then dead-letters it to the
    // queue they share.
    client.publish("config", "", &[b"poison".to_vec()]);
    assert!(
        wait_until(Duration::from_secs(10), || client
            .queue("config.dead-letters")
            .0
            == 2),
        "{:?}",
        seen.lock().unwrap().get("poison")
    );
    for replica in replicas {
        let stats = stop(replica);
        assert!(stats.handled >= 20, "{stats:?}");
        assert_eq!(stats.refused_late, 0, "{stats:?}");
        assert_eq!(stats.dead_lettered, 1, "{stats:?}");
    }
    let calls = &seen.lock().unwrap()["poison"];
    for id in 0..2 {
        assert_eq!(
            calls.iter().filter(|(r, _, _)| *r == id).count(),
            2,
            "{calls:?}"
        );
    }
    let origins: BTreeSet<String> = (0..2)
        .map(|_| {
            let (payload, death, _) = take_dead_letter(&client, "config.dead-letters");
            assert_eq!(payload, b"poison");
            assert_eq!(death["exchange"], "config", "{death:?}");
            death["queue"].clone()
        })
        .collect();
    assert_eq!(
        origins.len(),
        2,
        "one copy from each replica's queue: {origins:?}"
    );
}
