//! A `guard-gateway run` process whose servers are TLS-only: the Redis
//! locker at a `rediss://` URL with `tls_ca` (the Pub/Sub and stream
//! endpoints share its connection and TLS settings) and an MQTT endpoint
//! with `tls_ca`, all with certificates the test makes; and the same
//! configuration with a CA file that holds no certificate, refused with
//! its key.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use guard_redis::RedisTls;
use guard_testkit::{
    KillOnDrop as Process, Mosquitto, RedisServer, TestCerts, holds_within as wait_for,
};

fn config(redis_url: &str, ca: &std::path::Path, mqtt_port: u16) -> String {
    let ca = ca.display();
    format!(
        r#"
[locker]
kind = "redis"
url = "{redis_url}"
tls_ca = "{ca}"
request_timeout_ms = 1000

[guards]
owner = "tls"
active_ttl_ms = 2000
active_interval_ms = 250

[[endpoints]]
name = "alerts"
kind = "redis-pubsub"
patterns = ["alerts.*"]

[[endpoints]]
name = "orders"
kind = "redis-stream"
stream = "orders"
group = "billing"

[[endpoints]]
name = "telemetry"
kind = "mqtt"
host = "127.0.0.1"
port = {mqtt_port}
filter = "sensors/#"
share_group = "gateways"
tls_ca = "{ca}"
"#
    )
}

/// The payloads each endpoint printed as received.
fn received(lines: &Mutex<Vec<String>>, endpoint: &str) -> BTreeSet<String> {
    let prefix = format!("received endpoint={endpoint} from=");
    lines
        .lock()
        .unwrap()
        .iter()
        .filter_map(|line| line.strip_prefix(&prefix))
        .map(|rest| {
            rest.split(" payload=")
                .nth(1)
                .unwrap_or_default()
                .to_owned()
        })
        .collect()
}

#[test]
fn a_replica_serves_its_endpoints_over_tls() {
    let certs = TestCerts::generate().expect("certificates");
    let server = RedisServer::start_tls(&certs).expect("redis-server with TLS");
    let broker = Mosquitto::start_tls(&certs).expect("mosquitto with TLS");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tls.toml");
    std::fs::write(
        &path,
        config(&server.url(), &certs.ca_path(), broker.port()),
    )
    .unwrap();

    let mut child = Command::new(env!("CARGO_BIN_EXE_guard-gateway"))
        .args(["run", "--replica", "tls-0", "--config"])
        .arg(&path)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("guard-gateway");
    let stdout = child.stdout.take().unwrap();
    let _process = Process(child);
    let lines: Arc<Mutex<Vec<String>>> = Arc::default();
    let sink = lines.clone();
    thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            sink.lock().unwrap().push(line);
        }
    });

    let tls = RedisTls::new().with_root_ca(certs.ca_pem()).unwrap();
    let mut conn = tls
        .client(server.url())
        .and_then(|c| Ok(c.get_connection_with_timeout(Duration::from_secs(2))?))
        .expect("a TLS connection of the test's own");
    assert!(
        wait_for(Duration::from_secs(15), || {
            redis::cmd("PUBSUB")
                .arg("NUMPAT")
                .query::<i64>(&mut conn)
                .is_ok_and(|n| n == 1)
        }),
        "the Pub/Sub endpoint never subscribed over TLS: {:?}",
        lines.lock().unwrap()
    );
    for i in 0..5 {
        let _: i64 = redis::cmd("PUBLISH")
            .arg("alerts.fire")
            .arg(format!("a{i}"))
            .query(&mut conn)
            .unwrap();
        let _: String = redis::cmd("XADD")
            .arg("orders")
            .arg("*")
            .arg("payload")
            .arg(format!("o{i}"))
            .query(&mut conn)
            .unwrap();
    }
    // The MQTT endpoint subscribes on its own: probes until one arrives.
    assert!(
        wait_for(Duration::from_secs(15), || {
            broker
                .publish("sensors/probe", &[b"probe".to_vec()])
                .is_ok()
                && received(&lines, "telemetry").contains("probe")
        }),
        "the MQTT endpoint never subscribed over TLS: {:?}",
        lines.lock().unwrap()
    );
    let telemetry: Vec<Vec<u8>> = (0..5).map(|i| format!("t{i}").into_bytes()).collect();
    broker.publish("sensors/temp", &telemetry).unwrap();
    let expected =
        |prefix: char| -> BTreeSet<String> { (0..5).map(|i| format!("{prefix}{i}")).collect() };
    assert!(
        wait_for(Duration::from_secs(10), || {
            received(&lines, "alerts") == expected('a')
                && received(&lines, "orders") == expected('o')
                && received(&lines, "telemetry").is_superset(&expected('t'))
        }),
        "not every endpoint served its messages over TLS: {:?}",
        lines.lock().unwrap()
    );
}

#[test]
fn a_ca_file_without_a_certificate_is_refused_with_its_key() {
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("not-a-ca.pem");
    std::fs::write(&ca, "hello\n").unwrap();
    let path = dir.path().join("bad.toml");
    std::fs::write(&path, config("rediss://127.0.0.1:6380/", &ca, 8883)).unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_guard-gateway"))
        .args(["run", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("`locker.tls_ca`")
            && stderr.contains("not-a-ca.pem")
            && stderr.contains("no certificate"),
        "{stderr}"
    );
}
