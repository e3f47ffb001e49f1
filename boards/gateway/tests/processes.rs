//! Three `guard-gateway run` processes against a real redis-server (and
//! a Mosquitto broker for the endpoints).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use guard_testkit::Mosquitto;
use guard_testkit::http::sample;
use guard_testkit::nats::NatsServer;
use guard_testkit::{KillOnDrop as Process, RedisServer, free_port, holds_within as wait_for};

const TTL_MS: u64 = 2_000;
const INTERVAL_MS: u64 = 250;

type Lines = Arc<Mutex<Vec<(usize, Instant, String)>>>;

/// How long a test waits for what must happen eventually (a source set
/// up, messages handled, a replica ready again): generous, so that a
/// machine busy with other work only makes a passing test slower. A
/// bound the test judges is stated where it is checked, not here.
const SETTLE: Duration = Duration::from_secs(60);

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

fn start(id: usize, config: &std::path::Path, lines: &Lines) -> Process {
    start_as(id, &format!("replica-{id}"), config, lines)
}

/// [`start`] under the replica name `replica` (a restart keeps its name).
fn start_as(id: usize, replica: &str, config: &std::path::Path, lines: &Lines) -> Process {
    let child = Command::new(env!("CARGO_BIN_EXE_guard-gateway"))
        .args(["run", "--replica", replica, "--config"])
        .arg(config)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("guard-gateway");
    collect(id, child, lines)
}

/// [`start`], with the process's log lines (from `info` on, each
/// prefixed `log: `) among its stdout lines: what a failure shows.
fn start_logged(id: usize, config: &std::path::Path, lines: &Lines) -> Process {
    let mut child = Command::new(env!("CARGO_BIN_EXE_guard-gateway"))
        .args(["run", "--replica", &format!("replica-{id}"), "--config"])
        .arg(config)
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("guard-gateway");
    let stderr = child.stderr.take().unwrap();
    let log = lines.clone();
    thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            log.lock()
                .unwrap()
                .push((id, Instant::now(), format!("log: {line}")));
        }
    });
    collect(id, child, lines)
}

/// The bytes of each line of a replica's that a test keeps.
const KEPT_OF_A_LINE: usize = 16 * 1024;

/// Collects the lines `child` prints on its (piped) stdout as process `id`.
fn collect(id: usize, mut child: Child, lines: &Lines) -> Process {
    let stdout = child.stdout.take().unwrap();
    let lines = lines.clone();
    thread::spawn(move || {
        for mut line in BufReader::new(stdout).lines().map_while(Result::ok) {
            // What a test reads of a line is its start: a line of a
            // channel named with 256 KiB is kept in part.
            if line.len() > KEPT_OF_A_LINE {
                let end = (0..=KEPT_OF_A_LINE)
                    .rev()
                    .find(|&i| line.is_char_boundary(i))
                    .unwrap_or(0);
                line.truncate(end);
            }
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

/// Three processes on the locker `section` configures: one leader, a
/// standby takes over a SIGKILLed leader within ttl + interval + `late`
/// (the lock service's own lateness in ending a lease), every slot once.
fn three_processes_elect_and_run_each_slot_once(section: &str, late: Duration) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.toml");
    std::fs::write(
        &path,
        format!(
            "{section}\n[guards]\nowner = \"it\"\nactive_ttl_ms = {TTL_MS}\nactive_interval_ms = {INTERVAL_MS}\n\n[[schedules]]\nrouter = \"heartbeat\"\nevery_ms = 1000\n\n[[active]]\nname = \"sensors\"\n"
        ),
    )
    .unwrap();
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
    thread::sleep(Duration::from_millis(TTL_MS + INTERVAL_MS + 1_500) + late);
    let takeover = promoted_ids(&lines)
        .into_iter()
        .find(|(id, t)| *id != leader && *t > killed_at)
        .map(|(_, t)| t.duration_since(killed_at))
        .expect("a standby took over");
    assert!(
        takeover <= Duration::from_millis(TTL_MS + INTERVAL_MS + 100) + late,
        "took over after {takeover:?}, more than ttl + interval + {late:?}"
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
fn three_processes_run_each_slot_once_and_a_standby_takes_over_a_killed_leader() {
    let server = RedisServer::start().expect("redis-server");
    let section = format!(
        "[locker]\nkind = \"redis\"\nurl = \"{}\"\nrequest_timeout_ms = 300\n",
        server.url()
    );
    three_processes_elect_and_run_each_slot_once(&section, Duration::ZERO);
}

#[test]
fn three_processes_on_a_postgres_locker_run_each_slot_once_and_take_over_a_killed_leader() {
    let database = guard_testkit::postgres::PgDatabase::create()
        .expect("a database on the machine's PostgreSQL");
    let section = format!(
        "[locker]\nkind = \"postgres\"\nurl = \"{}\"\nrequest_timeout_ms = 300\n",
        database.url()
    );
    three_processes_elect_and_run_each_slot_once(&section, Duration::ZERO);
}

#[cfg(feature = "etcd")]
#[test]
fn three_processes_on_an_etcd_locker_run_each_slot_once_and_take_over_a_killed_leader() {
    let cluster = guard_testkit::etcd::EtcdCluster::start(3).expect("a 3-member etcd cluster");
    let urls: Vec<String> = cluster
        .endpoints()
        .iter()
        .map(|u| format!("{u:?}"))
        .collect();
    let section = format!(
        "[locker]\nkind = \"etcd\"\nurls = [{}]\nrequest_timeout_ms = 1000\n",
        urls.join(", ")
    );
    // etcd ends an expired lease on its lessor's next tick (every 500 ms).
    three_processes_elect_and_run_each_slot_once(&section, Duration::from_millis(600));
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
    guard_gateway::config::Config::from_path(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("gateway.toml"),
    )
    .expect("gateway.toml");
}

/// A GET of `path` on 127.0.0.1:`port`: the status line and the body.
fn http_get(port: u16, path: &str) -> (String, String) {
    guard_testkit::http::get(port, path).expect("metrics endpoint")
}

/// Whether the replica serving metrics on `port` answers `/readyz` 200
/// within [`SETTLE`].
fn ready(port: u16) -> bool {
    wait_for(SETTLE, || {
        TcpStream::connect(("127.0.0.1", port)).is_ok()
            && http_get(port, "/readyz").0.contains("200")
    })
}

/// `text` written as a configuration file in a directory of its own
/// (kept as long as the returned handle).
fn written(text: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.toml");
    std::fs::write(&path, text).unwrap();
    (dir, path)
}

fn run_command(args: &[&str], config: &std::path::Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_guard-gateway"))
        .args(args)
        .arg(config)
        .output()
        .unwrap()
}

#[test]
fn an_empty_configuration_is_refused_and_check_validates_without_connecting() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.toml");
    std::fs::write(&empty, "").unwrap();
    let output = run_command(&["run", "--config"], &empty);
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("the configuration does nothing"),
        "{stderr}"
    );

    // The shipped example names a Redis and a broker nobody runs here:
    // `check` still validates it, connecting to nothing.
    let example = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("gateway.toml");
    let output = run_command(&["check", "--config"], &example);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "{stdout}");
    assert!(stdout.starts_with("configuration is valid"), "{stdout}");
    assert!(
        stdout.contains(
            "telemetry (mqtt, shared subscription gateways, limited by uplink, to uplink)"
        ),
        "{stdout}"
    );
    assert!(
        stdout.contains("sinks      uplink (http POST to 127.0.0.1:8080, application/json"),
        "{stdout}"
    );
    assert!(
        !stdout.contains("redis://") && !stdout.contains("http://"),
        "no URLs (secrets) printed: {stdout}"
    );
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "[[schedules]]\nrouter = \"r\"\nevery_ms = -1\n").unwrap();
    let output = run_command(&["check", "--config"], &bad);
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("`schedules[0].every_ms` = -1"), "{stderr}");
}

/// The shipped example file, with only the addresses of this test's
/// servers put in.
fn example_with(redis: u16, mqtt: u16, metrics: u16, uplink: u16) -> String {
    let text = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("gateway.toml"),
    )
    .unwrap();
    let replaced = text
        .replace("127.0.0.1:6379", &format!("127.0.0.1:{redis}"))
        .replace("port = 1883", &format!("port = {mqtt}"))
        .replace("127.0.0.1:9000", &format!("127.0.0.1:{metrics}"))
        .replace("127.0.0.1:8080", &format!("127.0.0.1:{uplink}"));
    for original in [
        "127.0.0.1:6379",
        "port = 1883",
        "127.0.0.1:9000",
        "127.0.0.1:8080",
    ] {
        assert!(
            text.contains(original),
            "the example no longer has {original}"
        );
    }
    replaced
}

#[test]
fn the_shipped_example_starts_and_serves_each_of_its_endpoints() {
    let server = RedisServer::start().expect("redis-server");
    let broker = Mosquitto::start().expect("mosquitto");
    let uplink = guard_testkit::HttpReceiver::start().expect("receiver");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.toml");
    let metrics = free_port().unwrap();
    std::fs::write(
        &path,
        example_with(server.port(), broker.port(), metrics, uplink.port()),
    )
    .unwrap();
    let lines: Lines = Arc::default();
    let first = start(0, &path, &lines);
    // A second replica from the same file: its own name and metrics port.
    let second_metrics = free_port().unwrap();
    let second = {
        let child = Command::new(env!("CARGO_BIN_EXE_guard-gateway"))
            .args(["run", "--replica", "replica-1", "--metrics"])
            .arg(format!("127.0.0.1:{second_metrics}"))
            .arg("--config")
            .arg(&path)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("guard-gateway");
        collect(1, child, &lines)
    };
    for port in [metrics, second_metrics] {
        assert!(
            wait_for(SETTLE, || {
                TcpStream::connect(("127.0.0.1", port)).is_ok()
                    && http_get(port, "/readyz").0.contains("200")
            }),
            "replica on metrics port {port} never became ready: {:?}",
            lines.lock().unwrap()
        );
        assert!(http_get(port, "/healthz").0.contains("200"));
        assert!(http_get(port, "/nothing-here").0.contains("404"));
    }
    // Memory follows use: the example's in-memory `default` limiter,
    // which nothing in it uses, takes no table (its 65,536 keys took 69
    // MiB). What the process allocated, apart from its mapped binary:
    let allocated = status_kib(first.0.id(), "RssAnon");
    assert!(
        allocated < 16 * 1024,
        "the shipped example holds {allocated} KiB of anonymous memory"
    );
    let mut conn = redis::Client::open(server.url())
        .unwrap()
        .get_connection()
        .unwrap();
    // The Pub/Sub endpoint's elected subscriber is in place once a probe
    // reaches someone.
    assert!(
        wait_for(SETTLE, || {
            let _: i64 = redis::cmd("PUBLISH")
                .arg("alerts.fire")
                .arg("probe")
                .query(&mut conn)
                .unwrap();
            thread::sleep(Duration::from_millis(100));
            !received(&lines, "alerts").is_empty()
        }),
        "nobody subscribed to alerts.*"
    );
    thread::sleep(Duration::from_millis(500)); // both joined the MQTT share group
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
            .arg("customer")
            .arg("c7")
            .query(&mut conn)
            .unwrap();
    }
    let telemetry: Vec<Vec<u8>> = (0..5).map(|i| format!("t{i}").into_bytes()).collect();
    broker.publish("sensors/temp", &telemetry).unwrap();
    let all = wait_for(SETTLE, || {
        received(&lines, "alerts")
            .keys()
            .filter(|p| p.starts_with('a'))
            .count()
            == 5
            && received(&lines, "orders").len() == 5
            && received(&lines, "telemetry").len() == 5
    });
    let seen = lines.lock().unwrap().clone();
    assert!(all, "not every endpoint served its messages: {seen:?}");
    // A stream entry prints all its fields.
    assert!(
        seen.iter()
            .any(|(_, _, l)| l.starts_with("received endpoint=orders")
                && l.ends_with("customer=c7 payload=o0")),
        "{seen:?}"
    );
    // Each endpoint forwards to the uplink: every message it handled was
    // POSTed there first, each under a key of its own.
    let posted = uplink.requests();
    let bodies: std::collections::BTreeSet<String> = posted
        .iter()
        .map(|r| String::from_utf8_lossy(&r.body).into_owned())
        .collect();
    for prefix in ["a", "o", "t"] {
        for i in 0..5 {
            assert!(
                bodies.contains(&format!("{prefix}{i}")),
                "{prefix}{i} not forwarded: {bodies:?}"
            );
        }
    }
    let keys: std::collections::BTreeSet<&str> = posted
        .iter()
        .filter_map(|r| r.header("idempotency-key"))
        .collect();
    assert_eq!(keys.len(), posted.len(), "a key per message");
    assert!(
        posted
            .iter()
            .all(|r| r.path == "/ingest" && r.header("content-type") == Some("application/json"))
    );
    for (endpoint, by) in [
        ("orders", received(&lines, "orders")),
        ("telemetry", received(&lines, "telemetry")),
    ] {
        assert!(
            by.values().all(|ids| ids.len() == 1),
            "{endpoint} handled twice: {by:?}"
        );
    }
    // Every documented metric family is on /metrics; the telemetry
    // limiter counted its five admissions across the two replicas.
    let families = [
        "guard_rl_allowed_total",
        "guard_rl_denied_total",
        "guard_sink_dropped_total",
        "guard_once_total",
        "guard_active_transitions_total",
        "guard_active_leader",
        "guard_dlq_size",
        "guard_retry_attempts_total",
    ];
    let (_, first_text) = http_get(metrics, "/metrics");
    let (_, second_text) = http_get(second_metrics, "/metrics");
    for family in families {
        assert!(
            first_text.contains(family),
            "{family} missing from /metrics:\n{first_text}"
        );
    }
    let allowed: f64 = [&first_text, &second_text]
        .iter()
        .filter_map(|t| sample(t, "guard_rl_allowed_total{name=\"uplink\"}"))
        .sum();
    assert_eq!(allowed, 5.0, "{first_text}\n{second_text}");
    // A standby exports 0 for the lease it does not hold.
    let leaders: Vec<f64> = [&first_text, &second_text]
        .iter()
        .filter_map(|t| {
            t.lines()
                .find(|l| l.starts_with("guard_active_leader{") && l.contains("sensors"))
                .and_then(|l| l.rsplit(' ').next())
                .and_then(|v| v.parse().ok())
        })
        .collect();
    assert_eq!(
        leaders.iter().sum::<f64>(),
        1.0,
        "one leader, one standby at 0: {leaders:?}"
    );
    assert_eq!(
        leaders.len(),
        2,
        "both replicas export the gauge: {leaders:?}"
    );
    drop((first, second));
}

fn limited_config(redis: &str, metrics: u16, endpoint: &str) -> String {
    format!(
        r#"
[locker]
kind = "redis"
url = "{redis}"

[ratelimit]
enabled = true
[ratelimit.policies.slow]
algorithm = "token-bucket"
capacity = 5
rate_per_second = 10

[metrics]
prometheus = "127.0.0.1:{metrics}"

{endpoint}"#
    )
}

#[test]
fn a_rate_limited_stream_handles_at_the_limit_and_loses_nothing() {
    let server = RedisServer::start().expect("redis-server");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("limited.toml");
    let metrics = free_port().unwrap();
    std::fs::write(
        &path,
        limited_config(
            &server.url(),
            metrics,
            "[[endpoints]]\nname = \"orders\"\nkind = \"redis-stream\"\nstream = \"orders\"\ngroup = \"billing\"\nlimit = \"slow\"\nmax_wait_ms = 60000\n",
        ),
    )
    .unwrap();
    let lines: Lines = Arc::default();
    let _process = start(0, &path, &lines);
    assert!(wait_for(SETTLE, || {
        TcpStream::connect(("127.0.0.1", metrics)).is_ok()
            && http_get(metrics, "/readyz").0.contains("200")
    }));
    let mut conn = redis::Client::open(server.url())
        .unwrap()
        .get_connection()
        .unwrap();
    // 40 entries at once, far faster than 10 a second after a burst of 5.
    let started = Instant::now();
    for i in 0..40 {
        let _: String = redis::cmd("XADD")
            .arg("orders")
            .arg("*")
            .arg("payload")
            .arg(format!("o{i}"))
            .query(&mut conn)
            .unwrap();
    }
    assert!(
        wait_for(SETTLE, || received(&lines, "orders").len() == 40),
        "not all entries handled: {:?}",
        received(&lines, "orders").len()
    );
    let elapsed = started.elapsed();
    // (40 - 5) entries at 10 a second: at least 3.5 s.
    assert!(
        elapsed >= Duration::from_millis(3_300),
        "handled 40 in {elapsed:?}: the limit did not act"
    );
    assert!(
        elapsed <= Duration::from_millis(6_000),
        "handled 40 in {elapsed:?}: far slower than the limit"
    );
    let by = received(&lines, "orders");
    assert!(
        by.values().all(|ids| ids.len() == 1),
        "handled twice: {by:?}"
    );
    let (_, text) = http_get(metrics, "/metrics");
    assert_eq!(
        sample(&text, "guard_rl_allowed_total{name=\"slow\"}"),
        Some(40.0),
        "{text}"
    );
    let denied = sample(&text, "guard_rl_denied_total{name=\"slow\"}").unwrap_or(0.0);
    assert!(denied >= 1.0, "refusals are counted: {text}");
    let pending: Vec<redis::Value> = redis::cmd("XPENDING")
        .arg("orders")
        .arg("billing")
        .query(&mut conn)
        .unwrap();
    assert_eq!(
        pending.first(),
        Some(&redis::Value::Int(0)),
        "nothing left pending: {pending:?}"
    );
}

