//! MQTT endpoints on a real Mosquitto broker started by the test.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use guard_core::guard::{ActiveConfig, ActiveConfigError};
use guard_core::lock::{Locker, Ttl};
use guard_endpoints::Parameter;
use guard_endpoints::mqtt::{MqttEndpoint, MqttError, MqttOptions, Subscription};
use guard_smol::{RunHandle, RunnerError, control};
use guard_std::{GuardConfig, LocalLocker, SharedLocker};
use guard_testkit::Mosquitto;

/// Payload → the replicas that handled it, in order, with the fence each
/// was told.
type Seen = Arc<Mutex<BTreeMap<String, Vec<(usize, Option<u64>)>>>>;

fn wait_until(limit: Duration, done: impl FnMut() -> bool) -> bool {
    guard_testkit::wait_until("condition", limit, done).is_ok()
}

fn options(broker: &Mosquitto, id: usize) -> MqttOptions {
    MqttOptions::new("127.0.0.1", broker.port(), &format!("replica-{id}"))
        .unwrap()
        .with_reconnect_delay(Duration::from_millis(100))
}

/// Runs `endpoint` on its own thread as replica `id`, recording payloads.
fn start(endpoint: MqttEndpoint, id: usize, seen: &Seen) -> (RunHandle, thread::JoinHandle<()>) {
    let seen = seen.clone();
    let (handle, ctl) = control();
    let thread = thread::spawn(move || {
        smol::block_on(endpoint.run(ctl, move |message| {
            let seen = seen.clone();
            async move {
                let payload = String::from_utf8(message.payload).unwrap();
                seen.lock()
                    .unwrap()
                    .entry(payload)
                    .or_default()
                    .push((id, message.fence));
            }
        }))
    });
    (handle, thread)
}

fn payloads(prefix: &str, count: usize) -> Vec<Vec<u8>> {
    (0..count)
        .map(|i| format!("{prefix}{i}").into_bytes())
        .collect()
}

/// Publishes probes until some replica handles one: a subscription is in
/// place. Returns the replicas that handled the first probe seen.
fn wait_for_subscriber(broker: &Mosquitto, seen: &Seen, round: &str) -> Vec<usize> {
    for i in 0..100 {
        let probe = format!("probe-{round}-{i}");
        broker
            .publish("sensors/probe", &[probe.clone().into_bytes()])
            .unwrap();
        let handled = wait_until(Duration::from_millis(100), || {
            seen.lock().unwrap().contains_key(&probe)
        });
        if handled {
            // Copies to other subscribers arrive at about the same time.
            thread::sleep(Duration::from_millis(100));
            return seen.lock().unwrap()[&probe]
                .iter()
                .map(|(id, _)| *id)
                .collect();
        }
    }
    panic!("no replica subscribed");
}

