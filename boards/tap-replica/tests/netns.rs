//! End-to-end tests in a network namespace this test creates: a bridge,
//! one TAP device per replica (each with its own MAC) and a redis-server
//! inside it.
//!
//! - Three `guard-tap-replica` processes on embassy-net: the leader is
//!   killed, then Redis drops every client connection.
//! - The firmware image `net-replica` (boards/mps2-an386) under QEMU on
//!   its emulated LAN9118, beside two host replicas: the firmware leads and
//!   is killed, a host replica takes over; the firmware starts again as a
//!   standby and takes over when the host leader is killed.
//! - The firmware image `tls-locker` takes and releases a lock over TLS
//!   1.3, the server's certificate checked against the CA, and refuses a
//!   server another CA signed.
//!
//! Checks: one leader at a time as the protected resource judges by
//! fences (every write accepted, fences in order, none refused), takeover
//! within ttl + interval, every heartbeat slot run once. The Redis asks
//! for a password: the host replicas send the default user's
//! (`requirepass`), the firmware an ACL user's, and a firmware with a
//! wrong one stops at start with Redis's reason.
//!
//! Needs root (namespaces, TAP devices), so both are ignored by a plain
//! `cargo test` and reported as such, never as passed; the test script
//! runs them with `--ignored` as root. Asked for without root, they fail
//! with a message saying so. The namespace, its devices and every process
//! started are removed at the end, also on failure.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

const TTL_MS: u64 = 2_000;
const INTERVAL_MS: u64 = 250;
/// On top of ttl + interval, a takeover as the test sees it includes the
/// winning acquire's round trip and its log line's way to the test (QEMU's
/// semihosting, a pipe): the slack allowed for those.
const OBSERVED_SLACK_MS: u64 = 200;
const EVERY_MS: u64 = 1_000;
const SUBNET: &str = "10.77.0";
const REDIS_PORT: u16 = 6379;
/// The same Redis's TLS port, its certificate for `localhost` signed by
/// the test's CA.
const REDIS_TLS_PORT: u16 = 6380;
/// The namespace's Redis asks for a password (`requirepass`), which the
/// host replicas and the harness send; the firmware authenticates as an
/// ACL user of its own.
const HOST_PASSWORD: &str = "host-secret";
const FW_USER: &str = "fw";
const FW_PASSWORD: &str = "fw-secret";

type Lines = Arc<Mutex<Vec<(usize, Instant, String)>>>;

/// The namespace and what runs in it; all of it goes away on drop.
struct Namespace {
    name: String,
    children: Vec<Option<Child>>,
}

impl Namespace {
    fn create() -> Namespace {
        // Unique per test of this process (tests may run in parallel).
        static CREATED: AtomicUsize = AtomicUsize::new(0);
        let n = CREATED.fetch_add(1, Ordering::Relaxed);
        let name = format!("guard-e2e-{}-{n}", std::process::id());
        run(&["ip", "netns", "add", &name]);
        Namespace {
            name,
            children: Vec::new(),
        }
    }

    /// Runs a command inside the namespace, failing the test if it fails.
    fn exec(&self, args: &[&str]) {
        let mut full = vec!["ip", "netns", "exec", &self.name];
        full.extend_from_slice(args);
        run(&full);
    }

    /// Starts a process inside the namespace; its index in `children`.
    fn spawn(&mut self, args: &[&str], stdout: Stdio) -> usize {
        let child = Command::new("ip")
            .args(["netns", "exec", &self.name])
            .args(args)
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{args:?}: {e}"));
        self.children.push(Some(child));
        self.children.len() - 1
    }

