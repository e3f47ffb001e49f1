//! Real Redis servers for tests.
//!
//! Each server is a `redis-server` child process on a free 127.0.0.1 port,
//! with no persistence and its own temporary directory, stopped by PID
//! when dropped (also when a test panics). Nothing here touches a server
//! this machine may already run.
//!
//! A missing binary is an error naming the Debian package to install.
//!
//! Each also starts TLS-only (`start_tls`, with [`TestCerts`]): the plain
//! port is closed (`--port 0`), the URLs are `rediss://`, and the
//! harness's own commands go over TLS.

use std::ffi::OsString;
use std::fmt;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection, StreamOwned};

use crate::process::{HarnessError, binary, free_port, wait_until};
use crate::tls::TestCerts;

/// Sends one inline command and reads one reply line (enough for PING,
/// INFO fields, CLUSTER INFO and SENTINEL queries in the harness); over
/// TLS when `tls` is given.
fn command_reply(port: u16, tls: Option<&Arc<ClientConfig>>, cmd: &str) -> std::io::Result<String> {
    let stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    stream.set_write_timeout(Some(Duration::from_secs(2)))?;
    match tls {
        None => exchange(stream, cmd),
        Some(config) => {
            let name = ServerName::IpAddress(std::net::Ipv4Addr::LOCALHOST.into());
            let session =
                ClientConnection::new(config.clone(), name).map_err(std::io::Error::other)?;
            exchange(StreamOwned::new(session, stream), cmd)
        }
    }
}

fn exchange(mut stream: impl Read + Write, cmd: &str) -> std::io::Result<String> {
    stream.write_all(format!("{cmd}\r\n").as_bytes())?;
    stream.flush()?;
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

/// A TLS server's certificates, and the client configuration the harness
/// talks to it with.
#[derive(Clone)]
struct Tls {
    certs: TestCerts,
    client: Arc<ClientConfig>,
}

impl Tls {
    fn new(certs: &TestCerts) -> Result<Self, HarnessError> {
        Ok(Tls {
            certs: certs.clone(),
            client: certs.client_config()?,
        })
    }

    /// The options of a TLS-only server on `port`: clients may present a
    /// certificate (checked against the CA), need not.
    fn server_args(&self, port: u16) -> Vec<OsString> {
        let mut args: Vec<OsString> = ["--port", "0", "--tls-port"]
            .iter()
            .map(OsString::from)
            .collect();
        args.push(port.to_string().into());
        for (option, path) in [
            ("--tls-cert-file", self.certs.server_cert_path()),
            ("--tls-key-file", self.certs.server_key_path()),
            ("--tls-ca-cert-file", self.certs.ca_path()),
        ] {
            args.push(option.into());
            args.push(path.into());
        }
        args.extend(["--tls-auth-clients", "optional"].map(OsString::from));
        args
    }

    /// `redis-cli`'s options to reach a TLS server.
    fn cli_args(&self) -> Vec<OsString> {
        let mut args = vec![OsString::from("--tls")];
        for (option, path) in [
            ("--cacert", self.certs.ca_path()),
            ("--cert", self.certs.client_cert_path()),
            ("--key", self.certs.client_key_path()),
        ] {
            args.push(option.into());
            args.push(path.into());
        }
        args
    }
}

/// One `redis-server` process.
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
    extra: Vec<String>,
    tls: Option<Tls>,
}

