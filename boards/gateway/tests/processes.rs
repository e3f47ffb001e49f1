//! Three `guard-gateway run` processes against a real redis-server (and
//! a Mosquitto broker for the endpoints).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use guard_testkit::Mosquitto;
use guard_testkit::{RedisServer, free_port};

const TTL_MS: u64 = 2_000;
const INTERVAL_MS: u64 = 250;

type Lines = Arc<Mutex<Vec<(usize, Instant, String)>>>;

/// The locker and guard sections every test configuration starts with.
fn base_config(redis: &str) -> String {
    format!(
        r#"
[locker]
kind = "redis"
url = "{redis}"
request_timeout_ms = 300

[guards]
owner = "it"
active_ttl_ms = {TTL_MS}
active_interval_ms = {INTERVAL_MS}
"#
    )
}

fn config(dir: &std::path::Path, redis: &str, metrics: Option<u16>) -> std::path::PathBuf {
    let mut text = base_config(redis);
    text.push_str(
        r#"
[[schedules]]
router = "heartbeat"
every_ms = 1000

[[active]]
name = "sensors"
"#,
    );
    if let Some(port) = metrics {
        text.push_str(&format!("\n[metrics]\nprometheus = \"127.0.0.1:{port}\"\n"));
    }
    let path = dir.join(format!("gateway-{}.toml", metrics.unwrap_or(0)));
    std::fs::write(&path, text).unwrap();
    path
}

struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start(id: usize, config: &std::path::Path, lines: &Lines) -> Process {
    let mut child = Command::new(env!("CARGO_BIN_EXE_guard-gateway"))
        .args(["run", "--replica", &format!("replica-{id}"), "--config"])
        .arg(config)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("guard-gateway");
    let stdout = child.stdout.take().unwrap();
    let lines = lines.clone();
    thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            lines.lock().unwrap().push((id, Instant::now(), line));
        }
    });
    Process(child)
}

fn promoted_ids(lines: &Lines) -> Vec<(usize, Instant)> {
    lines
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, _, l)| l.starts_with("promoted name=sensors"))
        .map(|(id, t, _)| (*id, *t))
        .collect()
}

#[test]
fn three_processes_run_each_slot_once_and_a_standby_takes_over_a_killed_leader() {
    let server = RedisServer::start().expect("redis-server");
    let dir = tempfile::tempdir().unwrap();
    let path = config(dir.path(), &server.url(), None);
    let lines: Lines = Arc::default();
    let mut processes: Vec<Option<Process>> =
        (0..3).map(|id| Some(start(id, &path, &lines))).collect();
    thread::sleep(Duration::from_millis(4_000));
    let leaders = promoted_ids(&lines);
    assert_eq!(
        leaders.len(),
        1,
        "one leader among three processes: {:?}",
        lines.lock().unwrap()
    );
    let leader = leaders[0].0;
    let killed_at = Instant::now();
    drop(processes[leader].take()); // SIGKILL: no release, the lease must expire
    thread::sleep(Duration::from_millis(TTL_MS + INTERVAL_MS + 1_500));
    let takeover = promoted_ids(&lines)
        .into_iter()
        .find(|(id, t)| *id != leader && *t > killed_at)
        .map(|(_, t)| t.duration_since(killed_at))
        .expect("a standby took over");
    assert!(
        takeover <= Duration::from_millis(TTL_MS + INTERVAL_MS + 100),
        "took over after {takeover:?}, more than ttl + interval"
    );
    drop(processes);

    let mut slots: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
    for (id, _, line) in lines.lock().unwrap().iter() {
        if let Some(rest) = line.strip_prefix("executed router=heartbeat slot=") {
            let slot: u64 = rest.split_whitespace().next().unwrap().parse().unwrap();
            slots.entry(slot).or_default().push(*id);
        }
    }
    assert!(slots.len() >= 6, "{slots:?}");
    assert!(
        slots.values().all(|r| r.len() == 1),
        "a slot ran twice: {slots:?}"
    );
    let (first, last) = (*slots.keys().next().unwrap(), *slots.keys().last().unwrap());
    assert_eq!(
        slots.len() as u64,
        (last - first) / 1000 + 1,
        "a slot was missed: {slots:?}"
    );
}

