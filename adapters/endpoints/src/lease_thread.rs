//! Where an elected endpoint keeps its lease.
//!
//! An elected endpoint runs its active runner apart from its handler, so
//! a renewal never waits behind handling: a slow handler, or one that
//! blocks its thread, cannot starve the lease. On async-io the runner
//! gets a thread of its own; inside a tokio runtime (the `tokio`
//! feature) a task of that runtime, so no second reactor is started (a
//! handler that blocks one worker leaves the others to the lease). The
//! handler checks the runner's lease before every call, as before; only
//! the runner moved.

use std::future::Future;
use std::io;

use guard_std::run::RunHandle;

/// The runner's thread or task.
pub(crate) enum LeaseTask {
    /// A thread of its own, and the receiver of a channel whose only
    /// sender the thread drops as it ends (returned or unwound).
    Thread(std::thread::JoinHandle<()>, async_channel::Receiver<()>),
    #[cfg(feature = "tokio")]
    Task(tokio::task::JoinHandle<()>),
}

impl LeaseTask {
    /// Waits for it to end (it has, or is about to: it was stopped, and
    /// a release may take up to its timeout); `false` if it panicked.
    /// The caller's executor runs its other tasks meanwhile: the thread is
    /// joined only once it has signalled its end.
    pub(crate) async fn join(self) -> bool {
        match self {
            LeaseTask::Thread(thread, ended) => {
                // Nothing is ever sent: `recv` ends when the thread drops
                // the sender.
                let _ = ended.recv().await;
                // The thread is past its work: this waits at most for its
                // exit.
                thread.join().is_ok()
            }
            #[cfg(feature = "tokio")]
            LeaseTask::Task(task) => task.await.is_ok(),
        }
    }
}

/// Starts the future `lease` makes (the runner and what it drives): on a
/// task of the caller's tokio runtime if there is one, else on a thread
/// named `name` driven by async-io's reactor.
pub(crate) fn spawn<L, F>(name: &str, lease: L) -> io::Result<LeaseTask>
where
    L: FnOnce() -> F + Send + 'static,
    F: Future<Output = ()> + Send + 'static,
{
    #[cfg(feature = "tokio")]
    if let Ok(handle) = tokio::runtime::Handle::try_current() {
        return Ok(LeaseTask::Task(handle.spawn(async move { lease().await })));
    }
    let (ended, joined) = async_channel::bounded::<()>(1);
    std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(move || {
            // Dropped when the thread ends, a panic included: that closes
            // the channel `join` waits on.
            let _ended = ended;
            async_io::block_on(lease())
        })
        .map(|thread| LeaseTask::Thread(thread, joined))
}

/// Stops the lease's runner when the handler loop ends, however it ends
/// (returned, dropped, unwound from a panicking handler): the lease is
/// released rather than renewed for a consumer that is gone.
pub(crate) struct StopOnDrop(pub(crate) RunHandle);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.stop();
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::time::Duration;

    use async_io::Timer;
    use futures_lite::future;

    use super::spawn;

    #[test]
    fn join_leaves_the_caller_s_executor_to_its_other_tasks() {
        // The lease thread takes a second to end; meanwhile a ticker on the
        // same single-threaded executor as the join ticks every 10 ms.
        let task = spawn("join-test", || async {
            Timer::after(Duration::from_secs(1)).await;
        })
        .unwrap();
        let ticks = Cell::new(0_u32);
        let joined = Cell::new(None);
        future::block_on(future::zip(
            async {
                let ok = task.join().await;
                joined.set(Some((ok, ticks.get())));
            },
            async {
                while joined.get().is_none() {
                    ticks.set(ticks.get() + 1);
                    Timer::after(Duration::from_millis(10)).await;
                }
            },
        ));
        let (ok, ticked) = joined.get().unwrap();
        assert!(ok, "the lease thread ended without a panic");
        // About 100 ticks on an idle machine; a few on a loaded one.
        assert!(
            ticked >= 5,
            "the other task ran only {ticked} times while join waited"
        );
    }

    #[test]
    fn join_reports_a_panicked_lease_thread() {
        let task = spawn("join-panic-test", || async {
            Timer::after(Duration::from_millis(50)).await;
            panic!("the lease future panicked");
        })
        .unwrap();
        assert!(!future::block_on(task.join()));
    }
}