    /// Runs a command inside the namespace; whether it succeeded.
    fn succeeds(&self, args: &[&str]) -> bool {
        Command::new("ip")
            .args(["netns", "exec", &self.name])
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    /// Stops a process with SIGTERM (a clean shutdown) and waits for it.
    fn terminate(&mut self, index: usize) {
        if let Some(mut child) = self.children[index].take() {
            let pid = child.id().to_string();
            let _ = Command::new("kill").args(["-TERM", &pid]).status();
            let _ = child.wait();
        }
    }

    /// Waits up to `within` for a process to exit; its status, if it did.
    fn wait_exit(&mut self, index: usize, within: Duration) -> Option<std::process::ExitStatus> {
        let start = Instant::now();
        while start.elapsed() < within {
            if let Some(status) = self.children[index].as_mut()?.try_wait().ok()? {
                self.children[index] = None;
                return Some(status);
            }
            thread::sleep(Duration::from_millis(50));
        }
        None
    }

    /// Kills a process by its PID (`ip netns exec` execs the command).
    fn kill(&mut self, index: usize) {
        if let Some(mut child) = self.children[index].take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Namespace {
    fn drop(&mut self) {
        for index in 0..self.children.len() {
            self.kill(index);
        }
        // Deleting the namespace removes its bridge and TAP devices.
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

fn run(args: &[&str]) {
    let status = Command::new(args[0])
        .args(&args[1..])
        .stdout(Stdio::null())
        .status()
        .unwrap_or_else(|e| panic!("{args:?}: {e}"));
    assert!(status.success(), "{args:?} failed: {status}");
}

fn redis_cli(ns: &Namespace, args: &[&str]) -> String {
    let output = Command::new("ip")
        .args(["netns", "exec", &ns.name, "redis-cli", "-h"])
        .arg(format!("{SUBNET}.1"))
        .args(["-p", &REDIS_PORT.to_string()])
        .args(["-a", HOST_PASSWORD, "--no-auth-warning"])
        .args(args)
        .output()
        .expect("redis-cli");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn is_root() -> bool {
    // The workspace forbids unsafe code, so not libc::geteuid: ask `id`.
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

/// The TAP device, MAC and IPv4 address of replica `id`.
fn identity(id: usize) -> (String, String, String) {
    (
        format!("tap{id}"),
        format!("02:00:00:00:00:{:02x}", id + 1),
        format!("{SUBNET}.{}/24", 10 + id),
    )
}

/// Creates the namespace: a bridge at `SUBNET.1`, `taps` TAP devices on
/// it, and a redis-server there (its directory removed with the guard),
/// also on [`REDIS_TLS_PORT`] with `tls`' server certificate if given.
fn namespace_with_redis(
    taps: usize,
    tls: Option<&guard_testkit::TestCerts>,
) -> (Namespace, tempfile::TempDir) {
    assert!(
        is_root(),
        "this test creates a network namespace and TAP devices and needs root"
    );
    let ns = Namespace::create();
    ns.exec(&["ip", "link", "set", "lo", "up"]);
    ns.exec(&["ip", "link", "add", "br0", "type", "bridge"]);
    ns.exec(&["ip", "addr", "add", &format!("{SUBNET}.1/24"), "dev", "br0"]);
    ns.exec(&["ip", "link", "set", "br0", "up"]);
    for id in 0..taps {
        let (tap, _, _) = identity(id);
        ns.exec(&["ip", "tuntap", "add", "dev", &tap, "mode", "tap"]);
        ns.exec(&["ip", "link", "set", &tap, "master", "br0"]);
        ns.exec(&["ip", "link", "set", &tap, "up"]);
    }
    let mut ns = ns;
    let dir = tempfile::tempdir().unwrap();
    let tls_args: Vec<String> = tls
        .map(|certs| {
            vec![
                "--tls-port".into(),
                REDIS_TLS_PORT.to_string(),
                "--tls-cert-file".into(),
                certs.server_cert_path().display().to_string(),
                "--tls-key-file".into(),
                certs.server_key_path().display().to_string(),
                "--tls-ca-cert-file".into(),
                certs.ca_path().display().to_string(),
                "--tls-auth-clients".into(),
                "no".into(),
            ]
        })
        .unwrap_or_default();
    let (bind, port, password) = (
        format!("{SUBNET}.1"),
        REDIS_PORT.to_string(),
        format!(">{FW_PASSWORD}"),
    );
    let server: Vec<&str> = [
        "redis-server",
        "--bind",
        &bind,
        "--port",
        &port,
        "--protected-mode",
        "no",
        "--save",
        "",
        "--appendonly",
        "no",
        "--dir",
        dir.path().to_str().unwrap(),
        "--requirepass",
        HOST_PASSWORD,
        "--user",
        FW_USER,
        "on",
        &password,
        "~*",
        "&*",
        "+@all",
    ]
    .into_iter()
    .chain(tls_args.iter().map(String::as_str))
    .collect();
    ns.spawn(&server, Stdio::null());
    let start = Instant::now();
    while redis_cli(&ns, &["PING"]).trim() != "PONG" {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "redis-server did not start"
        );
        thread::sleep(Duration::from_millis(50));
    }
    (ns, dir)
}

/// Starts `command` in the namespace as replica `id`, its stdout lines
/// collected into `lines`; its index in the namespace's children.
fn collect(ns: &mut Namespace, id: usize, command: &[&str], lines: &Lines) -> usize {
    let index = ns.spawn(command, Stdio::piped());
    let stdout = ns.children[index].as_mut().unwrap().stdout.take().unwrap();
    let lines = lines.clone();
    thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            lines.lock().unwrap().push((id, Instant::now(), line));
        }
    });
    index
}

/// Starts host replica `id` (`guard-tap-replica` on `tap<id>`), with
/// `extra` options.
fn host_replica(ns: &mut Namespace, id: usize, extra: &[&str], lines: &Lines) -> usize {
    let (tap, mac, ip) = identity(id);
    let redis = format!("{SUBNET}.1:{REDIS_PORT}");
    let name = format!("r{id}");
    let (ttl, interval, every) = (
        TTL_MS.to_string(),
        INTERVAL_MS.to_string(),
        EVERY_MS.to_string(),
    );
    let command = [
        env!("CARGO_BIN_EXE_guard-tap-replica"),
        "--tap",
        &tap,
        "--mac",
        &mac,
        "--ip",
        &ip,
        "--redis",
        &redis,
        "--name",
        &name,
        "--ttl-ms",
        &ttl,
        "--interval-ms",
        &interval,
        "--every-ms",
        &every,
        "--redis-password",
        HOST_PASSWORD,
    ];
    let command: Vec<&str> = command.iter().chain(extra).copied().collect();
    collect(ns, id, &command, lines)
}

/// The firmware image `name`, built by `cargo build --release` in
/// boards/mps2-an386 (the test script does so before this test).
fn firmware_image(name: &str) -> String {
    let path = format!(
        "{}/../mps2-an386/target/thumbv7em-none-eabihf/release/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    assert!(
        std::path::Path::new(&path).exists(),
        "{path} is missing: build it with `cd boards/mps2-an386 && cargo build --release`"
    );
    path
}

/// Starts the firmware as replica `id` under QEMU on `tap<id>`,
/// authenticating as the ACL user `FW_USER` with `password`, with `extra`
/// options.
fn firmware_replica(
    ns: &mut Namespace,
    id: usize,
    image: &str,
    password: &str,
    extra: &str,
    lines: &Lines,
) -> usize {
    let (_, _, ip) = identity(id);
    let append = format!(
        "--name fw{id} --ip {ip} --redis {SUBNET}.1:{REDIS_PORT} --ttl-ms {TTL_MS} --interval-ms {INTERVAL_MS} --every-ms {EVERY_MS} --redis-user {FW_USER} --redis-password {password} {extra}"
    );
    firmware(ns, id, image, &append, lines)
}

/// Starts firmware `image` under QEMU on `tap<id>` with the command line
/// `append`.
fn firmware(ns: &mut Namespace, id: usize, image: &str, append: &str, lines: &Lines) -> usize {
    let (tap, mac, _) = identity(id);
    let nic = format!("tap,ifname={tap},script=no,downscript=no,mac={mac}");
    let command = [
        "qemu-system-arm",
        "-cpu",
        "cortex-m4",
        "-machine",
        "mps2-an386",
        "-nographic",
        "-monitor",
        "none",
        "-serial",
        "none",
        "-semihosting-config",
        "enable=on,target=native",
        "-nic",
        &nic,
        "-kernel",
        image,
        "-append",
        append,
    ];
    collect(ns, id, &command, lines)
}

fn promotions(lines: &Lines) -> Vec<(usize, Instant, u64)> {
    lines
        .lock()
        .unwrap()
        .iter()
        .filter_map(|(id, t, l)| {
            let fence = l.strip_prefix("promoted ")?.split("fence=").nth(1)?;
            Some((*id, *t, fence.trim().parse().ok()?))
        })
        .collect()
}

/// Waits until a replica other than those in `not` is promoted after
/// `since`; that replica, when, and its fence.
fn next_leader(
    lines: &Lines,
    since: Instant,
    not: &[usize],
    within: Duration,
) -> (usize, Instant, u64) {
    let start = Instant::now();
    loop {
        let after: Vec<_> = promotions(lines)
            .into_iter()
            .filter(|(id, t, _)| !not.contains(id) && *t > since)
            .collect();
        match after.as_slice() {
            [one] => return *one,
            [] if start.elapsed() < within => thread::sleep(Duration::from_millis(20)),
            _ => panic!(
                "expected one new leader within {within:?}: {:?}",
                lines.lock().unwrap()
            ),
        }
    }
}

/// The resource's accepted writes as (fence, replica), checked: fences
/// never go back and each fence is one replica's.
fn resource_log(ns: &Namespace) -> BTreeMap<u64, String> {
    let log = redis_cli(ns, &["LRANGE", "{guard:resource}:log", "0", "-1"]);
    let mut owner: BTreeMap<u64, String> = BTreeMap::new();
    let mut last = 0;
    for entry in log.lines().filter(|l| !l.trim().is_empty()) {
        let (fence, who) = entry.trim().split_once(' ').expect("fence and replica");
        let fence: u64 = fence.parse().unwrap();
        assert!(fence >= last, "fence {fence} accepted after {last}");
        last = fence;
        let holder = owner.entry(fence).or_insert_with(|| who.to_owned());
        assert_eq!(holder, who, "fence {fence} used by two replicas");
    }
    owner
}

/// Every heartbeat slot seen ran exactly once, none missed between the
/// first and the last; how many there were.
fn each_slot_once(lines: &Lines) -> usize {
    let mut slots: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
    for (id, _, line) in lines.lock().unwrap().iter() {
        if let Some(rest) = line.strip_prefix("executed ") {
            let slot = rest
                .split("slot=")
                .nth(1)
                .unwrap()
                .split_whitespace()
                .next()
                .unwrap();
            slots.entry(slot.parse().unwrap()).or_default().push(*id);
        }
    }
    assert!(slots.len() >= 8, "{slots:?}");
    assert!(
        slots.values().all(|r| r.len() == 1),
        "a slot ran twice: {slots:?}"
    );
    let (first_slot, last_slot) = (*slots.keys().next().unwrap(), *slots.keys().last().unwrap());
    assert_eq!(
        slots.len() as u64,
        (last_slot - first_slot) / EVERY_MS + 1,
        "a slot was missed: {slots:?}"
    );
    slots.len()
}

#[test]
#[ignore = "needs root: run as root with `cargo test -p guard-tap-replica --test netns -- --ignored`"]
fn three_tap_replicas_one_leader_at_a_time_takeover_and_each_slot_once() {
    let (mut ns, _dir) = namespace_with_redis(3, None);
    let lines: Lines = Arc::default();
    let replicas: Vec<usize> = (0..3)
        .map(|id| host_replica(&mut ns, id, &[], &lines))
        .collect();
    thread::sleep(Duration::from_millis(5_000));
    let first = promotions(&lines);
    assert_eq!(
        first.len(),
        1,
        "one leader among three: {:?}",
        lines.lock().unwrap()
    );
    let (leader, _, first_fence) = first[0];

    let killed_at = Instant::now();
    ns.kill(replicas[leader]); // SIGKILL: no release, the lease must expire
    let (_, promoted_at, second_fence) = next_leader(
        &lines,
        killed_at,
        &[leader],
        Duration::from_millis(TTL_MS + INTERVAL_MS + 2_500),
    );
    let takeover = promoted_at.duration_since(killed_at);
    assert!(
        takeover <= Duration::from_millis(TTL_MS + INTERVAL_MS + OBSERVED_SLACK_MS),
        "took over after {takeover:?}, more than ttl + interval"
    );
    assert!(second_fence > first_fence);
    thread::sleep(Duration::from_millis(1_000));

    // The resource's log so far: exactly the two leaders' fences.
    let log_before = resource_log(&ns);

    // Redis drops every client connection just after a slot was run. The
    // replicas reconnect (the locker's and the resource's links). A failed
    // renewal demotes (the guard's rule), so the lease may pass on, with a
    // higher fence: the resource must still see one leader at a time, and
    // no slot may be lost.
    let executed = |lines: &Lines| {
        lines
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, _, l)| l.starts_with("executed "))
            .count()
    };
    let before = executed(&lines);
    let start = Instant::now();
    while executed(&lines) == before {
        assert!(start.elapsed() < Duration::from_secs(3), "no slot ran");
        thread::sleep(Duration::from_millis(10));
    }
    thread::sleep(Duration::from_millis(100));
    let dropped_at = Instant::now();
    let killed: u32 = redis_cli(&ns, &["CLIENT", "KILL", "TYPE", "normal"])
        .trim()
        .parse()
        .expect("CLIENT KILL count");
    assert!(killed >= 3, "only {killed} client connections dropped");
    thread::sleep(Duration::from_millis(TTL_MS + 2_000));
    let accepted_after = lines
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, t, l)| {
            *t > dropped_at && l.starts_with("wrote ") && l.ends_with("accepted=true")
        })
        .count();
    assert!(
        accepted_after > 10,
        "{accepted_after} resource writes accepted after the reconnect"
    );

    // The resource's view: accepted writes in order, fences never going
    // back, each fence one replica's, nothing stale refused or accepted.
    let log = resource_log(&ns);
    let refused = redis_cli(&ns, &["GET", "{guard:resource}:refused"]);
    drop(ns); // every process stopped, the namespace removed

    assert_eq!(
        log_before.keys().copied().collect::<Vec<_>>(),
        vec![first_fence, second_fence],
        "writes under exactly the two leaders' fences"
    );
    let fences = log.keys().copied().collect::<Vec<_>>();
    assert!(
        fences.starts_with(&[first_fence, second_fence]),
        "{fences:?}"
    );
    eprintln!(
        "leader r{leader} (fence {first_fence}) killed; takeover after {takeover:?} (fence {second_fence}); {killed} client connections dropped, then fences {fences:?}"
    );
    assert!(
        refused.trim().is_empty(),
        "stale writes were refused: {refused}"
    );
    eprintln!("{} heartbeat slots, each run once", each_slot_once(&lines));
}

