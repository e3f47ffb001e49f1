//! Helpers for tests that start their own servers: find a binary (naming
//! the Debian package when it is missing), pick a free loopback port, wait
//! for readiness.

use std::fmt;
use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
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

/// The lowest port a test server is given.
const LOWEST_PORT: u32 = 20_000;

/// A port nobody listens on right now, below the kernel's ephemeral range.
///
/// Port 0 would hand out a port from the ephemeral range, where every
/// outgoing connection takes its local port too: between this probe and
/// the server's bind, a client connection of a parallel test could take
/// it, the server would not start, and a client would reach whatever holds
/// it (a reset). Below that range only explicit binds compete, and a
/// counter keeps one process from handing the same port out twice.
pub fn free_port() -> Result<u16, HarnessError> {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let highest = ephemeral_low().unwrap_or(32_768);
    if highest < LOWEST_PORT + 1_000 {
        // No room below the range: the kernel's choice, as before.
        return Ok(TcpListener::bind(("127.0.0.1", 0))?.local_addr()?.port());
    }
    let span = highest - LOWEST_PORT;
    // Processes start at different places, so two test binaries rarely
    // probe the same ports.
    let start = std::process::id().wrapping_mul(7_919) % span;
    for _ in 0..span {
        let offset = (start + NEXT.fetch_add(1, Ordering::Relaxed)) % span;
        let Ok(port) = u16::try_from(LOWEST_PORT + offset) else {
            continue;
        };
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    Err(HarnessError::Io(std::io::Error::other(format!(
        "no free loopback port between {LOWEST_PORT} and {highest}"
    ))))
}

/// The first port of the kernel's ephemeral range, where it says.
fn ephemeral_low() -> Option<u32> {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// A child process, killed (by PID) and reaped when dropped, even when
/// the test fails.
#[derive(Debug)]
pub struct KillOnDrop(pub std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Whether `done` came to hold within `limit` (polled every 20 ms).
pub fn holds_within(limit: Duration, done: impl FnMut() -> bool) -> bool {
    wait_until("condition", limit, done).is_ok()
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
