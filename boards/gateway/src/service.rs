//! The service manager's notify protocol (systemd's `sd_notify`, for a
//! unit of `Type=notify`): `READY=1` once the replica is ready, the
//! watchdog's `WATCHDOG=1` while it runs, `STATUS=` with what it waits
//! for, `STOPPING=1` when it stops.
//!
//! Guarantees:
//! - `READY=1` is sent once, when `/readyz` would first answer 200: the
//!   locker has answered, every endpoint has started and every source
//!   reaches its server ([`Readiness`]).
//! - `WATCHDOG=1` is sent at least every half of `WATCHDOG_USEC` (as
//!   `sd_watchdog_enabled(3)` advises), from a task on the executor that
//!   runs every endpoint, lease and schedule of the replica: an executor
//!   that hangs (a task that blocks it) stops the pings, and the service
//!   manager restarts the gateway. A `WATCHDOG_PID` naming another
//!   process turns the pings off, as `sd_watchdog_enabled` does.
//! - Without `NOTIFY_SOCKET` nothing is sent; a `NOTIFY_SOCKET` that is
//!   neither a path nor an `@`abstract name is an error at start, naming
//!   the variable, never ignored.
//! - A datagram the manager does not take is logged (throttled) and the
//!   gateway goes on: a manager that restarts is not a reason to stop.

use std::env;
use std::io;
use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use guard_smol::Control;
use guard_std::Throttle;

use crate::readiness::Readiness;

/// How often readiness is looked at before `READY=1` is sent and while
/// the status is kept current.
pub const POLL: Duration = Duration::from_millis(200);

/// A `NOTIFY_SOCKET` or `WATCHDOG_USEC` the gateway cannot use.
#[derive(Debug)]
pub struct ServiceError {
    variable: &'static str,
    value: String,
    expected: &'static str,
}

impl std::fmt::Display for ServiceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the environment variable {} = {:?}: expected {}",
            self.variable, self.value, self.expected
        )
    }
}

impl std::error::Error for ServiceError {}

/// Where the service manager listens.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Address {
    Path(PathBuf),
    /// A Linux abstract socket name (written `@name`).
    Abstract(Vec<u8>),
}

/// The service manager's socket and watchdog, as its environment gives
/// them.
#[derive(Debug)]
pub struct Notifier {
    socket: UnixDatagram,
    address: Address,
    watchdog: Option<Duration>,
    failures: Throttle,
}

impl Notifier {
    /// The notifier the environment asks for: `None` without
    /// `NOTIFY_SOCKET` (not run by a service manager, or not as
    /// `Type=notify`).
    pub fn from_env() -> Result<Option<Self>, ServiceError> {
        let socket = env::var_os("NOTIFY_SOCKET").map(|s| s.to_string_lossy().into_owned());
        Self::from_values(
            socket,
            env::var("WATCHDOG_USEC").ok().as_deref(),
            env::var("WATCHDOG_PID").ok().as_deref(),
        )
    }

    /// The notifier of `NOTIFY_SOCKET`, `WATCHDOG_USEC` and
    /// `WATCHDOG_PID` as given.
    fn from_values(
        socket: Option<String>,
        usec: Option<&str>,
        pid: Option<&str>,
    ) -> Result<Option<Self>, ServiceError> {
        let Some(socket) = socket else {
            return Ok(None);
        };
        let address = if let Some(name) = socket.strip_prefix('@') {
            Address::Abstract(name.as_bytes().to_vec())
        } else if socket.starts_with('/') {
            Address::Path(PathBuf::from(&socket))
        } else {
            return Err(ServiceError {
                variable: "NOTIFY_SOCKET",
                value: socket,
                expected: "an absolute path or an @abstract socket name",
            });
        };
        let watchdog = watchdog(usec, pid)?;
        let socket = UnixDatagram::unbound().map_err(|e| ServiceError {
            variable: "NOTIFY_SOCKET",
            value: format!("{socket} ({e})"),
            expected: "a datagram socket this process can open",
        })?;
        Ok(Some(Notifier {
            socket,
            address,
            watchdog,
            failures: Throttle::new(),
        }))
    }

