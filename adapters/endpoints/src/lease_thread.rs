//! The thread an elected endpoint keeps its lease on.
//!
//! An elected endpoint runs its [`ActiveRunner`](guard_smol::ActiveRunner)
//! on a thread of its own and its handler on the caller's executor, so a
//! renewal never waits behind handling: a slow handler, or one that
//! blocks its thread, cannot starve the lease. The handler checks the
//! runner's [`LeaseCheck`](guard_smol::LeaseCheck) before every call, as
//! before; only the runner moved.

use std::future::Future;
use std::io;
use std::thread::JoinHandle;

use guard_smol::RunHandle;

/// Starts the future `lease` makes (the runner and what it drives) on a
/// thread named `name`, driven by async-io's reactor. The future is made
/// on that thread, so it need not be `Send`.
pub(crate) fn spawn<L, F>(name: &str, lease: L) -> io::Result<JoinHandle<()>>
where
    L: FnOnce() -> F + Send + 'static,
    F: Future<Output = ()>,
{
    std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(move || async_io::block_on(lease()))
}

/// Stops the lease thread's runner when the handler loop ends, however it
/// ends (returned, dropped, unwound from a panicking handler): the lease
/// is released rather than renewed for a consumer that is gone.
pub(crate) struct StopOnDrop(pub(crate) RunHandle);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.stop();
    }
}
