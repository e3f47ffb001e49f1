//! PostgreSQL for tests: a database unique to the test on the machine's
//! server, and a private server (its own data directory and port) that a
//! test can stop and start again.
//!
//! - [`PgDatabase`]: `CREATE DATABASE guard_<pid>_<nanos>` on a running
//!   server (by default `postgres@127.0.0.1:5432`, trust authentication),
//!   dropped (`WITH (FORCE)`, so open connections do not keep it) when the
//!   value is dropped, also when a test panics.
//! - [`PgServer`]: `initdb` into a temporary directory and `postgres` on a
//!   free 127.0.0.1 port, its socket in that directory; stopped by PID
//!   (SIGINT: a fast shutdown that checkpoints, so the data survives a
//!   [`start_again`](PgServer::start_again)) when dropped. PostgreSQL
//!   refuses to run as root: a root test runs `initdb` and `postgres` as
//!   the `postgres` user and gives it the directory.
//!
//! Statements go through `psql`, so the harness needs no client library.
//! A missing binary is an error naming the Debian package to install.

use std::fmt;
use std::os::unix::fs::MetadataExt as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::process::{HarnessError, binary, free_port, wait_until};

/// The server [`PgDatabase::create`] uses: the default local one.
pub const MACHINE_HOST: &str = "127.0.0.1";
/// Its port.
pub const MACHINE_PORT: u16 = 5432;
/// The superuser the harness connects as (trust authentication).
pub const SUPERUSER: &str = "postgres";

/// How long a server has to start or stop.
const READY_TIMEOUT: Duration = Duration::from_secs(20);

/// Runs `sql` with `psql` against `database` on `host:port` as the
/// superuser; returns its unaligned, tuples-only output, trimmed.
fn psql(host: &str, port: u16, database: &str, sql: &str) -> Result<String, HarnessError> {
    let output = Command::new(binary("psql", "postgresql-client")?)
        .args(["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1"])
        .args(["-h", host, "-p", &port.to_string(), "-U", SUPERUSER])
        .args(["-d", database, "-c", sql])
        .env("PGCONNECT_TIMEOUT", "5")
        .stdin(Stdio::null())
        .output()?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
    } else {
        Err(HarnessError::Io(std::io::Error::other(format!(
            "psql on {host}:{port}/{database}: {sql}: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        ))))
    }
}

/// A name no other run uses: `guard_<pid>_<nanos since the epoch>`.
fn unique_name() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!("guard_{}_{nanos}", std::process::id())
}

/// A database created for one test on a running server, dropped with
/// the value.
pub struct PgDatabase {
    host: String,
    port: u16,
    name: String,
}

impl fmt::Debug for PgDatabase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgDatabase")
            .field("url", &self.url())
            .finish()
    }
}

impl PgDatabase {
    /// A new database on the machine's server ([`MACHINE_HOST`]:[`MACHINE_PORT`]).
    pub fn create() -> Result<Self, HarnessError> {
        Self::create_on(MACHINE_HOST, MACHINE_PORT)
    }

    /// A new database on the server at `host:port`.
    pub fn create_on(host: &str, port: u16) -> Result<Self, HarnessError> {
        let name = unique_name();
        psql(
            host,
            port,
            "postgres",
            &format!("CREATE DATABASE \"{name}\""),
        )?;
        Ok(PgDatabase {
            host: host.to_owned(),
            port,
            name,
        })
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `postgres://postgres@<host>:<port>/<name>`.
    pub fn url(&self) -> String {
        format!(
            "postgres://{SUPERUSER}@{}:{}/{}",
            self.host, self.port, self.name
        )
    }

    /// Runs `sql` in the database; its rows, one a line, columns
    /// separated by `|`.
    pub fn query(&self, sql: &str) -> Result<String, HarnessError> {
        psql(&self.host, self.port, &self.name, sql)
    }
}

impl Drop for PgDatabase {
    fn drop(&mut self) {
        let drop = format!("DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)", self.name);
        if let Err(e) = psql(&self.host, self.port, "postgres", &drop) {
            eprintln!("test database {} not dropped: {e}", self.name);
        }
    }
}

/// The directory of the newest installed server's binaries: Debian keeps
/// them in `/usr/lib/postgresql/<major>/bin`, off `PATH`; elsewhere they
/// are on `PATH`.
fn server_bin_dir() -> Result<PathBuf, HarnessError> {
    let newest = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let major: u32 = entry.file_name().to_str()?.parse().ok()?;
            let bin = entry.path().join("bin");
            bin.join("postgres").is_file().then_some((major, bin))
        })
        .max_by_key(|(major, _)| *major);
    if let Some((_, bin)) = newest {
        return Ok(bin);
    }
    let postgres = binary("postgres", "postgresql")?;
    Ok(postgres.parent().map(Path::to_path_buf).unwrap_or_default())
}