    /// How often the watchdog expects a ping, if it is on for this
    /// process.
    pub fn watchdog(&self) -> Option<Duration> {
        self.watchdog
    }

    /// Sends `state` (`READY=1`, `WATCHDOG=1`, newline-separated
    /// assignments) in one datagram.
    pub fn notify(&self, state: &str) -> io::Result<()> {
        let sent = match &self.address {
            Address::Path(path) => self.socket.send_to(state.as_bytes(), path),
            Address::Abstract(name) => {
                use std::os::linux::net::SocketAddrExt;
                let address = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
                self.socket.send_to_addr(state.as_bytes(), &address)
            }
        };
        sent.map(|_| ())
    }

    fn tell(&self, state: &str) {
        if let Err(e) = self.notify(state)
            && let Some(unlogged) = self.failures.admit()
        {
            tracing::warn!(
                "service manager: {:?} not sent: {e} ({unlogged} more not logged)",
                state.lines().next().unwrap_or_default()
            );
        }
    }

    /// Tells `STATUS=connecting` and pings the watchdog (when it is on);
    /// never ends: what the manager hears while the replica connects,
    /// raced against the connecting on the thread that does it.
    pub async fn connecting(&self) {
        self.tell("STATUS=connecting");
        loop {
            if self.watchdog.is_some() {
                self.tell("WATCHDOG=1");
            }
            async_io::Timer::after(self.tick()).await;
        }
    }

    /// How long the reports sleep: at most [`POLL`], and often enough
    /// that each half-period of the watchdog holds a ping.
    fn tick(&self) -> Duration {
        self.watchdog.map_or(POLL, |w| (w / 4).min(POLL))
    }

    /// Tells the manager a reload has begun (`RELOADING=1`, with
    /// `MONOTONIC_USEC=`, which systemd 253 and later require): it holds
    /// the unit in `reloading` until [`reloaded`](Self::reloaded).
    pub fn reloading(&self) {
        self.tell(&format!(
            "RELOADING=1\nMONOTONIC_USEC={}\nSTATUS=reloading",
            monotonic_usec()
        ));
    }

    /// Tells the manager a reload has ended, applied or refused
    /// (`READY=1`), with what `ready` says now.
    pub fn reloaded(&self, ready: &Readiness) {
        self.tell(&format!("READY=1\nSTATUS={}", one_line(&status(ready))));
    }

    /// Tells the manager what `ready` says until `control` stops: the
    /// status and `READY=1` once ready, the watchdog's pings throughout,
    /// `STOPPING=1` at the end. Runs as a task of the replica's own
    /// executor (the pings' guarantee).
    pub async fn report(self: Arc<Self>, ready: Arc<Readiness>, control: Control) {
        let mut told_ready = false;
        let mut told = String::new();
        let mut pinged: Option<Instant> = None;
        while !control.is_stopped() {
            let now = status(&ready);
            if now != told {
                told = now;
                let ready_line = if !told_ready && told == "ready" {
                    told_ready = true;
                    "READY=1\n"
                } else {
                    ""
                };
                self.tell(&format!("{ready_line}STATUS={}", one_line(&told)));
            }
            if let Some(period) = self.watchdog
                && pinged.is_none_or(|at| at.elapsed() >= period / 2)
            {
                self.tell("WATCHDOG=1");
                pinged = Some(Instant::now());
            }
            futures_lite::future::or(control.stopped(), async {
                async_io::Timer::after(self.tick()).await;
            })
            .await;
        }
        self.tell("STOPPING=1\nSTATUS=stopping");
    }
}

