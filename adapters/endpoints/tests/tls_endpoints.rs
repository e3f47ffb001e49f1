//! The endpoints over TLS (the `tls` feature), with certificates the test
//! makes: a Redis Pub/Sub endpoint, whose reader is a blocking connection
//! of its own, on a `rediss://` server that requires client certificates,
//! and an MQTT endpoint on a Mosquitto TLS listener.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use guard_core::guard::ActiveConfig;
use guard_core::lock::Ttl;
use guard_endpoints::mqtt::{MqttEndpoint, MqttOptions, MqttTls, Subscription};
use guard_endpoints::redis::PubSubEndpoint;
use guard_redis::{RedisConnection, RedisLocker, RedisTls, Topology};
use guard_smol::control;
use guard_std::{GuardConfig, SharedLocker};
use guard_testkit::{Mosquitto, RedisServer, TestCerts};

fn wait_until(limit: Duration, done: impl FnMut() -> bool) -> bool {
    guard_testkit::wait_until("condition", limit, done).is_ok()
}

#[test]
fn redis_pubsub_over_mutual_tls_subscribes_and_delivers() {
    let certs = TestCerts::generate().expect("certificates");
    let server = RedisServer::start_tls_with(&certs, &["--tls-auth-clients", "yes"])
        .expect("redis-server requiring client certificates");
    let tls = RedisTls::new()
        .with_root_ca(certs.ca_pem())
        .and_then(|t| t.with_client_identity(certs.client_cert_pem(), certs.client_key_pem()))
        .expect("TLS settings");
    let conn = smol::block_on(RedisConnection::connect_with_tls(
        Topology::Standalone { url: server.url() },
        Duration::from_secs(2),
        &tls,
    ))
    .expect("the locker's connection over TLS");
    let config = GuardConfig::new().with_locker(SharedLocker::new(RedisLocker::new(conn)));
    let scope = config
        .scope("endpoint/redis")
        .and_then(|s| s.segment("node", "tls-in"))
        .unwrap();
    let endpoint = PubSubEndpoint::new(&server.url(), &config, &scope, &["sensors.*"])
        .and_then(|e| e.with_tls(&tls))
        .and_then(|e| {
            e.with_settings(
                ActiveConfig::new()
                    .with_ttl(Ttl::new(Duration::from_millis(600)).unwrap())
                    .with_interval(Duration::from_millis(200)),
            )
        })
        .expect("endpoint")
        .with_confirm_timeout(Duration::from_secs(2));

    let received: Arc<Mutex<Vec<String>>> = Arc::default();
    let (handle, ctl) = control();
    let sink = received.clone();
    let runner = thread::spawn(move || {
        smol::block_on(endpoint.run(ctl, move |message| {
            let sink = sink.clone();
            async move {
                sink.lock()
                    .unwrap()
                    .push(String::from_utf8(message.payload).unwrap());
            }
        }))
    });

    // A publisher with the same settings, on a blocking connection.
    let mut publisher = tls
        .client(server.url())
        .and_then(|c| Ok(c.get_connection_with_timeout(Duration::from_secs(2))?))
        .expect("a blocking TLS connection");
    let subscribed = wait_until(Duration::from_secs(10), || {
        redis::cmd("PUBSUB")
            .arg("NUMPAT")
            .query::<i64>(&mut publisher)
            .is_ok_and(|n| n == 1)
    });
    assert!(subscribed, "the elected reader subscribed over TLS");
    let payloads: Vec<String> = (0..20).map(|i| format!("tls-{i}")).collect();
    for payload in &payloads {
        let receivers: i64 = redis::cmd("PUBLISH")
            .arg("sensors.temp")
            .arg(payload)
            .query(&mut publisher)
            .unwrap();
        assert_eq!(receivers, 1, "{payload} reached {receivers} subscribers");
    }
    assert!(
        wait_until(Duration::from_secs(5), || received.lock().unwrap().len()
            == payloads.len()),
        "every message handled: {:?}",
        received.lock().unwrap()
    );
    handle.stop();
    let stats = runner.join().unwrap();
    assert_eq!(*received.lock().unwrap(), payloads, "in order, once each");
    assert_eq!(stats.handled, payloads.len() as u64, "{stats:?}");
    assert_eq!(stats.disconnects, 0, "{stats:?}");
}

#[test]
fn a_pubsub_endpoint_refuses_tls_settings_for_a_plain_url() {
    let certs = TestCerts::generate().expect("certificates");
    let tls = RedisTls::new().with_root_ca(certs.ca_pem()).unwrap();
    let config = GuardConfig::new();
    let scope = config.scope("endpoint/redis").unwrap();
    let err = PubSubEndpoint::new("redis://127.0.0.1:6379/", &config, &scope, &["a.*"])
        .and_then(|e| e.with_tls(&tls))
        .unwrap_err();
    assert!(err.to_string().contains("must be rediss://"), "{err}");
}

#[test]
fn mqtt_over_tls_publishes_and_subscribes() {
    let certs = TestCerts::generate().expect("certificates");
    let broker = Mosquitto::start_tls(&certs).expect("mosquitto with TLS");
    let tls = MqttTls::new()
        .with_root_ca(certs.ca_pem())
        .and_then(|t| t.with_client_identity(certs.client_cert_pem(), certs.client_key_pem()))
        .expect("TLS settings");
    assert!(tls.has_root_ca() && tls.has_client_identity());
    let options = MqttOptions::new("127.0.0.1", broker.port(), "tls-replica")
        .unwrap()
        .with_reconnect_delay(Duration::from_millis(100))
        .with_tls(tls);
    let endpoint = MqttEndpoint::new(options, Subscription::plain("sensors/#").unwrap());
    let seen: Arc<Mutex<BTreeSet<String>>> = Arc::default();
    let (handle, ctl) = control();
    let sink = seen.clone();
    let runner = thread::spawn(move || {
        smol::block_on(endpoint.run(ctl, move |message| {
            let sink = sink.clone();
            async move {
                sink.lock()
                    .unwrap()
                    .insert(String::from_utf8(message.payload).unwrap());
            }
        }))
    });
    // Probes until the subscription is in place (the harness publishes
    // over TLS too).
    let subscribed = (0..100).any(|i| {
        let probe = format!("probe-{i}");
        broker
            .publish("sensors/probe", &[probe.clone().into_bytes()])
            .expect("publish over TLS");
        wait_until(Duration::from_millis(100), || {
            seen.lock().unwrap().contains(&probe)
        })
    });
    assert!(subscribed, "the endpoint subscribed over TLS");
    let payloads: Vec<Vec<u8>> = (0..20).map(|i| format!("m{i}").into_bytes()).collect();
    broker.publish("sensors/temp", &payloads).unwrap();
    assert!(
        wait_until(Duration::from_secs(5), || {
            let seen = seen.lock().unwrap();
            (0..20).all(|i| seen.contains(&format!("m{i}")))
        }),
        "every message handled: {:?}",
        seen.lock().unwrap()
    );
    handle.stop();
    runner.join().unwrap();
}