/// Two replicas share one quota of bytes on Redis: a fixed window aligned
/// to the epoch admits 100 bytes of payload between them, and what is
/// over it is dead-lettered with the reason, nothing lost.
#[test]
fn replicas_share_a_fixed_window_quota_of_bytes_and_dead_letter_the_rest() {
    const WEEK_S: u64 = 7 * 24 * 3_600;
    // Epoch weeks start on a Thursday at 00:00 UTC: keep clear of one.
    let into_week = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
        % WEEK_S;
    if into_week > WEEK_S - 120 {
        thread::sleep(Duration::from_secs(WEEK_S - into_week + 1));
    }
    let server = RedisServer::start().expect("redis-server");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("quota.toml");
    std::fs::write(
        &path,
        format!(
            r#"
[locker]
kind = "redis"
url = "{}"

[ratelimit]
enabled = true
[ratelimit.policies.uplink]
algorithm = "fixed-window"
backend = "redis"
window_ms = 604800000
limit = 100
cost = "bytes"

[[endpoints]]
name = "orders"
kind = "redis-stream"
stream = "orders"
group = "billing"
dead_letter_topic = "orders"
max_payload_bytes = 64
limit = "uplink"
when_limited = "dead-letter"
"#,
            server.url()
        ),
    )
    .unwrap();
    let lines: Lines = Arc::default();
    let _processes: Vec<Process> = (0..2).map(|id| start(id, &path, &lines)).collect();
    let mut conn = redis::Client::open(server.url())
        .unwrap()
        .get_connection()
        .unwrap();
    // Six entries of 30 bytes: three fit in 100.
    for i in 0..6 {
        let _: String = redis::cmd("XADD")
            .arg("orders")
            .arg("*")
            .arg("payload")
            .arg(format!("{i}{}", "x".repeat(29)))
            .query(&mut conn)
            .unwrap();
    }
    let dead_letters = |conn: &mut redis::Connection| -> Vec<(String, Vec<(String, String)>)> {
        redis::cmd("XRANGE")
            .arg("stream:topic:{orders}:dlq")
            .arg("-")
            .arg("+")
            .query(conn)
            .unwrap()
    };
    assert!(
        wait_for(SETTLE, || received(&lines, "orders").len() == 3
            && dead_letters(&mut conn).len() == 3),
        "{:?} {:?}",
        received(&lines, "orders"),
        dead_letters(&mut conn)
    );
    let letters = dead_letters(&mut conn);
    assert!(
        letters.iter().all(|(_, fields)| fields
            .iter()
            .any(|(k, v)| k == "error" && v.contains("rate limited"))),
        "{letters:?}"
    );
    let by = received(&lines, "orders");
    assert!(
        by.values().all(|ids| ids.len() == 1),
        "handled twice: {by:?}"
    );
    // The quota is shared: one more byte is refused whoever asks.
    let _: String = redis::cmd("XADD")
        .arg("orders")
        .arg("*")
        .arg("payload")
        .arg("y".repeat(11))
        .query(&mut conn)
        .unwrap();
    assert!(
        wait_for(SETTLE, || dead_letters(&mut conn).len() == 4),
        "{:?}",
        dead_letters(&mut conn)
    );
    assert_eq!(received(&lines, "orders").len(), 3);
}

