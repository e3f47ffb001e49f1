//! The runtime a request runs on: tokio's when the caller is inside a
//! tokio runtime (with the `tokio` feature), else async-io's. redis-rs
//! decides the same way for its own tasks (with both of its runtime
//! features, it takes tokio's inside a tokio runtime), so a tokio
//! application runs no second reactor.

use std::time::Duration;

/// Whether the caller runs inside a tokio runtime (and this build can
/// use it).
pub(crate) fn on_tokio() -> bool {
    #[cfg(feature = "tokio")]
    {
        tokio::runtime::Handle::try_current().is_ok()
    }
    #[cfg(not(feature = "tokio"))]
    {
        false
    }
}

/// Completes after `duration`, on the caller's runtime's timers.
pub(crate) async fn sleep(duration: Duration) {
    #[cfg(feature = "tokio")]
    if on_tokio() {
        tokio::time::sleep(duration).await;
        return;
    }
    async_io::Timer::after(duration).await;
}