/// The watchdog's period from `WATCHDOG_USEC`, when it is for this
/// process (`WATCHDOG_PID` unset or this process's id).
fn watchdog(usec: Option<&str>, pid: Option<&str>) -> Result<Option<Duration>, ServiceError> {
    let Some(usec) = usec else {
        return Ok(None);
    };
    let period = usec
        .trim()
        .parse::<u64>()
        .ok()
        .filter(|&us| us > 0)
        .ok_or_else(|| ServiceError {
            variable: "WATCHDOG_USEC",
            value: usec.to_owned(),
            expected: "a whole number of microseconds, above 0",
        })?;
    if let Some(pid) = pid
        && pid.trim().parse::<u32>().ok() != Some(std::process::id())
    {
        return Ok(None);
    }
    Ok(Some(Duration::from_micros(period)))
}

/// `CLOCK_MONOTONIC` now, in microseconds.
fn monotonic_usec() -> u64 {
    let now = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    let seconds = u64::try_from(now.tv_sec).unwrap_or(0);
    let micros = u64::try_from(now.tv_nsec).unwrap_or(0) / 1_000;
    seconds.saturating_mul(1_000_000).saturating_add(micros)
}

/// What `ready` says, as a status: `ready`, or what it waits for.
fn status(ready: &Readiness) -> String {
    match ready.check() {
        Ok(()) => "ready".to_owned(),
        Err(waiting) => format!("waiting: {waiting}"),
    }
}

/// A status is one line: the protocol reads assignments a line each.
fn one_line(text: &str) -> String {
    text.replace(['\n', '\r'], " ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_watchdog_is_for_this_process_only_and_a_bad_period_is_refused() {
        assert_eq!(watchdog(None, None).unwrap(), None);
        assert_eq!(
            watchdog(Some("30000000"), None).unwrap(),
            Some(Duration::from_secs(30))
        );
        let mine = std::process::id().to_string();
        assert_eq!(
            watchdog(Some("2000000"), Some(&mine)).unwrap(),
            Some(Duration::from_secs(2))
        );
        assert_eq!(watchdog(Some("2000000"), Some("1")).unwrap(), None);
        for bad in ["0", "", "soon", "-5"] {
            let e = watchdog(Some(bad), None).unwrap_err().to_string();
            assert!(e.contains("WATCHDOG_USEC"), "{e}");
        }
    }

    #[test]
    fn states_reach_a_path_and_an_abstract_socket_and_a_bad_address_is_refused() {
        let dir = std::env::temp_dir().join(format!("guard-notify-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("notify");
        let _ = std::fs::remove_file(&path);
        let manager = UnixDatagram::bind(&path).unwrap();
        let notifier = Notifier::from_values(Some(path.display().to_string()), None, None)
            .unwrap()
            .unwrap();
        notifier.notify("READY=1").unwrap();
        let mut buffer = [0u8; 64];
        let n = manager.recv(&mut buffer).unwrap();
        assert_eq!(&buffer[..n], b"READY=1");
        std::fs::remove_dir_all(&dir).unwrap();

        use std::os::linux::net::SocketAddrExt;
        let name = format!("guard-notify-{}", std::process::id());
        let address = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let manager = UnixDatagram::bind_addr(&address).unwrap();
        let notifier = Notifier::from_values(Some(format!("@{name}")), Some("1000000"), None)
            .unwrap()
            .unwrap();
        assert_eq!(notifier.watchdog(), Some(Duration::from_secs(1)));
        notifier.notify("WATCHDOG=1").unwrap();
        let n = manager.recv(&mut buffer).unwrap();
        assert_eq!(&buffer[..n], b"WATCHDOG=1");

        assert!(
            Notifier::from_values(None, Some("1000000"), None)
                .unwrap()
                .is_none()
        );
        let e = Notifier::from_values(Some("vsock:2:1".into()), None, None).unwrap_err();
        assert!(e.to_string().contains("NOTIFY_SOCKET"), "{e}");
    }

    #[test]
    fn a_status_stays_on_one_line() {
        assert_eq!(one_line("a\nREADY=1\r\nb"), "a READY=1  b");
    }
}
