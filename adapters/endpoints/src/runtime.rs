//! The runtime the endpoints' runners follow: the caller's (guard-redis's
//! [`CallerRuntime`]): tokio's inside a tokio runtime with the `tokio`
//! feature, async-io's otherwise.

use guard_redis::CallerRuntime;

/// guard-std's active runner on the caller's runtime.
pub(crate) type ActiveRunner = guard_std::run::ActiveRunner<CallerRuntime>;

/// The lease view of an [`ActiveRunner`].
pub(crate) type LeaseCheck = guard_std::run::LeaseCheck<CallerRuntime>;