/// The `postgres` user's uid and gid, from `/etc/passwd`.
fn postgres_user() -> Result<(u32, u32), HarnessError> {
    let passwd = std::fs::read_to_string("/etc/passwd")?;
    passwd
        .lines()
        .find_map(|line| {
            let mut fields = line.split(':');
            if fields.next()? != "postgres" {
                return None;
            }
            let uid = fields.nth(1)?.parse().ok()?;
            let gid = fields.next()?.parse().ok()?;
            Some((uid, gid))
        })
        .ok_or_else(|| {
            HarnessError::Io(std::io::Error::other(
                "no `postgres` user in /etc/passwd: the server refuses to run as root (apt-get install postgresql creates it)",
            ))
        })
}

/// Whether this process runs as root (the owner of `/proc/self`).
fn running_as_root() -> bool {
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// A private PostgreSQL server: its own data directory and port.
pub struct PgServer {
    child: Option<Child>,
    port: u16,
    bin: PathBuf,
    /// The user the server runs as when the test runs as root.
    owner: Option<(u32, u32)>,
    dir: tempfile::TempDir,
}

impl fmt::Debug for PgServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgServer")
            .field("port", &self.port)
            .field("dir", &self.dir.path())
            .field("running", &self.child.is_some())
            .finish()
    }
}

impl PgServer {
    /// Creates a cluster (`initdb`, trust authentication, superuser
    /// `postgres`) and starts it; returns once it accepts queries.
    pub fn start() -> Result<Self, HarnessError> {
        let bin = server_bin_dir()?;
        for (name, package) in [("initdb", "postgresql"), ("postgres", "postgresql")] {
            if !bin.join(name).is_file() {
                return Err(HarnessError::MissingBinary {
                    binary: name,
                    package,
                });
            }
        }
        // psql is what readiness is checked with.
        binary("psql", "postgresql-client")?;
        let owner = if running_as_root() {
            Some(postgres_user()?)
        } else {
            None
        };
        let dir = tempfile::tempdir()?;
        if let Some((uid, gid)) = owner {
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid))?;
        }
        let mut server = PgServer {
            child: None,
            port: free_port()?,
            bin,
            owner,
            dir,
        };
        let initdb = server
            .command("initdb")
            .arg("-D")
            .arg(server.data_dir())
            .args(["-U", SUPERUSER, "-A", "trust", "-E", "UTF8", "--no-sync"])
            .stdout(Stdio::null())
            .output()?;
        if !initdb.status.success() {
            return Err(HarnessError::Io(std::io::Error::other(format!(
                "initdb: {}",
                String::from_utf8_lossy(&initdb.stderr).trim()
            ))));
        }
        server.start_again()?;
        Ok(server)
    }

    /// `name` from the server's binaries, as the server's user, in its
    /// directory.
    fn command(&self, name: &str) -> Command {
        let mut command = Command::new(self.bin.join(name));
        command.current_dir(self.dir.path());
        if let Some((uid, gid)) = self.owner {
            command.uid(uid).gid(gid);
        }
        command
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// Starts the server (again, after [`stop`](Self::stop)) on its port
    /// with its data; returns once it accepts queries.
    pub fn start_again(&mut self) -> Result<(), HarnessError> {
        if self.child.is_some() {
            return Ok(());
        }
        let child = self
            .command("postgres")
            .arg("-D")
            .arg(self.data_dir())
            .args(["-p", &self.port.to_string()])
            .arg("-k")
            .arg(self.dir.path())
            .args(["-c", "listen_addresses=127.0.0.1"])
            // A test server: durability against a crash of the machine
            // is not needed (a clean stop still checkpoints).
            .args(["-c", "fsync=off", "-c", "full_page_writes=off"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        self.child = Some(child);
        let port = self.port;
        wait_until(&format!("postgres on port {port}"), READY_TIMEOUT, || {
            psql(MACHINE_HOST, port, "postgres", "SELECT 1").is_ok()
        })
    }

    /// Stops the server by PID (SIGINT: fast shutdown, which ends the
    /// sessions and checkpoints) and waits for it; kills it if it has not
    /// stopped in time.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let interrupted = Command::new("kill")
            .args(["-INT", &child.id().to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if interrupted {
            let start = Instant::now();
            while start.elapsed() < READY_TIMEOUT {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let _ = child.kill();
        let _ = child.wait();
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `postgres://postgres@127.0.0.1:<port>/postgres`.
    pub fn url(&self) -> String {
        format!(
            "postgres://{SUPERUSER}@{MACHINE_HOST}:{}/postgres",
            self.port
        )
    }

    /// Runs `sql` in the `postgres` database; its rows, one a line,
    /// columns separated by `|`.
    pub fn query(&self, sql: &str) -> Result<String, HarnessError> {
        psql(MACHINE_HOST, self.port, "postgres", sql)
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process::find_binary;

    #[test]
    fn names_differ_between_calls() {
        let (a, b) = (unique_name(), unique_name());
        assert_ne!(a, b);
        assert!(a.starts_with(&format!("guard_{}_", std::process::id())));
    }

    #[test]
    fn a_missing_psql_names_its_package() {
        let err = find_binary(
            "psql",
            "postgresql-client",
            std::ffi::OsStr::new("/nonexistent"),
        )
        .unwrap_err();
        assert!(err.to_string().contains("postgresql-client"), "{err}");
    }
}
