//! `guard-gateway run` as a systemd service: the notify protocol against
//! a socket the test binds in the manager's place, and the shipped unit
//! file checked by `systemd-analyze`.

use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use guard_testkit::{KillOnDrop, Mosquitto, RedisServer, free_port};

/// Generous: a busy machine only makes a passing test slower.
const SETTLE: Duration = Duration::from_secs(60);
/// The watchdog's period given to the gateway: it must ping at least
/// every half of it.
const WATCHDOG: Duration = Duration::from_secs(2);

/// The manager's end: a datagram socket at a path of a directory of its
/// own.
struct Manager {
    socket: UnixDatagram,
    path: PathBuf,
    _dir: tempfile::TempDir,
}

impl Manager {
    fn bind() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let socket = UnixDatagram::bind(&path).unwrap();
        Manager {
            socket,
            path,
            _dir: dir,
        }
    }

    /// The next datagram and when it came, within `limit`.
    fn next(&self, limit: Duration) -> Option<(Instant, String)> {
        self.socket.set_read_timeout(Some(limit)).unwrap();
        let mut buffer = [0u8; 4096];
        let n = self.socket.recv(&mut buffer).ok()?;
        Some((
            Instant::now(),
            String::from_utf8_lossy(&buffer[..n]).into_owned(),
        ))
    }

    /// Datagrams until one says `state` (a line of it), within `limit`:
    /// all of them, that one last.
    fn until(&self, state: &str, limit: Duration) -> Vec<(Instant, String)> {
        let end = Instant::now() + limit;
        let mut seen = Vec::new();
        while let Some(left) = end.checked_duration_since(Instant::now()) {
            let Some(datagram) = self.next(left.max(Duration::from_millis(1))) else {
                break;
            };
            let done = datagram.1.lines().any(|l| l == state);
            seen.push(datagram);
            if done {
                return seen;
            }
        }
        panic!("no {state} within {limit:?}; got {seen:?}");
    }
}

fn gateway(config: &Path, manager: &Manager, metrics: u16) -> KillOnDrop {
    KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_guard-gateway"))
            .args(["run", "--replica", "svc", "--metrics"])
            .arg(format!("127.0.0.1:{metrics}"))
            .arg("--config")
            .arg(config)
            .env("NOTIFY_SOCKET", &manager.path)
            .env("WATCHDOG_USEC", WATCHDOG.as_micros().to_string())
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("guard-gateway"),
    )
}