#[test]
#[ignore = "needs root: run as root with `cargo test -p guard-tap-replica --test netns -- --ignored`"]
fn firmware_under_qemu_leads_hands_over_and_takes_over_beside_host_replicas() {
    let image = firmware_image("net-replica");
    let (mut ns, _dir) = namespace_with_redis(3, None);
    let lines: Lines = Arc::default();
    let within = Duration::from_millis(TTL_MS + INTERVAL_MS + OBSERVED_SLACK_MS);
    let wait = Duration::from_millis(TTL_MS + INTERVAL_MS + 5_000);

    // The firmware (replica 2) with a wrong password: Redis refuses it,
    // and it stops at once, saying so, without a lease.
    const FW: usize = 2;
    let refused = firmware_replica(&mut ns, FW, &image, "not-the-password", "", &lines);
    let status = ns.wait_exit(refused, Duration::from_secs(20));
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(1),
        "{:?}",
        lines.lock().unwrap()
    );
    assert!(
        lines
            .lock()
            .unwrap()
            .iter()
            .any(|(id, _, l)| *id == FW && l.contains("credentials (AUTH): WRONGPASS")),
        "{:?}",
        lines.lock().unwrap()
    );
    assert!(promotions(&lines).is_empty());

    // The firmware, as its ACL user, starts first and takes the lease.
    let started = Instant::now();
    let firmware = firmware_replica(&mut ns, FW, &image, FW_PASSWORD, "", &lines);
    let (leader, _, fw_fence) = next_leader(&lines, started, &[], Duration::from_secs(20));
    assert_eq!(leader, FW, "{:?}", lines.lock().unwrap());
    let hosts = [
        host_replica(&mut ns, 0, &[], &lines),
        host_replica(&mut ns, 1, &[], &lines),
    ];
    thread::sleep(Duration::from_millis(3_000));
    assert_eq!(
        promotions(&lines).len(),
        1,
        "the host replicas stay standbys while the firmware renews: {:?}",
        lines.lock().unwrap()
    );

    // A frame larger than the driver's buffer (a 1,600-byte UDP datagram
    // on a link whose MTU allows it, as a VLAN tag or a misconfigured peer
    // makes) is dropped, and the firmware goes on receiving: it keeps its
    // lease. (bash's /dev/udp: no other tool needed.)
    for dev in ["br0", "tap0", "tap1", "tap2"] {
        ns.exec(&["ip", "link", "set", dev, "mtu", "2000"]);
    }
    let (_, _, fw_ip) = identity(FW);
    let fw_ip = fw_ip.trim_end_matches("/24").to_owned();
    let sent = Instant::now();
    ns.exec(&[
        "bash",
        "-c",
        &format!(
            "exec 3<>/dev/udp/{fw_ip}/9; head -c 1600 /dev/zero >&3; head -c 1600 /dev/zero >&3"
        ),
    ]);
    thread::sleep(Duration::from_millis(TTL_MS + 1_000));
    let demoted_after = lines
        .lock()
        .unwrap()
        .iter()
        .any(|(id, t, l)| *id == FW && *t > sent && l.starts_with("demoted "));
    assert!(
        !demoted_after,
        "an oversized frame cost the firmware its lease: {:?}",
        lines.lock().unwrap()
    );

    // Case 1: the firmware leader dies (QEMU killed: no release).
    let killed_at = Instant::now();
    ns.kill(firmware);
    let (host_leader, promoted_at, host_fence) = next_leader(&lines, killed_at, &[FW], wait);
    let firmware_to_host = promoted_at.duration_since(killed_at);
    assert!(
        firmware_to_host <= within,
        "a host replica took over from the firmware after {firmware_to_host:?}, more than ttl + interval"
    );
    assert!(host_fence > fw_fence);

    // The firmware starts again, as a standby; the other host replica
    // stops, so the firmware is the one standby left.
    let restarted = Instant::now();
    let firmware = firmware_replica(&mut ns, FW, &image, FW_PASSWORD, "", &lines);
    let other = 1 - host_leader;
    let up = Instant::now();
    while !lines
        .lock()
        .unwrap()
        .iter()
        .any(|(id, t, l)| *id == FW && *t > restarted && l.starts_with("up "))
    {
        assert!(
            up.elapsed() < Duration::from_secs(20),
            "the firmware did not come up again"
        );
        thread::sleep(Duration::from_millis(20));
    }
    ns.kill(hosts[other]);
    thread::sleep(Duration::from_millis(2_000));

    // Case 2: the host leader dies; the firmware takes over.
    let killed_at = Instant::now();
    ns.kill(hosts[host_leader]);
    let (leader, promoted_at, fw_fence_again) =
        next_leader(&lines, killed_at, &[host_leader, other], wait);
    assert_eq!(leader, FW);
    let host_to_firmware = promoted_at.duration_since(killed_at);
    assert!(
        host_to_firmware <= within,
        "the firmware took over after {host_to_firmware:?}, more than ttl + interval"
    );
    assert!(fw_fence_again > host_fence);
    thread::sleep(Duration::from_millis(2_000));

    let log = resource_log(&ns);
    let refused = redis_cli(&ns, &["GET", "{guard:resource}:refused"]);
    ns.kill(firmware);
    drop(ns);

    assert_eq!(
        log.iter()
            .map(|(fence, who)| (*fence, who.clone()))
            .collect::<Vec<_>>(),
        vec![
            (fw_fence, format!("fw{FW}")),
            (host_fence, format!("r{host_leader}")),
            (fw_fence_again, format!("fw{FW}")),
        ],
        "the resource saw the three leaders in order, nothing else"
    );
    assert!(
        refused.trim().is_empty(),
        "stale writes were refused: {refused}"
    );
    let slots = each_slot_once(&lines);
    let ran_by = |id: usize| {
        lines
            .lock()
            .unwrap()
            .iter()
            .filter(|(i, _, l)| *i == id && l.starts_with("executed "))
            .count()
    };
    assert!(ran_by(FW) > 0, "the firmware ran no slot");
    // Each slot ran near its start: the fence is the lock service's clock
    // (µs) at the claim, so a replica whose clock runs slow shows here
    // long before it runs a slot twice.
    let mut latest = [0u64; 3];
    for (id, _, line) in lines.lock().unwrap().iter() {
        let Some(rest) = line.strip_prefix("executed ") else {
            continue;
        };
        // Both fields, as numbers: a slot run without a fence (`fence=-`)
        // would make the lateness check pass by default.
        let field = |name: &str| -> u64 {
            rest.split(name)
                .nth(1)
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| {
                    panic!("replica {id} ran a slot without a numeric {name}: {line}")
                })
        };
        let (slot, fence) = (field("slot="), field("fence="));
        let late_ms = (fence / 1_000).saturating_sub(slot);
        latest[*id] = latest[*id].max(late_ms);
        assert!(
            late_ms < 100,
            "replica {id} ran slot {slot} {late_ms} ms late: {line}"
        );
    }
    eprintln!("latest slot run per replica (ms after the slot's start): {latest:?}");
    eprintln!(
        "firmware led (fence {fw_fence}), killed: r{host_leader} took over after {firmware_to_host:?} (fence {host_fence}); r{host_leader} killed: the firmware took over after {host_to_firmware:?} (fence {fw_fence_again}); {slots} heartbeat slots, each run once ({} by the firmware)",
        ran_by(FW)
    );
}

