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
/// every half of its period throughout; a reload says `RELOADING=1`,
/// then `READY=1`; a stop says `STOPPING=1`.
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
    assert!(
        reload.iter().any(|(_, d)| d.starts_with("RELOADING=1")),
        "READY=1 after a reload without RELOADING=1: {reload:?}"
    );
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