/// `READY=1` waits for every endpoint's source to reach its server (an
/// MQTT broker not yet up holds it back, the status saying why), is sent
/// once, when `/readyz` answers 200; the watchdog is pinged at least
/// every half of its period throughout; a reload says `RELOADING=1`
/// (with `MONOTONIC_USEC=`), then `READY=1`; a stop says `STOPPING=1`.
#[test]
fn a_replica_tells_its_manager_ready_once_connected_pings_its_watchdog_and_says_stopping() {
    let redis = RedisServer::start().expect("redis-server");
    let mqtt_port = free_port().unwrap();
    let metrics = free_port().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("gateway.toml");
    std::fs::write(
        &config,
        format!(
            "[locker]\nkind = \"redis\"\nurl = \"{}\"\n\n[[endpoints]]\nname = \"telemetry\"\nkind = \"mqtt\"\nhost = \"127.0.0.1\"\nport = {mqtt_port}\nfilter = \"t/#\"\nshare_group = \"g\"\n",
            redis.url()
        ),
    )
    .unwrap();
    let manager = Manager::bind();
    let started = Instant::now();
    let mut process = gateway(&config, &manager, metrics);

    // No broker: waiting, never ready, the watchdog pinged meanwhile.
    let mut seen = manager.until("STATUS=connecting", SETTLE);
    let mut waiting = Vec::new();
    while started.elapsed() < Duration::from_secs(4) {
        if let Some(datagram) = manager.next(Duration::from_millis(500)) {
            waiting.push(datagram);
        }
    }
    assert!(
        waiting.iter().all(|(_, d)| !d.contains("READY=1")),
        "ready without its broker: {waiting:?}"
    );
    assert!(
        waiting
            .iter()
            .any(|(_, d)| d.starts_with("STATUS=waiting: endpoint telemetry")),
        "the status names the endpoint it waits for: {waiting:?}"
    );
    seen.extend(waiting);

    // The broker comes up: ready, once, as /readyz is.
    let _broker = Mosquitto::start_on(mqtt_port).expect("mosquitto");
    let until_ready = manager.until("READY=1", SETTLE);
    let ready = until_ready.last().unwrap().1.clone();
    assert!(ready.contains("STATUS=ready"), "{ready}");
    seen.extend(until_ready);
    let (status, _) = guard_testkit::http::get(metrics, "/readyz").expect("metrics endpoint");
    assert!(status.contains("200"), "READY=1 before /readyz: {status}");

    // Pings go on; then a stop.
    let pinging = Instant::now();
    while pinging.elapsed() < WATCHDOG * 2 {
        if let Some(datagram) = manager.next(Duration::from_millis(200)) {
            seen.push(datagram);
        }
    }
    // A reload (the same file): RELOADING=1, then READY=1 again.
    kill(&process, "-HUP");
    let reload = manager.until("READY=1", SETTLE);
    let reloading = reload
        .iter()
        .find(|(_, d)| d.starts_with("RELOADING=1"))
        .unwrap_or_else(|| panic!("READY=1 after a reload without RELOADING=1: {reload:?}"));
    // systemd 253 and later end a reload without the monotonic time.
    let usec: Option<u64> = reloading
        .1
        .lines()
        .find_map(|l| l.strip_prefix("MONOTONIC_USEC="))
        .and_then(|v| v.parse().ok());
    assert!(usec.is_some_and(|u| u > 0), "{reloading:?}");
    seen.extend(reload);
    kill(&process, "-TERM");
    seen.extend(manager.until("STOPPING=1", SETTLE));
    assert!(
        process.0.wait().unwrap().success(),
        "a stopped replica exits 0"
    );

    let readies = seen.iter().filter(|(_, d)| d.contains("READY=1")).count();
    assert_eq!(
        readies, 2,
        "READY=1 once, and once after the reload: {seen:?}"
    );
    let pings: Vec<Instant> = seen
        .iter()
        .filter(|(_, d)| d == "WATCHDOG=1")
        .map(|(at, _)| *at)
        .collect();
    assert!(pings.len() >= 4, "{} pings: {seen:?}", pings.len());
    let widest = pings
        .windows(2)
        .map(|w| w[1] - w[0])
        .max()
        .unwrap_or_default();
    // The manager restarts a service silent for a whole period; the
    // gateway aims at half of it, this allows the rest to a busy machine.
    assert!(widest < WATCHDOG, "a gap of {widest:?} between pings");
}

/// Sends `signal` (`-HUP`, `-TERM`) to `process`.
fn kill(process: &KillOnDrop, signal: &str) {
    let sent = Command::new("kill")
        .arg(signal)
        .arg(process.0.id().to_string())
        .status()
        .expect("kill");
    assert!(sent.success(), "kill {signal}");
}

/// A `NOTIFY_SOCKET` the gateway cannot use stops it at start, naming
/// the variable.
#[test]
fn a_notify_socket_that_is_no_address_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("gateway.toml");
    std::fs::write(&config, "[[schedules]]\nrouter = \"r\"\nevery_ms = 1000\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_guard-gateway"))
        .args(["run", "--config"])
        .arg(&config)
        .env("NOTIFY_SOCKET", "vsock:2:1234")
        .output()
        .expect("guard-gateway");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("NOTIFY_SOCKET"), "{err}");
}

/// The shipped unit verifies, is `Type=notify` with a watchdog, reloads
/// with SIGHUP, runs as
/// its own user with no new privileges and nothing writable but its state
/// directory, and scores at most 2.0 ("OK") in systemd's own exposure
/// check.
#[test]
fn the_shipped_unit_verifies_and_is_hardened() {
    let unit = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/dist/guard-gateway.service"
    ))
    .unwrap();
    for line in [
        "Type=notify",
        "NotifyAccess=main",
        "WatchdogSec=30s",
        "DynamicUser=yes",
        "StateDirectory=guard-gateway",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "CapabilityBoundingSet=",
        "ExecReload=/bin/kill -HUP $MAINPID",
    ] {
        assert!(unit.lines().any(|l| l == line), "{line} missing");
    }
    // verify wants the program to exist: this build's, in its place.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("guard-gateway.service");
    std::fs::write(
        &path,
        unit.replace(
            "/usr/local/bin/guard-gateway",
            env!("CARGO_BIN_EXE_guard-gateway"),
        ),
    )
    .unwrap();
    let verify = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .output()
        .expect("systemd-analyze (Debian's systemd)");
    assert!(
        verify.status.success() && verify.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&verify.stderr)
    );
    let security = Command::new("systemd-analyze")
        .args(["security", "--offline=yes", "--threshold=20"])
        .arg(&path)
        .output()
        .expect("systemd-analyze");
    let report = String::from_utf8_lossy(&security.stdout);
    assert!(
        security.status.success(),
        "exposure above 2.0: {report}{}",
        String::from_utf8_lossy(&security.stderr)
    );
}