const MQTT_PORT: u16 = 1883;

/// Starts mosquitto in the namespace on the bridge's address, keeping its
/// sessions and queued messages in `dir` across a restart; its index.
fn mosquitto(ns: &mut Namespace, dir: &std::path::Path) -> usize {
    let conf = dir.join("mosquitto.conf");
    std::fs::write(
        &conf,
        format!(
            "listener {MQTT_PORT} {SUBNET}.1\nallow_anonymous true\npersistence true\npersistence_location {}/\n",
            dir.display()
        ),
    )
    .unwrap();
    let index = ns.spawn(&["mosquitto", "-c", conf.to_str().unwrap()], Stdio::null());
    let start = Instant::now();
    while !ns.succeeds(&[
        "bash",
        "-c",
        &format!("exec 3<>/dev/tcp/{SUBNET}.1/{MQTT_PORT}"),
    ]) {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "mosquitto did not start"
        );
        thread::sleep(Duration::from_millis(50));
    }
    index
}

/// A message the subscriber received: its topic and payload.
fn received(lines: &Lines, subscriber: usize) -> Vec<(String, String)> {
    lines
        .lock()
        .unwrap()
        .iter()
        .filter(|(id, _, _)| *id == subscriber)
        .filter_map(|(_, _, l)| {
            let (topic, payload) = l.split_once(' ')?;
            Some((topic.to_owned(), payload.to_owned()))
        })
        .collect()
}