#[test]
fn a_rate_limited_broadcast_dead_letters_what_it_refuses_and_loses_nothing() {
    let server = RedisServer::start().expect("redis-server");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("limited.toml");
    let metrics = free_port().unwrap();
    std::fs::write(
        &path,
        limited_config(
            &server.url(),
            metrics,
            "[[endpoints]]\nname = \"alerts\"\nkind = \"redis-pubsub\"\npatterns = [\"alerts.*\"]\nlimit = \"slow\"\nwhen_limited = \"dead-letter\"\n",
        ),
    )
    .unwrap();
    let lines: Lines = Arc::default();
    let _process = start(0, &path, &lines);
    let mut conn = pattern_subscribed(&server);
    for i in 0..20 {
        let _: i64 = redis::cmd("PUBLISH")
            .arg("alerts.fire")
            .arg(format!("a{i}"))
            .query(&mut conn)
            .unwrap();
    }
    let count = |prefix: &str| {
        lines
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, _, l)| l.starts_with(prefix))
            .count()
    };
    assert!(
        wait_for(SETTLE, || count("received endpoint=alerts")
            + count("dead-lettered endpoint=alerts")
            == 20),
        "{:?}",
        lines.lock().unwrap()
    );
    let (handled, refused) = (
        count("received endpoint=alerts"),
        count("dead-lettered endpoint=alerts"),
    );
    assert!(
        (5..=7).contains(&handled),
        "a burst of 5 (and what refilled meanwhile): {handled}"
    );
    let (_, text) = http_get(metrics, "/metrics");
    assert_eq!(
        sample(&text, "guard_dlq_size{topic=\"alerts\"}"),
        Some(refused as f64),
        "{text}"
    );
    assert_eq!(
        sample(&text, "guard_rl_denied_total{name=\"slow\"}"),
        Some(refused as f64),
        "{text}"
    );
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
        wait_for(SETTLE, || {
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
    let all = wait_for(SETTLE, || {
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
    /// NATS subject `alerts.fire` on a server's URL.
    Nats(String),
    /// RabbitMQ fanout exchange `alerts` on a broker's URL.
    Amqp(String),
    /// Rows inserted into `app.orders (item)` of a MariaDB on a port, read
    /// from its binlog.
    Binlog(u16),
}

/// A client process fed on its standard input: dropped, its input is
/// closed and it is waited for, so that what it was given is done.
struct Fed {
    stdin: Option<std::process::ChildStdin>,
    client: Child,
}

impl Drop for Fed {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let _ = self.client.wait();
    }
}

/// A NATS client of `url`, and a way to run its futures.
fn nats_client(url: &str) -> async_nats::Client {
    nats_block_on(async_nats::connect(url)).expect("nats connect")
}

fn nats_block_on<F: std::future::Future>(work: F) -> F::Output {
    futures_lite::future::block_on(async_compat::Compat::new(work))
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
            Source::Amqp(url) => {
                use lapin::options::{BasicPublishOptions, ExchangeDeclareOptions};
                use lapin::{BasicProperties, Connection, ConnectionProperties, ExchangeKind};
                let connection =
                    smol::block_on(Connection::connect(&url, ConnectionProperties::default()))
                        .expect("amqp connect");
                let channel = smol::block_on(connection.create_channel()).unwrap();
                // The endpoint declares it too; whoever is first creates it.
                smol::block_on(channel.exchange_declare(
                    "alerts".into(),
                    ExchangeKind::Fanout,
                    ExchangeDeclareOptions {
                        durable: true,
                        ..Default::default()
                    },
                    lapin::types::FieldTable::default(),
                ))
                .unwrap();
                Box::new(move |payload| {
                    let _keep = &connection;
                    smol::block_on(channel.basic_publish(
                        "alerts".into(),
                        "fire".into(),
                        BasicPublishOptions::default(),
                        payload.as_bytes(),
                        BasicProperties::default(),
                    ))
                    .unwrap();
                })
            }
            Source::Binlog(port) => {
                // One client for every insert, fed on its standard input.
                let mut client = Command::new("mariadb")
                    .args(["-h", "127.0.0.1", "-P", &port.to_string(), "-u", "root"])
                    .stdin(Stdio::piped())
                    .stdout(Stdio::null())
                    .spawn()
                    .expect("the mariadb client");
                let stdin = client.stdin.take().unwrap();
                let mut fed = Fed {
                    stdin: Some(stdin),
                    client,
                };
                Box::new(move |payload| {
                    let stdin = fed.stdin.as_mut().unwrap();
                    writeln!(stdin, "INSERT INTO app.orders (item) VALUES ('{payload}');").unwrap();
                    stdin.flush().unwrap();
                })
            }
            Source::Nats(url) => {
                let client = nats_client(&url);
                Box::new(move |payload| {
                    nats_block_on(async {
                        client.publish("alerts.fire", payload.into()).await.unwrap();
                        client.flush().await.unwrap();
                    });
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

#[test]
fn a_paused_nats_leader_does_not_handle_what_arrived_after_its_deadline() {
    let server = RedisServer::start().expect("redis-server");
    let nats = NatsServer::start().expect("nats-server");
    let endpoint = format!(
        "[[endpoints]]\nname = \"alerts\"\nkind = \"nats\"\nurl = \"{}\"\nsubject = \"alerts.*\"\nguard = true\n",
        nats.url()
    );
    a_paused_leader_acts_late_on_nothing(&endpoint, &Source::Nats(nats.url()), &server);
}

#[test]
fn a_paused_rabbitmq_leader_does_not_handle_what_arrived_after_its_deadline() {
    let server = RedisServer::start().expect("redis-server");
    let vhost = guard_testkit::rabbitmq::Vhost::create().expect("a RabbitMQ vhost");
    let endpoint = format!(
        "[[endpoints]]\nname = \"alerts\"\nkind = \"rabbitmq\"\nurl = \"{}\"\nexchange = \"alerts\"\nguard = true\n",
        vhost.url()
    );
    a_paused_leader_acts_late_on_nothing(&endpoint, &Source::Amqp(vhost.url()), &server);
}

/// How a test takes the elected endpoint's lease key away mid-lease.
#[derive(Clone, Copy, Debug)]
enum Loss {
    /// `DEL` of the lease key alone (an operator, an eviction).
    Del,
    /// `FLUSHALL`: the key, its grant record and the fence counter.
    FlushAll,
}

/// The PTTL of `key`, in ms (negative when it has none or is gone).
fn pttl(conn: &mut redis::Connection, key: &str) -> i64 {
    redis::cmd("PTTL").arg(key).query(conn).unwrap()
}

/// Two replicas share the elected endpoint `alerts`, which forwards to an
/// HTTP sink; messages arrive every 20 ms. The standby starts just after
/// one of the leader's renewals, so that its polls come just after them;
/// right after a later renewal the lease key is lost (`loss`), so the
/// standby's next poll comes before the leader's next renewal (the window
/// the lease's grant record and quarantine close); the sink answers 503
/// for a while after, so the leader is retrying when it learns of the
/// loss.
/// No request may reach the sink under the old fence after the first one
/// under the successor's, and no message is taken (2xx) twice; from a
/// source that keeps its messages (a binlog), every one is taken. (A
/// broadcast source's messages published while no replica leads reach
/// nobody.) A `FLUSHALL` takes the grant record too: the replicas run
/// with the leases' quarantine.
fn a_lost_lease_key_lets_no_effect_overlap(
    endpoint: &str,
    source: &Source,
    server: &RedisServer,
    loss: Loss,
) {
    const TTL_MS: u64 = 6_000;
    const INTERVAL_MS: u64 = 2_000;
    let receiver = guard_testkit::HttpReceiver::start().expect("receiver");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lost-lease.toml");
    std::fs::write(
        &path,
        format!(
            r#"
[locker]
kind = "redis"
url = "{}"
request_timeout_ms = 300
quarantine = {}

[guards]
owner = "it"
active_ttl_ms = {TTL_MS}
active_interval_ms = {INTERVAL_MS}

[[sinks]]
name = "uplink"
kind = "http"
url = "{}"
timeout_ms = 2000
retries = 1000
retry_delay_ms = 100
max_retry_delay_ms = 200

{endpoint}to = "uplink"
"#,
            server.url(),
            matches!(loss, Loss::FlushAll),
            receiver.url("/ingest")
        ),
    )
    .unwrap();
    let lines: Lines = Arc::default();
    let mut processes: Vec<Process> = vec![start(0, &path, &lines)];
    let fence_of = |r: &guard_testkit::Received| -> Option<u64> {
        r.header("guard-fence").and_then(|f| f.parse().ok())
    };
    let mut publish = source.publisher();
    let mut probe = 0;
    let old_fence = loop {
        assert!(
            probe < 200,
            "nothing forwarded: {:?}",
            lines.lock().unwrap()
        );
        publish(format!("probe{probe}"));
        probe += 1;
        thread::sleep(Duration::from_millis(100));
        if let Some(fence) = receiver.requests().iter().find_map(fence_of) {
            break fence;
        }
    };
    // Right after a renewal: the lease key's time to live jumps back up.
    let mut conn = redis::Client::open(server.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let key = endpoint_lease_key(server).expect("the endpoint's lease key");
    let mut renewed = || {
        let mut last = pttl(&mut conn, &key);
        let watching = Instant::now();
        loop {
            assert!(
                watching.elapsed() < Duration::from_secs(30),
                "no renewal seen"
            );
            let now = pttl(&mut conn, &key);
            if now > last + 500 {
                return;
            }
            last = now;
            thread::sleep(Duration::from_millis(2));
        }
    };
    renewed();
    thread::sleep(Duration::from_millis(100));
    processes.push(start(1, &path, &lines));
    // For 20 s: past the lost lease's end and the successor's start.
    let publisher = {
        let source = source.clone();
        thread::spawn(move || {
            let mut publish = source.publisher();
            let started = Instant::now();
            let mut sent = 0;
            while started.elapsed() < Duration::from_secs(20) {
                publish(format!("m{sent}"));
                sent += 1;
                thread::sleep(Duration::from_millis(20));
            }
            sent
        })
    };
    // The standby has started and polled (once at its start).
    renewed();
    renewed();
    receiver.script((0..30).map(|_| guard_testkit::Answer::status(503)));
    match loss {
        Loss::Del => {
            let deleted: i64 = redis::cmd("DEL").arg(&key).query(&mut conn).unwrap();
            assert_eq!(deleted, 1);
        }
        Loss::FlushAll => redis::cmd("FLUSHALL").query::<()>(&mut conn).unwrap(),
    }
    let sent = publisher.join().unwrap();
    let taken_all = |requests: &[guard_testkit::Received]| {
        let bodies: Vec<String> = requests
            .iter()
            .filter(|r| (200..300).contains(&r.status))
            .map(|r| String::from_utf8_lossy(&r.body).into_owned())
            .collect();
        (0..sent)
            .filter(|i| {
                let quoted = format!("\"m{i}\"");
                !bodies.iter().any(|b| b.contains(&quoted))
            })
            .collect::<Vec<_>>()
    };
    if matches!(source, Source::Binlog(_)) {
        let all = wait_for(SETTLE, || taken_all(&receiver.requests()).is_empty());
        assert!(
            all,
            "rows never taken ({loss:?}): {:?}",
            taken_all(&receiver.requests())
        );
    }
    thread::sleep(Duration::from_secs(2));
    let requests = receiver.stop();
    let first_new = requests
        .iter()
        .filter(|r| fence_of(r).is_some_and(|f| f > old_fence))
        .map(|r| r.at)
        .min()
        .unwrap_or_else(|| panic!("no request under a new fence after the loss ({loss:?})"));
    let stale: Vec<_> = requests
        .iter()
        .filter(|r| r.at > first_new && fence_of(r) == Some(old_fence))
        .map(|r| String::from_utf8_lossy(&r.body).into_owned())
        .collect();
    assert!(
        stale.is_empty(),
        "{} request(s) under the old fence {old_fence} after the successor's first ({loss:?}): {stale:?}",
        stale.len()
    );
    let mut taken: BTreeMap<Vec<u8>, usize> = BTreeMap::new();
    for r in requests.iter().filter(|r| (200..300).contains(&r.status)) {
        *taken.entry(r.body.clone()).or_default() += 1;
    }
    let twice: Vec<_> = taken.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "taken twice ({loss:?}): {twice:?}");
}

#[test]
fn a_pubsub_leader_whose_lease_key_is_deleted_makes_no_effect_beside_its_successor() {
    let server = RedisServer::start().expect("redis-server");
    let endpoint =
        "[[endpoints]]\nname = \"alerts\"\nkind = \"redis-pubsub\"\npatterns = [\"alerts.*\"]\n";
    a_lost_lease_key_lets_no_effect_overlap(
        endpoint,
        &Source::Redis(server.url()),
        &server,
        Loss::Del,
    );
}

#[test]
fn a_pubsub_leader_whose_locker_is_flushed_makes_no_effect_beside_its_successor() {
    let server = RedisServer::start().expect("redis-server");
    let endpoint =
        "[[endpoints]]\nname = \"alerts\"\nkind = \"redis-pubsub\"\npatterns = [\"alerts.*\"]\n";
    a_lost_lease_key_lets_no_effect_overlap(
        endpoint,
        &Source::Redis(server.url()),
        &server,
        Loss::FlushAll,
    );
}

/// A binlog with a table `app.orders (id, item)` on a MariaDB of its own,
/// and the endpoint that reads it.
fn orders_binlog() -> (guard_testkit::mariadb::MariaDb, String) {
    let mariadb = guard_testkit::mariadb::MariaDb::start().expect("mariadbd");
    mariadb
        .execute(
            "CREATE DATABASE app; \
             CREATE TABLE app.orders (id INT AUTO_INCREMENT PRIMARY KEY, item VARCHAR(16))",
        )
        .unwrap();
    let endpoint = format!(
        "[[endpoints]]\nname = \"alerts\"\nkind = \"mysql-binlog\"\nurl = \"{}\"\n",
        mariadb.url("app")
    );
    (mariadb, endpoint)
}

#[test]
fn a_binlog_leader_whose_locker_is_flushed_makes_no_effect_beside_its_successor() {
    let server = RedisServer::start().expect("redis-server");
    let (mariadb, endpoint) = orders_binlog();
    a_lost_lease_key_lets_no_effect_overlap(
        &endpoint,
        &Source::Binlog(mariadb.port()),
        &server,
        Loss::FlushAll,
    );
}

#[test]
fn a_binlog_leader_whose_lease_key_is_deleted_makes_no_effect_beside_its_successor() {
    let server = RedisServer::start().expect("redis-server");
    let (mariadb, endpoint) = orders_binlog();
    a_lost_lease_key_lets_no_effect_overlap(
        &endpoint,
        &Source::Binlog(mariadb.port()),
        &server,
        Loss::Del,
    );
}

#[test]
fn a_nats_leader_whose_lease_key_is_deleted_makes_no_effect_beside_its_successor() {
    let server = RedisServer::start().expect("redis-server");
    let nats = NatsServer::start().expect("nats-server");
    let endpoint = format!(
        "[[endpoints]]\nname = \"alerts\"\nkind = \"nats\"\nurl = \"{}\"\nsubject = \"alerts.*\"\nguard = true\n",
        nats.url()
    );
    a_lost_lease_key_lets_no_effect_overlap(
        &endpoint,
        &Source::Nats(nats.url()),
        &server,
        Loss::Del,
    );
}

#[test]
fn three_processes_share_a_nats_queue_group_and_a_jetstream_consumer_each_message_once() {
    let server = RedisServer::start().expect("redis-server");
    let nats = NatsServer::start().expect("nats-server");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nats.toml");
    let url = nats.url();
    std::fs::write(
        &path,
        base_config(&server.url())
            + &format!(
                r#"
[[endpoints]]
name = "orders"
kind = "nats"
url = "{url}"
subject = "orders.*"
queue_group = "billing"

[[endpoints]]
name = "jobs"
kind = "nats-jetstream"
url = "{url}"
stream = "JOBS"
subjects = ["jobs.>"]
durable = "gateways"
"#
            ),
    )
    .unwrap();
    let lines: Lines = Arc::default();
    let processes: Vec<Process> = (0..3).map(|id| start(id, &path, &lines)).collect();
    let client = nats_client(&url);
    let js = nats_block_on(async { async_nats::jetstream::new(client.clone()) });
    assert!(
        wait_for(SETTLE, || nats_block_on(js.get_stream("JOBS")).is_ok()),
        "no process created the stream"
    );
    // Every process subscribed to the queue group.
    thread::sleep(Duration::from_millis(1_000));
    nats_block_on(async {
        for i in 0..100 {
            client
                .publish("orders.created", format!("o{i}").into())
                .await
                .unwrap();
            js.publish("jobs.new", format!("j{i}").into())
                .await
                .unwrap()
                .await
                .unwrap();
        }
        client.flush().await.unwrap();
    });
    let counts = [("orders", 100), ("jobs", 100)];
    let all = wait_for(SETTLE, || {
        counts
            .iter()
            .all(|(endpoint, n)| received(&lines, endpoint).len() == *n)
    });
    thread::sleep(Duration::from_millis(300)); // late duplicates would show
    for (endpoint, n) in counts {
        let by = received(&lines, endpoint);
        assert!(all && by.len() == n, "{endpoint}: {} of {n}", by.len());
        let twice: Vec<_> = by.iter().filter(|(_, ids)| ids.len() > 1).collect();
        assert!(twice.is_empty(), "{endpoint}: handled twice: {twice:?}");
    }
    let took_part: std::collections::BTreeSet<usize> = received(&lines, "orders")
        .values()
        .flatten()
        .copied()
        .collect();
    assert_eq!(took_part.len(), 3, "orders: only {took_part:?} took part");
    drop(processes);
}

#[test]
fn three_processes_share_a_work_queue_a_table_of_work_and_a_binlog_each_item_once() {
    use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
    use lapin::{BasicProperties, Connection, ConnectionProperties};

    let server = RedisServer::start().expect("redis-server");
    let vhost = guard_testkit::rabbitmq::Vhost::create().expect("a RabbitMQ vhost");
    let database = guard_testkit::postgres::PgDatabase::create().expect("a PostgreSQL database");
    let mariadb = guard_testkit::mariadb::MariaDb::start().expect("mariadbd");
    mariadb
        .execute(
            "CREATE DATABASE app; CREATE TABLE app.orders (id INT PRIMARY KEY, item VARCHAR(16))",
        )
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sources.toml");
    std::fs::write(
        &path,
        base_config(&server.url())
            + &format!(
                r#"
[[endpoints]]
name = "orders"
kind = "rabbitmq"
url = "{}"
queue = "orders"

[[endpoints]]
name = "jobs"
kind = "postgres-queue"
url = "{}"
table = "jobs"

[[endpoints]]
name = "cdc"
kind = "mysql-binlog"
url = "{}"
"#,
                vhost.url(),
                database.url(),
                mariadb.url("app"),
            ),
    )
    .unwrap();
    let lines: Lines = Arc::default();
    let processes: Vec<Process> = (0..3).map(|id| start_logged(id, &path, &lines)).collect();
    // Each source is ready: the queue declared, the table created, the
    // binlog reader's checkpoint claimed.
    let amqp = smol::block_on(Connection::connect(
        &vhost.url(),
        ConnectionProperties::default(),
    ))
    .expect("amqp connect");
    let channel = smol::block_on(amqp.create_channel()).unwrap();
    smol::block_on(channel.confirm_select(ConfirmSelectOptions::default())).unwrap();
    let waiting = std::cell::Cell::new("");
    let set_up = wait_for(SETTLE, || {
        let ready = [
            (
                "the jobs table",
                database.query("SELECT count(*) FROM jobs").is_ok(),
            ),
            (
                "the binlog checkpoint",
                mariadb
                    .execute("SELECT fence FROM app.guard_binlog_checkpoints")
                    .is_ok_and(|out| !out.trim().is_empty()),
            ),
            (
                // A passive declare of a missing queue closes its channel
                // (404): each check asks on a channel of its own.
                "the orders queue",
                smol::block_on(async {
                    let probe = amqp.create_channel().await?;
                    probe
                        .queue_declare(
                            "orders".into(),
                            lapin::options::QueueDeclareOptions {
                                passive: true,
                                ..Default::default()
                            },
                            lapin::types::FieldTable::default(),
                        )
                        .await
                })
                .is_ok(),
            ),
        ];
        let missing = ready
            .iter()
            .find(|(_, ok)| !ok)
            .map_or("", |(what, _)| *what);
        waiting.set(missing);
        missing.is_empty()
    });
    assert!(
        set_up,
        "a source was not set up ({} missing): {:?}",
        waiting.get(),
        lines.lock().unwrap()
    );
    thread::sleep(Duration::from_millis(500));
    smol::block_on(async {
        for i in 0..50 {
            channel
                .basic_publish(
                    "".into(),
                    "orders".into(),
                    BasicPublishOptions::default(),
                    format!("o{i}").as_bytes(),
                    BasicProperties::default(),
                )
                .await
                .unwrap();
        }
        channel.wait_for_confirms().await.unwrap();
    });
    database
        .query("INSERT INTO jobs (payload) SELECT convert_to('j' || g, 'UTF8') FROM generate_series(0, 49) g")
        .unwrap();
    let inserts: String = (0..50)
        .map(|i| format!("INSERT INTO app.orders VALUES ({i}, 'c{i}');"))
        .collect();
    mariadb.execute(&inserts).unwrap();

    // A binlog change prints its row as the `after` field.
    let changes = |lines: &Lines| -> BTreeMap<String, Vec<usize>> {
        let mut by: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        for (id, _, line) in lines.lock().unwrap().iter() {
            if line.starts_with("received endpoint=cdc ")
                && let Some(after) = line.split(" after=").nth(1)
            {
                by.entry(after.to_owned()).or_default().push(*id);
            }
        }
        by
    };
    let all = wait_for(SETTLE, || {
        received(&lines, "orders").len() == 50
            && received(&lines, "jobs").len() == 50
            && changes(&lines).len() == 50
    });
    thread::sleep(Duration::from_millis(300)); // late duplicates would show
    for (endpoint, by) in [
        ("orders", received(&lines, "orders")),
        ("jobs", received(&lines, "jobs")),
        ("cdc", changes(&lines)),
    ] {
        assert!(
            all && by.len() == 50,
            "{endpoint}: {} of 50: {by:?}",
            by.len()
        );
        let twice: Vec<_> = by.iter().filter(|(_, ids)| ids.len() > 1).collect();
        assert!(twice.is_empty(), "{endpoint}: handled twice: {twice:?}");
    }
    // One elected reader hands the binlog over.
    let readers: std::collections::BTreeSet<usize> =
        changes(&lines).values().flatten().copied().collect();
    assert_eq!(readers.len(), 1, "cdc: read by {readers:?}");
    drop(processes);
}

#[test]
fn a_stop_while_connecting_to_a_silent_redis_ends_the_replica_at_once() {
    // Accepts connections and never answers.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("silent.toml");
    std::fs::write(
        &path,
        format!(
            "[locker]\nkind = \"redis\"\nurl = \"redis://127.0.0.1:{port}/\"\nrequest_timeout_ms = 60000\n\n[[schedules]]\nrouter = \"r\"\nevery_ms = 1000\n"
        ),
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_guard-gateway"))
        .args(["run", "--config"])
        .arg(&path)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    thread::sleep(Duration::from_millis(1_000));
    let asked = Instant::now();
    let sent = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if asked.elapsed() > Duration::from_secs(5) {
            let _ = child.kill();
            panic!("still connecting 5 s after SIGINT");
        }
        thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(status.code(), Some(0));
    drop(silent);
}

/// Open descriptors of process `pid`.
fn open_descriptors(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

#[test]
fn a_flood_of_idle_metrics_connections_takes_nothing_the_locker_needs() {
    let mut server = RedisServer::start().expect("redis-server");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("flood.toml");
    let metrics = free_port().unwrap();
    std::fs::write(
        &path,
        format!(
            "[locker]\nkind = \"redis\"\nurl = \"{}\"\nrequest_timeout_ms = 300\n\n[[schedules]]\nrouter = \"tick\"\nevery_ms = 500\n\n[metrics]\nprometheus = \"127.0.0.1:{metrics}\"\n",
            server.url()
        ),
    )
    .unwrap();
    let log_path = dir.path().join("stderr.log");
    let log = std::fs::File::create(&log_path).unwrap();
    // A small descriptor limit, as on an edge gateway: without a cap the
    // flood below would take every one of them.
    let child = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ulimit -n 160 && exec {} run --config {}",
            env!("CARGO_BIN_EXE_guard-gateway"),
            path.display()
        ))
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .unwrap();
    let pid = child.id();
    let lines: Lines = Arc::default();
    let _process = collect(0, child, &lines);
    assert!(wait_for(SETTLE, || {
        TcpStream::connect(("127.0.0.1", metrics)).is_ok()
    }));
    let before = open_descriptors(pid);
    // 260 clients that start a request and never finish its head (those
    // past the listen backlog give up after 200 ms).
    let address: std::net::SocketAddr = ([127, 0, 0, 1], metrics).into();
    let flood: Vec<TcpStream> = (0..260)
        .filter_map(|_| {
            let mut s = TcpStream::connect_timeout(&address, Duration::from_millis(200)).ok()?;
            s.write_all(b"GET /metrics HTTP/1.1\r\n").ok()?;
            Some(s)
        })
        .collect();
    // More than the descriptors the replica has left, were they all taken.
    assert!(
        flood.len() >= 180,
        "the flood could not connect: {}",
        flood.len()
    );
    thread::sleep(Duration::from_millis(500));
    let during = open_descriptors(pid);
    assert!(
        during <= before + 70,
        "{during} descriptors open during the flood ({before} before): the cap did not hold"
    );
    // Redis restarts during the flood: the locker must reconnect, so the
    // schedule goes on running its slots.
    server.restart().expect("restart");
    let executed = |lines: &Lines| {
        lines
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, _, l)| l.starts_with("executed router=tick"))
            .count()
    };
    let after_restart = executed(&lines);
    assert!(
        wait_for(SETTLE, || executed(&lines) >= after_restart + 4),
        "no slot ran after the Redis restart: {:?}",
        lines.lock().unwrap()
    );
    // Once the flood is gone, scrapes are answered at once.
    drop(flood);
    assert!(
        wait_for(Duration::from_secs(10), || {
            std::panic::catch_unwind(|| http_get(metrics, "/metrics").0.contains("200"))
                .unwrap_or(false)
        }),
        "no scrape answered after the flood"
    );
    let logged = std::fs::metadata(&log_path).unwrap().len();
    assert!(logged < 64 * 1024, "{logged} bytes of log during the flood");
}

/// A liveness probe is answered at once however many clients hold
/// connections open without finishing a request: 1,000 of them, half
/// silent and half sending their head a byte at a time.
#[test]
fn a_thousand_idle_or_slow_metrics_connections_never_keep_a_probe_waiting() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idle.toml");
    let metrics = free_port().unwrap();
    std::fs::write(
        &path,
        format!(
            "[locker]\nkind = \"local\"\n\n[[schedules]]\nrouter = \"tick\"\nevery_ms = 1000\n\n[metrics]\nprometheus = \"127.0.0.1:{metrics}\"\n"
        ),
    )
    .unwrap();
    let lines: Lines = Arc::default();
    let _process = start(0, &path, &lines);
    assert!(ready(metrics), "the replica never became ready");
    let address: std::net::SocketAddr = ([127, 0, 0, 1], metrics).into();
    let mut held: Vec<TcpStream> = (0..1_000)
        .filter_map(|i| {
            let mut s = TcpStream::connect_timeout(&address, Duration::from_secs(1)).ok()?;
            if i % 2 == 1 {
                s.write_all(b"G").ok()?;
            }
            Some(s)
        })
        .collect();
    assert!(held.len() >= 900, "only {} connected", held.len());
    let mut slowest = Duration::ZERO;
    for round in 0..20 {
        // The slow half sends one more byte of its head each round.
        for s in held.iter_mut().skip(1).step_by(2) {
            let _ = s.write_all(&b"ET /metrics HTTP/1.1\r\n"[round..=round]);
        }
        let path = if round % 2 == 0 {
            "/healthz"
        } else {
            "/metrics"
        };
        let asked = Instant::now();
        let (status, _) = http_get(metrics, path);
        slowest = slowest.max(asked.elapsed());
        assert!(status.contains("200"), "{path}: {status}");
    }
    assert!(
        slowest < Duration::from_millis(100),
        "a probe waited {slowest:?} behind idle connections"
    );
    drop(held);
}

#[test]
fn a_backend_outage_is_logged_once_per_interval_and_each_skipped_slot_printed() {
    let mut server = RedisServer::start().expect("redis-server");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("outage.toml");
    std::fs::write(
        &path,
        format!(
            "[locker]\nkind = \"redis\"\nurl = \"{}\"\nrequest_timeout_ms = 100\n\n[guards]\nactive_ttl_ms = 600\nactive_interval_ms = 100\n\n[[schedules]]\nrouter = \"tick\"\nevery_ms = 100\n\n[[active]]\nname = \"sensors\"\n",
            server.url()
        ),
    )
    .unwrap();
    let log_path = dir.path().join("stderr.log");
    let child = Command::new(env!("CARGO_BIN_EXE_guard-gateway"))
        .args(["run", "--config"])
        .arg(&path)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log_path).unwrap())
        .spawn()
        .unwrap();
    let lines: Lines = Arc::default();
    let _process = collect(0, child, &lines);
    thread::sleep(Duration::from_millis(1_000));
    // Four seconds without Redis: some 40 slots and 40 lease attempts fail.
    server.stop();
    thread::sleep(Duration::from_millis(4_000));
    // Each slot skipped is a line on stdout, as a refused run is.
    let skipped = lines
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, _, l)| {
            l.starts_with("skipped router=tick slot=") && l.contains("reason=backend_error")
        })
        .count();
    assert!(
        skipped >= 10,
        "{skipped} slots printed as skipped in 4 s of outage: {:?}",
        lines.lock().unwrap()
    );
    let log = std::fs::read_to_string(&log_path).unwrap();
    let count = |what: &str| log.lines().filter(|l| l.contains(what)).count();
    assert!(
        count("backend error, skip action") >= 1,
        "the outage is logged:\n{log}"
    );
    assert!(
        count("backend error, skip action") <= 2,
        "one line per slot instead of one per interval:\n{log}"
    );
    assert!(count("try lock") <= 2, "one line per attempt:\n{log}");
    assert!(log.contains("more not logged"), "{log}");
}

#[test]
fn oversized_messages_and_entries_without_their_fields_are_dead_lettered_with_the_reason() {
    let server = RedisServer::start().expect("redis-server");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bounds.toml");
    std::fs::write(
        &path,
        format!(
            "[locker]\nkind = \"redis\"\nurl = \"{}\"\n\n[[endpoints]]\nname = \"orders\"\nkind = \"redis-stream\"\nstream = \"orders\"\ngroup = \"billing\"\ndead_letter_topic = \"orders\"\nmax_payload_bytes = 64\n\n[[endpoints]]\nname = \"alerts\"\nkind = \"redis-pubsub\"\npatterns = [\"alerts.*\"]\nmax_payload_bytes = 16\n",
            server.url()
        ),
    )
    .unwrap();
    let lines: Lines = Arc::default();
    let _process = start(0, &path, &lines);
    let mut conn = pattern_subscribed(&server);
    let xadd = |conn: &mut redis::Connection, field: &str, value: String| -> String {
        redis::cmd("XADD")
            .arg("orders")
            .arg("*")
            .arg(field)
            .arg(value)
            .query(conn)
            .unwrap()
    };
    let fine = xadd(&mut conn, "payload", "small".into());
    let big = xadd(&mut conn, "payload", "x".repeat(100));
    let fieldless = xadd(&mut conn, "body", "no payload field".into());
    for payload in ["short", &"y".repeat(32)] {
        let _: i64 = redis::cmd("PUBLISH")
            .arg("alerts.fire")
            .arg(payload)
            .query(&mut conn)
            .unwrap();
    }
    let dlq = "stream:topic:{orders}:dlq";
    let dead_letters = |conn: &mut redis::Connection| -> Vec<(String, Vec<(String, String)>)> {
        redis::cmd("XRANGE")
            .arg(dlq)
            .arg("-")
            .arg("+")
            .query(conn)
            .unwrap()
    };
    assert!(
        wait_for(SETTLE, || dead_letters(&mut conn).len() == 2
            && lines.lock().unwrap().iter().any(
                |(_, _, l)| l.starts_with("dead-lettered endpoint=alerts")
            )),
        "{:?} {:?}",
        dead_letters(&mut conn),
        lines.lock().unwrap()
    );
    let seen = lines.lock().unwrap().clone();
    let received: Vec<&str> = seen
        .iter()
        .filter(|(_, _, l)| l.starts_with("received"))
        .map(|(_, _, l)| l.as_str())
        .collect();
    assert!(received.iter().any(|l| l.contains(&fine)), "{received:?}");
    assert!(
        received.iter().any(|l| l.ends_with("payload=short")),
        "{received:?}"
    );
    assert!(
        !received
            .iter()
            .any(|l| l.contains(&big) || l.contains(&fieldless)),
        "{received:?}"
    );
    let letters = dead_letters(&mut conn);
    let reasons: Vec<String> = letters
        .iter()
        .map(|(_, fields)| {
            fields
                .iter()
                .find(|(k, _)| k == "error")
                .map(|(_, v)| v.clone())
                .unwrap_or_default()
        })
        .collect();
    assert!(
        reasons
            .iter()
            .any(|r| r.contains("payload of 100 bytes over max_payload_bytes = 64")),
        "{reasons:?}"
    );
    assert!(
        reasons
            .iter()
            .any(|r| r.contains("without the field(s) [\"payload\"]")),
        "{reasons:?}"
    );
    // Dead-lettered at once: no retries for what can never pass.
    assert!(
        letters
            .iter()
            .all(|(_, f)| f.iter().any(|(k, v)| k == "attempts" && v == "1")),
        "{letters:?}"
    );
    assert!(
        seen.iter()
            .any(|(_, _, l)| l.starts_with("dead-lettered endpoint=alerts")
                && l.contains("payload of 32 bytes over max_payload_bytes = 16")),
        "{seen:?}"
    );
}