/// Every metric name (`guard_…`) in `text`.
fn metric_names(text: &str) -> std::collections::BTreeSet<String> {
    let mut names = std::collections::BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("guard_") {
        let name: String = rest[at..]
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
            .collect();
        rest = &rest[at + name.len()..];
        names.insert(name);
    }
    names
}

/// A configuration's `[locker]` section on `redis`.
fn redis_locker(redis: &RedisServer) -> String {
    format!("[locker]\nkind = \"redis\"\nurl = \"{}\"\n", redis.url())
}

/// `guard-gateway run --config config` with `env`, its output discarded.
fn quiet_gateway(config: &Path, env: &[(&str, &str)]) -> KillOnDrop {
    KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_guard-gateway"))
            .args(["run", "--config"])
            .arg(config)
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("guard-gateway"),
    )
}

/// The shipped Grafana dashboard and Prometheus rules query only families
/// a live gateway exports from its start (a replica leading, a limiter in
/// memory and one on Redis, a sink's queue and dead letters on disk
/// configured) or, for the latency histograms, once a message passed
/// (one on each stream); every alert the
/// operating guide lists is there; `promtool check rules` and `promtool
/// test rules` (the rules' own unit tests) pass.
#[test]
fn the_dashboard_and_alert_rules_query_what_a_live_gateway_exports_and_pass_promtool() {
    let dist = Path::new(env!("CARGO_MANIFEST_DIR")).join("dist");
    let rules = dist.join("prometheus/guard-gateway.rules.yml");
    let rules_text = std::fs::read_to_string(&rules).unwrap();
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dist.join("grafana/guard-gateway.json")).unwrap(),
    )
    .unwrap();
    let mut queried = String::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            queried.push_str(target["expr"].as_str().unwrap());
            queried.push('\n');
        }
    }
    for variable in dashboard["templating"]["list"].as_array().unwrap() {
        if let Some(query) = variable["query"]["query"].as_str() {
            queried.push_str(query);
            queried.push('\n');
        }
    }
    for line in rules_text.lines() {
        if let Some(expr) = line.trim().strip_prefix("expr:") {
            queried.push_str(expr);
            queried.push('\n');
        }
    }
    let alerts: Vec<&str> = rules_text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
        .collect();
    for needed in [
        "GuardLeaseWithoutLeader",
        "GuardRenewalsFailing",
        "GuardDeadLettersGrowing",
        "GuardQueueNearFull",
        "GuardReloadRefused",
        "GuardLimiterTableNearCapacity",
    ] {
        assert!(alerts.contains(&needed), "{needed} missing from {alerts:?}");
    }

    // A gateway with everything those queries are about.
    let redis = RedisServer::start().expect("redis-server");
    let receiver = guard_testkit::HttpReceiver::start().expect("receiver");
    let metrics = free_port().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("gateway.toml");
    std::fs::write(
        &config,
        format!(
            r#"{locker}
[[schedules]]
router = "heartbeat"
every_ms = 1000

[[active]]
name = "sensors"

[ratelimit]
enabled = true
[ratelimit.policies.uplink]
algorithm = "token-bucket"
capacity = 100
rate_per_second = 100
[ratelimit.policies.shared]
algorithm = "token-bucket"
backend = "redis"
capacity = 100
rate_per_second = 100

[dead_letters]
dir = "{letters}"

[[sinks]]
name = "uplink"
kind = "http"
url = "{uplink}"

[sinks.queue]
dir = "{queue}"

[[endpoints]]
name = "orders"
kind = "redis-stream"
stream = "orders"
group = "billing"
limit = "uplink"
to = "uplink"

[[endpoints]]
name = "events"
kind = "redis-stream"
stream = "events"
group = "audit"
limit = "shared"

[metrics]
prometheus = "127.0.0.1:{metrics}"
"#,
            locker = redis_locker(&redis),
            letters = dir.path().join("dead-letters").display(),
            uplink = receiver.url("/ingest"),
            queue = dir.path().join("queue").display(),
        ),
    )
    .unwrap();
    let _gateway = quiet_gateway(&config, &[("RUST_LOG", "warn")]);
    let exported = |name: &str, text: &str| {
        text.lines()
            .any(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
    };
    let wanted = metric_names(&queried);
    assert!(wanted.len() >= 19, "{wanted:?}");
    let mut text = String::new();
    let all_there = guard_testkit::holds_within(SETTLE, || {
        // Messages on each stream until they show (the first may come
        // before the gateway made its group): the latency histograms of
        // handling, a sink's send and a shared limiter's decision.
        for stream in ["orders", "events"] {
            redis
                .command(&format!("XADD {stream} * payload hello"))
                .ok();
        }
        text = guard_testkit::http::get(metrics, "/metrics")
            .map(|(_, body)| body)
            .unwrap_or_default();
        wanted.iter().all(|name| exported(name, &text))
    });
    let missing: Vec<&String> = wanted.iter().filter(|n| !exported(n, &text)).collect();
    assert!(all_there, "queried, not exported: {missing:?}\n{text}");

    let promtool = guard_testkit::binary("promtool", "prometheus").expect("promtool");
    for args in [
        ["check", "rules", "guard-gateway.rules.yml"],
        ["test", "rules", "guard-gateway.rules.test.yml"],
    ] {
        let out = Command::new(&promtool)
            .args(args)
            .current_dir(dist.join("prometheus"))
            .output()
            .expect("promtool");
        assert!(
            out.status.success(),
            "promtool {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// With the `otel` feature and `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` set,
/// the gateway's spans reach an OpenTelemetry collector: OTLP over HTTP,
/// protobuf, as service `guard-gateway`, with a lease's acquisition (its
/// key) and a sink's send (the message's id). The batch is held far
/// longer than the test runs, so what arrives was sent by the stop.
#[cfg(feature = "otel")]
#[test]
fn spans_reach_an_opentelemetry_collector_and_the_last_are_sent_at_the_stop() {
    let redis = RedisServer::start().expect("redis-server");
    // The collector and the sink's receiver in one.
    let receiver = guard_testkit::HttpReceiver::start().expect("receiver");
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("gateway.toml");
    std::fs::write(
        &config,
        format!(
            r#"{locker}
[[active]]
name = "sensors"

[[sinks]]
name = "uplink"
kind = "http"
url = "{uplink}"

[[endpoints]]
name = "orders"
kind = "redis-stream"
stream = "orders"
group = "billing"
to = "uplink"
"#,
            locker = redis_locker(&redis),
            uplink = receiver.url("/ingest"),
        ),
    )
    .unwrap();
    let collector = receiver.url("/v1/traces");
    let mut gateway = quiet_gateway(
        &config,
        &[
            ("RUST_LOG", "info,guard_endpoints=debug"),
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", &collector),
            ("OTEL_BSP_SCHEDULE_DELAY", "600000"),
        ],
    );
    let mut polls = 0;
    let forwarded = guard_testkit::holds_within(SETTLE, || {
        // An entry every 200 ms until one arrives: the first ones may
        // come before the gateway made its group (from the stream's end).
        if polls % 10 == 0 {
            redis.command("XADD orders * payload hello").ok();
        }
        polls += 1;
        receiver.requests().iter().any(|r| r.path == "/ingest")
    });
    assert!(
        forwarded,
        "the entry reached the sink: {:?}",
        receiver.requests()
    );
    kill(&gateway, "-TERM");
    assert!(
        gateway.0.wait().unwrap().success(),
        "a stopped replica exits 0"
    );

    let exported: Vec<u8> = receiver
        .requests()
        .into_iter()
        .filter(|r| r.method == "POST" && r.path == "/v1/traces")
        .inspect(|r| {
            assert_eq!(r.header("content-type"), Some("application/x-protobuf"));
        })
        .flat_map(|r| r.body)
        .collect();
    let holds = |what: &str| exported.windows(what.len()).any(|w| w == what.as_bytes());
    for expected in [
        "guard-gateway",
        "acquire",
        "sensors",
        "send",
        "uplink",
        "handle",
    ] {
        assert!(holds(expected), "{expected:?} not in the exported spans");
    }
    let sent = receiver
        .requests()
        .into_iter()
        .find(|r| r.path == "/ingest")
        .and_then(|r| r.header("idempotency-key").map(str::to_owned))
        .expect("the message's id");
    assert!(
        holds(&sent),
        "the send of {sent:?} not in the exported spans"
    );
}