#[test]
#[ignore = "needs root: run as root with `cargo test -p guard-tap-replica --test netns -- --ignored`"]
fn firmware_publishes_through_a_broker_restart_losing_nothing_and_only_the_leader_announces() {
    let image = firmware_image("net-replica");
    let (mut ns, _dir) = namespace_with_redis(3, None);
    let mqtt_dir = tempfile::tempdir().unwrap();
    let lines: Lines = Arc::default();
    let broker = mosquitto(&mut ns, mqtt_dir.path());
    // A subscriber with a session that outlives its connection (`-c`), so
    // the broker keeps what arrives while it reconnects after a restart.
    const SUBSCRIBER: usize = 99;
    let sub = format!("{SUBNET}.1");
    let port = MQTT_PORT.to_string();
    collect(
        &mut ns,
        SUBSCRIBER,
        &[
            "mosquitto_sub",
            "-h",
            &sub,
            "-p",
            &port,
            "-t",
            "guard/#",
            "-q",
            "1",
            "-c",
            "-i",
            "guard-e2e-subscriber",
            "-v",
        ],
        &lines,
    );
    thread::sleep(Duration::from_millis(500));

    // The firmware leads; two host replicas stand by. All three publish
    // readings every 200 ms, at most 20 a second each.
    const FW: usize = 2;
    let broker_at = format!("{SUBNET}.1:{MQTT_PORT}");
    let started = Instant::now();
    let firmware = firmware_replica(
        &mut ns,
        FW,
        &image,
        FW_PASSWORD,
        &format!("--mqtt {broker_at} --produce-ms 200"),
        &lines,
    );
    let (leader, _, fw_fence) = next_leader(&lines, started, &[], Duration::from_secs(20));
    assert_eq!(leader, FW, "{:?}", lines.lock().unwrap());
    let mqtt_args = ["--mqtt", &broker_at, "--produce-ms", "200"];
    for id in 0..2 {
        host_replica(&mut ns, id, &mqtt_args, &lines);
    }
    thread::sleep(Duration::from_secs(4));

    // The broker stops for 10 s and starts again on its saved state.
    ns.terminate(broker);
    thread::sleep(Duration::from_secs(10));
    mosquitto(&mut ns, mqtt_dir.path());
    // Fifty readings each were made meanwhile: they drain at 20 a second.
    thread::sleep(Duration::from_secs(8));

    // The firmware leader dies; a host replica takes over and announces.
    let killed_at = Instant::now();
    ns.kill(firmware);
    let wait = Duration::from_millis(TTL_MS + INTERVAL_MS + 5_000);
    let (host_leader, _, host_fence) = next_leader(&lines, killed_at, &[FW], wait);
    thread::sleep(Duration::from_secs(3));

    let messages = received(&lines, SUBSCRIBER);
    let log = || format!("{:?}", lines.lock().unwrap());
    // Every reading by its id: a stream per replica and boot, numbered
    // from 1. Nothing twice, nothing missing before the newest received
    // (what a killed replica still held is gone with it).
    let mut streams: BTreeMap<(String, String), Vec<u64>> = BTreeMap::new();
    for (topic, payload) in messages
        .iter()
        .filter(|(t, _)| t.starts_with("guard/readings/"))
    {
        let parts: Vec<&str> = payload.split('/').collect();
        assert_eq!(parts.len(), 3, "reading {payload:?} on {topic}");
        assert_eq!(topic, &format!("guard/readings/{}", parts[0]));
        streams
            .entry((parts[0].to_owned(), parts[1].to_owned()))
            .or_default()
            .push(parts[2].parse().unwrap());
    }
    assert_eq!(
        streams.len(),
        3,
        "one stream a replica: {streams:?} {}",
        log()
    );
    let mut repeats = BTreeMap::new();
    for ((name, boot), seqs) in &streams {
        let mut sorted = seqs.clone();
        sorted.sort_unstable();
        sorted.dedup();
        // At least once: the one reading in flight when the broker stopped
        // may come again (its PUBACK lost); nothing else may.
        let repeated = seqs.len() - sorted.len();
        assert!(
            repeated <= 1,
            "{name} (boot {boot}): {repeated} readings arrived twice: {seqs:?}"
        );
        repeats.insert(name.clone(), repeated);
        let newest = *sorted.last().unwrap();
        assert_eq!(
            sorted,
            (1..=newest).collect::<Vec<_>>(),
            "{name} (boot {boot}): readings missing"
        );
        // Made through the outage and after: well past what 4 s before it
        // hold, so the ones made while the broker was down arrived.
        assert!(newest >= 80, "{name} (boot {boot}): only {newest} readings");
    }
    for ((name, boot), seqs) in &streams {
        println!(
            "{name} (boot {boot}): readings 1 to {} arrived, {} of them twice",
            seqs.len() - repeats[name],
            repeats[name]
        );
    }
    // The leader topic: the firmware's fence while it led, then the host
    // leader's; never a standby's.
    let announced: Vec<&str> = messages
        .iter()
        .filter(|(t, _)| t == "guard/leader")
        .map(|(_, p)| p.as_str())
        .collect();
    let fw_line = format!("fw{FW} fence={fw_fence}");
    let host_line = format!("r{host_leader} fence={host_fence}");
    assert!(
        announced.iter().all(|a| *a == fw_line || *a == host_line),
        "{announced:?} {}",
        log()
    );
    assert!(announced.contains(&fw_line.as_str()), "{announced:?}");
    assert!(announced.contains(&host_line.as_str()), "{announced:?}");
    let fw_last = announced.iter().rposition(|a| *a == fw_line).unwrap();
    let host_first = announced.iter().position(|a| *a == host_line).unwrap();
    assert!(
        fw_last < host_first,
        "one leader's announcements at a time: {announced:?}"
    );
    assert!(
        !lines
            .lock()
            .unwrap()
            .iter()
            .any(|(_, _, l)| l.starts_with("outbox-")),
        "no reading refused by a full outbox: {}",
        log()
    );
    println!(
        "announcements: {} by the firmware, then {} by r{host_leader}",
        announced.iter().filter(|a| **a == fw_line).count(),
        announced.iter().filter(|a| **a == host_line).count()
    );
}

