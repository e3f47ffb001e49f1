//! A real etcd cluster of `N` members, each an `etcd` process on free
//! loopback ports with a data directory of its own, stopped by PID when
//! dropped (also when a test panics). An etcd this machine may already run
//! (a Debian service on 2379) is never touched.
//!
//! Raft runs fast for tests (`--heartbeat-interval 50 --election-timeout
//! 500`): a lost leader is replaced within about a second, and the
//! shortest lease the members grant is 1 s (1.5 election timeouts, rounded
//! up to a second). Data directories are on `/dev/shm` when it exists, so
//! raft's fsyncs cost nothing; they survive [`EtcdCluster::kill`] and
//! [`EtcdCluster::restart`] like a disk would.
//!
//! [`EtcdCluster::leader`] and the readiness checks read each member's
//! status through etcd's JSON gateway (`POST /v3/maintenance/status`) over
//! plain HTTP, so the harness needs no gRPC client or tokio runtime.
//!
//! ```no_run
//! let mut cluster = guard_testkit::etcd::EtcdCluster::start(3)?;
//! let leader = cluster.leader()?;
//! cluster.kill(leader);
//! cluster.restart(leader)?;
//! println!("etcd at {:?}", cluster.endpoints());
//! # Ok::<(), guard_testkit::HarnessError>(())
//! ```

use std::fmt;
use std::fs::OpenOptions;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::process::{HarnessError, binary, free_port, wait_until};

/// How long a cluster (or a restarted member) may take to have a leader.
const READY_TIMEOUT: Duration = Duration::from_secs(20);

/// How long one status request may take (a paused member never answers).
const STATUS_TIMEOUT: Duration = Duration::from_millis(500);

/// One member: its ports, its data directory, its process while it runs.
struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    dir: PathBuf,
    child: Option<Child>,
    paused: bool,
}

/// A running etcd cluster; see the [module](self) documentation.
pub struct EtcdCluster {
    binary: PathBuf,
    token: String,
    members: Vec<Member>,
    // Dropped after the processes are stopped (field order).
    root: tempfile::TempDir,
}

impl fmt::Debug for EtcdCluster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdCluster")
            .field("endpoints", &self.endpoints())
            .field(
                "running",
                &self
                    .members
                    .iter()
                    .map(|m| m.child.is_some())
                    .collect::<Vec<_>>(),
            )
            .field("dir", &self.root.path())
            .finish()
    }
}

/// What a member's status says: its own raft id and the leader's (0 when
/// it knows of none).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Status {
    member: u64,
    leader: u64,
}

impl EtcdCluster {
    /// Starts `members` members (at least 1) of a new cluster and waits
    /// until every one of them follows the same leader.
    ///
    /// A missing `etcd` binary is [`HarnessError::MissingBinary`] naming
    /// the Debian package `etcd-server`.
    pub fn start(members: usize) -> Result<Self, HarnessError> {
        // A free port is free when probed, not when etcd binds it: another
        // process on a busy machine can take one in between, and a member
        // that cannot bind never joins. A new cluster on new ports then.
        const ATTEMPTS: usize = 3;
        let mut attempt = 1;
        loop {
            match Self::start_once(members) {
                Err(HarnessError::NotReady(why)) if attempt < ATTEMPTS => {
                    eprintln!("etcd harness: {why}; starting a new cluster on new ports");
                    attempt += 1;
                }
                result => return result,
            }
        }
    }

    fn start_once(members: usize) -> Result<Self, HarnessError> {
        let binary = binary("etcd", "etcd-server")?;
        let members = members.max(1);
        // Memory-backed when possible: raft fsyncs every entry.
        let shm = Path::new("/dev/shm");
        let root = if shm.is_dir() {
            tempfile::Builder::new()
                .prefix("guard-etcd-")
                .tempdir_in(shm)?
        } else {
            tempfile::Builder::new().prefix("guard-etcd-").tempdir()?
        };
        let mut list = Vec::with_capacity(members);
        for i in 0..members {
            let name = format!("m{i}");
            let dir = root.path().join(&name);
            std::fs::create_dir_all(&dir)?;
            list.push(Member {
                name,
                client_port: free_port()?,
                peer_port: free_port()?,
                dir,
                child: None,
                paused: false,
            });
        }
        let mut cluster = EtcdCluster {
            binary,
            token: unique_token(),
            members: list,
            root,
        };
        for i in 0..members {
            cluster.spawn(i)?;
        }
        cluster.wait_for_leader(READY_TIMEOUT, true)?;
        Ok(cluster)
    }