/// A connection to `server` once one pattern subscription is in place
/// there (an elected Pub/Sub endpoint has subscribed).
fn pattern_subscribed(server: &RedisServer) -> redis::Connection {
    let mut conn = redis::Client::open(server.url())
        .unwrap()
        .get_connection()
        .unwrap();
    assert!(
        wait_for(SETTLE, || {
            redis::cmd("PUBSUB")
                .arg("NUMPAT")
                .query::<i64>(&mut conn)
                .unwrap()
                == 1
        }),
        "no pattern subscriber"
    );
    conn
}

/// One replica whose `alerts` endpoint is an elected Pub/Sub subscriber
/// (plus what `extra` configures), subscribed, with its metrics port.
struct AlertsReplica {
    process: Process,
    lines: Lines,
    metrics: u16,
    /// A connection to the replica's Redis, for publishing.
    conn: redis::Connection,
    _server: RedisServer,
    _dir: tempfile::TempDir,
}

impl AlertsReplica {
    fn start(extra: &str, endpoint: &str) -> Self {
        let server = RedisServer::start().expect("redis-server");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("alerts.toml");
        let metrics = free_port().unwrap();
        std::fs::write(
            &path,
            format!(
                "{}\n[metrics]\nprometheus = \"127.0.0.1:{metrics}\"\n{extra}\n[[endpoints]]\nname = \"alerts\"\nkind = \"redis-pubsub\"\npatterns = [\"alerts.*\"]\n{endpoint}",
                base_config(&server.url())
            ),
        )
        .unwrap();
        let lines: Lines = Arc::default();
        let process = start(0, &path, &lines);
        let conn = pattern_subscribed(&server);
        AlertsReplica {
            process,
            lines,
            metrics,
            conn,
            _server: server,
            _dir: dir,
        }
    }

    /// Messages the endpoint has handled.
    fn handled(&self) -> u64 {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, _, l)| l.starts_with("received endpoint=alerts"))
            .count() as u64
    }

    /// The sum of the samples of metric `name` (Pub/Sub endpoint series
    /// only) whose labels contain `label`.
    fn metric(&self, name: &str, label: &str) -> f64 {
        let (_, text) = http_get(self.metrics, "/metrics");
        text.lines()
            .filter(|l| l.starts_with(name) && l.contains("endpoint/redis") && l.contains(label))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    /// Messages the endpoint counted as dropped.
    fn dropped(&self) -> u64 {
        self.metric("guard_endpoint_dropped_total", "") as u64
    }

    /// Waits until each of `published` messages was handled or counted
    /// as dropped.
    fn accounts_for(&self, published: u64) {
        assert!(
            wait_for(Duration::from_secs(60), || self.handled() + self.dropped()
                == published),
            "published {published}, handled {}, dropped {}",
            self.handled(),
            self.dropped()
        );
    }
}

#[test]
fn a_pubsub_flood_neither_demotes_the_leader_nor_loses_a_message_silently() {
    // The observation: 500,000 messages published to an elected Pub/Sub
    // endpoint as fast as Redis takes them made the leader's renewal time
    // out; it demoted, and about 146,000 messages went unhandled, uncounted.
    let mut replica = AlertsReplica::start("", "");
    // Half a million messages is about Redis's default limit for a
    // subscriber's output buffer (32 MiB): a loaded machine must not turn
    // this into a test of the server's disconnect (counted in
    // guard_endpoint_disconnects_total; what it discards cannot be).
    let () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("client-output-buffer-limit")
        .arg("pubsub 512mb 512mb 0")
        .query(&mut replica.conn)
        .unwrap();
    let mut published = 0_u64;
    for round in 0..500 {
        let mut pipe = redis::pipe();
        for i in 0..1000 {
            pipe.cmd("PUBLISH")
                .arg("alerts.fire")
                .arg(format!("m{round}-{i}"));
        }
        let receivers: Vec<i64> = pipe.query(&mut replica.conn).unwrap();
        assert!(
            receivers.iter().all(|&r| r == 1),
            "the subscription lapsed in round {round}"
        );
        published += receivers.len() as u64;
    }
    replica.accounts_for(published);
    let demoted = replica.metric("guard_active_transitions_total", "transition=\"demoted\"");
    assert_eq!(demoted, 0.0);
    assert_eq!(replica.metric("guard_active_leader", ""), 1.0);
    assert_eq!(replica.metric("guard_endpoint_disconnects_total", ""), 0.0);
    eprintln!(
        "published {published}, handled {}, dropped {}",
        replica.handled(),
        replica.dropped()
    );
}

/// The resident memory of process `pid`, in KiB.
fn resident_kib(pid: u32) -> u64 {
    status_kib(pid, "VmRSS")
}

/// A `/proc/<pid>/status` figure in KiB (`VmRSS`, `RssAnon`).
fn status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("{field} of process {pid}"))
}

#[test]
fn channels_of_a_quarter_mebibyte_never_grow_the_gateway_past_its_bounds_in_bytes() {
    // The probe: 1,000 Pub/Sub channels of 256 KiB on an endpoint limited
    // per channel took the gateway from 28 to 288 MB. A channel over the
    // key rule is limited under the endpoint's key; the handler queue and
    // the dead letters in memory hold 16 MiB each at most; the limiter's
    // table is sized in bytes. Every message is handled, dead-lettered or
    // counted as dropped.
    let mut replica = AlertsReplica::start(
        "\n[ratelimit]\nenabled = true\nmemory_bytes = 16777216\n[ratelimit.policies.per-channel]\nalgorithm = \"token-bucket\"\nbackend = \"memory\"\ncapacity = 5\nrate_per_second = 100\n",
        "limit = \"per-channel\"\nlimit_key = \"topic\"\nwhen_limited = \"dead-letter\"\n",
    );
    let pid = replica.process.0.id();
    let metrics = replica.metrics;
    // Handled, kept as dead letters, dropped: where each message ended.
    let ended = |replica: &AlertsReplica| {
        let (_, text) = http_get(metrics, "/metrics");
        let dead = sample(&text, "guard_dlq_size{topic=\"alerts\"}").unwrap_or(0.0);
        let dropped = sample(&text, "guard_sink_dropped_total{name=\"alerts\"}").unwrap_or(0.0);
        (replica.handled(), dead as u64, dropped as u64, text)
    };
    let settled = |replica: &AlertsReplica, published: u64, slack: u64| {
        wait_for(Duration::from_secs(60), || {
            let (handled, dead, dropped, _) = ended(replica);
            handled + dead + dropped + slack >= published
        })
    };
    for i in 0..20 {
        let _: i64 = redis::cmd("PUBLISH")
            .arg(format!("alerts.{i}"))
            .arg("x")
            .query(&mut replica.conn)
            .unwrap();
    }
    assert!(settled(&replica, 20, 0), "{:?}", ended(&replica));
    let before = resident_kib(pid);
    let channel = |i: u64| format!("alerts.{i:04}.{}", "c".repeat(256 * 1024));
    let mut published = 20;
    for chunk in 0..20 {
        let mut pipe = redis::pipe();
        for i in chunk * 50..(chunk + 1) * 50 {
            pipe.cmd("PUBLISH").arg(channel(i)).arg("x").ignore();
        }
        pipe.query::<()>(&mut replica.conn).unwrap();
        published += 50;
        // Never more than a chunk ahead: Redis closes a subscriber that
        // falls 32 MB behind, which is not what this measures.
        assert!(settled(&replica, published, 50), "{:?}", ended(&replica));
    }
    assert!(settled(&replica, published, 0), "{:?}", ended(&replica));
    let (handled, dead, dropped, text) = ended(&replica);
    let peak = status_kib(pid, "VmHWM");
    eprintln!(
        "RSS {before} KiB before, peak {peak} KiB; handled {handled}, dead letters {dead}, dropped {dropped}"
    );
    assert_eq!(handled + dead + dropped, published);
    assert!(
        handled < 1020 && dead > 0,
        "the long channels share the endpoint's key: handled {handled}, dead letters {dead}"
    );
    let dlq_bytes = sample(&text, "guard_dlq_bytes{topic=\"alerts\"}").expect("guard_dlq_bytes");
    assert!(dlq_bytes <= 16.0 * 1024.0 * 1024.0, "{dlq_bytes}");
    let table =
        sample(&text, "guard_rl_max_bytes{name=\"per-channel\"}").expect("guard_rl_max_bytes");
    assert!(table <= 16.0 * 1024.0 * 1024.0, "{table}");
    // 256 MB of channel names passed through; the queue and the dead
    // letters keep 32 MiB of them at most.
    assert!(
        peak < before + 96 * 1024,
        "RSS from {before} KiB to a peak of {peak} KiB"
    );
}

#[test]
fn a_flood_of_distinct_limiter_keys_stays_within_the_table() {
    // 100,000 messages on distinct 200-byte channels, limited per channel:
    // 20 MB of keys if the table kept them all. It holds at most its
    // bound, shown on /metrics, and the process does not grow with them.
    let mut replica = AlertsReplica::start(
        "\n[ratelimit]\nenabled = true\nmemory_keys = 1024\n[ratelimit.policies.per-channel]\nalgorithm = \"token-bucket\"\nbackend = \"memory\"\ncapacity = 5\nrate_per_second = 500\n",
        "limit = \"per-channel\"\nlimit_key = \"topic\"\nmax_wait_ms = 1000\n",
    );
    let pid = replica.process.0.id();
    let padding = "k".repeat(200);
    let table = |metrics: u16| {
        let (_, text) = http_get(metrics, "/metrics");
        (
            sample(&text, "guard_rl_keys{name=\"per-channel\"}"),
            sample(&text, "guard_rl_keys_capacity{name=\"per-channel\"}"),
        )
    };
    // Publishes `count` messages on distinct channels from `from`, calling
    // `during` after each thousand, and waits until each was handled or
    // counted as dropped.
    let mut published = 0_u64;
    let mut flood =
        |replica: &mut AlertsReplica, from: u64, count: u64, during: &mut dyn FnMut()| {
            for chunk in (from..from + count).step_by(1000) {
                let mut pipe = redis::pipe();
                for i in chunk..chunk + 1000 {
                    pipe.cmd("PUBLISH")
                        .arg(format!("alerts.{padding}-{i}"))
                        .arg("x")
                        .ignore();
                }
                pipe.query::<()>(&mut replica.conn).unwrap();
                published += 1000;
                during();
            }
            replica.accounts_for(published);
        };
    // Warm up: the table fills to its bound.
    flood(&mut replica, 0, 5_000, &mut || {});
    let before = resident_kib(pid);
    let mut largest = 0.0_f64;
    let mut capacity = None;
    let metrics = replica.metrics;
    flood(&mut replica, 5_000, 100_000, &mut || {
        let (held, cap) = table(metrics);
        largest = largest.max(held.expect("guard_rl_keys"));
        capacity = cap;
    });
    // The gauge is refreshed once a second: read it a while longer, so
    // that a refresh after the flood is seen too (keys are replaced, never
    // removed, so the table stays as full as the flood left it).
    let settled = std::time::Instant::now();
    while settled.elapsed() < Duration::from_millis(2_500) {
        let (held, cap) = table(metrics);
        largest = largest.max(held.expect("guard_rl_keys"));
        capacity = cap;
        thread::sleep(Duration::from_millis(200));
    }
    let after = resident_kib(pid);
    let capacity = capacity.expect("guard_rl_keys_capacity");
    eprintln!(
        "keys: at most {largest} held of {capacity}; RSS {before} KiB -> {after} KiB; handled {}, dropped {}",
        replica.handled(),
        replica.dropped()
    );
    assert!(
        (1024.0..2048.0).contains(&capacity),
        "memory_keys = 1024, rounded up to whole shards: {capacity}"
    );
    assert!(largest <= capacity, "{largest} keys held of {capacity}");
    assert!(
        largest >= 1024.0,
        "100,000 distinct keys fill the table: {largest}"
    );
    // 100,000 keys of over 200 bytes each would be 20 MB more.
    assert!(
        after < before + 8 * 1024,
        "RSS grew from {before} KiB to {after} KiB"
    );
}

/// The lease key of the elected endpoint's lease in `server` (the key
/// that expires, as opposed to the fence counter).
fn endpoint_lease_key(server: &RedisServer) -> Option<String> {
    let mut conn = redis::Client::open(server.url())
        .and_then(|c| c.get_connection())
        .unwrap();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*endpoint*")
        .query(&mut conn)
        .unwrap();
    // The lock itself, not its grant record (`grant:{...}`), which keeps
    // the deadline of the last grant beside it.
    keys.into_iter().find(|key| {
        let ttl: i64 = redis::cmd("PTTL").arg(key).query(&mut conn).unwrap();
        ttl > 0 && !key.contains("grant:{")
    })
}

#[test]
fn a_rate_limited_elected_leader_makes_no_effect_after_its_lease_is_gone() {
    const TTL_MS: u64 = 3_000;
    let server = RedisServer::start().expect("redis-server");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("limited-elected.toml");
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

[ratelimit]
enabled = true
[ratelimit.policies.slow]
algorithm = "sliding"
window_ms = 4000
limit = 1

[[endpoints]]
name = "alerts"
kind = "redis-pubsub"
patterns = ["alerts.*"]
limit = "slow"
when_limited = "wait"
max_wait_ms = 20000
"#,
            server.url()
        ),
    )
    .unwrap();
    let lines: Lines = Arc::default();
    let _processes: Vec<Process> = (0..2).map(|id| start(id, &path, &lines)).collect();
    let mut conn = pattern_subscribed(&server);
    for i in 0..5 {
        let _: i64 = redis::cmd("PUBLISH")
            .arg("alerts.fire")
            .arg(format!("m{i}"))
            .query(&mut conn)
            .unwrap();
    }
    // The first passes the limiter; the next waits in it, in the handler.
    assert!(
        wait_for(SETTLE, || !received_with_fences(&lines, "alerts")
            .is_empty()),
        "{:?}",
        lines.lock().unwrap()
    );
    let (leader, old_fence, _) = received_with_fences(&lines, "alerts")[0].clone();
    // The lease is taken from the leader while a message waits in its
    // limiter.
    let key = endpoint_lease_key(&server).expect("the endpoint's lease key");
    let _: i64 = redis::cmd("DEL").arg(&key).query(&mut conn).unwrap();
    let taken_at = Instant::now();
    // The lease's grant record keeps it from everyone until the lost
    // lease's end; then either replica may lead, the old leader too, but
    // under a new fence. The new leader subscribes; what it receives, it
    // handles.
    let new_leader_first = loop {
        assert!(
            taken_at.elapsed() < Duration::from_secs(15),
            "no new leader: {:?}",
            lines.lock().unwrap()
        );
        let _: i64 = redis::cmd("PUBLISH")
            .arg("alerts.fire")
            .arg(format!("after-{}", taken_at.elapsed().as_millis()))
            .query(&mut conn)
            .unwrap();
        thread::sleep(Duration::from_millis(500));
        let found = lines.lock().unwrap().iter().find_map(|(_, t, l)| {
            (l.starts_with("received endpoint=alerts")
                && !l.contains(&format!(" fence={old_fence} ")))
            .then_some(*t)
        });
        if let Some(at) = found {
            break at;
        }
    };
    // The old leader's limiter admits its waiting messages within the
    // 4 s window and its 20 s wait.
    thread::sleep(Duration::from_secs(9));
    let stale: Vec<String> = lines
        .lock()
        .unwrap()
        .iter()
        .filter(|(id, t, l)| {
            *id == leader
                && *t > new_leader_first
                && l.starts_with("received endpoint=alerts")
                && l.contains(&format!(" fence={old_fence} "))
        })
        .map(|(_, _, l)| l.clone())
        .collect();
    assert!(
        stale.is_empty(),
        "the old leader acted under fence {old_fence} after the new leader's first message: {stale:?}"
    );
    // What it held is kept as dead letters, with the reason.
    let kept = lines
        .lock()
        .unwrap()
        .iter()
        .filter(|(id, _, l)| *id == leader && l.starts_with("dead-lettered endpoint=alerts"))
        .count();
    assert!(kept >= 1, "{:?}", lines.lock().unwrap());
}