#[test]
fn a_replica_serves_prometheus_metrics() {
    let server = RedisServer::start().expect("redis-server");
    let dir = tempfile::tempdir().unwrap();
    let port = free_port().unwrap();
    let path = config(dir.path(), &server.url(), Some(port));
    let lines: Lines = Arc::default();
    let _process = start(0, &path, &lines);
    thread::sleep(Duration::from_millis(2_500));
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("metrics endpoint");
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    assert!(response.starts_with("HTTP/1.1 200 OK"), "{response}");
    assert!(response.contains("guard_active_leader"), "{response}");
    assert!(response.contains("guard_once_total"), "{response}");
}

#[test]
fn an_unreachable_redis_is_a_clear_startup_error() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port().unwrap();
    let path = config(dir.path(), &format!("redis://127.0.0.1:{port}/"), None);
    let output = Command::new(env!("CARGO_BIN_EXE_guard-gateway"))
        .args(["run", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("cannot reach the Redis locker"), "{stderr}");
}

#[test]
fn a_bad_configuration_is_refused_with_its_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    std::fs::write(&path, "[guards]\nfail_policy = \"sometimes\"\n").unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_guard-gateway"))
        .args(["run", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("sometimes") && stderr.contains("`closed` or `open`"),
        "{stderr}"
    );
}

#[test]
fn the_example_configuration_is_valid() {
    guard_endpoints::config::FileConfig::from_path(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("gateway.toml"),
    )
    .expect("gateway.toml");
}

/// Payload → the processes that handled it, for one endpoint.
fn received(lines: &Lines, endpoint: &str) -> BTreeMap<String, Vec<usize>> {
    let prefix = format!("received endpoint={endpoint} from=");
    let mut by: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for (id, _, line) in lines.lock().unwrap().iter() {
        if let Some(rest) = line.strip_prefix(&prefix) {
            let payload = rest.split(" payload=").nth(1).unwrap_or_default();
            by.entry(payload.to_owned()).or_default().push(*id);
        }
    }
    by
}

fn wait_for(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    guard_testkit::wait_until("condition", limit, &mut done).is_ok()
}

#[test]
fn three_processes_wire_the_configured_endpoints_each_message_handled_once() {
    let server = RedisServer::start().expect("redis-server");
    let broker = Mosquitto::start().expect("mosquitto");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("endpoints.toml");
    let redis = server.url();
    let mqtt_port = broker.port();
    std::fs::write(
        &path,
        base_config(&redis)
            + &format!(
                r#"
[[endpoints]]
name = "orders"
kind = "redis-stream"
stream = "orders"
group = "billing"
dead_letter_topic = "orders"

[[endpoints]]
name = "alerts"
kind = "redis-pubsub"
patterns = ["alerts.*"]

[[endpoints]]
name = "telemetry"
kind = "mqtt"
host = "127.0.0.1"
port = {mqtt_port}
filter = "sensors/#"
share_group = "gateways"
"#
            ),
    )
    .unwrap();
    let lines: Lines = Arc::default();
    let _processes: Vec<Process> = (0..3).map(|id| start(id, &path, &lines)).collect();

    let client = redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_connection().unwrap();
    assert!(
        wait_for(Duration::from_secs(10), || {
            redis::cmd("PUBSUB")
                .arg("NUMPAT")
                .query::<i64>(&mut conn)
                .unwrap()
                == 1
        }),
        "no replica subscribed to the Pub/Sub endpoint"
    );
    // Every replica connected to the broker (a shared group of three).
    thread::sleep(Duration::from_millis(1_000));

    for i in 0..100 {
        redis::cmd("XADD")
            .arg("orders")
            .arg("*")
            .arg("payload")
            .arg(format!("o{i}"))
            .query::<String>(&mut conn)
            .unwrap();
    }
    for i in 0..20 {
        let receivers: i64 = redis::cmd("PUBLISH")
            .arg("alerts.fire")
            .arg(format!("a{i}"))
            .query(&mut conn)
            .unwrap();
        assert_eq!(receivers, 1, "one subscriber among three processes");
    }
    let telemetry: Vec<Vec<u8>> = (0..30).map(|i| format!("t{i}").into_bytes()).collect();
    broker.publish("sensors/temp", &telemetry).unwrap();

    let counts = [("orders", 100), ("alerts", 20), ("telemetry", 30)];
    let all = wait_for(Duration::from_secs(10), || {
        counts
            .iter()
            .all(|(endpoint, n)| received(&lines, endpoint).len() == *n)
    });
    thread::sleep(Duration::from_millis(300)); // late duplicates would show
    for (endpoint, n) in counts {
        let by = received(&lines, endpoint);
        assert!(
            all && by.len() == n,
            "{endpoint}: {} of {n}: {by:?}",
            by.len()
        );
        let twice: Vec<_> = by.iter().filter(|(_, ids)| ids.len() > 1).collect();
        assert!(twice.is_empty(), "{endpoint}: handled twice: {twice:?}");
    }
    // Mosquitto round-robins a share group: every process took a share.
    // (A consumer group promises no spread: one fast consumer may take a
    // whole burst.)
    let processes: std::collections::BTreeSet<usize> = received(&lines, "telemetry")
        .values()
        .flatten()
        .copied()
        .collect();
    assert_eq!(
        processes.len(),
        3,
        "telemetry: only {processes:?} took part"
    );
}

