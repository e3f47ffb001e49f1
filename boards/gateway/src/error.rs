//! Why a replica cannot start.

use std::fmt;

use guard_redis::RedisGuardError;
use guard_smol::{RunnerError, ScheduleError};

/// Why a replica cannot start.
///
/// The message says what failed, as `guard-gateway run` prints it;
/// [`source`](std::error::Error::source) returns the cause (the Redis
/// backend's, an endpoint's, a guard's).
#[derive(Debug)]
#[non_exhaustive]
pub enum GatewayError {
    /// The Redis locker did not answer.
    LockerUnreachable(RedisGuardError),
    /// The Redis locker cannot be built (its prefix).
    Locker(RedisGuardError),
    /// Another lock service (PostgreSQL, etcd) cannot be built, did not
    /// answer, or refused the replica (its rights), or this build cannot
    /// make it.
    LockService {
        /// The `[locker] kind`.
        kind: &'static str,
        /// Why.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A Redis rate limiter cannot be built.
    Limiter {
        /// The limiter's name.
        name: String,
        /// Why.
        source: RedisGuardError,
    },
    /// A schedule or an endpoint names a rate limiter that does not exist.
    UnknownLimiter {
        /// The name given.
        name: String,
    },
    /// A scheduled job cannot be added.
    Schedule {
        /// The job's router.
        router: String,
        /// Why.
        source: ScheduleError,
    },
    /// A leader-only consumer's guard cannot be built.
    Consumer {
        /// The consumer.
        name: String,
        /// Why.
        source: RunnerError,
    },
    /// An endpoint cannot be built or connected.
    Endpoint {
        /// The endpoint.
        name: String,
        /// Why: a [`guard_endpoints::redis::EndpointError`], a
        /// [`guard_endpoints::mqtt::MqttError`], a [`RedisGuardError`] or
        /// a `guard_core::lock::KeyError`.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A sink cannot be made.
    Sink {
        /// The sink.
        name: String,
        /// Why.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The dead letters on disk cannot be opened or read.
    DeadLetters {
        /// Why.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl fmt::Display for GatewayError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GatewayError::LockerUnreachable(e) => write!(f, "cannot reach the Redis locker: {e}"),
            GatewayError::Locker(e) => write!(f, "Redis locker: {e}"),
            GatewayError::LockService { kind, source } => {
                write!(f, "{kind} locker: {source}")
            }
            GatewayError::Limiter { name, source } => write!(f, "rate limiter {name}: {source}"),
            GatewayError::UnknownLimiter { name } => write!(f, "no rate limiter named {name:?}"),
            GatewayError::Schedule { router, source } => write!(f, "schedule {router}: {source}"),
            GatewayError::Consumer { name, source } => write!(f, "consumer {name}: {source}"),
            GatewayError::Endpoint { name, source } => write!(f, "endpoint {name}: {source}"),
            GatewayError::Sink { name, source } => write!(f, "sink {name}: {source}"),
            GatewayError::DeadLetters { source } => write!(f, "dead letters: {source}"),
        }
    }
}

impl std::error::Error for GatewayError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            GatewayError::LockerUnreachable(e)
            | GatewayError::Locker(e)
            | GatewayError::Limiter { source: e, .. } => Some(e),
            GatewayError::Schedule { source, .. } => Some(source),
            GatewayError::Consumer { source, .. } => Some(source),
            GatewayError::Endpoint { source, .. }
            | GatewayError::Sink { source, .. }
            | GatewayError::DeadLetters { source }
            | GatewayError::LockService { source, .. } => Some(&**source),
            GatewayError::UnknownLimiter { .. } => None,
        }
    }
}
