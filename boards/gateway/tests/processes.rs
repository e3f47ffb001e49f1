//! Three `guard-gateway run` processes against a real redis-server.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use guard_redis::testkit::{RedisServer, free_port};

const TTL_MS: u64 = 2_000;
const INTERVAL_MS: u64 = 250;

type Lines = Arc<Mutex<Vec<(usize, Instant, String)>>>;

fn config(dir: &std::path::Path, redis: &str, metrics: Option<u16>) -> std::path::PathBuf {
    let mut text = format!(
        r#"
[locker]
kind = "redis"
url = "{redis}"
request_timeout_ms = 300

[guards]
owner = "it"
active_ttl_ms = {TTL_MS}
active_interval_ms = {INTERVAL_MS}

[[schedules]]
router = "heartbeat"
every_ms = 1000

[[active]]
name = "sensors"
"#
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
        .args(["run", "--config"])
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
    guard_std::config::FileConfig::from_path(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("gateway.toml"),
    )
    .expect("gateway.toml");
}