/// Sends `signal` (`STOP`, `CONT`) to a process.
fn signal(process: &Process, signal: &str) {
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(process.0.id().to_string())
        .status()
        .expect("kill");
    assert!(status.success(), "kill -{signal}");
}

/// (process, fence, payload) of each message an endpoint handled.
fn received_with_fences(lines: &Lines, endpoint: &str) -> Vec<(usize, u64, String)> {
    let prefix = format!("received endpoint={endpoint} from=");
    lines
        .lock()
        .unwrap()
        .iter()
        .filter_map(|(id, _, line)| {
            let rest = line.strip_prefix(&prefix)?;
            let fence = rest
                .split(" fence=")
                .nth(1)?
                .split(' ')
                .next()?
                .parse()
                .ok()?;
            let payload = rest.split(" payload=").nth(1)?.to_owned();
            Some((*id, fence, payload))
        })
        .collect()
}

/// Where the paused-leader tests publish.
#[derive(Clone)]
enum Source {
    /// Redis Pub/Sub on channel `alerts.fire`.
    Redis(String),
    /// MQTT topic `alerts/fire` on a broker's port.
    Mqtt(u16),
}

impl Source {
    /// A function that publishes one payload.
    fn publisher(&self) -> Box<dyn FnMut(String)> {
        match self.clone() {
            Source::Redis(url) => {
                let mut conn = redis::Client::open(url).unwrap().get_connection().unwrap();
                Box::new(move |payload| {
                    let _: i64 = redis::cmd("PUBLISH")
                        .arg("alerts.fire")
                        .arg(payload)
                        .query(&mut conn)
                        .unwrap();
                })
            }
            Source::Mqtt(port) => {
                use rumqttc::{Client, MqttOptions, QoS};
                let (client, mut connection) = Client::new(
                    MqttOptions::new("paused-leader-publisher", "127.0.0.1", port),
                    64,
                );
                thread::spawn(move || for _ in connection.iter() {});
                Box::new(move |payload| {
                    client
                        .publish("alerts/fire", QoS::AtLeastOnce, false, payload)
                        .unwrap();
                })
            }
        }
    }
}

