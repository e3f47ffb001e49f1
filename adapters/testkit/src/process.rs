//! Helpers for tests that start their own servers: find a binary (naming
//! the Debian package when it is missing), pick a free loopback port, wait
//! for readiness.

use std::fmt;
use std::net::TcpListener;
use std::path::PathBuf;
use std::thread;
use std::time::{Duration, Instant};

/// Why a test server could not be started.
#[derive(Debug)]
pub enum HarnessError {
    /// A binary is not installed.
    MissingBinary {
        /// The binary.
        binary: &'static str,
        /// The Debian package that provides it.
        package: &'static str,
    },
    /// Starting or talking to a process failed.
    Io(std::io::Error),
    /// A server did not become ready in time.
    NotReady(String),
}

impl fmt::Display for HarnessError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HarnessError::MissingBinary { binary, package } => write!(
                f,
                "`{binary}` was not found: install the Debian package `{package}` (apt-get install {package}); the test script does this"
            ),
            HarnessError::Io(e) => write!(f, "test server: {e}"),
            HarnessError::NotReady(what) => write!(f, "test server not ready: {what}"),
        }
    }
}

impl std::error::Error for HarnessError {}

impl From<std::io::Error> for HarnessError {
    fn from(e: std::io::Error) -> Self {
        HarnessError::Io(e)
    }
}

/// Looks `name` up on `PATH`; a missing one is an error naming the
/// Debian `package` that provides it.
pub fn binary(name: &'static str, package: &'static str) -> Result<PathBuf, HarnessError> {
    find_binary(name, package, &std::env::var_os("PATH").unwrap_or_default())
}

/// Looks `name` up in a `PATH`-style list of directories; a missing one
/// is an error naming the Debian `package` that provides it.
pub fn find_binary(
    name: &'static str,
    package: &'static str,
    path: &std::ffi::OsStr,
) -> Result<PathBuf, HarnessError> {
    std::env::split_paths(path)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
        .ok_or(HarnessError::MissingBinary {
            binary: name,
            package,
        })
}

/// A port nobody listens on right now.
pub fn free_port() -> Result<u16, HarnessError> {
    Ok(TcpListener::bind(("127.0.0.1", 0))?.local_addr()?.port())
}

/// Polls `ready` every 20 ms until it holds or `timeout` passes.
pub fn wait_until(
    what: &str,
    timeout: Duration,
    mut ready: impl FnMut() -> bool,
) -> Result<(), HarnessError> {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if ready() {
            return Ok(());
        }
        thread::sleep(Duration::from_millis(20));
    }
    Err(HarnessError::NotReady(what.to_owned()))
}

/// The names of this process's threads (Linux: `/proc/self/task`), for
/// tests that check which runtimes started threads.
pub fn thread_names() -> Vec<String> {
    std::fs::read_dir("/proc/self/task")
        .map(|tasks| {
            tasks
                .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
                .map(|name| name.trim().to_owned())
                .collect()
        })
        .unwrap_or_default()
}