/// What `guard-gateway <args> --config <config>` printed (stdout, then
/// stderr) within `limit`, killed then if it still runs, with its exit
/// code if it ended by itself.
fn printed_within(
    args: &[&str],
    config: &std::path::Path,
    env: &[(&str, String)],
    limit: Duration,
) -> (Option<i32>, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_guard-gateway"))
        .args(args)
        .arg("--config")
        .arg(config)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .env("RUST_LOG", "debug")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("guard-gateway");
    let read = |mut from: Box<dyn Read + Send>| {
        thread::spawn(move || {
            let mut text = String::new();
            from.read_to_string(&mut text).ok();
            text
        })
    };
    let stdout = read(Box::new(child.stdout.take().unwrap()));
    let stderr = read(Box::new(child.stderr.take().unwrap()));
    let started = Instant::now();
    let code = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status.code();
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        thread::sleep(Duration::from_millis(50));
    };
    (code, stdout.join().unwrap() + &stderr.join().unwrap())
}

/// A password in any URL of the file, written there or expanded from the
/// environment, is printed neither by `check` nor by `run` (at `debug`):
/// not in a start-up error, nor while endpoints fail to connect and
/// retry beside a replica that leads (its locker takes its password).
#[test]
fn no_password_of_a_url_is_printed_by_check_or_run() {
    const SECRET: &str = "TopSecret42";
    let server = RedisServer::start().expect("redis-server");
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("requirepass")
        .arg(SECRET)
        .query(
            &mut redis::Client::open(server.url())
                .unwrap()
                .get_connection()
                .unwrap(),
        )
        .expect("a password set");
    let closed = free_port().expect("a free port");
    let head = format!(
        "[locker]\nkind = \"redis\"\nurl = \"redis://:{SECRET}@127.0.0.1:{}/\"\n\n[guards]\nowner = \"it\"\nactive_ttl_ms = {TTL_MS}\nactive_interval_ms = {INTERVAL_MS}\n\n[[active]]\nname = \"sensors\"\n",
        server.port()
    );
    // Refused at start: the replica cannot serve them.
    let at_start = [
        format!(
            "[[endpoints]]\nname = \"orders\"\nkind = \"redis-stream\"\nurl = \"redis://:{SECRET}-stream@127.0.0.1:{closed}/\"\nstream = \"orders\"\ngroup = \"billing\"\n"
        ),
        format!(
            "[[endpoints]]\nname = \"work\"\nkind = \"postgres-queue\"\nurl = \"postgres://app:{SECRET}-pg@127.0.0.1:{closed}/app\"\ntable = \"jobs\"\n"
        ),
    ];
    // Retried while the replica runs; two from the environment.
    let retried = format!(
        "[[endpoints]]\nname = \"events\"\nkind = \"nats\"\nurl = \"${{NATS_URL}}\"\nsubject = \"events.>\"\nqueue_group = \"gateways\"\n\n[[endpoints]]\nname = \"queue\"\nkind = \"rabbitmq\"\nurl = \"amqp://guest:{SECRET}-amqp@127.0.0.1:{closed}/%2f\"\nqueue = \"orders\"\n\n[[endpoints]]\nname = \"cdc\"\nkind = \"mysql-binlog\"\nurl = \"${{MYSQL_URL}}\"\n"
    );
    let env = [
        (
            "NATS_URL",
            format!("nats://app:{SECRET}-nats@127.0.0.1:{closed}"),
        ),
        (
            "MYSQL_URL",
            format!("mysql://root:{SECRET}-mysql@127.0.0.1:{closed}/app"),
        ),
    ];
    let dir = tempfile::tempdir().unwrap();
    let file = |name: &str, endpoints: &[&str]| {
        let path = dir.path().join(name);
        std::fs::write(&path, format!("{head}\n{}", endpoints.join("\n"))).unwrap();
        path
    };
    let leaked = |what: &str, printed: &str| {
        let lines: Vec<&str> = printed.lines().filter(|l| l.contains(SECRET)).collect();
        assert!(lines.is_empty(), "{what} printed a password: {lines:#?}");
    };

    let all = file("all.toml", &[&at_start[0], &at_start[1], &retried]);
    let (code, printed) = printed_within(&["check"], &all, &env, Duration::from_secs(10));
    assert_eq!(code, Some(0), "{printed}");
    leaked("`check`", &printed);

    for (n, endpoint) in at_start.iter().enumerate() {
        let path = file(&format!("start-{n}.toml"), &[endpoint]);
        let (code, printed) = printed_within(
            &["run", "--replica", "r0"],
            &path,
            &env,
            Duration::from_secs(10),
        );
        assert!(
            code.is_some_and(|c| c != 0),
            "refused at start: {code:?} {printed}"
        );
        leaked("a start-up error", &printed);
    }

    let running = file("running.toml", &[&retried]);
    let (code, printed) = printed_within(
        &["run", "--replica", "r0"],
        &running,
        &env,
        Duration::from_secs(4),
    );
    assert_eq!(code, None, "still running: {printed}");
    for shown in [
        "promoted name=sensors",
        "events: nats: connect",
        "queue: amqp connect",
        "binlog: connect",
    ] {
        assert!(printed.contains(shown), "{shown:?} not printed: {printed}");
    }
    leaked("`run`", &printed);
}

/// With the MQTT broker unreachable, `/readyz` says so (naming the
/// endpoint), its failed connections are counted, and the warning about
/// them is throttled; once a broker answers on that port the replica is
/// ready again.
#[test]
fn an_unreachable_broker_makes_the_replica_not_ready_counted_and_logged_once_per_interval() {
    let server = RedisServer::start().expect("redis-server");
    let broker_port = free_port().unwrap();
    let metrics = free_port().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("unreachable.toml");
    std::fs::write(
        &path,
        base_config(&server.url())
            + &format!(
                "\n[[endpoints]]\nname = \"telemetry\"\nkind = \"mqtt\"\nhost = \"127.0.0.1\"\nport = {broker_port}\nfilter = \"sensors/#\"\nshare_group = \"gateways\"\n\n[[endpoints]]\nname = \"commands\"\nkind = \"mqtt\"\nhost = \"127.0.0.1\"\nport = {broker_port}\nfilter = \"commands/#\"\nguard = true\n\n[metrics]\nprometheus = \"127.0.0.1:{metrics}\"\n"
            ),
    )
    .unwrap();
    let log_path = dir.path().join("stderr.log");
    let child = Command::new(env!("CARGO_BIN_EXE_guard-gateway"))
        .args(["run", "--config"])
        .arg(&path)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log_path).unwrap())
        .spawn()
        .unwrap();
    let _process = Process(child);
    assert!(
        wait_for(SETTLE, || {
            TcpStream::connect(("127.0.0.1", metrics)).is_ok()
        }),
        "no metrics endpoint"
    );
    // Four seconds of failed connections, one a second.
    thread::sleep(Duration::from_secs(4));
    let (status, body) = http_get(metrics, "/readyz");
    assert!(status.contains("503"), "{status}: {body}");
    assert!(body.contains("telemetry"), "names the endpoint: {body}");
    let (_, text) = http_get(metrics, "/metrics");
    let failed = sample(
        &text,
        "guard_source_disconnects_total{source=\"telemetry\"}",
    );
    assert!(failed.is_some_and(|n| n >= 3.0), "{failed:?}");
    // One series per endpoint, by its name: no second one a library
    // default left behind (it read 1 while the broker was down).
    assert!(
        !text.contains("source=\"MQTT "),
        "a source series not named after its endpoint:\n{text}"
    );
    let log = std::fs::read_to_string(&log_path).unwrap();
    let lines = log.lines().filter(|l| l.contains("telemetry")).count();
    assert!(
        lines <= 2,
        "one warning per interval, not per attempt:\n{log}"
    );
    // The elected endpoint's promotions fail every interval (16 in four
    // seconds): its lines are throttled too, the promotions and demotions
    // themselves at debug while they fail.
    let elected = log
        .lines()
        .filter(|l| l.contains("commands") || l.contains("endpoint/mqtt"))
        .count();
    assert!(
        elected <= 4,
        "a line or two per interval, not per promotion:\n{log}"
    );
    // A broker on that port: ready again.
    let _broker = Mosquitto::start_on(broker_port).expect("mosquitto");
    assert!(
        wait_for(SETTLE, || http_get(metrics, "/readyz").0.contains("200")),
        "never ready again: {:?}",
        http_get(metrics, "/readyz")
    );
}

/// An endpoint whose task ends while the replica runs (here a RabbitMQ
/// queue declared before with other properties, which the broker refuses
/// for good) leaves the replica not ready, naming the endpoint and why,
/// with the refusal logged; its source is counted down.
#[test]
fn an_endpoint_that_ends_while_the_replica_runs_makes_it_not_ready() {
    use lapin::options::QueueDeclareOptions;
    use lapin::types::FieldTable;
    use lapin::{Connection, ConnectionProperties};

    let server = RedisServer::start().expect("redis-server");
    let vhost = guard_testkit::rabbitmq::Vhost::create().expect("a RabbitMQ vhost");
    // `orders` exists, not durable: the gateway's durable declaration of
    // it is refused (PRECONDITION_FAILED), which no reconnection fixes.
    let amqp = smol::block_on(Connection::connect(
        &vhost.url(),
        ConnectionProperties::default(),
    ))
    .expect("amqp connect");
    let channel = smol::block_on(amqp.create_channel()).unwrap();
    smol::block_on(channel.queue_declare(
        "orders".into(),
        QueueDeclareOptions {
            durable: false,
            ..Default::default()
        },
        FieldTable::default(),
    ))
    .unwrap();
    let metrics = free_port().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("refused.toml");
    std::fs::write(
        &path,
        base_config(&server.url())
            + &format!(
                "\n[[endpoints]]\nname = \"orders\"\nkind = \"rabbitmq\"\nurl = \"{}\"\nqueue = \"orders\"\n\n[metrics]\nprometheus = \"127.0.0.1:{metrics}\"\n",
                vhost.url()
            ),
    )
    .unwrap();
    let log_path = dir.path().join("stderr.log");
    let child = Command::new(env!("CARGO_BIN_EXE_guard-gateway"))
        .args(["run", "--config"])
        .arg(&path)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log_path).unwrap())
        .spawn()
        .unwrap();
    let mut process = Process(child);
    let refused = || {
        guard_testkit::http::get(metrics, "/readyz").is_ok_and(|(status, body)| {
            status.contains("503") && body.contains("endpoint orders: stopped")
        })
    };
    assert!(
        wait_for(SETTLE, refused),
        "ready with a dead endpoint: {:?} (exited: {:?})\n{}",
        guard_testkit::http::get(metrics, "/readyz"),
        process.0.try_wait(),
        std::fs::read_to_string(&log_path).unwrap_or_default()
    );
    // It stays so: nothing the connection does after sets it up again.
    thread::sleep(Duration::from_secs(2));
    assert!(refused(), "{:?}", http_get(metrics, "/readyz"));
    let (_, text) = http_get(metrics, "/metrics");
    assert_eq!(
        sample(&text, "guard_source_up{source=\"orders\"}"),
        Some(0.0),
        "{text}"
    );
    let log = std::fs::read_to_string(&log_path).unwrap();
    assert!(
        log.contains("PRECONDITION_FAILED") || log.contains("inequivalent"),
        "the refusal is logged:\n{log}"
    );
}

/// The outage of the uplink in [`a_stream_forwarded_to_an_http_sink_loses_nothing_across_an_outage_and_a_kill`].
const OUTAGE: Duration = Duration::from_secs(60);

/// A stream endpoint forwards to an HTTP sink while entries arrive at 100
/// a second: the receiver is stopped for a minute (connections refused)
/// and the gateway killed with SIGKILL in the middle of it and started
/// again; once the receiver is back, every entry arrives, in stream
/// order, each under its entry's `Idempotency-Key`, and nothing stays
/// pending. An entry sent again (the one in flight at the kill) carries
/// the key and body of its first delivery, so a receiver that drops a
/// repeated key handles each entry once.
#[test]
fn a_stream_forwarded_to_an_http_sink_loses_nothing_across_an_outage_and_a_kill() {
    let server = RedisServer::start().expect("redis-server");
    let receiver = guard_testkit::HttpReceiver::start().expect("receiver");
    let port = receiver.port();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("forward.toml");
    let metrics = free_port().unwrap();
    let mut text = base_config(&server.url());
    text.push_str(&format!(
        r#"
[metrics]
prometheus = "127.0.0.1:{metrics}"

[[sinks]]
name = "uplink"
kind = "http"
url = "{}"
timeout_ms = 2000
retries = 1000
retry_delay_ms = 100
max_retry_delay_ms = 1000

[[endpoints]]
name = "orders"
kind = "redis-stream"
stream = "orders"
group = "uplink"
claim_idle_ms = 2000
to = "uplink"
"#,
        receiver.url("/ingest")
    ));
    std::fs::write(&path, text).unwrap();
    let lines: Lines = Arc::default();
    let mut gateway = start(0, &path, &lines);
    assert!(ready(metrics), "the gateway became ready");
    // 100 entries a second, for the whole test, from a thread of its own.
    let producing = produce(&server, (OUTAGE.as_secs() + 10) * 100, 100);
    thread::sleep(Duration::from_secs(5));
    let mut requests = receiver.stop();
    assert!(!requests.is_empty(), "forwarding before the outage");
    let outage = Instant::now();
    thread::sleep(OUTAGE / 2);
    signal(&gateway, "KILL");
    let _ = gateway.0.wait();
    gateway = start(1, &path, &lines);
    thread::sleep(OUTAGE.saturating_sub(outage.elapsed()));
    let receiver = guard_testkit::HttpReceiver::start_on(port).expect("the receiver back");
    let sent = producing.join().unwrap();
    assert!(
        wait_for(SETTLE, || keys_arrived(&receiver.requests())
            + keys_arrived(&requests)
            >= sent.len()),
        "not all entries arrived: {} of {}",
        keys_arrived(&receiver.requests()) + keys_arrived(&requests),
        sent.len()
    );
    requests.extend(receiver.requests());
    let again = each_entry_once_in_order(&requests, &sent);
    assert!(
        again <= 5,
        "{again} entries sent twice: more than those in flight at the kill"
    );
    let mut conn = redis::Client::open(server.url())
        .unwrap()
        .get_connection()
        .unwrap();
    assert!(
        wait_for(SETTLE, || pending_entries(&mut conn) == 0),
        "entries left pending"
    );
    drop(gateway);
}

/// Adds `total` entries to the stream `orders`, `per_second` of them a
/// second, from a thread of its own: their ids and payloads.
fn produce(
    server: &RedisServer,
    total: u64,
    per_second: u64,
) -> thread::JoinHandle<Vec<(String, String)>> {
    let url = server.url();
    thread::spawn(move || {
        let mut conn = redis::Client::open(url).unwrap().get_connection().unwrap();
        let started = Instant::now();
        let mut ids = Vec::new();
        for i in 0..total {
            let due = started + Duration::from_micros(i * 1_000_000 / per_second);
            thread::sleep(due.saturating_duration_since(Instant::now()));
            let id: String = redis::cmd("XADD")
                .arg("orders")
                .arg("*")
                .arg("payload")
                .arg(format!("o{i}"))
                .query(&mut conn)
                .unwrap();
            ids.push((id, format!("o{i}")));
        }
        ids
    })
}

/// Entries of the group `uplink` on `orders` read and not acknowledged.
fn pending_entries(conn: &mut redis::Connection) -> i64 {
    let pending: Vec<redis::Value> = redis::cmd("XPENDING")
        .arg("orders")
        .arg("uplink")
        .query(conn)
        .unwrap();
    match pending.first() {
        Some(redis::Value::Int(n)) => *n,
        other => panic!("XPENDING answered {other:?}"),
    }
}

/// Checks that `requests` carry every entry of `sent` under the key
/// `orders:<entry id>`, first delivered in stream order, a repeat with
/// the first delivery's body: the repeats.
fn each_entry_once_in_order(
    requests: &[guard_testkit::Received],
    sent: &[(String, String)],
) -> usize {
    let mut first: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    let mut order = Vec::new();
    for r in requests {
        assert_eq!((r.method.as_str(), r.path.as_str()), ("POST", "/ingest"));
        let key = r.header("idempotency-key").expect("a key").to_owned();
        match first.get(&key) {
            Some(body) => assert_eq!(body, &r.body, "{key} sent again with another body"),
            None => {
                first.insert(key.clone(), r.body.clone());
                order.push(key);
            }
        }
    }
    let expected: Vec<String> = sent.iter().map(|(id, _)| format!("orders:{id}")).collect();
    assert_eq!(
        order, expected,
        "every entry, once each by key, in stream order"
    );
    for (id, payload) in sent {
        assert_eq!(first[&format!("orders:{id}")], payload.as_bytes());
    }
    requests.len() - order.len()
}

/// Distinct `Idempotency-Key`s in `requests`.
fn keys_arrived(requests: &[guard_testkit::Received]) -> usize {
    requests
        .iter()
        .filter_map(|r| r.header("idempotency-key"))
        .collect::<std::collections::BTreeSet<_>>()
        .len()
}

/// A stream endpoint forwarding to an HTTP sink through a queue on disk
/// in `queue` (with `queue_keys` besides its `dir`), the sink retrying
/// every 50 to 200 ms; dead letters in `dead_letters`.
fn queued_config(
    redis: &str,
    metrics: u16,
    uplink: &str,
    queue: &std::path::Path,
    dead_letters: &std::path::Path,
    queue_keys: &str,
) -> String {
    format!(
        r#"{}
[metrics]
prometheus = "127.0.0.1:{metrics}"

[dead_letters]
dir = "{}"

[[sinks]]
name = "uplink"
kind = "http"
url = "{uplink}"
timeout_ms = 2000
retries = 3
retry_delay_ms = 50
max_retry_delay_ms = 200

[sinks.queue]
dir = "{}"
{queue_keys}

[[endpoints]]
name = "orders"
kind = "redis-stream"
stream = "orders"
group = "uplink"
claim_idle_ms = 2000
to = "uplink"
"#,
        base_config(redis),
        dead_letters.display(),
        queue.display(),
    )
}

/// The outage of [`a_queued_sink_takes_entries_on_disk_and_forwards_them_in_order_across_an_outage_and_a_kill`].
const QUEUED_OUTAGE: Duration = Duration::from_secs(14);

