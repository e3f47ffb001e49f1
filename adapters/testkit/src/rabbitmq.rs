//! RabbitMQ for tests: a virtual host unique to the test on the machine's
//! broker, and a private node that a test can restart.
//!
//! - [`Vhost`]: the machine's broker (127.0.0.1:5672, user `guest`) gets a
//!   virtual host made for one test with `rabbitmqctl add_vhost`, which
//!   `guest` may use, and deleted with everything in it when the value is
//!   dropped (also when the test panics). Nothing outside it is touched.
//! - [`RabbitNode`]: a `rabbitmq-server` of the test's own (its own node
//!   name, AMQP and distribution ports, data, logs, configuration and
//!   Erlang cookie in a temporary directory), stopped by PID when dropped.
//!   It takes several seconds to start (about 7 s on two cores, 5 s to
//!   start again on its data) and 3 s to stop: for the tests that must
//!   restart a broker. It registers with the machine's Erlang port mapper
//!   (`epmd`, which the machine's broker runs); where none runs, the node
//!   starts one on the loopback, and that one outlives the test.
//!
//! A missing `rabbitmqctl` or `rabbitmq-server` is
//! [`HarnessError::MissingBinary`] naming the Debian package
//! `rabbitmq-server`.

use std::ffi::OsString;
use std::fmt;
use std::fs;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::process::{HarnessError, find_binary, free_port, wait_until};

/// The machine's broker.
pub const MACHINE_BROKER: &str = "127.0.0.1:5672";

/// The Debian package of the broker and its tools.
const PACKAGE: &str = "rabbitmq-server";

/// How long one `rabbitmqctl` command may take.
const CTL_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a node may take to start.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a node may take to stop before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(15);

/// Where `rabbitmqctl` is: `PATH`, then `/usr/sbin` (which a user's
/// `PATH` may lack), where Debian puts the wrapper that runs it as the
/// broker's user, with the broker's Erlang cookie.
fn ctl_path() -> OsString {
    let mut path = std::env::var_os("PATH").unwrap_or_default();
    path.push(":/usr/sbin");
    path
}

/// Where `rabbitmq-server` is: `/usr/lib/rabbitmq/bin` first, where Debian
/// puts the script itself (`/usr/sbin`'s wrapper switches to the
/// `rabbitmq` user, who cannot write a test's temporary directory), then
/// `PATH` and `/usr/sbin`.
fn server_path() -> OsString {
    let mut path = OsString::from("/usr/lib/rabbitmq/bin:");
    path.push(ctl_path());
    path
}

/// A name no other test of any run has: `<prefix>-<pid>-<n>-<time>`.
fn unique_name(prefix: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    format!("{prefix}-{}-{n}-{nanos}", std::process::id())
}

/// Runs `command` to completion within `limit` (killed after it); an
/// error carries what it wrote on stderr.
fn run_bounded(command: &mut Command, what: &str, limit: Duration) -> Result<(), HarnessError> {
    let dir = tempfile::tempdir()?;
    let (out, err) = (dir.path().join("out"), dir.path().join("err"));
    let mut child = command
        .stdin(Stdio::null())
        .stdout(fs::File::create(&out)?)
        .stderr(fs::File::create(&err)?)
        .spawn()?;
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            return Err(HarnessError::NotReady(format!(
                "{what}: no answer within {limit:?}"
            )));
        }
        thread::sleep(Duration::from_millis(20));
    };
    if status.success() {
        return Ok(());
    }
    let stderr = fs::read_to_string(&err).unwrap_or_default();
    let stdout = fs::read_to_string(&out).unwrap_or_default();
    Err(HarnessError::NotReady(format!(
        "{what}: {status}: {} {}",
        stderr.trim(),
        stdout.trim()
    )))
}

/// A virtual host on the machine's broker, deleted when dropped.
pub struct Vhost {
    name: String,
    rabbitmqctl: PathBuf,
}

impl fmt::Debug for Vhost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Vhost").field("name", &self.name).finish()
    }
}

impl Vhost {
    /// Makes a virtual host unique to this test on the machine's broker
    /// and lets `guest` configure, write and read everything in it.
    pub fn create() -> Result<Self, HarnessError> {
        let rabbitmqctl = find_binary("rabbitmqctl", PACKAGE, &ctl_path())?;
        let name = unique_name("guard-test");
        run_bounded(
            Command::new(&rabbitmqctl).args(["add_vhost", &name]),
            &format!("rabbitmqctl add_vhost {name} (is the machine's broker running?)"),
            CTL_TIMEOUT,
        )?;
        // From here on, dropping it deletes it.
        let vhost = Vhost { name, rabbitmqctl };
        run_bounded(
            Command::new(&vhost.rabbitmqctl).args([
                "set_permissions",
                "-p",
                &vhost.name,
                "guest",
                ".*",
                ".*",
                ".*",
            ]),
            &format!("rabbitmqctl set_permissions -p {}", vhost.name),
            CTL_TIMEOUT,
        )?;
        Ok(vhost)
    }

