//! A private MariaDB server that logs rows to its binlog, for the binlog
//! reader's tests: its own data directory (made by `mariadb-install-db`)
//! and a free loopback port, stopped by PID when dropped (also when a
//! test panics). A server this machine may already run is never touched.
//!
//! It runs with `--log-bin`, `--binlog-format=ROW`, `--server-id=1` and
//! `--skip-grant-tables` (every client is root, with every privilege, the
//! binlog's included). [`MariaDb::restart`] stops it and starts it again
//! on the same port and data, as a server restart looks to clients.

use std::fmt;
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::process::{HarnessError, find_binary, free_port, wait_until};

/// One `mariadbd` process.
pub struct MariaDb {
    child: Option<Child>,
    server: PathBuf,
    client: PathBuf,
    port: u16,
    dir: tempfile::TempDir,
}

impl fmt::Debug for MariaDb {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MariaDb")
            .field("port", &self.port)
            .field("running", &self.child.is_some())
            .finish()
    }
}

/// `PATH` with the directories Debian puts servers in.
fn search_path() -> std::ffi::OsString {
    let mut path = std::env::var_os("PATH").unwrap_or_default();
    path.push(":/usr/sbin:/usr/bin");
    path
}

impl MariaDb {
    /// Makes a data directory and starts a server on it.
    pub fn start() -> Result<Self, HarnessError> {
        let path = search_path();
        let install = find_binary("mariadb-install-db", "mariadb-server", &path)?;
        let server = find_binary("mariadbd", "mariadb-server", &path)?;
        let client = find_binary("mariadb", "mariadb-client", &path)?;
        let dir = tempfile::tempdir()?;
        let data = dir.path().join("data");
        let mut command = Command::new(install);
        command
            .arg("--no-defaults")
            .arg(format!("--datadir={}", data.display()))
            .args(["--skip-test-db", "--auth-root-authentication-method=normal"]);
        if running_as_root() {
            command.arg("--user=root");
        }
        // Several tests install at once; one that fails is tried again
        // (into a clean directory) before its output is reported.
        let mut attempts = 0;
        loop {
            attempts += 1;
            let installed = command.stdout(Stdio::null()).output()?;
            if installed.status.success() {
                break;
            }
            if attempts == 3 {
                return Err(HarnessError::NotReady(format!(
                    "mariadb-install-db exited with {}: {}",
                    installed.status,
                    String::from_utf8_lossy(&installed.stderr).trim()
                )));
            }
            let _ = std::fs::remove_dir_all(&data);
            std::thread::sleep(Duration::from_millis(200));
        }
        let mut db = MariaDb {
            child: None,
            server,
            client,
            port: free_port()?,
            dir,
        };
        db.spawn()?;
        Ok(db)
    }

    fn spawn(&mut self) -> Result<(), HarnessError> {
        let dir = self.dir.path();
        let mut command = Command::new(&self.server);
        command
            .arg("--no-defaults")
            .arg(format!("--datadir={}", dir.join("data").display()))
            .arg(format!("--socket={}", dir.join("mysqld.sock").display()))
            .arg(format!("--pid-file={}", dir.join("mysqld.pid").display()))
            .arg(format!(
                "--log-bin={}",
                dir.join("data").join("binlog").display()
            ))
            .arg(format!("--port={}", self.port))
            .args([
                "--bind-address=127.0.0.1",
                "--binlog-format=ROW",
                "--server-id=1",
                "--skip-grant-tables",
                "--skip-name-resolve",
                "--innodb-buffer-pool-size=16M",
            ]);
        if running_as_root() {
            command.arg("--user=root");
        }
        self.child = Some(
            command
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()?,
        );
        let port = self.port;
        wait_until(
            &format!("mariadbd on port {port}"),
            Duration::from_secs(30),
            || TcpStream::connect(("127.0.0.1", port)).is_ok(),
        )
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `mysql://root@127.0.0.1:<port>/<database>`.
    pub fn url(&self, database: &str) -> String {
        format!("mysql://root@127.0.0.1:{}/{database}", self.port)
    }

    /// Runs `sql` with the `mariadb` client; its output, tab-separated,
    /// without column names.
    pub fn execute(&self, sql: &str) -> Result<String, HarnessError> {
        let output = Command::new(&self.client)
            .args([
                "-h",
                "127.0.0.1",
                "-P",
                &self.port.to_string(),
                "-u",
                "root",
            ])
            .args(["--batch", "--skip-column-names", "-e", sql])
            .output()?;
        if !output.status.success() {
            return Err(HarnessError::NotReady(format!(
                "{sql}: {}",
                String::from_utf8_lossy(&output.stderr).trim()
            )));
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    /// Stops the process (by PID) and waits for it.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops the server and starts it again on the same port and data.
    pub fn restart(&mut self) -> Result<(), HarnessError> {
        self.stop();
        self.spawn()
    }
}

impl Drop for MariaDb {
    fn drop(&mut self) {
        self.stop();
    }
}

fn running_as_root() -> bool {
    // The effective user of this process, as the servers check it.
    std::fs::metadata("/proc/self")
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0)
        .unwrap_or(false)
}
