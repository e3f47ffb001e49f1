//! The errors of the Redis endpoints.

use std::error::Error;
use std::fmt;

use guard_redis::RedisGuardError;
use guard_std::run::RunnerError;

use crate::parameter::Parameter;

/// A Redis endpoint that cannot be built, or a round of a stream consumer
/// that failed.
///
/// The message names what failed; [`source`](Error::source) returns the
/// cause: the [`RedisGuardError`] of the backend, the [`RunnerError`] of
/// the endpoint's guard, or the check that refused a parameter.
///
/// ```
/// use guard_endpoints::Parameter;
/// use guard_endpoints::redis::{EndpointError, PubSubEndpoint};
/// use guard_std::GuardConfig;
///
/// let config = GuardConfig::new();
/// let scope = config.scope("endpoint/redis")?;
/// let err = PubSubEndpoint::new("redis://127.0.0.1:6379/", &config, &scope, &[]).unwrap_err();
/// assert!(matches!(
///     err,
///     EndpointError::InvalidInput(guard_endpoints::InvalidInput { parameter: Parameter::Patterns, .. })
/// ));
/// # Ok::<(), guard_core::lock::KeyError>(())
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum EndpointError {
    /// A parameter that cannot be used.
    InvalidInput(crate::InvalidInput),
    /// The endpoint's guard (its lease runner) cannot be built.
    Guard(RunnerError),
    /// The Redis backend refused or failed: a URL it cannot use, a
    /// dead-letter topic it refuses, a request that failed.
    Redis(RedisGuardError),
}

impl EndpointError {
    /// `value` of `parameter` breaks `rule`.
    pub(crate) fn invalid(
        parameter: Parameter,
        value: impl Into<String>,
        rule: impl Into<String>,
    ) -> Self {
        EndpointError::InvalidInput(crate::InvalidInput::new(parameter, value, rule))
    }
}

crate::parameter::refusal!(EndpointError);

impl fmt::Display for EndpointError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EndpointError::InvalidInput(e) => fmt::Display::fmt(e, f),
            EndpointError::Guard(e) => write!(f, "endpoint guard: {e}"),
            EndpointError::Redis(e) => fmt::Display::fmt(e, f),
        }
    }
}

impl Error for EndpointError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            EndpointError::InvalidInput(e) => Error::source(e),
            EndpointError::Guard(e) => Some(e),
            EndpointError::Redis(e) => Some(e),
        }
    }
}

impl From<RedisGuardError> for EndpointError {
    fn from(e: RedisGuardError) -> Self {
        EndpointError::Redis(e)
    }
}

impl From<redis::RedisError> for EndpointError {
    fn from(e: redis::RedisError) -> Self {
        EndpointError::Redis(e.into())
    }
}

impl From<RunnerError> for EndpointError {
    fn from(e: RunnerError) -> Self {
        EndpointError::Guard(e)
    }
}