/// Starts `tls-locker` on `tap0` against the TLS port, trusting the CA
/// in `ca_der` (a file), a round every 500 ms; its index.
fn tls_locker(ns: &mut Namespace, image: &str, ca_der: &std::path::Path, lines: &Lines) -> usize {
    let (_, _, ip) = identity(0);
    let append = format!(
        "--name fw0 --ip {ip} --redis {SUBNET}.1:{REDIS_TLS_PORT} --tls-ca {} --redis-user {FW_USER} --redis-password {FW_PASSWORD} --every-ms 500",
        ca_der.display()
    );
    firmware(ns, 0, image, &append, lines)
}

fn said(lines: &Lines) -> Vec<String> {
    lines
        .lock()
        .unwrap()
        .iter()
        .map(|(_, _, l)| l.clone())
        .collect()
}

/// The rounds `tls-locker` reported: (round, fence, handshakes so far).
fn tls_rounds(said: &[String]) -> Vec<(u32, u64, u32)> {
    said.iter()
        .filter_map(|l| {
            let fields: BTreeMap<&str, &str> = l
                .strip_prefix("locked name=fw0 ")?
                .split(' ')
                .filter_map(|f| f.split_once('='))
                .collect();
            Some((
                fields["round"].parse().ok()?,
                fields["fence"].parse().ok()?,
                fields["handshakes"].parse().ok()?,
            ))
        })
        .collect()
}

