//! The endpoints in a tokio application (the `tokio` feature): an elected
//! Redis Pub/Sub endpoint and an MQTT shared subscription, spawned as
//! tokio tasks (their futures are `Send`), run on the application's
//! runtime: no async-io reactor or lease thread, no smol executor and
//! no private tokio runtime is started. One test per process: the threads checked are the
//! process's.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use guard_endpoints::mqtt::{MqttEndpoint, MqttOptions, Subscription};
use guard_endpoints::redis::PubSubEndpoint;
use guard_redis::{RedisConnection, RedisLocker, Topology};
use guard_std::run::control;
use guard_std::{GuardConfig, SharedLocker};
use guard_testkit::{Mosquitto, RedisServer, thread_names};

type Seen = Arc<Mutex<Vec<(String, Option<u64>)>>>;

/// Publishes `prefix-i` on `publish` every 50 ms until `seen` holds one,
/// for at most 10 s; returns the payload seen.
async fn publish_until_seen(
    seen: &Seen,
    prefix: &str,
    publish: impl Fn(String) + Clone + Send + 'static,
) -> String {
    for i in 0..200 {
        let payload = format!("{prefix}-{i}");
        let publish = publish.clone();
        tokio::task::spawn_blocking(move || publish(payload))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        if let Some((payload, _)) = seen
            .lock()
            .unwrap()
            .iter()
            .find(|(p, _)| p.starts_with(prefix))
        {
            return payload.clone();
        }
    }
    panic!("nothing published as {prefix} was handled");
}

#[test]
fn an_elected_pubsub_endpoint_and_an_mqtt_subscription_run_on_the_application_s_tokio_runtime() {
    let redis = RedisServer::start().expect("redis-server");
    let broker = Arc::new(Mosquitto::start().expect("mosquitto"));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("app-worker")
        .enable_all()
        .build()
        .unwrap();
    let seen: Seen = Arc::default();
    runtime.block_on(async {
        let conn = RedisConnection::connect(
            Topology::Standalone { url: redis.url() },
            Duration::from_secs(2),
        )
        .await
        .expect("connect");
        let config = GuardConfig::new().with_locker(SharedLocker::new(RedisLocker::new(conn)));
        let scope = config
            .scope("endpoint/redis")
            .and_then(|s| s.segment("node", "sensors-in"))
            .unwrap();
        let pubsub = PubSubEndpoint::new(&redis.url(), &config, &scope, &["sensors.*"]).unwrap();
        let (pubsub_handle, ctl) = control();
        let record = seen.clone();
        let pubsub_task = tokio::spawn(async move {
            pubsub
                .run(ctl, move |message| {
                    let record = record.clone();
                    async move {
                        let payload = String::from_utf8(message.payload).unwrap();
                        record.lock().unwrap().push((payload, Some(message.fence)));
                    }
                })
                .await
        });

        let options = MqttOptions::new("127.0.0.1", broker.port(), "replica-0")
            .unwrap()
            .with_reconnect_delay(Duration::from_millis(100));
        let mqtt = MqttEndpoint::new(
            options,
            Subscription::shared("gateways", "telemetry/#").unwrap(),
        );
        let (mqtt_handle, ctl) = control();
        let record = seen.clone();
        let mqtt_task = tokio::spawn(async move {
            mqtt.run(ctl, move |message| {
                let record = record.clone();
                async move {
                    let payload = String::from_utf8(message.payload).unwrap();
                    record.lock().unwrap().push((payload, message.fence));
                }
            })
            .await
        });

        let url = redis.url();
        let from_redis = publish_until_seen(&seen, "redis", move |payload| {
            let mut conn = redis::Client::open(url.as_str())
                .and_then(|c| c.get_connection())
                .expect("publisher");
            let _: i64 = redis::cmd("PUBLISH")
                .arg("sensors.kitchen")
                .arg(payload)
                .query(&mut conn)
                .expect("PUBLISH");
        })
        .await;
        let publisher = broker.clone();
        let from_mqtt = publish_until_seen(&seen, "mqtt", move |payload| {
            // On a blocking thread of the application's runtime: the
            // harness's client (async-compat) runs on that runtime too.
            publisher
                .publish("telemetry/kitchen", &[payload.into_bytes()])
                .expect("publish");
        })
        .await;
        let seen = seen.lock().unwrap().clone();
        let fence = |p: &str| seen.iter().find(|(s, _)| s == p).map(|(_, f)| *f);
        assert!(
            matches!(fence(&from_redis), Some(Some(_))),
            "the elected endpoint hands its fence"
        );
        assert_eq!(
            fence(&from_mqtt),
            Some(None),
            "a shared subscription has no guard"
        );
        pubsub_handle.stop();
        mqtt_handle.stop();
        pubsub_task.await.unwrap();
        mqtt_task.await.unwrap();
    });
    let names = thread_names();
    assert!(
        !names.iter().any(|n| n == "async-io"
            || n.starts_with("smol")
            || n.contains("compat")
            || n.ends_with("-lease")),
        "a second reactor, executor or runtime was started: {names:?}"
    );
    assert!(names.iter().any(|n| n == "app-worker"), "{names:?}");
}
