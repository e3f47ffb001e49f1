//! What a schedule's run does, once per slot across replicas: report it
//! (the default), run a command, or send a message to a sink.
//!
//! - **A command** (`run = ["/usr/local/bin/backup", "--fast"]`, no
//!   shell) gets the schedule's name, chain, slot and fence in its
//!   environment (`GUARD_SCHEDULE`, `GUARD_CHAIN`, `GUARD_SLOT` in Unix
//!   milliseconds, `GUARD_FENCE`, empty without one), no standard input,
//!   and its output captured (the last [`KEPT_OUTPUT`] bytes of its
//!   standard error go into a failure's reason). Exit status 0 is
//!   success; another status, a command that cannot start and one still
//!   running at its `timeout_ms` (killed) are failures, retried under the
//!   schedule's policy, then reported as `failed …`. A command still
//!   running when the replica stops is killed, so a stop never waits for
//!   it. With `exclusive =
//!   true` the run holds a lock renewed by a `LockWatchdog`: a command
//!   still running when the next slot comes keeps every replica from
//!   starting it (that slot is skipped as `running_elsewhere`), and one
//!   whose lock is lost is killed at once, so runs never overlap.
//! - **A message** (`to = "<sink>"`): `{"schedule","chain","slot","fence"}`
//!   as JSON, its id `schedule:<chain>:<router>:<slot>` (the same on
//!   every attempt and on every replica), through the sink's retries;
//!   with exclusive runs no attempt is made once the run's lock is lost.

use std::process::Stdio;
use std::time::Duration;

use futures_lite::{AsyncReadExt, future};
use guard_core::retry::{Backoff, RetryPolicy, WithoutRandom};
use guard_endpoints::sink::{LeaseGate, MessageSink, Outgoing, deliver};
use guard_smol::{Control, JobRun};
use guard_std::run::{CallerRuntime, Runtime as _};

/// The bytes of a failed command's standard error kept in its reason.
pub const KEPT_OUTPUT: usize = 256;
/// A command's time limit unless configured: ten minutes.
pub const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(600);
/// The most a command may run: a day.
pub const MAX_COMMAND_TIMEOUT_MS: u64 = 24 * 3600 * 1000;

/// What a schedule's run does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Only reported (`executed …`).
    Report,
    /// A command run.
    Command(CommandAction),
    /// A message sent to a sink, by name.
    Send {
        /// The sink.
        sink: String,
    },
}

/// A schedule's command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandAction {
    /// The program and its arguments (no shell).
    pub argv: Vec<String>,
    /// Killed when still running after it.
    pub timeout: Duration,
    /// How a failed run is tried again.
    pub retry: RetryPolicy,
}

/// The slot a run is for, as the action sees it, and what stops the
/// replica (a command still running then is killed).
pub(crate) struct Slot<'a> {
    pub router: &'a str,
    pub chain: &'a str,
    pub run: &'a JobRun,
    pub stop: &'a Control,
}

/// How a run's action ended, when it failed.
#[derive(Debug)]
pub(crate) struct Failed {
    pub attempts: u32,
    pub reason: String,
}

/// The run's lock as a sink's lease gate (exclusive runs only).
struct RunLock<'a>(&'a JobRun);

impl LeaseGate for RunLock<'_> {
    fn fence(&self) -> u64 {
        self.0.fence.unwrap_or_default()
    }
    fn is_valid(&self) -> bool {
        !self.0.is_lost()
    }
}