#[test]
#[ignore = "needs root: creates a network namespace and a TAP device, runs QEMU"]
fn firmware_locks_over_tls_reconnects_after_redis_drops_it_and_refuses_another_ca() {
    let image = firmware_image("tls-locker");
    let certs = guard_testkit::TestCerts::generate().expect("certificates");
    let (mut ns, dir) = namespace_with_redis(1, Some(&certs));
    let ca = dir.path().join("ca.der");
    std::fs::write(&ca, certs.ca_der().expect("CA")).unwrap();
    let lines: Lines = Arc::default();
    let firmware = tls_locker(&mut ns, &image, &ca, &lines);
    // Redis drops every client connection (the firmware's TLS one among
    // them) once the firmware has locked five times.
    let start = Instant::now();
    while tls_rounds(&said(&lines)).len() < 5 {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "five rounds: {:#?}",
            said(&lines)
        );
        thread::sleep(Duration::from_millis(20));
    }
    let killed = redis_cli(&ns, &["CLIENT", "KILL", "TYPE", "normal"]);
    assert!(
        killed.trim().parse::<u32>().is_ok_and(|n| n >= 1),
        "{killed}"
    );
    let status = ns.wait_exit(firmware, Duration::from_secs(60));
    let said = said(&lines);
    assert_eq!(status.and_then(|s| s.code()), Some(0), "{said:#?}");
    assert!(
        said.iter()
            .any(|l| l == "authenticated name=fw0 handshakes=1"),
        "{said:#?}"
    );
    let rounds = tls_rounds(&said);
    assert_eq!(
        rounds.iter().map(|r| r.0).collect::<Vec<_>>(),
        (1..=20).collect::<Vec<_>>(),
        "every round locked once: {said:#?}"
    );
    assert!(
        rounds.windows(2).all(|w| w[0].1 < w[1].1),
        "fences increase: {rounds:?}"
    );
    let handshakes = rounds.last().unwrap().2;
    assert_eq!(handshakes, 2, "one new session after the drop: {said:#?}");
    // The locks went through this Redis: its fence counter holds the last
    // fence, and the lock itself is gone.
    let keys = guard_core::lock::redis::RedisKeys::new("", "tls:fw0").unwrap();
    let (lock, counter) = (keys.lock().to_string(), keys.fence().to_string());
    assert_eq!(redis_cli(&ns, &["EXISTS", &lock]).trim(), "0", "{lock}");
    assert_eq!(
        redis_cli(&ns, &["GET", &counter]).trim(),
        rounds.last().unwrap().1.to_string(),
        "{counter}"
    );

    // A CA that did not sign the server's certificate: refused in the
    // handshake, before AUTH or any command.
    let stranger = guard_testkit::TestCerts::generate().expect("certificates");
    let wrong = dir.path().join("stranger.der");
    std::fs::write(&wrong, stranger.ca_der().expect("CA")).unwrap();
    let lines: Lines = Arc::default();
    let refused = tls_locker(&mut ns, &image, &wrong, &lines);
    let status = ns.wait_exit(refused, Duration::from_secs(60));
    let said = self::said(&lines);
    assert_eq!(status.and_then(|s| s.code()), Some(1), "{said:#?}");
    assert!(
        said.iter()
            .any(|l| l.starts_with("tls-locker: TLS: Invalid")),
        "{said:#?}"
    );
    assert!(tls_rounds(&said).is_empty(), "{said:#?}");
}