/// With a queue on disk in front of the HTTP sink, a stream's entries are
/// acknowledged once queued, so nothing stays pending at the source while
/// the receiver is down; the gateway is killed with SIGKILL in the middle
/// of the outage and started again, and reopens its queue with nothing
/// lost; once the receiver is back every entry arrives, in stream order,
/// each under its entry's key, repeats (forwarded, not yet recorded as
/// such at the kill) carrying the first delivery's body.
#[test]
fn a_queued_sink_takes_entries_on_disk_and_forwards_them_in_order_across_an_outage_and_a_kill() {
    let server = RedisServer::start().expect("redis-server");
    let receiver = guard_testkit::HttpReceiver::start().expect("receiver");
    let port = receiver.port();
    let dir = tempfile::tempdir().unwrap();
    let queue = dir.path().join("queue");
    let metrics = free_port().unwrap();
    let (_config_dir, path) = written(&queued_config(
        &server.url(),
        metrics,
        &receiver.url("/ingest"),
        &queue,
        &dir.path().join("dead-letters"),
        "sync_ms = 100",
    ));
    let lines: Lines = Arc::default();
    let mut gateway = start(0, &path, &lines);
    assert!(ready(metrics), "the gateway became ready");
    let producing = produce(&server, (QUEUED_OUTAGE.as_secs() + 8) * 100, 100);
    thread::sleep(Duration::from_secs(3));
    let mut requests = receiver.stop();
    assert!(!requests.is_empty(), "forwarding before the outage");
    let outage = Instant::now();
    thread::sleep(QUEUED_OUTAGE / 2);
    // Down for seconds, and the source holds nothing back: each entry was
    // acknowledged once on disk.
    let mut conn = redis::Client::open(server.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let pending = pending_entries(&mut conn);
    assert!(pending <= 5, "{pending} entries pending while queued");
    let (_, text) = http_get(metrics, "/metrics");
    let queued = sample(&text, "guard_queue_pending{name=\"uplink\"}").unwrap_or(0.0);
    assert!(queued >= 300.0, "{queued} queued after 7 s down:\n{text}");
    // The status view shows the queue and the dead letters on disk.
    let status = status_of(metrics);
    let sink = &status["sinks"][0];
    assert_eq!(sink["name"], "uplink", "{status}");
    assert!(sink["queued"].as_u64().unwrap_or(0) >= 300, "{status}");
    assert!(sink["bytes"].as_u64().unwrap_or(0) > 0, "{status}");
    assert!(status["dead_letters"]["bytes"].is_u64(), "{status}");
    signal(&gateway, "KILL");
    let _ = gateway.0.wait();
    // Started again under its name, as a service manager does: what the
    // killed one had read but not yet queued (pending on its name) comes
    // first, so the order holds.
    gateway = start_as(1, "replica-0", &path, &lines);
    assert!(
        wait_for(SETTLE, || lines.lock().unwrap().iter().any(|(id, _, l)| {
            *id == 1
                && l.starts_with("queue sink=uplink")
                && l.contains("lost_bytes=0 damaged_segments=0")
        })),
        "reopened whole: {:?}",
        lines
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, _, l)| l.starts_with("queue"))
            .collect::<Vec<_>>()
    );
    thread::sleep(QUEUED_OUTAGE.saturating_sub(outage.elapsed()));
    let receiver = guard_testkit::HttpReceiver::start_on(port).expect("the receiver back");
    let sent = producing.join().unwrap();
    assert!(
        wait_for(SETTLE, || keys_arrived(&receiver.requests())
            + keys_arrived(&requests)
            >= sent.len()),
        "not all entries arrived: {} of {}",
        keys_arrived(&receiver.requests()) + keys_arrived(&requests),
        sent.len()
    );
    requests.extend(receiver.requests());
    let again = each_entry_once_in_order(&requests, &sent);
    assert!(again <= 5, "{again} entries sent twice");
    assert_eq!(pending_entries(&mut conn), 0, "entries left pending");
    drop(gateway);
}

/// A queue whose last segment lost its tail (a power loss tore the last
/// write): the gateway starts, says what it cut, and forwards every whole
/// record before the tear, in order.
#[test]
fn a_truncated_queue_file_at_start_is_cut_counted_and_the_rest_forwarded() {
    let server = RedisServer::start().expect("redis-server");
    // The receiver's port, closed while the queue fills.
    let receiver = guard_testkit::HttpReceiver::start().expect("receiver");
    let port = receiver.port();
    let url = receiver.url("/ingest");
    drop(receiver.stop());
    let dir = tempfile::tempdir().unwrap();
    let queue = dir.path().join("queue");
    let metrics = free_port().unwrap();
    let (_config_dir, path) = written(&queued_config(
        &server.url(),
        metrics,
        &url,
        &queue,
        &dir.path().join("dead-letters"),
        "sync_ms = 100",
    ));
    let lines: Lines = Arc::default();
    let gateway = start(0, &path, &lines);
    assert!(ready(metrics), "the gateway became ready");
    let sent = produce(&server, 50, 500).join().unwrap();
    let mut conn = redis::Client::open(server.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let queued = || {
        let (_, text) = http_get(metrics, "/metrics");
        sample(&text, "guard_queue_pending{name=\"uplink\"}") == Some(50.0)
    };
    assert!(wait_for(SETTLE, queued), "all 50 queued");
    assert_eq!(pending_entries(&mut conn), 0);
    drop(gateway);
    // The last record's last 3 bytes never reached the disk.
    let mut segments: Vec<_> = std::fs::read_dir(&queue)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .collect();
    segments.sort();
    let last = segments.pop().unwrap();
    let len = std::fs::metadata(&last).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&last)
        .unwrap()
        .set_len(len - 3)
        .unwrap();
    let receiver = guard_testkit::HttpReceiver::start_on(port).expect("the receiver");
    let _gateway = start(1, &path, &lines);
    let opened = || {
        lines
            .lock()
            .unwrap()
            .iter()
            .find(|(id, _, l)| *id == 1 && l.starts_with("queue sink=uplink"))
            .map(|(_, _, l)| l.clone())
    };
    assert!(wait_for(SETTLE, || opened().is_some()));
    let opened = opened().unwrap();
    assert!(
        opened.contains("pending=49 ") && opened.contains("damaged_segments=1"),
        "{opened}"
    );
    let lost: u64 = opened
        .split_whitespace()
        .find_map(|f| f.strip_prefix("lost_bytes="))
        .unwrap()
        .parse()
        .unwrap();
    assert!(lost > 0 && lost < 200, "one torn record's bytes: {opened}");
    assert!(wait_for(SETTLE, || keys_arrived(&receiver.requests()) >= 49));
    thread::sleep(Duration::from_millis(500));
    let again = each_entry_once_in_order(&receiver.requests(), &sent[..49]);
    assert_eq!(again, 0);
}

/// A queue on a file system that fills (a 64 KiB tmpfs, in a mount
/// namespace of the gateway's own) while the sink is down: the writes
/// that find no room are cut off and the source is held back (its
/// entries stay in the stream), counted and logged as a full disk; once
/// the sink is back the queue drains, readable, and every entry arrives,
/// in stream order.
/// Needs root (a mount namespace); the test command runs it as root.
#[test]
#[ignore = "needs root: mounts a tmpfs in a mount namespace"]
fn a_queue_on_a_full_disk_holds_the_source_back_and_stays_readable() {
    let server = RedisServer::start().expect("redis-server");
    let receiver = guard_testkit::HttpReceiver::start().expect("receiver");
    let port = receiver.port();
    let url = receiver.url("/ingest");
    drop(receiver.stop());
    let dir = tempfile::tempdir().unwrap();
    let mount = dir.path().join("tmpfs");
    std::fs::create_dir(&mount).unwrap();
    let metrics = free_port().unwrap();
    // The dead letters off the small file system.
    let (_config_dir, path) = written(&queued_config(
        &server.url(),
        metrics,
        &url,
        &mount.join("queue"),
        &dir.path().join("dead-letters"),
        "max_bytes = 1048576\nfull_wait_ms = 100",
    ));
    let log_path = dir.path().join("stderr.log");
    let lines: Lines = Arc::default();
    let child = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg(r#"mount -t tmpfs -o size=64k tmpfs "$1" && exec "$2" run --config "$3""#)
        .arg("sh")
        .arg(&mount)
        .arg(env!("CARGO_BIN_EXE_guard-gateway"))
        .arg(&path)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log_path).unwrap())
        .spawn()
        .expect("unshare");
    let _gateway = collect(0, child, &lines);
    assert!(
        ready(metrics),
        "the gateway became ready: {}",
        std::fs::read_to_string(&log_path).unwrap_or_default()
    );
    let sent = produce(&server, 2000, 2000).join().unwrap();
    let held_back = || {
        let (_, text) = http_get(metrics, "/metrics");
        sample(
            &text,
            "guard_queue_full_total{name=\"uplink\",outcome=\"held_back\"}",
        )
        .unwrap_or(0.0)
    };
    assert!(wait_for(SETTLE, || held_back() >= 1.0), "never held back");
    let (_, text) = http_get(metrics, "/metrics");
    let queued = sample(&text, "guard_queue_pending{name=\"uplink\"}").unwrap();
    assert!(
        queued > 100.0 && queued < 2000.0,
        "{queued} queued on 64 KiB"
    );
    let log = std::fs::read_to_string(&log_path).unwrap();
    assert!(
        log.contains("no room on the disk") && log.contains("held back"),
        "a full disk is a clear error:\n{log}"
    );
    let receiver = guard_testkit::HttpReceiver::start_on(port).expect("the receiver");
    assert!(
        wait_for(Duration::from_secs(120), || keys_arrived(
            &receiver.requests()
        ) >= sent.len()),
        "{} of {} arrived\n{}",
        keys_arrived(&receiver.requests()),
        sent.len(),
        std::fs::read_to_string(&log_path).unwrap_or_default()
    );
    // Held back, not passed over: the stream's order is kept.
    let again = each_entry_once_in_order(&receiver.requests(), &sent);
    assert!(again <= 5, "{again} entries sent twice");
}

/// What a sink refuses for good is dead-lettered at once with its answer:
/// a stream entry answered 400 goes to the stream's dead-letter topic
/// with the status and the body's excerpt, attempts 1; a Pub/Sub message
/// answered 400, or refused by a fenced receiver as a stale leader's (409
/// with `Guard-Highest-Fence`), goes to the endpoint's dead letters with
/// that reason. A 503 with `Retry-After: 1` is retried after the second
/// it asks for, under the same key.
#[test]
fn a_sink_refusing_for_good_or_as_stale_dead_letters_with_its_answer() {
    let server = RedisServer::start().expect("redis-server");
    let receiver = guard_testkit::HttpReceiver::start().expect("receiver");
    let (_dir, path) = written(&format!(
        "{}\n[[sinks]]\nname = \"uplink\"\nkind = \"http\"\nurl = \"{}\"\nretries = 3\nretry_delay_ms = 10\n\n[[endpoints]]\nname = \"orders\"\nkind = \"redis-stream\"\nstream = \"orders\"\ngroup = \"billing\"\ndead_letter_topic = \"orders\"\nto = \"uplink\"\n\n[[endpoints]]\nname = \"alerts\"\nkind = \"redis-pubsub\"\npatterns = [\"alerts.*\"]\nto = \"uplink\"\n",
        base_config(&server.url()),
        receiver.url("/in")
    ));
    let lines: Lines = Arc::default();
    let _process = start(0, &path, &lines);
    let mut conn = pattern_subscribed(&server);
    use guard_testkit::Answer;
    // One message at a time, each with its scripted answer.
    receiver.script([Answer::status(400).with_body("{\"error\":\"no such sensor\"}")]);
    let refused: String = redis::cmd("XADD")
        .arg("orders")
        .arg("*")
        .arg("payload")
        .arg("o1")
        .query(&mut conn)
        .unwrap();
    let dlq = "stream:topic:{orders}:dlq";
    let dead_letters = |conn: &mut redis::Connection| -> Vec<(String, Vec<(String, String)>)> {
        redis::cmd("XRANGE")
            .arg(dlq)
            .arg("-")
            .arg("+")
            .query(conn)
            .unwrap()
    };
    assert!(wait_for(SETTLE, || dead_letters(&mut conn).len() == 1));
    let letter = &dead_letters(&mut conn)[0].1;
    let field = |name: &str| {
        letter
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    assert!(
        field("error").contains("HTTP 400") && field("error").contains("no such sensor"),
        "{letter:?}"
    );
    assert_eq!(field("attempts"), "1", "{letter:?}");
    assert_eq!(field("origin_id"), refused, "{letter:?}");
    assert_eq!(field("payload"), "o1", "{letter:?}");
    let published = |conn: &mut redis::Connection, payload: &str| {
        let _: i64 = redis::cmd("PUBLISH")
            .arg("alerts.fire")
            .arg(payload)
            .query(conn)
            .unwrap();
    };
    let dead_lettered = |payload_reason: &str| {
        lines.lock().unwrap().iter().any(|(_, _, l)| {
            l.starts_with("dead-lettered endpoint=alerts") && l.contains(payload_reason)
        })
    };
    receiver.script([Answer::status(400).with_body("bad alert")]);
    published(&mut conn, "a1");
    assert!(
        wait_for(SETTLE, || dead_lettered("HTTP 400: bad alert")),
        "{:?}",
        lines.lock().unwrap()
    );
    receiver.script([Answer::status(409).with_header("Guard-Highest-Fence", "999999")]);
    published(&mut conn, "a2");
    assert!(
        wait_for(SETTLE, || dead_lettered(
            "is below the 999999 the sink has accepted"
        )),
        "{:?}",
        lines.lock().unwrap()
    );
    // Asked to wait a second: the retry comes no sooner, with the same key.
    receiver.script([Answer::status(503).with_header("Retry-After", "1")]);
    let before = receiver.requests().len();
    published(&mut conn, "a3");
    assert!(wait_for(SETTLE, || lines.lock().unwrap().iter().any(
        |(_, _, l)| l.starts_with("received endpoint=alerts") && l.ends_with("payload=a3")
    )));
    let requests = receiver.requests();
    let tried = &requests[before..];
    assert_eq!(tried.len(), 2, "{tried:?}");
    assert_eq!(
        tried[0].header("idempotency-key"),
        tried[1].header("idempotency-key")
    );
    let waited = tried[1].at - tried[0].at;
    assert!(
        waited >= Duration::from_millis(900),
        "retried after {waited:?}, asked 1 s"
    );
    assert!(
        tried[0].header("guard-fence").is_some(),
        "an elected source's fence is sent"
    );
    let received: Vec<String> = lines
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, _, l)| l.starts_with("received"))
        .map(|(_, _, l)| l.clone())
        .collect();
    assert_eq!(
        received.len(),
        1,
        "only what the sink took counts as handled: {received:?}"
    );
}

/// A Redis Stream sink appends each message once, with its payload,
/// origin, id and fence; once the stream has taken a higher fence than
/// the leader's (as a newer leader's write would leave it), the leader's
/// messages are refused as a stale leader's and dead-lettered with that
/// reason, nothing appended.
#[test]
fn a_redis_stream_sink_appends_once_and_refuses_a_stale_leader() {
    let server = RedisServer::start().expect("redis-server");
    let (_dir, path) = written(&format!(
        "{}\n[[sinks]]\nname = \"archive\"\nkind = \"redis-stream\"\nstream = \"uplink\"\n\n[[endpoints]]\nname = \"alerts\"\nkind = \"redis-pubsub\"\npatterns = [\"alerts.*\"]\nto = \"archive\"\n",
        base_config(&server.url()),
    ));
    let lines: Lines = Arc::default();
    let _process = start(0, &path, &lines);
    let mut conn = pattern_subscribed(&server);
    let entries = |conn: &mut redis::Connection| -> Vec<(String, BTreeMap<String, String>)> {
        redis::cmd("XRANGE")
            .arg("uplink")
            .arg("-")
            .arg("+")
            .query(conn)
            .unwrap()
    };
    let _: i64 = redis::cmd("PUBLISH")
        .arg("alerts.fire")
        .arg("a1")
        .query(&mut conn)
        .unwrap();
    assert!(wait_for(SETTLE, || entries(&mut conn).len() == 1));
    let (_, entry) = &entries(&mut conn)[0];
    assert_eq!(entry["payload"], "a1");
    assert_eq!(entry["origin"], "alerts.fire");
    assert!(entry["id"].starts_with("alerts:"), "{entry:?}");
    let fence: u64 = entry["fence"].parse().expect("the leader's fence");
    let stale = received_with_fences(&lines, "alerts");
    assert_eq!(stale.len(), 1);
    assert_eq!(
        stale[0].1, fence,
        "the fence printed is the one the stream took"
    );
    // A newer leader's write, as the stream would keep it.
    let _: () = redis::cmd("SET")
        .arg("uplink:guard:fence")
        .arg(fence + 1000)
        .query(&mut conn)
        .unwrap();
    let _: i64 = redis::cmd("PUBLISH")
        .arg("alerts.fire")
        .arg("a2")
        .query(&mut conn)
        .unwrap();
    let expected = format!(
        "refused: fence {fence} is below the {} the sink has accepted (a stale leader)",
        fence + 1000
    );
    assert!(
        wait_for(SETTLE, || lines.lock().unwrap().iter().any(|(_, _, l)| l
            .starts_with("dead-lettered endpoint=alerts")
            && l.contains(&expected))),
        "{:?}",
        lines.lock().unwrap()
    );
    assert_eq!(
        entries(&mut conn).len(),
        1,
        "nothing appended under a stale fence"
    );
    assert_eq!(received_with_fences(&lines, "alerts").len(), 1);
}

