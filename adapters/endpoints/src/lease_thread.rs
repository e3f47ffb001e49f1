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
    Thread(std::thread::JoinHandle<()>),
    #[cfg(feature = "tokio")]
    Task(tokio::task::JoinHandle<()>),
}

impl LeaseTask {
    /// Waits for it to end (it has, or is about to: it was stopped);
    /// `false` if it panicked.
    pub(crate) async fn join(self) -> bool {
        match self {
            LeaseTask::Thread(thread) => thread.join().is_ok(),
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
    std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(move || async_io::block_on(lease()))
        .map(LeaseTask::Thread)
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