/// Three processes share one elected endpoint `alerts`; the leader is
/// paused (SIGSTOP) for twice the lease while messages keep coming, then
/// resumed. Nothing may be handled twice, and the paused leader must not
/// handle anything under its expired lease after it wakes.
fn a_paused_leader_acts_late_on_nothing(endpoint: &str, source: &Source, server: &RedisServer) {
    const TTL_MS: u64 = 3_000;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("paused.toml");
    std::fs::write(
        &path,
        format!(
            r#"
[locker]
kind = "redis"
url = "{}"
request_timeout_ms = 300

[guards]
owner = "it"
active_ttl_ms = {TTL_MS}
active_interval_ms = 500

{endpoint}"#,
            server.url()
        ),
    )
    .unwrap();
    let lines: Lines = Arc::default();
    let processes: Vec<Process> = (0..3).map(|id| start(id, &path, &lines)).collect();
    // A probe shows which process subscribed.
    let mut publish = source.publisher();
    let mut probe = 0;
    let leader = loop {
        assert!(
            probe < 100,
            "no process subscribed: {:?}",
            lines.lock().unwrap()
        );
        publish(format!("probe{probe}"));
        probe += 1;
        thread::sleep(Duration::from_millis(100));
        if let Some((id, _, _)) = received_with_fences(&lines, "alerts").first() {
            break *id;
        }
    };

    // Publish every 20 ms throughout: before, during and after the pause.
    let publisher = {
        let source = source.clone();
        thread::spawn(move || {
            let mut publish = source.publisher();
            for i in 0..600 {
                publish(format!("m{i}"));
                thread::sleep(Duration::from_millis(20));
            }
        })
    };
    thread::sleep(Duration::from_millis(1_500));
    signal(&processes[leader], "STOP");
    // Twice the lease: a standby takes over and handles what arrives,
    // while the same messages pile up on the paused leader's socket.
    thread::sleep(Duration::from_millis(2 * TTL_MS));
    let resumed_at = Instant::now();
    signal(&processes[leader], "CONT");
    publisher.join().unwrap();
    thread::sleep(Duration::from_millis(500));
    drop(processes);

    let handled = received_with_fences(&lines, "alerts");
    let mut by: BTreeMap<&str, Vec<(usize, u64)>> = BTreeMap::new();
    for (id, fence, payload) in &handled {
        by.entry(payload.as_str()).or_default().push((*id, *fence));
    }
    let twice: Vec<_> = by.iter().filter(|(_, h)| h.len() > 1).collect();
    assert!(twice.is_empty(), "handled twice: {twice:?}");
    let old_fence = handled.iter().find(|(id, _, _)| *id == leader).unwrap().1;
    let successor = handled
        .iter()
        .find(|(id, _, _)| *id != leader)
        .expect("a standby took over and handled messages");
    assert!(
        successor.1 > old_fence,
        "{successor:?} after fence {old_fence}"
    );
    let late: Vec<_> = lines
        .lock()
        .unwrap()
        .iter()
        .filter(|(id, t, l)| {
            *id == leader && *t > resumed_at && l.starts_with("received endpoint=alerts")
        })
        .map(|(_, _, l)| l.clone())
        .collect();
    // After waking it may lead again only under a new, higher fence.
    assert!(
        late.iter()
            .all(|l| !l.contains(&format!(" fence={old_fence} "))),
        "the paused leader handled under its expired lease: {late:?}"
    );
}

#[test]
fn a_paused_pubsub_leader_does_not_handle_what_arrived_after_its_deadline() {
    let server = RedisServer::start().expect("redis-server");
    let endpoint =
        "[[endpoints]]\nname = \"alerts\"\nkind = \"redis-pubsub\"\npatterns = [\"alerts.*\"]\n";
    a_paused_leader_acts_late_on_nothing(endpoint, &Source::Redis(server.url()), &server);
}

#[test]
fn a_paused_mqtt_leader_does_not_handle_what_arrived_after_its_deadline() {
    let server = RedisServer::start().expect("redis-server");
    let broker = Mosquitto::start().expect("mosquitto");
    let endpoint = format!(
        "[[endpoints]]\nname = \"alerts\"\nkind = \"mqtt\"\nhost = \"127.0.0.1\"\nport = {}\nfilter = \"alerts/#\"\nguard = true\n",
        broker.port()
    );
    a_paused_leader_acts_late_on_nothing(&endpoint, &Source::Mqtt(broker.port()), &server);
}