/// A command schedule on three replicas: each slot's command runs once
/// across them, with the slot and fence in its environment; an exclusive
/// one that outlasts its period never overlaps itself (the slots that
/// come while it runs are skipped, printed as `running_elsewhere`), its
/// fences increasing run after run.
#[test]
fn a_command_schedule_on_three_replicas_runs_once_per_slot_and_never_overlaps() {
    let server = RedisServer::start().expect("redis-server");
    let dir = tempfile::tempdir().unwrap();
    let every = dir.path().join("every.log");
    let long = dir.path().join("long.log");
    let path = dir.path().join("cron.toml");
    std::fs::write(
        &path,
        format!(
            r#"{}
[[schedules]]
router = "tick"
every_ms = 1000
run = ["sh", "-c", "echo $GUARD_SCHEDULE $GUARD_SLOT $GUARD_FENCE >> {}"]

[[schedules]]
router = "backup"
every_ms = 1000
exclusive = true
run = ["sh", "-c", "echo start $GUARD_SLOT $GUARD_FENCE >> {log}; sleep 1.5; echo end $GUARD_SLOT >> {log}"]
"#,
            base_config(&server.url()),
            every.display(),
            log = long.display()
        ),
    )
    .unwrap();
    let lines: Lines = Arc::default();
    let replicas: Vec<Process> = (0..3).map(|id| start(id, &path, &lines)).collect();
    thread::sleep(Duration::from_secs(10));
    drop(replicas);
    // A command running at the kill finishes by itself.
    thread::sleep(Duration::from_secs(2));
    let every = std::fs::read_to_string(&every).unwrap_or_default();
    let slots: Vec<&str> = every
        .lines()
        .map(|l| l.split(' ').nth(1).unwrap())
        .collect();
    let unique: std::collections::BTreeSet<&&str> = slots.iter().collect();
    assert_eq!(unique.len(), slots.len(), "a slot ran twice: {every}");
    assert!(slots.len() >= 7, "about one run a second for 10 s: {every}");
    assert!(every.lines().all(|l| l.starts_with("tick ")), "{every}");
    let long = std::fs::read_to_string(&long).unwrap_or_default();
    let mut running: Option<&str> = None;
    let mut fences = Vec::new();
    for line in long.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        match fields.as_slice() {
            ["start", slot, fence] => {
                assert_eq!(
                    running, None,
                    "{slot} started while {running:?} ran:\n{long}"
                );
                running = Some(slot);
                fences.push(fence.parse::<u64>().expect("a fence"));
            }
            ["end", slot] => {
                assert_eq!(running, Some(*slot), "an end without its start:\n{long}");
                running = None;
            }
            _ => panic!("{line:?}"),
        }
    }
    assert!(
        fences.len() >= 3,
        "runs of 1.5 s every other second: {long}"
    );
    assert!(
        fences.windows(2).all(|w| w[0] < w[1]),
        "fences increase run after run: {fences:?}"
    );
    let skipped = lines
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, _, l)| {
            l.starts_with("skipped router=backup") && l.ends_with("reason=running_elsewhere")
        })
        .count();
    assert!(
        skipped >= 2,
        "the slots a run outlasted were skipped: {:?}",
        lines.lock().unwrap()
    );
}

/// A command that fails is retried as configured, then reported with its
/// exit status and what it said on standard error; one still running at
/// its timeout is killed and reported so.
#[test]
fn a_failing_or_hanging_command_is_retried_then_reported_with_its_status() {
    let server = RedisServer::start().expect("redis-server");
    let dir = tempfile::tempdir().unwrap();
    let tries = dir.path().join("tries.log");
    let path = dir.path().join("failing.toml");
    std::fs::write(
        &path,
        format!(
            r#"{}
[[schedules]]
router = "fails"
every_ms = 3000
run = ["sh", "-c", "echo $GUARD_SLOT >> {}; echo disk full >&2; exit 3"]
retries = 2
retry_delay_ms = 10

[[schedules]]
router = "hangs"
every_ms = 3000
run = ["sleep", "30"]
timeout_ms = 300
"#,
            base_config(&server.url()),
            tries.display()
        ),
    )
    .unwrap();
    let lines: Lines = Arc::default();
    let _replica = start(0, &path, &lines);
    let failed = |router: &str| {
        lines
            .lock()
            .unwrap()
            .iter()
            .find(|(_, _, l)| l.starts_with(&format!("failed router={router} ")))
            .map(|(_, _, l)| l.clone())
    };
    assert!(
        wait_for(Duration::from_secs(90), || failed("fails").is_some()
            && failed("hangs").is_some()),
        "{:?}",
        lines.lock().unwrap()
    );
    let fails = failed("fails").unwrap();
    assert!(
        fails.contains("attempts=3") && fails.contains("exit status: 3: disk full"),
        "{fails}"
    );
    let slot = fails
        .split(' ')
        .find_map(|f| f.strip_prefix("slot="))
        .unwrap()
        .to_owned();
    let tries = std::fs::read_to_string(&tries).unwrap();
    assert_eq!(
        tries.lines().filter(|l| *l == slot).count(),
        3,
        "1 + 2 retries of slot {slot}: {tries}"
    );
    let hangs = failed("hangs").unwrap();
    assert!(
        hangs.contains("attempts=1") && hangs.contains("still running after 300ms: killed"),
        "{hangs}"
    );
}

/// A schedule with `to` sends one message a slot, from whichever of two
/// replicas claimed it, under the slot's key: the receiver sees each slot
/// once, with the slot and fence in the body.
#[test]
fn a_schedule_sends_each_slot_to_its_sink_once_under_the_slot_key() {
    let server = RedisServer::start().expect("redis-server");
    let receiver = guard_testkit::HttpReceiver::start().expect("receiver");
    let (_dir, path) = written(&format!(
        "{}\n[[sinks]]\nname = \"uplink\"\nkind = \"http\"\nurl = \"{}\"\n\n[[schedules]]\nrouter = \"heartbeat\"\nchain = \"edge\"\nevery_ms = 500\nto = \"uplink\"\n",
        base_config(&server.url()),
        receiver.url("/beat")
    ));
    let lines: Lines = Arc::default();
    let replicas: Vec<Process> = (0..2).map(|id| start(id, &path, &lines)).collect();
    assert!(wait_for(SETTLE, || receiver.requests().len() >= 6));
    drop(replicas);
    let requests = receiver.requests();
    let keys: Vec<&str> = requests
        .iter()
        .filter_map(|r| r.header("idempotency-key"))
        .collect();
    let unique: std::collections::BTreeSet<&&str> = keys.iter().collect();
    assert_eq!(unique.len(), keys.len(), "a slot sent twice: {keys:?}");
    for r in &requests {
        let key = r.header("idempotency-key").unwrap();
        let slot = key.strip_prefix("schedule:edge:heartbeat:").expect(key);
        let body = String::from_utf8_lossy(&r.body);
        assert!(
            body.contains(&format!("\"slot\":{slot}"))
                && body.contains("\"schedule\":\"heartbeat\""),
            "{body}"
        );
        assert_eq!(r.header("guard-origin"), Some("heartbeat"));
        assert!(
            r.header("guard-fence").is_some(),
            "the claim's fence is sent"
        );
    }
}

/// A quota in front of a sink: a fixed window of 5 messages every 2 s
/// caps what goes out; what is over it waits for the next window (the
/// stream holds it), nothing dead-lettered, every entry delivered.
#[test]
fn a_quota_in_front_of_a_sink_holds_back_what_is_over_it_and_loses_nothing() {
    let server = RedisServer::start().expect("redis-server");
    let receiver = guard_testkit::HttpReceiver::start().expect("receiver");
    let metrics = free_port().unwrap();
    let (_dir, path) = written(&format!(
        "{}\n[metrics]\nprometheus = \"127.0.0.1:{metrics}\"\n\n[ratelimit]\nenabled = true\n[ratelimit.policies.plan]\nalgorithm = \"fixed-window\"\nwindow_ms = 2000\nlimit = 5\n\n[[sinks]]\nname = \"uplink\"\nkind = \"http\"\nurl = \"{}\"\nlimit = \"plan\"\nretries = 50\nretry_delay_ms = 50\nmax_retry_delay_ms = 200\n\n[[endpoints]]\nname = \"orders\"\nkind = \"redis-stream\"\nstream = \"orders\"\ngroup = \"g\"\nto = \"uplink\"\n",
        base_config(&server.url()),
        receiver.url("/in")
    ));
    let lines: Lines = Arc::default();
    let _process = start(0, &path, &lines);
    assert!(ready(metrics));
    let mut conn = redis::Client::open(server.url())
        .unwrap()
        .get_connection()
        .unwrap();
    for i in 0..12 {
        let _: String = redis::cmd("XADD")
            .arg("orders")
            .arg("*")
            .arg("payload")
            .arg(format!("o{i}"))
            .query(&mut conn)
            .unwrap();
    }
    assert!(wait_for(SETTLE, || received(&lines, "orders").len() == 12));
    let requests = receiver.requests();
    assert_eq!(requests.len(), 12, "each once: nothing sent over the quota");
    // 5 a window: the twelfth waits for the third window, whose start is
    // 2 s after the second's, itself after the first request.
    let span = requests[11].at - requests[0].at;
    assert!(
        span >= Duration::from_millis(1_950),
        "12 messages in {span:?}: the quota did not act"
    );
    let bodies: Vec<String> = requests
        .iter()
        .map(|r| String::from_utf8_lossy(&r.body).into_owned())
        .collect();
    let expected: Vec<String> = (0..12).map(|i| format!("o{i}")).collect();
    assert_eq!(bodies, expected, "in stream order");
    assert!(
        !lines
            .lock()
            .unwrap()
            .iter()
            .any(|(_, _, l)| l.starts_with("dead-lettered")),
        "nothing dead-lettered"
    );
    let (_, text) = http_get(metrics, "/metrics");
    assert!(
        sample(&text, "guard_rl_denied_total{name=\"plan\"}").unwrap_or(0.0) >= 1.0,
        "{text}"
    );
}

/// A stop while a failed command waits for its retry ends the wait at
/// once and starts nothing more: the run is reported failed, the replica
/// exits long before the retry delay, and the command ran once.
#[test]
fn a_stop_during_a_command_s_retry_wait_starts_nothing_more() {
    let dir = tempfile::tempdir().unwrap();
    let tries = dir.path().join("tries.log");
    let (_config, path) = written(&format!(
        "[locker]\nkind = \"local\"\n\n[[schedules]]\nrouter = \"flaky\"\nevery_ms = 1000\nrun = [\"sh\", \"-c\", \"echo $GUARD_SLOT >> {}; exit 1\"]\nretries = 5\nretry_delay_ms = 30000\n",
        tries.display()
    ));
    let lines: Lines = Arc::default();
    let mut replica = start(0, &path, &lines);
    assert!(wait_for(SETTLE, || std::fs::read_to_string(&tries)
        .is_ok_and(|t| !t.is_empty())));
    signal(&replica, "TERM");
    let stopping = Instant::now();
    let exited = wait_for(Duration::from_secs(20), || {
        matches!(replica.0.try_wait(), Ok(Some(_)))
    });
    assert!(
        exited,
        "still running {:?} after the stop",
        stopping.elapsed()
    );
    let tries = std::fs::read_to_string(&tries).unwrap();
    assert_eq!(
        tries.lines().count(),
        1,
        "started again after the stop: {tries}"
    );
    assert!(
        lines
            .lock()
            .unwrap()
            .iter()
            .any(|(_, _, l)| l.starts_with("failed router=flaky")
                && l.ends_with("the replica stopped before the next attempt")),
        "{:?}",
        lines.lock().unwrap()
    );
}

/// `guard-gateway dlq …` on `config`: its exit status and standard output.
fn dlq(args: &[&str], config: &std::path::Path) -> (Option<i32>, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_guard-gateway"))
        .arg("dlq")
        .args(args)
        .arg("--config")
        .arg(config)
        .output()
        .unwrap();
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned()
            + &String::from_utf8_lossy(&output.stderr),
    )
}

/// The ids `dlq list` printed, in order.
fn letter_ids(list: &str) -> Vec<String> {
    list.lines()
        .filter_map(|l| l.strip_prefix("id="))
        .map(|l| l.split_whitespace().next().unwrap().to_owned())
        .collect()
}

/// Dead letters go to disk: a queued stream entry its sink refuses (400)
/// and a broadcast message a sink without a queue refuses, each with the
/// status and the body's excerpt, its origin and attempts. `dlq list`
/// and `show` read them from a running gateway, and after a SIGKILL, from
/// the stopped one; they survive the restart; `replay` sends one to its
/// sink again under its message's key and removes it; `purge` empties the
/// rest.
#[test]
fn dead_letters_on_disk_survive_a_restart_and_are_listed_shown_replayed_and_purged() {
    let server = RedisServer::start().expect("redis-server");
    let receiver = guard_testkit::HttpReceiver::start().expect("receiver");
    let dir = tempfile::tempdir().unwrap();
    let queue = dir.path().join("queue");
    let metrics = free_port().unwrap();
    let mut text = queued_config(
        &server.url(),
        metrics,
        &receiver.url("/ingest"),
        &queue,
        &dir.path().join("dead-letters"),
        "sync_ms = 100",
    );
    text.push_str(&format!(
        "\n[[sinks]]\nname = \"direct\"\nkind = \"http\"\nurl = \"{}\"\nretries = 0\n\n[[endpoints]]\nname = \"alerts\"\nkind = \"redis-pubsub\"\npatterns = [\"alerts.*\"]\nto = \"direct\"\n",
        receiver.url("/ingest")
    ));
    let (_config_dir, path) = written(&text);
    let lines: Lines = Arc::default();
    let gateway = start(0, &path, &lines);
    assert!(ready(metrics), "the gateway became ready");
    let mut conn = pattern_subscribed(&server);
    use guard_testkit::Answer;
    receiver.script([Answer::status(400).with_body("{\"error\":\"no such sensor\"}")]);
    let entry: String = redis::cmd("XADD")
        .arg("orders")
        .arg("*")
        .arg("payload")
        .arg("o1")
        .query(&mut conn)
        .unwrap();
    let dead_lettered = |prefix: &str| {
        lines
            .lock()
            .unwrap()
            .iter()
            .any(|(_, _, l)| l.starts_with(prefix))
    };
    assert!(
        wait_for(SETTLE, || dead_lettered("dead-lettered sink=uplink")),
        "{:?}",
        lines.lock().unwrap()
    );
    receiver.script([Answer::status(400).with_body("bad alert")]);
    let _: i64 = redis::cmd("PUBLISH")
        .arg("alerts.fire")
        .arg("a1")
        .query(&mut conn)
        .unwrap();
    assert!(
        wait_for(SETTLE, || dead_lettered("dead-lettered endpoint=alerts")),
        "{:?}",
        lines.lock().unwrap()
    );
    let (status, list) = dlq(&["list"], &path);
    assert_eq!(status, Some(0), "{list}");
    let ids = letter_ids(&list);
    assert_eq!(ids.len(), 2, "{list}");
    let first = list.lines().next().unwrap();
    assert!(
        first.contains("sink=uplink")
            && first.contains("attempts=1")
            && first.contains("HTTP 400")
            && first.contains("no such sensor"),
        "{first}"
    );
    let second = list.lines().nth(1).unwrap();
    assert!(
        second.contains("endpoint=alerts")
            && second.contains("from=alerts.fire")
            && second.contains("bad alert"),
        "{second}"
    );
    let (status, shown) = dlq(&["show", &ids[0]], &path);
    assert_eq!(status, Some(0), "{shown}");
    assert!(
        shown.contains(&format!("message    orders:{entry}")) && shown.ends_with("o1\n"),
        "{shown}"
    );
    // Stopped hard: the letters are read from the stopped gateway's disk,
    // and are still there after a restart.
    signal(&gateway, "KILL");
    drop(gateway);
    let (_, stopped) = dlq(&["list"], &path);
    assert_eq!(letter_ids(&stopped), ids, "{stopped}");
    let _gateway = start(1, &path, &lines);
    assert!(ready(metrics), "the gateway became ready again");
    assert!(wait_for(SETTLE, || dead_lettered("dead-letters dir=")));
    let before = receiver.requests().len();
    let (status, replayed) = dlq(&["replay", &ids[0]], &path);
    assert_eq!(status, Some(0), "{replayed}");
    let requests = receiver.requests();
    let sent = &requests[before..];
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(sent[0].body, b"o1");
    assert_eq!(
        sent[0].header("idempotency-key"),
        Some(format!("orders:{entry}").as_str())
    );
    let (_, left) = dlq(&["list"], &path);
    assert_eq!(letter_ids(&left), ids[1..], "{left}");
    // The Pub/Sub letter keeps the fence the killed gateway read it under;
    // once the new one leads under a higher fence, a replay keeps it (the
    // new leader may have handled the same message) unless forced.
    let fence: u64 = left
        .lines()
        .next()
        .and_then(|l| l.split(" fence=").nth(1))
        .and_then(|f| f.split(' ').next())
        .and_then(|f| f.parse().ok())
        .unwrap_or_else(|| panic!("a letter read under a lease shows its fence: {left}"));
    let granted_since = || {
        let mut conn = redis::Client::open(server.url())
            .unwrap()
            .get_connection()
            .unwrap();
        let counters: Vec<String> = redis::cmd("KEYS").arg("fence:*").query(&mut conn).unwrap();
        counters.iter().any(|counter| {
            let value: Option<u64> = redis::cmd("GET").arg(counter).query(&mut conn).unwrap();
            value.is_some_and(|v| v > fence)
        })
    };
    assert!(
        wait_for(SETTLE, granted_since),
        "the lease was never granted again"
    );
    let (status, kept) = dlq(&["replay", &ids[1]], &path);
    assert_eq!(status, Some(1), "{kept}");
    assert!(
        kept.contains(&format!(
            "not replayed: read under fence {fence}, below the last fence"
        )) && kept.contains("--force"),
        "{kept}"
    );
    let before = receiver.requests().len();
    let (status, forced) = dlq(&["replay", "--force", &ids[1]], &path);
    assert_eq!(status, Some(0), "{forced}");
    let requests = receiver.requests();
    let sent = &requests[before..];
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(sent[0].body, b"a1");
    assert_eq!(
        sent[0].header("guard-fence"),
        Some(fence.to_string().as_str())
    );
    let (status, unknown) = dlq(&["replay", "12345"], &path);
    assert_eq!(status, Some(1), "{unknown}");
    assert!(unknown.contains("no dead letter 12345"), "{unknown}");
    let (status, purged) = dlq(&["purge", "--all"], &path);
    assert_eq!(status, Some(0), "{purged}");
    assert!(purged.contains("purged 0"), "{purged}");
    let (_, empty) = dlq(&["list"], &path);
    assert!(letter_ids(&empty).is_empty(), "{empty}");
}

