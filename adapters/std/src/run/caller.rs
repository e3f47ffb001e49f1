//! The runtime of whoever calls: tokio's when the caller is inside a tokio
//! runtime (with the `tokio` feature), else async-io's. redis-rs decides
//! the same way for its own tasks (with both of its runtime features, it
//! takes tokio's inside a tokio runtime), so a tokio application runs no
//! second reactor; the sources and adapters that follow their caller
//! (guard-redis, guard-endpoints) all take it from here.

use std::future::Future;
use std::time::Duration;

use super::Runtime;

/// Whether the caller runs inside a tokio runtime (and this build can
/// use it).
pub fn on_tokio() -> bool {
    #[cfg(feature = "tokio")]
    {
        tokio::runtime::Handle::try_current().is_ok()
    }
    #[cfg(not(feature = "tokio"))]
    {
        false
    }
}

/// The caller's runtime as a [`Runtime`]: tokio's clock, timers and tasks
/// inside a tokio runtime (with the `tokio` feature), else async-io's
/// timers, `std::time::Instant` and a thread for detached clean-up. For
/// runners that must follow whichever runtime drives them.
#[derive(Clone, Copy, Debug, Default)]
pub struct CallerRuntime;

impl CallerRuntime {
    /// Runs `future` beside the caller until it completes: a task on the
    /// caller's tokio runtime (with the `tokio` feature), else a thread
    /// named `name` driving it on async-io. An error means no thread could
    /// be made.
    pub fn spawn(
        name: &str,
        future: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        #[cfg(feature = "tokio")]
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            drop(handle.spawn(future));
            return Ok(());
        }
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || async_io::block_on(future))
            .map(drop)
    }

    /// Completes after `duration`, on the caller's runtime's timers.
    pub async fn sleep_for(duration: Duration) {
        #[cfg(feature = "tokio")]
        if on_tokio() {
            tokio::time::sleep(duration).await;
            return;
        }
        async_io::Timer::after(duration).await;
    }
}

impl Runtime for CallerRuntime {
    fn now(&self) -> std::time::Instant {
        #[cfg(feature = "tokio")]
        if on_tokio() {
            return tokio::time::Instant::now().into_std();
        }
        std::time::Instant::now()
    }

    fn sleep_until(&self, at: std::time::Instant) -> impl Future<Output = ()> + Send {
        // Decided when the sleep starts: the runtime that polls it.
        let tokio = on_tokio();
        async move {
            #[cfg(feature = "tokio")]
            if tokio {
                tokio::time::sleep_until(tokio::time::Instant::from_std(at)).await;
                return;
            }
            let _ = tokio;
            async_io::Timer::at(at).await;
        }
    }

    fn spawn_detached(&self, future: crate::BoxFuture<'static, ()>) -> bool {
        Self::spawn("guard-cleanup", future).is_ok()
    }
}