/// The replicas that handled the payloads starting with `prefix`, after
/// checking that each of `count` was handled exactly once.
fn handled_once(seen: &Seen, prefix: &str, count: usize) -> Vec<usize> {
    assert!(
        wait_until(Duration::from_secs(5), || {
            seen.lock()
                .unwrap()
                .keys()
                .filter(|p| p.starts_with(prefix))
                .count()
                == count
        }),
        "not every {prefix}* message was handled: {:?}",
        seen.lock().unwrap()
    );
    // Late duplicates would arrive within this wait.
    thread::sleep(Duration::from_millis(200));
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

fn stop(replica: (RunHandle, thread::JoinHandle<()>)) {
    replica.0.stop();
    replica.1.join().unwrap();
}

#[test]
fn shared_subscription_delivers_each_message_to_one_of_three() {
    let broker = Mosquitto::start().expect("mosquitto");
    let seen: Seen = Arc::default();
    let replicas: Vec<_> = (0..3)
        .map(|id| {
            let subscription = Subscription::shared("gateways", "sensors/#").unwrap();
            start(
                MqttEndpoint::new(options(&broker, id), subscription),
                id,
                &seen,
            )
        })
        .collect();
    wait_for_subscriber(&broker, &seen, "a");
    // Let every member subscribe before the real messages.
    thread::sleep(Duration::from_millis(500));
    broker.publish("sensors/temp", &payloads("m", 100)).unwrap();
    let by = handled_once(&seen, "m", 100);
    // Mosquitto round-robins the group: every member took a share.
    assert_eq!(by, vec![0, 1, 2]);
    // No lease, no fence.
    assert!(seen.lock().unwrap().values().all(|h| h[0].1.is_none()));
    replicas.into_iter().for_each(stop);
}

#[test]
fn plain_subscription_without_a_guard_reaches_every_replica() {
    let broker = Mosquitto::start().expect("mosquitto");
    let seen: Seen = Arc::default();
    let replicas: Vec<_> = (0..2)
        .map(|id| {
            let subscription = Subscription::plain("sensors/#").unwrap();
            start(
                MqttEndpoint::new(options(&broker, id), subscription),
                id,
                &seen,
            )
        })
        .collect();
    thread::sleep(Duration::from_millis(500));
    broker.publish("sensors/temp", &payloads("m", 10)).unwrap();
    assert!(wait_until(Duration::from_secs(5), || {
        seen.lock()
            .unwrap()
            .values()
            .filter(|h| h.len() == 2)
            .count()
            == 10
    }));
    replicas.into_iter().for_each(stop);
}

#[test]
fn plain_subscription_with_a_guard_is_handled_by_the_leader_only() {
    let broker = Mosquitto::start().expect("mosquitto");
    let seen: Seen = Arc::default();
    // One locker shared by the replicas, as one Redis would be.
    let config = GuardConfig::new().with_locker(SharedLocker::new(LocalLocker::new()));
    let scope = config
        .scope("endpoint/mqtt")
        .and_then(|s| s.segment("node", "sensors-in"))
        .unwrap();
    let mut replicas: Vec<_> = (0..3)
        .map(|id| {
            let endpoint = MqttEndpoint::new(
                options(&broker, id),
                Subscription::plain("sensors/#").unwrap(),
            )
            .with_guard(&config, &scope)
            .unwrap()
            .with_guard_settings(
                ActiveConfig::new()
                    .with_ttl(Ttl::new(Duration::from_millis(300)).unwrap())
                    .with_interval(Duration::from_millis(100)),
            )
            .unwrap();
            Some(start(endpoint, id, &seen))
        })
        .collect();
    let first = wait_for_subscriber(&broker, &seen, "a");
    assert_eq!(first.len(), 1, "probe handled by {first:?}");
    broker.publish("sensors/temp", &payloads("a", 30)).unwrap();
    let leader = handled_once(&seen, "a", 30);
    assert_eq!(leader, first, "only the leader handles messages");

    // The leader stops; a standby subscribes and handles the next ones.
    stop(replicas[leader[0]].take().unwrap());
    let next = wait_for_subscriber(&broker, &seen, "b");
    assert_eq!(next.len(), 1, "probe handled by {next:?}");
    assert_ne!(next, leader);
    broker.publish("sensors/temp", &payloads("b", 30)).unwrap();
    assert_eq!(handled_once(&seen, "b", 30), next);
    // Each leader's messages carry its lease's fence, the new one higher.
    let fences = |prefix: &str| -> Vec<Option<u64>> {
        let seen = seen.lock().unwrap();
        let mut fences: Vec<_> = seen
            .iter()
            .filter(|(p, _)| p.starts_with(prefix))
            .map(|(_, h)| h[0].1)
            .collect();
        fences.dedup();
        fences
    };
    let (a, b) = (fences("a"), fences("b"));
    assert!(
        a.len() == 1 && b.len() == 1 && a[0].is_some(),
        "{a:?} {b:?}"
    );
    assert!(b[0] > a[0], "{a:?} then {b:?}");
    replicas.into_iter().flatten().for_each(stop);
}

#[test]
fn guarded_endpoint_without_a_broker_keeps_releasing_the_lease() {
    // Nobody listens on the port: every promotion fails and releases, so
    // the lease is free between attempts and the endpoint never serves.
    let port = guard_testkit::free_port().unwrap();
    let locker = SharedLocker::new(LocalLocker::new());
    let config = GuardConfig::new().with_locker(locker.clone());
    let scope = config.scope("endpoint/mqtt").unwrap();
    let endpoint = MqttEndpoint::new(
        MqttOptions::new("127.0.0.1", port, "lonely").unwrap(),
        Subscription::plain("t").unwrap(),
    )
    .with_guard(&config, &scope)
    .unwrap()
    .with_guard_settings(
        ActiveConfig::new()
            .with_ttl(Ttl::new(Duration::from_secs(10)).unwrap())
            .with_interval(Duration::from_millis(100)),
    )
    .unwrap();
    let seen: Seen = Arc::default();
    let replica = start(endpoint, 0, &seen);
    thread::sleep(Duration::from_millis(500));
    // With a 10 s lease, a kept lease would still be held; it is not.
    let key = guard_core::lock::active_key(config.prefix(), &scope).unwrap();
    let free = wait_until(Duration::from_secs(2), || {
        smol::block_on(async {
            let ttl = Ttl::new(Duration::from_millis(50)).unwrap();
            locker.try_lock(key.as_str(), ttl).await.unwrap().is_some()
        })
    });
    assert!(
        free,
        "the lease was kept by a replica that cannot subscribe"
    );
    stop(replica);
}

#[test]
fn bad_input_is_refused_with_a_reason() {
    let err = MqttOptions::new("127.0.0.1", 1883, "").unwrap_err();
    assert!(err.to_string().contains("client id"), "{err}");
    let err = Subscription::shared("a/b", "t").unwrap_err();
    assert!(err.to_string().contains("share group"), "{err}");
    let err = Subscription::plain("$share/g/t").unwrap_err();
    assert!(err.to_string().contains("$share"), "{err}");
    assert_eq!(
        Subscription::shared("g", "sensors/#")
            .unwrap()
            .topic_filter(),
        "$share/g/sensors/#"
    );
    let config = GuardConfig::new();
    let scope = config.scope("endpoint/mqtt").unwrap();
    let shared = MqttEndpoint::new(
        MqttOptions::new("127.0.0.1", 1883, "x").unwrap(),
        Subscription::shared("g", "t").unwrap(),
    );
    let err = shared.with_guard(&config, &scope).unwrap_err();
    assert!(
        matches!(
            err,
            MqttError::InvalidInput(guard_endpoints::InvalidInput {
                parameter: Parameter::GuardedSubscription,
                ..
            })
        ),
        "{err}"
    );
    assert!(err.to_string().contains("no guard"), "{err}");
    let err = MqttOptions::new("", 1883, "x").unwrap_err();
    assert!(
        matches!(&err, MqttError::InvalidInput(guard_endpoints::InvalidInput { parameter: Parameter::BrokerHost, value, .. }) if value.is_empty()),
        "{err}"
    );
}

#[test]
fn a_guard_that_cannot_be_built_is_the_source() {
    let config = GuardConfig::new();
    let scope = config.scope("endpoint/mqtt").unwrap();
    let endpoint = MqttEndpoint::new(
        MqttOptions::new("127.0.0.1", 1883, "x").unwrap(),
        Subscription::plain("t").unwrap(),
    )
    .with_guard(&config, &scope)
    .unwrap();
    // A drift margin longer than the lease leaves no time to renew.
    let err = endpoint
        .with_guard_settings(ActiveConfig::new().with_drift(Duration::from_secs(60)))
        .unwrap_err();
    let timing = RunnerError::Timing(ActiveConfigError::DriftNotBelowTtl);
    assert!(matches!(err, MqttError::Guard(e) if e == timing), "{err}");
    let source = std::error::Error::source(&err).expect("the runner's error");
    assert_eq!(source.downcast_ref::<RunnerError>(), Some(&timing));
    assert!(err.to_string().contains("drift"), "{err}");
}

#[test]
fn a_burst_larger_than_the_request_channel_is_handled_and_acknowledged() {
    // Acknowledgements queue in rumqttc's request channel while events
    // buffered from one read are handed out first; an endpoint that
    // waited for room there would stop, and the broker would drop the
    // rest of the burst once its queue for the client filled.
    let broker = Mosquitto::start().expect("mosquitto");
    let seen: Seen = Arc::default();
    let subscription = Subscription::shared("gateways", "sensors/#").unwrap();
    let replica = start(
        MqttEndpoint::new(options(&broker, 0), subscription),
        0,
        &seen,
    );
    wait_for_subscriber(&broker, &seen, "burst");
    broker
        .publish("sensors/burst", &payloads("m", 900))
        .unwrap();
    let arrived = wait_until(Duration::from_secs(20), || {
        seen.lock()
            .unwrap()
            .keys()
            .filter(|k| k.starts_with('m'))
            .count()
            == 900
    });
    let count = seen
        .lock()
        .unwrap()
        .keys()
        .filter(|k| k.starts_with('m'))
        .count();
    stop(replica);
    assert!(arrived, "{count} of 900 handled");
}

#[test]
fn a_guarded_endpoint_keeps_its_lease_while_its_handler_blocks_under_a_flood() {
    // The handler blocks its thread 2 ms a message; messages arrive much
    // faster for 6 s; the lease is 600 ms. Renewals that waited behind
    // the handler would lose it within the first second.
    let broker = Mosquitto::start().expect("mosquitto");
    let config = GuardConfig::new().with_locker(SharedLocker::new(LocalLocker::new()));
    let scope = config.scope("endpoint/mqtt").unwrap();
    let endpoint = MqttEndpoint::new(
        options(&broker, 0),
        Subscription::plain("sensors/#").unwrap(),
    )
    .with_guard(&config, &scope)
    .unwrap()
    .with_guard_settings(
        ActiveConfig::new()
            .with_ttl(Ttl::new(Duration::from_millis(600)).unwrap())
            .with_interval(Duration::from_millis(100)),
    )
    .unwrap();
    let fences = Arc::new(Mutex::new(Vec::new()));
    let (handle, ctl) = control();
    let replica = {
        let fences = fences.clone();
        thread::spawn(move || {
            smol::block_on(endpoint.run(ctl, move |message| {
                thread::sleep(Duration::from_millis(2));
                fences.lock().unwrap().push(message.fence);
                async {}
            }))
        })
    };
    // The first probe handled says the subscription is in place.
    assert!(wait_until(Duration::from_secs(5), || {
        broker.publish("sensors/probe", &[b"p".to_vec()]).unwrap();
        !fences.lock().unwrap().is_empty()
    }));
    let started = std::time::Instant::now();
    while started.elapsed() < Duration::from_secs(6) {
        broker
            .publish("sensors/flood", &payloads("m", 200))
            .unwrap();
    }
    handle.stop();
    replica.join().unwrap();
    let fences = fences.lock().unwrap();
    // About 500 a second for 6 s, all under the first lease.
    assert!(fences.len() > 1_500, "{} handled", fences.len());
    assert!(
        fences.iter().all(|f| *f == fences[0] && f.is_some()),
        "the lease changed: {:?}",
        fences.iter().collect::<std::collections::BTreeSet<_>>()
    );
}
