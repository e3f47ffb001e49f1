//! Stopping and demoting a running guard from elsewhere.

use std::future::Future;

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
    /// More sources of commands, one per [`Control::linked`] between
    /// the first handle and this control.
    local: Vec<Receiver<Command>>,
}

/// A connected handle and control.
pub fn control() -> (RunHandle, Control) {
    let (tx, rx) = async_channel::unbounded();
    (
        RunHandle { tx },
        Control {
            rx,
            local: Vec::new(),
        },
    )
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
        let received = if self.local.is_empty() {
            self.rx.recv().await
        } else {
            let mut waits: Vec<_> = std::iter::once(&self.rx)
                .chain(&self.local)
                .map(|rx| Box::pin(rx.recv()))
                .collect();
            futures_lite::future::poll_fn(|cx| {
                waits
                    .iter_mut()
                    .find_map(|wait| match wait.as_mut().poll(cx) {
                        std::task::Poll::Ready(heard) => Some(heard),
                        std::task::Poll::Pending => None,
                    })
                    .map_or(std::task::Poll::Pending, std::task::Poll::Ready)
            })
            .await
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
        stopped(&self.rx) || self.local.iter().any(stopped)
    }

    /// A control that hears this one and also a handle of its own.
    ///
    /// For code that runs a guard on its caller's behalf and must demote
    /// it itself (a subscription died while the lease still renews): the
    /// caller's handle still stops and demotes the runner, and so does
    /// the returned handle (stopping it, or dropping it, stops the
    /// runner). Links nest: a control linked from a linked one hears
    /// every handle along the way (a replica stops one endpoint with its
    /// handle, the endpoint demotes its own runner with another).
    pub fn linked(&self) -> (RunHandle, Control) {
        let (tx, own) = async_channel::unbounded();
        let mut local = self.local.clone();
        local.push(own);
        (
            RunHandle { tx },
            Control {
                rx: self.rx.clone(),
                local,
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_control_linked_twice_hears_every_handle_along_the_way() {
        let (first, root) = control();
        let (middle, once) = root.linked();
        let (last, twice) = once.linked();
        assert!(!twice.is_stopped());
        // The inner handle demotes and stops only what it was made for.
        assert!(last.demote());
        assert!(matches!(
            futures_lite::future::block_on(twice.heard()),
            Heard::Demote
        ));
        last.stop();
        assert!(twice.is_stopped() && !once.is_stopped() && !root.is_stopped());
        // The handle in the middle reaches the control linked from its own.
        let (_, again) = once.linked();
        middle.stop();
        assert!(again.is_stopped() && once.is_stopped() && !root.is_stopped());
        futures_lite::future::block_on(again.stopped());
        // The first handle reaches them all.
        let (_kept, fresh) = root.linked();
        let (_kept_too, fresher) = fresh.linked();
        first.stop();
        assert!(fresher.is_stopped() && root.is_stopped());
        futures_lite::future::block_on(fresher.stopped());
    }
}
