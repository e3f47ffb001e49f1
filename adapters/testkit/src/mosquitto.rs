//! A real Mosquitto broker for tests.
//!
//! The broker is a `mosquitto` child process on a free 127.0.0.1 port,
//! with a generated configuration (`listener <port> 127.0.0.1`,
//! `allow_anonymous true`, `persistence false`) in its own temporary
//! directory, stopped by PID when dropped (also when a test panics). A
//! broker this machine may already run is never touched.
//!
//! [`Mosquitto::start_tls`] gives the listener TLS (`cafile`, `certfile`,
//! `keyfile` from [`TestCerts`]; a client certificate is optional).

use std::fmt;
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use crate::process::{HarnessError, find_binary, free_port, wait_until};
use crate::tls::TestCerts;

/// One `mosquitto` process.
pub struct Mosquitto {
    child: Option<Child>,
    port: u16,
    tls: Option<Arc<rustls::ClientConfig>>,
    _dir: tempfile::TempDir,
    _certs: Option<TestCerts>,
}

impl fmt::Debug for Mosquitto {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mosquitto")
            .field("port", &self.port)
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

impl Mosquitto {
    /// Starts a broker and waits until it accepts connections.
    pub fn start() -> Result<Self, HarnessError> {
        Self::start_inner(None, free_port()?)
    }

    /// Starts a broker on `port` (one a client was told of before the
    /// broker existed) and waits until it accepts connections.
    pub fn start_on(port: u16) -> Result<Self, HarnessError> {
        Self::start_inner(None, port)
    }

    /// Starts a broker whose only listener is TLS, with `certs`' server
    /// certificate (clients need not present one), and waits until it
    /// accepts connections.
    pub fn start_tls(certs: &TestCerts) -> Result<Self, HarnessError> {
        Self::start_inner(Some(certs), free_port()?)
    }

    fn start_inner(certs: Option<&TestCerts>, port: u16) -> Result<Self, HarnessError> {
        // Debian puts the broker in /usr/sbin, which a user's PATH may lack.
        let mut path = std::env::var_os("PATH").unwrap_or_default();
        path.push(":/usr/sbin");
        let mosquitto = find_binary("mosquitto", "mosquitto", &path)?;
        let dir = tempfile::tempdir()?;
        let config = dir.path().join("mosquitto.conf");
        let mut text = format!(
            "listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\nlog_dest none\n"
        );
        if let Some(certs) = certs {
            // Options of the listener above.
            text.push_str(&format!(
                "cafile {}\ncertfile {}\nkeyfile {}\nrequire_certificate false\n",
                certs.ca_path().display(),
                certs.server_cert_path().display(),
                certs.server_key_path().display(),
            ));
        }
        std::fs::write(&config, text)?;
        let tls = certs.map(TestCerts::client_config).transpose()?;
        let child = Command::new(mosquitto)
            .arg("-c")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let broker = Mosquitto {
            child: Some(child),
            port,
            tls,
            _dir: dir,
            _certs: certs.cloned(),
        };
        wait_until(
            &format!("mosquitto on port {port}"),
            Duration::from_secs(10),
            || TcpStream::connect(("127.0.0.1", port)).is_ok(),
        )?;
        Ok(broker)
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Publishes `payloads` to `topic` at QoS 1 from a client of its own
    /// (over TLS, trusting the test CA, for a TLS broker), in order, and
    /// returns once the broker acknowledged every one.
    pub fn publish(&self, topic: &str, payloads: &[Vec<u8>]) -> Result<(), HarnessError> {
        use rumqttc::{
            AsyncClient, Event, Incoming, MqttOptions, QoS, TlsConfiguration, Transport,
        };
        let failed = |e: &dyn fmt::Display| HarnessError::NotReady(format!("publish: {e}"));
        // A client id of its own for each call: a broker takes a second
        // connection under one id over from the first, and resets the
        // first if it is still open (a publish from another thread, or
        // one whose DISCONNECT the broker has not read yet).
        static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let id = format!("testkit-publisher-{}-{call}", std::process::id());
        let mut options = MqttOptions::new(id, "127.0.0.1", self.port);
        if let Some(config) = &self.tls {
            options.set_transport(Transport::tls_with_config(TlsConfiguration::Rustls(
                config.clone(),
            )));
        }
        let (client, mut events) = AsyncClient::new(options, payloads.len().max(1));
        futures_lite::future::block_on(async_compat::Compat::new(async {
            for payload in payloads {
                client
                    .publish(topic, QoS::AtLeastOnce, false, payload.clone())
                    .await
                    .map_err(|e| failed(&e))?;
            }
            let mut acked = 0;
            while acked < payloads.len() {
                match events.poll().await {
                    Ok(Event::Incoming(Incoming::PubAck(_))) => acked += 1,
                    Ok(_) => {}
                    Err(e) => return Err(failed(&e)),
                }
            }
            client.disconnect().await.map_err(|e| failed(&e))?;
            // Send the DISCONNECT.
            while events.poll().await.is_ok() {}
            Ok(())
        }))
    }

    /// Stops the process (by PID) and waits for it.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Mosquitto {
    fn drop(&mut self) {
        self.stop();
    }
}
