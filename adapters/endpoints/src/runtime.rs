//! The runtime the endpoints' runners follow: the caller's (guard-redis's
//! [`CallerRuntime`]): tokio's inside a tokio runtime with the `tokio`
//! feature, async-io's otherwise.

use guard_std::run::CallerRuntime;

/// guard-std's active runner on the caller's runtime.
pub(crate) type ActiveRunner = guard_std::run::ActiveRunner<CallerRuntime>;

/// The lease view of an [`ActiveRunner`].
pub(crate) type LeaseCheck = guard_std::run::LeaseCheck<CallerRuntime>;

/// Runs `work` where a tokio-based client (async-nats, mysql_async) can:
/// on the caller's tokio runtime if there is one, else on async-compat's
/// runtime thread (their timers and sockets need tokio's reactor).
#[cfg(any(feature = "nats", feature = "mysql"))]
pub(crate) async fn on_tokio<F: std::future::Future>(work: F) -> F::Output {
    async_compat::Compat::new(work).await
}