    fn initial_cluster(&self) -> String {
        self.members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
            .collect::<Vec<_>>()
            .join(",")
    }

    fn spawn(&mut self, i: usize) -> Result<(), HarnessError> {
        let initial = self.initial_cluster();
        let member = &self.members[i];
        let client = format!("http://127.0.0.1:{}", member.client_port);
        let peer = format!("http://127.0.0.1:{}", member.peer_port);
        // The member's log, kept with its data for a failed test to read.
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(member.dir.join("etcd.log"))?;
        let child = Command::new(&self.binary)
            .arg("--name")
            .arg(&member.name)
            .arg("--data-dir")
            .arg(member.dir.join("data"))
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &initial])
            // Ignored by a member that restarts on its data directory.
            .args(["--initial-cluster-state", "new"])
            .args(["--initial-cluster-token", &self.token])
            // etcd requires election >= 5 x heartbeat.
            .args(["--heartbeat-interval", "50", "--election-timeout", "500"])
            .args(["--logger", "zap", "--log-level", "warn"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()?;
        let member = &mut self.members[i];
        member.child = Some(child);
        member.paused = false;
        Ok(())
    }

    /// Waits until the running, unpaused members know a leader: all the
    /// same one when `all` is set, else at least one member.
    fn wait_for_leader(&self, timeout: Duration, all: bool) -> Result<(), HarnessError> {
        wait_until(
            &format!("etcd cluster {:?} electing a leader", self.endpoints()),
            timeout,
            || {
                let live: Vec<Option<Status>> = self
                    .members
                    .iter()
                    .filter(|m| m.child.is_some() && !m.paused)
                    .map(|m| status(m.client_port))
                    .collect();
                let mut leaders = live.iter().map(|s| s.map(|s| s.leader));
                if all {
                    let first = leaders.next().flatten();
                    first.is_some_and(|l| l != 0) && leaders.all(|l| l == first)
                } else {
                    leaders.any(|l| l.is_some_and(|l| l != 0))
                }
            },
        )
    }

    /// How many members the cluster has (running or not).
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Whether the cluster has no members (never: it has at least one).
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Every member's client URL (`http://127.0.0.1:<port>`), in member
    /// order.
    pub fn endpoints(&self) -> Vec<String> {
        (0..self.members.len()).map(|i| self.endpoint(i)).collect()
    }

    /// Member `i`'s client URL.
    ///
    /// # Panics
    /// If `i` is not a member (`i >= len()`).
    pub fn endpoint(&self, i: usize) -> String {
        format!("http://127.0.0.1:{}", self.members[i].client_port)
    }

    /// Where member `i` keeps its data and its log (`etcd.log`).
    ///
    /// # Panics
    /// If `i` is not a member.
    pub fn dir(&self, i: usize) -> &Path {
        &self.members[i].dir
    }

    /// The member that is raft leader: the running member whose status
    /// names itself as leader. Waits up to 10 s for one (an election in
    /// progress); [`HarnessError::NotReady`] if none appears.
    pub fn leader(&self) -> Result<usize, HarnessError> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let found = self.members.iter().position(|m| {
                m.child.is_some()
                    && !m.paused
                    && status(m.client_port).is_some_and(|s| s.leader != 0 && s.leader == s.member)
            });
            if let Some(i) = found {
                return Ok(i);
            }
            if Instant::now() >= deadline {
                return Err(HarnessError::NotReady(format!(
                    "no etcd member of {:?} is leader",
                    self.endpoints()
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Kills member `i` (`SIGKILL`, by PID) and waits for it: a crash, with
    /// its data directory kept for [`restart`](Self::restart). A member
    /// that is not running is left as it is.
    ///
    /// # Panics
    /// If `i` is not a member.
    pub fn kill(&mut self, i: usize) {
        let member = &mut self.members[i];
        if let Some(mut child) = member.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        member.paused = false;
    }

    /// Kills member `i` if it runs and starts it again on the same ports
    /// and data directory; waits until it follows a leader.
    ///
    /// # Panics
    /// If `i` is not a member.
    pub fn restart(&mut self, i: usize) -> Result<(), HarnessError> {
        self.kill(i);
        self.spawn(i)?;
        let port = self.members[i].client_port;
        wait_until(
            &format!("restarted etcd member {i} following a leader"),
            READY_TIMEOUT,
            || status(port).is_some_and(|s| s.leader != 0),
        )
    }

    /// Freezes member `i` (`SIGSTOP`): it neither answers nor votes, and
    /// its peers' messages wait in its sockets, as in a long GC pause or a
    /// partition that heals. [`resume`](Self::resume) continues it.
    ///
    /// # Panics
    /// If `i` is not a member.
    pub fn pause(&mut self, i: usize) -> Result<(), HarnessError> {
        self.signal(i, "-STOP")?;
        self.members[i].paused = true;
        Ok(())
    }

    /// Continues member `i` after [`pause`](Self::pause) (`SIGCONT`).
    ///
    /// # Panics
    /// If `i` is not a member.
    pub fn resume(&mut self, i: usize) -> Result<(), HarnessError> {
        self.signal(i, "-CONT")?;
        self.members[i].paused = false;
        Ok(())
    }

    fn signal(&self, i: usize, signal: &str) -> Result<(), HarnessError> {
        let Some(child) = &self.members[i].child else {
            return Err(HarnessError::NotReady(format!(
                "etcd member {i} is not running"
            )));
        };
        let sent = Command::new("kill")
            .args([signal, &child.id().to_string()])
            .status()?;
        if sent.success() {
            Ok(())
        } else {
            Err(HarnessError::NotReady(format!(
                "kill {signal} {} failed: {sent}",
                child.id()
            )))
        }
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        // SIGKILL ends a paused member too.
        for i in 0..self.members.len() {
            self.kill(i);
        }
    }
}

/// A cluster token no other cluster on this machine uses, so members of
/// two test clusters never join each other.
fn unique_token() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!(
        "guard-test-{}-{}-{nanos}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// The status of the member on `port`, or `None` if it does not answer
/// within [`STATUS_TIMEOUT`] (stopped, paused, starting).
fn status(port: u16) -> Option<Status> {
    let body = post(port, "/v3/maintenance/status", "{}")?;
    let json: serde_json::Value = serde_json::from_str(&body).ok()?;
    // The gateway writes 64-bit ids as strings; a missing leader is 0.
    let id = |v: Option<&serde_json::Value>| -> Option<u64> {
        match v {
            None => Some(0),
            Some(serde_json::Value::String(s)) => s.parse().ok(),
            Some(v) => v.as_u64(),
        }
    };
    let member = id(json.get("header").and_then(|h| h.get("member_id")))?;
    let leader = id(json.get("leader"))?;
    (member != 0).then_some(Status { member, leader })
}

/// One HTTP/1.0 POST (so the reply is neither chunked nor kept alive);
/// the body of a 200 reply.
fn post(port: u16, path: &str, body: &str) -> Option<String> {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut stream = TcpStream::connect_timeout(&addr, STATUS_TIMEOUT).ok()?;
    stream.set_read_timeout(Some(STATUS_TIMEOUT)).ok()?;
    stream.set_write_timeout(Some(STATUS_TIMEOUT)).ok()?;
    write!(
        stream,
        "POST {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .ok()?;
    let mut reply = String::new();
    stream.read_to_string(&mut reply).ok()?;
    let (head, body) = reply.split_once("\r\n\r\n")?;
    let code = head.split(' ').nth(1)?;
    (code == "200").then(|| body.to_owned())
}