/// A stream endpoint forwarding to an MQTT broker (`kind = "mqtt"`): each
/// entry is published at QoS 1 with its payload and, as MQTT 5 user
/// properties, its entry's `Idempotency-Key` and its origin (the stream);
/// the entries are acknowledged at the stream once the broker took them.
#[test]
fn a_stream_forwarded_to_an_mqtt_broker_arrives_with_its_key_as_a_user_property() {
    use rumqttc::v5::mqttbytes::QoS;
    use rumqttc::v5::mqttbytes::v5::Packet;
    use rumqttc::v5::{AsyncClient, Event, MqttOptions};
    let server = RedisServer::start().expect("redis-server");
    let broker = Mosquitto::start().expect("mosquitto");
    // Each publish: its payload and its user properties.
    type Published = (Vec<u8>, Vec<(String, String)>);
    let arrived: Arc<Mutex<Vec<Published>>> = Arc::default();
    let subscribed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    {
        let (arrived, subscribed, port) = (arrived.clone(), subscribed.clone(), broker.port());
        thread::spawn(move || {
            let (client, mut events) =
                AsyncClient::new(MqttOptions::new("bridge-check", "127.0.0.1", port), 16);
            futures_lite::future::block_on(async_compat::Compat::new(async {
                loop {
                    match events.poll().await {
                        Ok(Event::Incoming(Packet::ConnAck(_))) => {
                            client.subscribe("cloud/#", QoS::AtLeastOnce).await.unwrap();
                        }
                        Ok(Event::Incoming(Packet::SubAck(_))) => {
                            subscribed.store(true, std::sync::atomic::Ordering::SeqCst);
                        }
                        Ok(Event::Incoming(Packet::Publish(p))) => {
                            let properties =
                                p.properties.map(|p| p.user_properties).unwrap_or_default();
                            arrived
                                .lock()
                                .unwrap()
                                .push((p.payload.to_vec(), properties));
                        }
                        Ok(_) => {}
                        Err(_) => return,
                    }
                }
            }));
        });
    }
    assert!(wait_for(SETTLE, || subscribed
        .load(std::sync::atomic::Ordering::SeqCst)));
    let (_dir, path) = written(&format!(
        "{}\n[[sinks]]\nname = \"cloud\"\nkind = \"mqtt\"\nhost = \"127.0.0.1\"\nport = {}\ntopic = \"cloud/readings\"\n\n[[endpoints]]\nname = \"orders\"\nkind = \"redis-stream\"\nstream = \"orders\"\ngroup = \"uplink\"\nto = \"cloud\"\n",
        base_config(&server.url()),
        broker.port()
    ));
    let lines: Lines = Arc::default();
    let _gateway = start(0, &path, &lines);
    let sent = produce(&server, 20, 200).join().unwrap();
    assert!(
        wait_for(SETTLE, || arrived.lock().unwrap().len() >= 20),
        "{} of 20 arrived",
        arrived.lock().unwrap().len()
    );
    let arrived = arrived.lock().unwrap().clone();
    for ((payload, properties), (id, sent_payload)) in arrived.iter().zip(&sent) {
        assert_eq!(payload, sent_payload.as_bytes());
        let property = |name: &str| {
            properties
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.as_str())
        };
        let key = format!("orders:{id}");
        assert_eq!(property("Idempotency-Key"), Some(key.as_str()));
        assert_eq!(property("Guard-Origin"), Some("orders"));
    }
    let mut conn = redis::Client::open(server.url())
        .unwrap()
        .get_connection()
        .unwrap();
    assert!(wait_for(SETTLE, || pending_entries(&mut conn) == 0));
}

/// A queue at its bound (4 KiB) while the sink is down holds its source
/// back, counted; a stop then ends the held-back send at once (the
/// replica exits within seconds, the entry left pending at the stream);
/// started again with the sink back, every entry arrives.
#[test]
fn a_full_queue_holds_the_source_back_and_a_stop_ends_the_wait_at_once() {
    let server = RedisServer::start().expect("redis-server");
    let receiver = guard_testkit::HttpReceiver::start().expect("receiver");
    let port = receiver.port();
    let url = receiver.url("/ingest");
    drop(receiver.stop());
    let dir = tempfile::tempdir().unwrap();
    let queue = dir.path().join("queue");
    let metrics = free_port().unwrap();
    let text = queued_config(
        &server.url(),
        metrics,
        &url,
        &queue,
        &dir.path().join("dead-letters"),
        "max_bytes = 4096",
    );
    let (_config_dir, path) = written(&text);
    let lines: Lines = Arc::default();
    let gateway = start(0, &path, &lines);
    assert!(ready(metrics), "the gateway became ready");
    let sent = produce(&server, 200, 1000).join().unwrap();
    let held_back = || {
        let (_, text) = http_get(metrics, "/metrics");
        sample(
            &text,
            "guard_queue_full_total{name=\"uplink\",outcome=\"held_back\"}",
        )
        .unwrap_or(0.0)
    };
    assert!(wait_for(SETTLE, || held_back() >= 1.0), "never held back");
    let mut conn = redis::Client::open(server.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let (_, text) = http_get(metrics, "/metrics");
    let queued = sample(&text, "guard_queue_pending{name=\"uplink\"}").unwrap();
    assert!(queued < 200.0, "{queued} queued in 4 KiB");
    signal(&gateway, "TERM");
    let stopping = Instant::now();
    let mut gateway = gateway;
    assert!(
        wait_for(Duration::from_secs(10), || matches!(
            gateway.0.try_wait(),
            Ok(Some(_))
        )),
        "still running {:?} after the stop",
        stopping.elapsed()
    );
    assert!(
        pending_entries(&mut conn) >= 1,
        "the held-back entry is kept"
    );
    let receiver = guard_testkit::HttpReceiver::start_on(port).expect("the receiver");
    let _gateway = start(1, &path, &lines);
    assert!(
        wait_for(SETTLE, || keys_arrived(&receiver.requests()) >= sent.len()),
        "{} of {} arrived",
        keys_arrived(&receiver.requests()),
        sent.len()
    );
}

/// Sends SIGHUP to `gateway` and waits for the reload line it prints,
/// which must start with `expected`: that line.
fn reload_line(gateway: &Process, lines: &Lines, expected: &str) -> String {
    let before = lines.lock().unwrap().len();
    signal(gateway, "HUP");
    let mut line = String::new();
    let seen = wait_for(SETTLE, || {
        let all = lines.lock().unwrap();
        match all[before..]
            .iter()
            .find(|(_, _, l)| l.starts_with("reload"))
        {
            Some((_, _, l)) => {
                line = l.clone();
                true
            }
            None => false,
        }
    });
    assert!(seen, "no reload line after SIGHUP");
    assert!(line.starts_with(expected), "{line}");
    line
}

/// The lines of `lines` that start with `prefix`.
fn lines_starting(lines: &Lines, prefix: &str) -> Vec<String> {
    lines
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, _, l)| l.starts_with(prefix))
        .map(|(_, _, l)| l.clone())
        .collect()
}

/// SIGHUP reads the file again. Adding an endpoint starts it while the
/// leader of `[[active]] sensors` and the elected Pub/Sub subscriber keep
/// their leases (no demotion, the same fences); a file `check` refuses,
/// and one that changes `[locker]`, change nothing and are counted; a
/// changed endpoint restarts under a new fence and a removed one stops.
#[test]
fn a_reload_starts_what_was_added_while_leaders_keep_their_fences_and_refuses_a_bad_file() {
    let server = RedisServer::start().expect("redis-server");
    let metrics = free_port().unwrap();
    let first = base_config(&server.url())
        + &format!(
            "\n[[active]]\nname = \"sensors\"\n\n[[endpoints]]\nname = \"alerts\"\nkind = \"redis-pubsub\"\npatterns = [\"alerts.*\"]\n\n[metrics]\nprometheus = \"127.0.0.1:{metrics}\"\n"
        );
    let (_dir, path) = written(&first);
    let lines: Lines = Arc::default();
    let gateway = start(0, &path, &lines);
    assert!(ready(metrics), "/readyz never 200");
    let mut conn = redis::Client::open(server.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let mut publish = |channel: &str, payload: &str| {
        let _: i64 = redis::cmd("PUBLISH")
            .arg(channel)
            .arg(payload)
            .query(&mut conn)
            .unwrap();
    };
    // A payload published until the endpoint has handled it: its fence.
    let mut handled = |channel: &str, payload: &str| -> u64 {
        let mut fence = None;
        let got = wait_for(SETTLE, || {
            publish(channel, payload);
            thread::sleep(Duration::from_millis(100));
            fence = received_with_fences(&lines, "alerts")
                .into_iter()
                .find(|(_, _, p)| p == payload)
                .map(|(_, f, _)| f);
            fence.is_some()
        });
        assert!(got, "{payload} on {channel} never handled");
        fence.unwrap()
    };
    let lease = handled("alerts.fire", "before");
    assert!(
        wait_for(SETTLE, || !lines_starting(&lines, "promoted name=sensors")
            .is_empty()),
        "sensors never led"
    );
    let sensors = lines_starting(&lines, "promoted name=sensors");
    // The status view shows both leases led, with their fences; reading
    // it twice changes nothing.
    let led = |status: &serde_json::Value, unit: &str| -> Option<u64> {
        status["leases"]
            .as_array()?
            .iter()
            .find(|l| l["for"] == unit && l["leading"] == true)?["fence"]
            .as_u64()
    };
    let status = status_of(metrics);
    let sensors_fence: u64 = sensors[0]
        .rsplit("fence=")
        .next()
        .and_then(|f| f.parse().ok())
        .unwrap();
    assert_eq!(
        led(&status, "active:sensors"),
        Some(sensors_fence),
        "{status}"
    );
    assert_eq!(led(&status, "endpoint:alerts"), Some(lease), "{status}");
    // Each lease as Redis holds it: a key that is there.
    for held in status["leases"].as_array().unwrap() {
        let stored = held["stored_as"].as_str().unwrap();
        let mut conn = redis::Client::open(server.url())
            .unwrap()
            .get_connection()
            .unwrap();
        let there: i64 = redis::cmd("EXISTS").arg(stored).query(&mut conn).unwrap();
        assert_eq!(there, 1, "{stored} is not in Redis: {status}");
    }
    let alerts = &status["endpoints"][0];
    assert_eq!(
        (&alerts["name"], &alerts["connected"], &alerts["leading"]),
        (
            &serde_json::json!("alerts"),
            &serde_json::json!(true),
            &serde_json::json!(true)
        ),
        "{status}"
    );
    assert_eq!(status["ready"], true, "{status}");
    assert_eq!(led(&status_of(metrics), "endpoint:alerts"), Some(lease));
    let hup = |expected: &str| reload_line(&gateway, &lines, expected);

    // An endpoint added: started, everything else kept.
    let added = first.clone()
        + "\n[[endpoints]]\nname = \"orders\"\nkind = \"redis-stream\"\nstream = \"orders\"\ngroup = \"billing\"\n";
    std::fs::write(&path, &added).unwrap();
    hup("reloaded started=endpoint:orders restarted=- stopped=- failed=- kept=2");
    let mut xadd = redis::Client::open(server.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let _: String = redis::cmd("XADD")
        .arg("orders")
        .arg("*")
        .arg("payload")
        .arg("o1")
        .query(&mut xadd)
        .unwrap();
    assert!(
        wait_for(SETTLE, || !received(&lines, "orders").is_empty()),
        "the added endpoint handled nothing"
    );
    assert_eq!(
        handled("alerts.fire", "after-add"),
        lease,
        "the subscriber's lease changed"
    );

    // A file check refuses, then a change to [locker]: nothing changes.
    std::fs::write(&path, added.replace("group = \"billing\"", "group = \"\"")).unwrap();
    let refused = hup("reload-refused reason=");
    assert!(refused.contains("endpoints"), "{refused}");
    std::fs::write(
        &path,
        added.replace("request_timeout_ms = 300", "request_timeout_ms = 400"),
    )
    .unwrap();
    let refused = hup("reload-refused reason=");
    assert!(
        refused.contains("[locker]") && refused.contains("restart"),
        "{refused}"
    );
    assert_eq!(handled("alerts.fire", "after-refusals"), lease);
    let (_, body) = http_get(metrics, "/metrics");
    for (outcome, count) in [("applied", 1), ("refused", 2)] {
        let series = format!("guard_gateway_reloads_total{{outcome=\"{outcome}\"}} {count}");
        assert!(body.contains(&series), "no {series} in:\n{body}");
    }
    assert!(
        lines_starting(&lines, "demoted").is_empty(),
        "a reload demoted a leader: {:?}",
        lines_starting(&lines, "demoted")
    );
    assert_eq!(lines_starting(&lines, "promoted name=sensors"), sensors);

    // The Pub/Sub endpoint changed, the stream endpoint removed: the one
    // restarts under a new lease, the other stops; sensors is kept.
    std::fs::write(&path, first.replace("alerts.*", "alarms.*")).unwrap();
    hup("reloaded started=- restarted=endpoint:alerts stopped=endpoint:orders failed=- kept=1");
    let renewed = handled("alarms.fire", "after-change");
    assert!(
        renewed > lease,
        "fence {renewed} after a restart, {lease} before"
    );
    assert_eq!(lines_starting(&lines, "promoted name=sensors"), sensors);
    assert!(ready(metrics), "not ready after the reloads");
    let status = status_of(metrics);
    assert_eq!(
        led(&status, "active:sensors"),
        Some(sensors_fence),
        "{status}"
    );
    assert_eq!(led(&status, "endpoint:alerts"), Some(renewed), "{status}");
    let names: Vec<&str> = status["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["name"].as_str())
        .collect();
    assert_eq!(names, ["alerts"], "a removed endpoint is no longer shown");
}

/// `GET /status` on the metrics address, parsed.
fn status_of(port: u16) -> serde_json::Value {
    let (head, body) = http_get(port, "/status");
    assert!(head.contains("200"), "{head}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

/// A reload adds an endpoint whose server is down: it is named in
/// `failed=`, and `/readyz` names it with its error (not "connecting");
/// once the server is up, a reload of the same file starts it.
#[test]
fn an_endpoint_that_fails_to_start_on_a_reload_is_not_ready_with_why_and_a_reload_starts_it() {
    let server = RedisServer::start().expect("redis-server");
    let mut late = RedisServer::start().expect("redis-server");
    late.stop();
    let metrics = free_port().unwrap();
    let first = base_config(&server.url())
        + &format!(
            "\n[[active]]\nname = \"sensors\"\n\n[metrics]\nprometheus = \"127.0.0.1:{metrics}\"\n"
        );
    let (_dir, path) = written(&first);
    let lines: Lines = Arc::default();
    let gateway = start(0, &path, &lines);
    assert!(ready(metrics), "/readyz never 200");
    let reload = |expected: &str| reload_line(&gateway, &lines, expected);
    std::fs::write(
        &path,
        first.clone()
            + &format!(
                "\n[[endpoints]]\nname = \"late\"\nkind = \"redis-stream\"\nurl = \"{}\"\nstream = \"late\"\ngroup = \"g\"\n",
                late.url()
            ),
    )
    .unwrap();
    reload("reloaded started=endpoint:late restarted=- stopped=- failed=endpoint:late kept=1");
    let (status, body) = http_get(metrics, "/readyz");
    assert!(
        status.contains("503")
            && body.contains("endpoint late: stopped:")
            && !body.contains("connecting"),
        "{status} {body}"
    );

    late.restart().expect("redis-server again");
    reload("reloaded started=endpoint:late restarted=- stopped=- failed=- kept=1");
    assert!(ready(metrics), "not ready once the endpoint started");
    let mut conn = redis::Client::open(late.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let _: String = redis::cmd("XADD")
        .arg("late")
        .arg("*")
        .arg("payload")
        .arg("l1")
        .query(&mut conn)
        .unwrap();
    assert!(
        wait_for(SETTLE, || !received(&lines, "late").is_empty()),
        "the endpoint started on the second reload handled nothing"
    );
}

/// A reload whose file cannot be read (a FIFO nobody writes) does not
/// hold up a stop: SIGTERM ends the replica at once, exit 0.
#[test]
fn a_stop_is_not_held_up_by_a_reload_that_cannot_read_its_file() {
    let server = RedisServer::start().expect("redis-server");
    let metrics = free_port().unwrap();
    let (_dir, path) = written(
        &(base_config(&server.url())
            + &format!(
                "\n[[active]]\nname = \"sensors\"\n\n[metrics]\nprometheus = \"127.0.0.1:{metrics}\"\n"
            )),
    );
    let lines: Lines = Arc::default();
    let mut gateway = start(0, &path, &lines);
    assert!(ready(metrics), "/readyz never 200");
    std::fs::remove_file(&path).unwrap();
    let made = Command::new("mkfifo").arg(&path).status().expect("mkfifo");
    assert!(made.success());
    signal(&gateway, "HUP");
    thread::sleep(Duration::from_millis(300));
    signal(&gateway, "TERM");
    let stopped = wait_for(Duration::from_secs(10), || {
        matches!(gateway.0.try_wait(), Ok(Some(_)))
    });
    assert!(stopped, "SIGTERM held up by a reload reading a FIFO");
    assert!(
        gateway.0.wait().unwrap().success(),
        "a stopped replica exits 0"
    );
}