    /// The virtual host's name (letters, digits and `-`: no encoding
    /// needed in a URL).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `amqp://guest:guest@127.0.0.1:5672/<name>`.
    pub fn url(&self) -> String {
        format!("amqp://guest:guest@{MACHINE_BROKER}/{}", self.name)
    }
}

impl Drop for Vhost {
    fn drop(&mut self) {
        let deleted = run_bounded(
            Command::new(&self.rabbitmqctl).args(["delete_vhost", &self.name]),
            &format!("rabbitmqctl delete_vhost {}", self.name),
            CTL_TIMEOUT,
        );
        if let Err(e) = deleted {
            eprintln!("test vhost {} left behind: {e}", self.name);
        }
    }
}

/// A `rabbitmq-server` of the test's own on free 127.0.0.1 ports, stopped
/// by PID when dropped.
pub struct RabbitNode {
    child: Option<Child>,
    server: PathBuf,
    node: String,
    port: u16,
    dist_port: u16,
    dir: tempfile::TempDir,
}

impl fmt::Debug for RabbitNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RabbitNode")
            .field("node", &self.node)
            .field("port", &self.port)
            .field("running", &self.child.is_some())
            .finish()
    }
}

impl RabbitNode {
    /// Starts a node and waits until it accepts connections.
    pub fn start() -> Result<Self, HarnessError> {
        let server = find_binary("rabbitmq-server", PACKAGE, &server_path())?;
        let dir = tempfile::tempdir()?;
        let port = free_port()?;
        let dist_port = free_port()?;
        let node = format!("{}@localhost", unique_name("guard-test"));
        let root = dir.path();
        fs::write(root.join("enabled_plugins"), "[].\n")?;
        // An environment file of its own: the machine's may name its node.
        fs::write(root.join("rabbitmq-env.conf"), "")?;
        fs::write(
            root.join("rabbitmq.conf"),
            format!(
                "listeners.tcp.1 = 127.0.0.1:{port}\n\
                 # A lone node has nobody to wait for.\n\
                 cluster_formation.randomized_startup_delay_range.min = 0\n\
                 cluster_formation.randomized_startup_delay_range.max = 0\n"
            ),
        )?;
        let mut rabbit = RabbitNode {
            child: None,
            server,
            node,
            port,
            dist_port,
            dir,
        };
        rabbit.launch()?;
        Ok(rabbit)
    }

    /// Starts the process on the node's data and waits for its listener.
    fn launch(&mut self) -> Result<(), HarnessError> {
        let root = self.dir.path();
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(root.join("console.log"))?;
        let child = Command::new(&self.server)
            // The script then runs the Erlang VM in its own place (it does
            // so under systemd), so the PID held here is the broker's, and
            // killing it stops the broker.
            .env("RUNNING_UNDER_SYSTEMD", "true")
            .env("HOME", root)
            .env("RABBITMQ_CONF_ENV_FILE", root.join("rabbitmq-env.conf"))
            .env("RABBITMQ_NODENAME", &self.node)
            .env("RABBITMQ_NODE_PORT", self.port.to_string())
            .env("RABBITMQ_DIST_PORT", self.dist_port.to_string())
            .env("RABBITMQ_MNESIA_BASE", root.join("mnesia"))
            .env("RABBITMQ_LOG_BASE", root.join("log"))
            .env(
                "RABBITMQ_ENABLED_PLUGINS_FILE",
                root.join("enabled_plugins"),
            )
            .env("RABBITMQ_CONFIG_FILE", root.join("rabbitmq.conf"))
            // Distribution and the port mapper on the loopback only.
            .env("ERL_EPMD_ADDRESS", "127.0.0.1")
            .env(
                "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS",
                "-kernel inet_dist_use_interface {127,0,0,1}",
            )
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?;
        self.child = Some(child);
        let port = self.port;
        let ready = wait_until(
            &format!("rabbitmq-server {} on port {port}", self.node),
            START_TIMEOUT,
            || TcpStream::connect(("127.0.0.1", port)).is_ok(),
        );
        if let Err(e) = ready {
            let console = fs::read_to_string(root.join("console.log")).unwrap_or_default();
            let tail: String = console
                .lines()
                .rev()
                .take(20)
                .collect::<Vec<_>>()
                .join("\n");
            self.kill();
            return Err(HarnessError::NotReady(format!("{e}; console:\n{tail}")));
        }
        Ok(())
    }

    /// The AMQP port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `amqp://guest:guest@127.0.0.1:<port>/%2f` (the default virtual
    /// host).
    pub fn url(&self) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.port)
    }

    /// Where the node keeps its data, logs and configuration.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Stops the node as an operator would (`SIGTERM`: it closes its
    /// client connections and writes its queues), killing it if it takes
    /// longer than 15 s; then waits for it.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let asked = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .is_ok_and(|s| s.success());
        let started = Instant::now();
        while asked && started.elapsed() < STOP_TIMEOUT {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
    }

    /// Stops the node ([`stop`](Self::stop)) and starts it again on the
    /// same ports and data: durable queues and exchanges survive.
    pub fn restart(&mut self) -> Result<(), HarnessError> {
        self.stop();
        self.launch()
    }

    /// Kills the process (by PID) and waits for it.
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for RabbitNode {
    fn drop(&mut self) {
        self.kill();
    }
}
