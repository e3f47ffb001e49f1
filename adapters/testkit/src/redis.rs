//! Real Redis servers for tests.
//!
//! Each server is a `redis-server` child process on a free 127.0.0.1 port,
//! with no persistence and its own temporary directory, stopped by PID
//! when dropped (also when a test panics). Nothing here touches a server
//! this machine may already run.
//!
//! A missing binary is an error naming the Debian package to install.

use std::fmt;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::process::{HarnessError, binary, free_port, wait_until};

/// Sends one inline command and reads one reply line (enough for PING,
/// INFO fields, CLUSTER INFO and SENTINEL queries in the harness).
fn command_reply(port: u16, cmd: &str) -> std::io::Result<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    stream.write_all(format!("{cmd}\r\n").as_bytes())?;
    let mut reader = BufReader::new(stream);
    let mut first = String::new();
    reader.read_line(&mut first)?;
    if let Some(len) = first.strip_prefix('$') {
        // A bulk string: read its body.
        let len: i64 = len.trim().parse().unwrap_or(-1);
        if len < 0 {
            return Ok(String::new());
        }
        let mut body = vec![0u8; usize::try_from(len).unwrap_or(0) + 2];
        reader.read_exact(&mut body)?;
        return Ok(String::from_utf8_lossy(&body).into_owned());
    }
    Ok(first)
}

/// One `redis-server` process.
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
    extra: Vec<String>,
}

impl fmt::Debug for RedisServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisServer")
            .field("port", &self.port)
            .finish()
    }
}

impl RedisServer {
    /// A standalone server.
    pub fn start() -> Result<Self, HarnessError> {
        Self::start_with(&[])
    }

    /// A server with extra `--option value` arguments.
    pub fn start_with(extra: &[&str]) -> Result<Self, HarnessError> {
        let mut server = RedisServer {
            child: None,
            port: free_port()?,
            dir: tempfile::tempdir()?,
            extra: extra.iter().map(|s| (*s).to_owned()).collect(),
        };
        server.launch()?;
        Ok(server)
    }

    fn launch(&mut self) -> Result<(), HarnessError> {
        let mut command = Command::new(binary("redis-server", "redis-server")?);
        command
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .args(&self.extra);
        self.spawn(command, "redis-server")
    }

    /// Starts `command` quietly and waits until this port answers PING.
    fn spawn(&mut self, mut command: Command, what: &str) -> Result<(), HarnessError> {
        let child = command
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        self.child = Some(child);
        let port = self.port;
        wait_until(
            &format!("{what} on port {port}"),
            Duration::from_secs(10),
            || command_reply(port, "PING").is_ok_and(|r| r.starts_with("+PONG")),
        )
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The server's temporary directory.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Stops the process (by PID) and waits for it.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port (its data is gone).
    pub fn restart(&mut self) -> Result<(), HarnessError> {
        self.stop();
        self.launch()
    }

    /// Runs one inline command and returns the first reply line.
    pub fn command(&self, cmd: &str) -> Result<String, HarnessError> {
        Ok(command_reply(self.port, cmd)?)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A Redis Cluster of three masters (no replicas), created with
/// `redis-cli --cluster create`.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts three cluster-enabled servers and joins them.
    pub fn start() -> Result<Self, HarnessError> {
        let cli = binary("redis-cli", "redis-tools")?;
        let nodes = (0..3)
            .map(|_| {
                RedisServer::start_with(&[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "2000",
                ])
            })
            .collect::<Result<Vec<_>, _>>()?;
        let addresses: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        let status = Command::new(cli)
            .args(["--cluster", "create"])
            .args(&addresses)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()?;
        if !status.success() {
            return Err(HarnessError::NotReady(format!(
                "redis-cli --cluster create exited with {status}"
            )));
        }
        for node in &nodes {
            let port = node.port();
            wait_until("cluster_state:ok", Duration::from_secs(15), || {
                command_reply(port, "CLUSTER INFO")
                    .is_ok_and(|info| info.contains("cluster_state:ok"))
            })?;
        }
        Ok(RedisCluster { nodes })
    }

    /// The nodes' URLs.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// The nodes.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }
}

/// A master monitored by one sentinel (quorum 1), service name `mymaster`.
#[derive(Debug)]
pub struct RedisSentinel {
    master: RedisServer,
    replica: Option<RedisServer>,
    sentinel: RedisServer,
}

/// The service name the sentinel monitors.
pub const SENTINEL_SERVICE: &str = "mymaster";

impl RedisSentinel {
    /// Starts a master and a sentinel watching it.
    pub fn start() -> Result<Self, HarnessError> {
        Self::start_inner(false)
    }

    /// Starts a master, a replica of it, and a sentinel that will fail
    /// over to the replica once the master is down for a second.
    pub fn start_with_replica() -> Result<Self, HarnessError> {
        Self::start_inner(true)
    }

    fn start_inner(with_replica: bool) -> Result<Self, HarnessError> {
        let master = RedisServer::start()?;
        let replica = if with_replica {
            let replica =
                RedisServer::start_with(&["--replicaof", "127.0.0.1", &master.port().to_string()])?;
            let port = master.port();
            // The sentinel learns about the replica from the master.
            wait_until(
                "the replica is linked to the master",
                Duration::from_secs(10),
                || {
                    command_reply(port, "INFO replication")
                        .is_ok_and(|r| r.contains("connected_slaves:1"))
                },
            )?;
            Some(replica)
        } else {
            None
        };
        let dir = tempfile::tempdir()?;
        let config = dir.path().join("sentinel.conf");
        std::fs::write(
            &config,
            format!(
                "sentinel monitor {SENTINEL_SERVICE} 127.0.0.1 {} 1\nsentinel down-after-milliseconds {SENTINEL_SERVICE} 1000\n",
                master.port()
            ),
        )?;
        let config = config.to_string_lossy().into_owned();
        // The sentinel is redis-server in sentinel mode; it rewrites its
        // config file, which lives in its own temporary directory.
        let mut sentinel = RedisServer {
            child: None,
            port: free_port()?,
            dir,
            extra: vec![],
        };
        sentinel.launch_sentinel(&config)?;
        let port = sentinel.port();
        wait_until("sentinel knows the master", Duration::from_secs(10), || {
            command_reply(
                port,
                &format!("SENTINEL get-master-addr-by-name {SENTINEL_SERVICE}"),
            )
            .is_ok_and(|r| r.starts_with('*'))
        })?;
        Ok(RedisSentinel {
            master,
            replica,
            sentinel,
        })
    }

    /// Stops the master (by PID), so the sentinel fails over.
    pub fn stop_master(&mut self) {
        self.master.stop();
    }

    /// The replica, if started with one.
    pub fn replica(&self) -> Option<&RedisServer> {
        self.replica.as_ref()
    }

    /// The sentinel's URL.
    pub fn sentinel_url(&self) -> String {
        self.sentinel.url()
    }

    /// The master.
    pub fn master(&self) -> &RedisServer {
        &self.master
    }
}

impl RedisServer {
    fn launch_sentinel(&mut self, config: &str) -> Result<(), HarnessError> {
        let mut command = Command::new(binary("redis-server", "redis-server")?);
        command.arg(config).arg("--sentinel").args([
            "--port",
            &self.port.to_string(),
            "--bind",
            "127.0.0.1",
            "--protected-mode",
            "no",
        ]);
        self.spawn(command, "sentinel")
    }
}
