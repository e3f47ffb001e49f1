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

/// The receiving side, given to [`ActiveRunner::run`](super::ActiveRunner::run) or
/// [`Scheduler::run`](super::Scheduler::run). Cloneable: one handle can stop many runners.
#[derive(Clone, Debug)]
pub struct Control {
    rx: Receiver<Command>,
    /// A second source of commands, from [`Control::linked`].
    local: Option<Receiver<Command>>,
}

/// A connected handle and control.
pub fn control() -> (RunHandle, Control) {
    let (tx, rx) = async_channel::unbounded();
    (RunHandle { tx }, Control { rx, local: None })
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
        let received = match &self.local {
            None => self.rx.recv().await,
            Some(local) => futures_lite::future::or(self.rx.recv(), local.recv()).await,
        };
        match received {
            Ok(Command::Demote) => Heard::Demote,
            Err(_) => Heard::Stop,
        }
    }

    /// Waits until stop is requested (or every handle is gone), for loops
    /// that lead nothing: a demote request means nothing to them and is
    /// passed over.
    pub async fn stopped(&self) {
        while let Heard::Demote = self.heard().await {}
    }

    /// Whether stop has been requested.
    pub fn is_stopped(&self) -> bool {
        let stopped = |rx: &Receiver<Command>| rx.is_closed() && rx.is_empty();
        stopped(&self.rx) || self.local.as_ref().is_some_and(stopped)
    }

    /// A control that hears this one and also a handle of its own.
    ///
    /// For code that runs a guard on its caller's behalf and must demote
    /// it itself (a subscription died while the lease still renews): the
    /// caller's handle still stops and demotes the runner, and so does
    /// the returned handle (stopping it, or dropping it, stops the
    /// runner). The returned control's own handle replaces any this
    /// control was linked to before.
    pub fn linked(&self) -> (RunHandle, Control) {
        let (tx, local) = async_channel::unbounded();
        (
            RunHandle { tx },
            Control {
                rx: self.rx.clone(),
                local: Some(local),
            },
        )
    }
}
