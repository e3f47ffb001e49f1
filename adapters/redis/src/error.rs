//! Errors of the Redis backends.

use std::fmt;
use std::time::Duration;

/// A Redis backend failure or a request it refuses to send.
#[derive(Debug)]
pub enum RedisGuardError {
    /// The server or the connection failed.
    Redis(redis::RedisError),
    /// No reply within the request timeout.
    Timeout(Duration),
    /// The server answered something the script cannot return.
    UnexpectedReply(String),
    /// A key or parameter that cannot be used, and why.
    InvalidInput(String),
}

impl fmt::Display for RedisGuardError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RedisGuardError::Redis(e) => write!(f, "redis: {e}"),
            RedisGuardError::Timeout(d) => write!(f, "redis: no reply within {d:?}"),
            RedisGuardError::UnexpectedReply(r) => write!(f, "redis: unexpected reply {r}"),
            RedisGuardError::InvalidInput(why) => write!(f, "invalid input: {why}"),
        }
    }
}

impl std::error::Error for RedisGuardError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            RedisGuardError::Redis(e) => Some(e),
            _ => None,
        }
    }
}

impl From<redis::RedisError> for RedisGuardError {
    fn from(e: redis::RedisError) -> Self {
        RedisGuardError::Redis(e)
    }
}