/// Runs `command` for `slot`, retried under its policy: `Err` once the
/// attempts are spent, or the run's lock is lost or the replica stops
/// before the next attempt (nothing is started after either).
pub(crate) async fn run_command(command: &CommandAction, slot: &Slot<'_>) -> Result<(), Failed> {
    let mut backoff = Backoff::new(command.retry);
    let mut attempts = 0u32;
    loop {
        attempts = attempts.saturating_add(1);
        let reason = match once(command, slot).await {
            Ok(()) => return Ok(()),
            Err(reason) => reason,
        };
        let Some(delay) = backoff.next_delay(&mut WithoutRandom) else {
            return Err(Failed { attempts, reason });
        };
        tracing::warn!(
            "schedule {} slot {}: {reason}; retried in {delay:?}",
            slot.router,
            slot.run.slot
        );
        // A stop during the wait ends it at once.
        future::or(CallerRuntime.sleep(delay), slot.stop.stopped()).await;
        let ended = if slot.run.is_lost() {
            Some("the run's lock was lost")
        } else if slot.stop.is_stopped() {
            Some("the replica stopped")
        } else {
            None
        };
        if let Some(ended) = ended {
            return Err(Failed {
                attempts,
                reason: format!("{reason}; {ended} before the next attempt"),
            });
        }
    }
}

/// One attempt: the command started, waited for within its timeout and
/// the run's lock; killed when either ends first.
async fn once(command: &CommandAction, slot: &Slot<'_>) -> Result<(), String> {
    let Some((program, args)) = command.argv.split_first() else {
        return Err("no command".to_owned());
    };
    let mut child = smol::process::Command::new(program)
        .args(args)
        .env("GUARD_SCHEDULE", slot.router)
        .env("GUARD_CHAIN", slot.chain)
        .env("GUARD_SLOT", slot.run.slot.0.to_string())
        .env(
            "GUARD_FENCE",
            slot.run.fence.map_or_else(String::new, |f| f.to_string()),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot start {program:?}: {e}"))?;
    let stderr = child.stderr.take();
    let ran = async {
        // Read to the end (the pipe never fills and blocks the command),
        // keeping the tail.
        let mut kept = Vec::new();
        if let Some(mut stderr) = stderr {
            let mut buffer = [0u8; 4096];
            while let Ok(n) = stderr.read(&mut buffer).await {
                if n == 0 {
                    break;
                }
                kept.extend_from_slice(&buffer[..n]);
                let excess = kept.len().saturating_sub(KEPT_OUTPUT);
                kept.drain(..excess);
            }
        }
        let status = child.status().await;
        Ok((status, kept))
    };
    let timed_out = async {
        CallerRuntime.sleep(command.timeout).await;
        Err(format!("still running after {:?}: killed", command.timeout))
    };
    let lost = async {
        slot.run.lost().await;
        Err("the run's lock was lost: killed".to_owned())
    };
    let stopped = async {
        slot.stop.stopped().await;
        Err("the replica stopped: killed".to_owned())
    };
    // Dropping the child (kill_on_drop) kills a command still running.
    let (status, kept) = future::or(ran, future::or(timed_out, future::or(lost, stopped))).await?;
    let status = status.map_err(|e| format!("waiting for {program:?}: {e}"))?;
    if status.success() {
        return Ok(());
    }
    let said = String::from_utf8_lossy(&kept).trim().to_owned();
    Err(if said.is_empty() {
        format!("{status}")
    } else {
        format!("{status}: {said}")
    })
}

/// Sends the slot's message through `sink` under `retry`: `Err` with the
/// sink's last answer once it is spent or refused for good.
pub(crate) async fn send(
    sink: &dyn MessageSink,
    retry: &RetryPolicy,
    slot: &Slot<'_>,
    exclusive: bool,
) -> Result<(), Failed> {
    let id = format!(
        "schedule:{}:{}:{}",
        slot.chain, slot.router, slot.run.slot.0
    );
    let payload = serde_json::json!({
        "schedule": slot.router,
        "chain": slot.chain,
        "slot": slot.run.slot.0,
        "fence": slot.run.fence,
    })
    .to_string();
    let message = Outgoing {
        id: &id,
        origin: slot.router,
        fence: slot.run.fence,
        payload: payload.as_bytes(),
    };
    let lock = RunLock(slot.run);
    let gate = (exclusive && slot.run.fence.is_some()).then_some(&lock as &dyn LeaseGate);
    let delivery = deliver(sink, &message, retry, &mut WithoutRandom, gate).await;
    delivery.outcome.map_err(|e| Failed {
        attempts: delivery.attempts,
        reason: e.to_string(),
    })
}
