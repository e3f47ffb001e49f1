//! A `nats-server` with JetStream on a free loopback port, in a temporary
//! directory, stopped by PID when dropped (also when a test panics). A
//! server this machine may already run is never touched.
//!
//! [`NatsServer::restart`] stops it and starts it again on the same port
//! with the same JetStream store, as a server restart looks to clients.

use std::fmt;
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::process::{HarnessError, find_binary, free_port, wait_until};

/// One `nats-server` process.
pub struct NatsServer {
    child: Option<Child>,
    binary: PathBuf,
    port: u16,
    dir: tempfile::TempDir,
}

impl fmt::Debug for NatsServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NatsServer")
            .field("port", &self.port)
            .field("running", &self.child.is_some())
            .finish()
    }
}

impl NatsServer {
    /// Starts a server with JetStream and waits until it accepts
    /// connections.
    pub fn start() -> Result<Self, HarnessError> {
        // Debian puts the server in /usr/sbin, which a user's PATH may lack.
        let mut path = std::env::var_os("PATH").unwrap_or_default();
        path.push(":/usr/sbin");
        let binary = find_binary("nats-server", "nats-server", &path)?;
        let mut server = NatsServer {
            child: None,
            binary,
            port: free_port()?,
            dir: tempfile::tempdir()?,
        };
        server.spawn()?;
        Ok(server)
    }

    fn spawn(&mut self) -> Result<(), HarnessError> {
        let child = Command::new(&self.binary)
            .args([
                "-a",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-js",
                "-sd",
            ])
            .arg(self.dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        self.child = Some(child);
        let port = self.port;
        wait_until(
            &format!("nats-server on port {port}"),
            Duration::from_secs(10),
            || TcpStream::connect(("127.0.0.1", port)).is_ok(),
        )
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `nats://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Stops the process (by PID) and waits for it.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops the server and starts it again on the same port and store.
    pub fn restart(&mut self) -> Result<(), HarnessError> {
        self.stop();
        self.spawn()
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.stop();
    }
}
