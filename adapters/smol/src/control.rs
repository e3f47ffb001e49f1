//! Stopping and demoting a running guard from elsewhere.

use async_channel::{Receiver, Sender};

/// A command to a running guard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Command {
    Demote,
}

/// What a runner hears from its [`RunHandle`]s.
pub(crate) enum Heard {
    Demote,
    Stop,
}

/// The sending side: stop a runner (or a scheduler), or ask its leader to
/// step down. Cloneable; dropping every handle also stops.
#[derive(Clone, Debug)]
pub struct RunHandle {
    tx: Sender<Command>,
}

/// The receiving side, given to [`crate::ActiveRunner::run`] or
/// [`crate::Scheduler::run`]. Cloneable: one handle can stop many runners.
#[derive(Clone, Debug)]
pub struct Control {
    rx: Receiver<Command>,
}

/// A connected handle and control.
pub fn control() -> (RunHandle, Control) {
    let (tx, rx) = async_channel::unbounded();
    (RunHandle { tx }, Control { rx })
}

impl RunHandle {
    /// Stops every runner listening: leaders demote, then release.
    pub fn stop(&self) {
        self.tx.close();
    }

    /// Asks a leading runner to step down (demote, then release) so that
    /// a standby takes over at once; the runner keeps running as a standby.
    /// Returns false if the runner has stopped.
    pub fn demote(&self) -> bool {
        self.tx.try_send(Command::Demote).is_ok()
    }
}

impl Control {
    /// Waits for the next command; stop once every handle is gone or
    /// `stop` was called.
    pub(crate) async fn heard(&self) -> Heard {
        match self.rx.recv().await {
            Ok(Command::Demote) => Heard::Demote,
            Err(_) => Heard::Stop,
        }
    }

    /// Whether stop has been requested.
    pub(crate) fn is_stopped(&self) -> bool {
        self.rx.is_closed() && self.rx.is_empty()
    }
}