impl fmt::Debug for RedisServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisServer")
            .field("port", &self.port)
            .field("tls", &self.tls.is_some())
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
        Self::start_inner(extra, None)
    }

    /// A TLS-only server (`--port 0 --tls-port <port>`) with `certs`'
    /// server certificate; clients may present a certificate signed by
    /// its CA (`--tls-auth-clients optional`), need not. Its
    /// [`url`](Self::url) is `rediss://`.
    pub fn start_tls(certs: &TestCerts) -> Result<Self, HarnessError> {
        Self::start_tls_with(certs, &[])
    }

    /// [`start_tls`](Self::start_tls) with extra `--option value`
    /// arguments (after the TLS ones, so they may override them, e.g.
    /// `--tls-auth-clients yes`).
    pub fn start_tls_with(certs: &TestCerts, extra: &[&str]) -> Result<Self, HarnessError> {
        Self::start_inner(extra, Some(Tls::new(certs)?))
    }

    fn start_inner(extra: &[&str], tls: Option<Tls>) -> Result<Self, HarnessError> {
        let mut server = RedisServer {
            child: None,
            port: free_port()?,
            dir: tempfile::tempdir()?,
            extra: extra.iter().map(|s| (*s).to_owned()).collect(),
            tls,
        };
        server.launch()?;
        Ok(server)
    }

    fn launch(&mut self) -> Result<(), HarnessError> {
        let mut command = Command::new(binary("redis-server", "redis-server")?);
        match &self.tls {
            None => command.args(["--port", &self.port.to_string()]),
            Some(tls) => command.args(tls.server_args(self.port)),
        };
        command
            .args(["--bind", "127.0.0.1"])
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
        let tls = self.tls.as_ref().map(|t| &t.client);
        wait_until(
            &format!("{what} on port {port}"),
            Duration::from_secs(10),
            || command_reply(port, tls, "PING").is_ok_and(|r| r.starts_with("+PONG")),
        )
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>/`, or `rediss://` for a TLS server.
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() {
            "rediss"
        } else {
            "redis"
        };
        format!("{scheme}://127.0.0.1:{}/", self.port)
    }

    /// The server's temporary directory.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The process's PID, while it runs (to pause it with `SIGSTOP`).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
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

    /// Runs one inline command and returns the first reply line (over
    /// TLS, with the client certificate, for a TLS server).
    pub fn command(&self, cmd: &str) -> Result<String, HarnessError> {
        let tls = self.tls.as_ref().map(|t| &t.client);
        Ok(command_reply(self.port, tls, cmd)?)
    }

    /// How many times `command` (lower case: `evalsha`) ran since the
    /// server started or its last `CONFIG RESETSTAT`, from `INFO
    /// commandstats`; 0 if it never ran.
    pub fn command_calls(&self, command: &str) -> Result<u64, HarnessError> {
        let info = self.command("INFO commandstats")?;
        let prefix = format!("cmdstat_{command}:calls=");
        Ok(info
            .lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|rest| rest.split(',').next()?.parse().ok())
            .unwrap_or(0))
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
        Self::start_inner(None)
    }

    /// Starts three TLS-only cluster nodes (as
    /// [`RedisServer::start_tls`]) whose cluster bus is TLS too
    /// (`--tls-cluster yes`, so `CLUSTER SLOTS` names the TLS ports), and
    /// joins them; their [`urls`](Self::urls) are `rediss://`.
    pub fn start_tls(certs: &TestCerts) -> Result<Self, HarnessError> {
        Self::start_inner(Some(Tls::new(certs)?))
    }

    fn start_inner(tls: Option<Tls>) -> Result<Self, HarnessError> {
        let cli = binary("redis-cli", "redis-tools")?;
        let nodes = (0..3)
            .map(|_| {
                // The bus port is given: the default (port + 10000) is
                // out of range for a port above 55535.
                let bus = free_port()?.to_string();
                let mut args = vec![
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "2000",
                    "--cluster-port",
                    &bus,
                ];
                if tls.is_some() {
                    args.extend(["--tls-cluster", "yes", "--tls-replication", "yes"]);
                }
                RedisServer::start_inner(&args, tls.clone())
            })
            .collect::<Result<Vec<_>, _>>()?;
        let addresses: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        let status = Command::new(cli)
            .args(tls.iter().flat_map(Tls::cli_args))
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
            wait_until("cluster_state:ok", Duration::from_secs(15), || {
                node.command("CLUSTER INFO")
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
        Self::start_inner(false, None)
    }

    /// Starts a master, a replica of it, and a sentinel that will fail
    /// over to the replica once the master is down for a second.
    pub fn start_with_replica() -> Result<Self, HarnessError> {
        Self::start_inner(true, None)
    }

    /// Starts a TLS-only master (as [`RedisServer::start_tls`]) and a
    /// TLS-only sentinel that reaches it over TLS (`tls-replication
    /// yes`); the [`sentinel_url`](Self::sentinel_url) is `rediss://`.
    pub fn start_tls(certs: &TestCerts) -> Result<Self, HarnessError> {
        Self::start_inner(false, Some(Tls::new(certs)?))
    }

    fn start_inner(with_replica: bool, tls: Option<Tls>) -> Result<Self, HarnessError> {
        // A replica's first sync through a file: a diskless one waits 5 s
        // for more replicas to join, and once done streams nothing until
        // the replica's first acknowledgement (up to a second after it
        // shows online), so a write at once would not reach it.
        let master = RedisServer::start_inner(&["--repl-diskless-sync", "no"], tls.clone())?;
        let replica = if with_replica {
            let replica = RedisServer::start_inner(
                &["--replicaof", "127.0.0.1", &master.port().to_string()],
                tls.clone(),
            )?;
            // The sentinel learns about the replica from the master; the
            // replica has the master's data once its first sync is done.
            wait_until(
                "the replica is linked to the master and synced",
                Duration::from_secs(10),
                || {
                    master.command("INFO replication").is_ok_and(|r| {
                        r.contains("connected_slaves:1") && r.contains("state=online")
                    })
                },
            )?;
            Some(replica)
        } else {
            None
        };
        let dir = tempfile::tempdir()?;
        let config = dir.path().join("sentinel.conf");
        let mut text = format!(
            "sentinel monitor {SENTINEL_SERVICE} 127.0.0.1 {} 1\nsentinel down-after-milliseconds {SENTINEL_SERVICE} 1000\n",
            master.port()
        );
        if tls.is_some() {
            // The sentinel talks TLS to the servers it monitors.
            text.push_str("tls-replication yes\n");
        }
        std::fs::write(&config, text)?;
        let config = config.to_string_lossy().into_owned();
        // The sentinel is redis-server in sentinel mode; it rewrites its
        // config file, which lives in its own temporary directory.
        let mut sentinel = RedisServer {
            child: None,
            port: free_port()?,
            dir,
            extra: vec![],
            tls,
        };
        sentinel.launch_sentinel(&config)?;
        wait_until("sentinel knows the master", Duration::from_secs(10), || {
            sentinel
                .command(&format!(
                    "SENTINEL get-master-addr-by-name {SENTINEL_SERVICE}"
                ))
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

    /// Waits until the sentinel names the replica as the master (after
    /// [`stop_master`](Self::stop_master)), for at most `within`.
    pub fn wait_for_failover(&self, within: Duration) -> Result<(), HarnessError> {
        let Some(replica) = &self.replica else {
            return Err(HarnessError::NotReady("no replica to fail over to".into()));
        };
        let port = replica.port().to_string();
        let ask = format!("SENTINEL get-master-addr-by-name {SENTINEL_SERVICE}");
        wait_until("the sentinel promotes the replica", within, || {
            // The reply is an array: the host, then the port.
            self.sentinel_reply(&ask)
                .is_ok_and(|r| r.lines().any(|l| l == port))
        })
    }

    /// A sentinel command's reply of bulk strings, one a line (a plain
    /// connection: the TLS set-up has no replica to promote).
    fn sentinel_reply(&self, cmd: &str) -> Result<String, HarnessError> {
        let stream = TcpStream::connect(("127.0.0.1", self.sentinel.port()))?;
        stream.set_read_timeout(Some(Duration::from_secs(2)))?;
        let mut writer = stream.try_clone()?;
        writer.write_all(format!("{cmd}\r\n").as_bytes())?;
        let mut reader = BufReader::new(stream);
        let mut line = String::new();
        reader.read_line(&mut line)?;
        let count: usize = line
            .trim()
            .strip_prefix('*')
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        let mut lines = Vec::with_capacity(count);
        for _ in 0..count {
            let (mut head, mut body) = (String::new(), String::new());
            reader.read_line(&mut head)?;
            reader.read_line(&mut body)?;
            lines.push(body.trim_end().to_owned());
        }
        Ok(lines.join("\n"))
    }

    /// The replica, if started with one.
    pub fn replica(&self) -> Option<&RedisServer> {
        self.replica.as_ref()
    }

    /// The sentinel's URL (`rediss://` for a TLS set-up).
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
        command.arg(config).arg("--sentinel");
        match &self.tls {
            None => command.args(["--port", &self.port.to_string()]),
            Some(tls) => command.args(tls.server_args(self.port)),
        };
        command.args(["--bind", "127.0.0.1", "--protected-mode", "no"]);
        self.spawn(command, "sentinel")
    }
}
