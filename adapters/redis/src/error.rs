//! Errors of the Redis backends.

use std::error::Error;
use std::fmt;
use std::time::Duration;

/// A Redis backend failure or a request it refuses to send.
///
/// The message names what failed; [`source`](Error::source) returns the
/// cause where there is one (the [`redis::RedisError`], or for refused
/// input guard-core's reason, e.g.
/// [`InvalidRedisKey`](guard_core::lock::redis::InvalidRedisKey)).
///
/// ```
/// use guard_redis::{Parameter, RedisGuardError, lock_keys};
///
/// let err = lock_keys("", "").unwrap_err();
/// assert!(matches!(
///     err,
///     RedisGuardError::InvalidInput { parameter: Parameter::LockKey, .. }
/// ));
/// assert_eq!(err.to_string(), "invalid lock key \"\": a lock key must not be empty");
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum RedisGuardError {
    /// The server or the connection failed.
    Redis(redis::RedisError),
    /// No reply within the request timeout.
    Timeout(Duration),
    /// The server answered something the script cannot return. The reply
    /// is kept as text: it is data from the server, with no error type of
    /// its own.
    UnexpectedReply(String),
    /// A key or parameter refused before anything was sent.
    #[non_exhaustive]
    InvalidInput {
        /// What was refused.
        parameter: Parameter,
        /// The value given, as text (a duration or a count is formatted
        /// as in the message).
        value: String,
        /// The rule it breaks.
        rule: String,
        /// The check that refused it, where another crate's check did
        /// (guard-core's [`InvalidRedisKey`](guard_core::lock::redis::InvalidRedisKey)
        /// for lock keys and locker prefixes).
        source: Option<Box<dyn Error + Send + Sync>>,
    },
    /// A write (a lease's renewal) was applied by the primary but fewer
    /// replicas than asked acknowledged it in time
    /// ([`RedisLocker::with_replica_acks`](crate::RedisLocker::with_replica_acks)):
    /// a failover could lose it, so it does not count.
    NotAcknowledged {
        /// Replicas asked for.
        wanted: u32,
        /// Replicas that acknowledged.
        acked: u32,
    },
}

/// A key or parameter of a Redis backend, as named in
/// [`RedisGuardError::InvalidInput`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Parameter {
    /// A lock key ([`lock_keys`](crate::lock_keys), the locker's calls).
    LockKey,
    /// A locker's key prefix.
    LockerPrefix,
    /// A rate-limit key.
    RateLimitKey,
    /// A rate limiter's key prefix.
    LimiterPrefix,
    /// A bucket's refill (or drain) interval.
    RefillInterval,
    /// A bucket's capacity times its interval: how long an emptied bucket
    /// takes to refill.
    BucketSpan,
    /// A sliding window's width.
    SlidingWindow,
    /// A fixed window's length.
    FixedWindowPeriod,
    /// Where a fixed window's windows start.
    FixedWindowOffset,
    /// A request's cost in a limiter's units.
    Cost,
    /// How long an exact deduplicator remembers an item.
    DedupTtl,
    /// A windowed deduplicator's window.
    DedupWindow,
    /// A deduplicator's name.
    DeduplicatorName,
    /// A Bloom filter's size in bits.
    BloomBits,
    /// A Bloom filter's number of hash functions.
    BloomHashes,
    /// A dead-letter queue's topic.
    DeadLetterTopic,
    /// A dead-letter queue's key prefix.
    DeadLetterPrefix,
    /// A server's URL, e.g. a `redis://` one given TLS settings.
    Url,
    /// The certificate authorities a TLS connection trusts (PEM).
    TlsRootCa,
    /// The client certificate a TLS connection presents (PEM).
    TlsClientCert,
    /// The private key of that client certificate (PEM).
    TlsClientKey,
    /// A shared circuit breaker's key.
    BreakerKey,
    /// A shared circuit breaker's configuration.
    BreakerConfig,
    /// How many replicas must acknowledge a grant, and within how long.
    ReplicaAcks,
}

impl Parameter {
    /// Whether the value is text (quoted in messages, so an empty one
    /// shows) rather than a quantity.
    fn is_text(self) -> bool {
        matches!(
            self,
            Parameter::LockKey
                | Parameter::LockerPrefix
                | Parameter::RateLimitKey
                | Parameter::LimiterPrefix
                | Parameter::DeduplicatorName
                | Parameter::DeadLetterTopic
                | Parameter::DeadLetterPrefix
                | Parameter::Url
                | Parameter::BreakerKey
        )
    }
}

impl fmt::Display for Parameter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Parameter::LockKey => "lock key",
            Parameter::LockerPrefix => "locker prefix",
            Parameter::RateLimitKey => "rate-limit key",
            Parameter::LimiterPrefix => "key prefix",
            Parameter::RefillInterval => "refill interval",
            Parameter::BucketSpan => "capacity × interval",
            Parameter::SlidingWindow => "sliding window",
            Parameter::FixedWindowPeriod => "fixed window period",
            Parameter::FixedWindowOffset => "fixed window offset",
            Parameter::Cost => "cost",
            Parameter::DedupTtl => "deduplication TTL",
            Parameter::DedupWindow => "deduplication window",
            Parameter::DeduplicatorName => "deduplicator name",
            Parameter::BloomBits => "Bloom filter size in bits",
            Parameter::BloomHashes => "Bloom filter hash count",
            Parameter::DeadLetterTopic => "dead-letter topic",
            Parameter::DeadLetterPrefix => "dead-letter stream prefix",
            Parameter::Url => "Redis URL",
            Parameter::TlsRootCa => "TLS root CA",
            Parameter::TlsClientCert => "TLS client certificate",
            Parameter::TlsClientKey => "TLS client key",
            Parameter::BreakerKey => "circuit breaker key",
            Parameter::BreakerConfig => "circuit breaker configuration",
            Parameter::ReplicaAcks => "replica acknowledgements",
        })
    }
}

impl RedisGuardError {
    /// `value` of `parameter` breaks `rule`.
    pub(crate) fn invalid(
        parameter: Parameter,
        value: impl Into<String>,
        rule: impl Into<String>,
    ) -> Self {
        RedisGuardError::InvalidInput {
            parameter,
            value: value.into(),
            rule: rule.into(),
            source: None,
        }
    }

    /// `value` of `parameter` was refused by another crate's check: its
    /// error is the rule and the source.
    pub(crate) fn refused_by(
        parameter: Parameter,
        value: impl Into<String>,
        check: impl Error + Send + Sync + 'static,
    ) -> Self {
        RedisGuardError::InvalidInput {
            parameter,
            value: value.into(),
            rule: check.to_string(),
            source: Some(Box::new(check)),
        }
    }
}

impl fmt::Display for RedisGuardError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RedisGuardError::Redis(e) => write!(f, "redis: {e}"),
            RedisGuardError::Timeout(d) => write!(f, "redis: no reply within {d:?}"),
            RedisGuardError::UnexpectedReply(r) => write!(f, "redis: unexpected reply {r}"),
            RedisGuardError::NotAcknowledged { wanted, acked } => write!(
                f,
                "redis: {acked} of the {wanted} replica(s) asked for acknowledged the write in time"
            ),
            RedisGuardError::InvalidInput {
                parameter,
                value,
                rule,
                ..
            } => {
                if parameter.is_text() {
                    write!(f, "invalid {parameter} {value:?}: {rule}")
                } else {
                    write!(f, "invalid {parameter} {value}: {rule}")
                }
            }
        }
    }
}

impl Error for RedisGuardError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            RedisGuardError::Redis(e) => Some(e),
            RedisGuardError::InvalidInput {
                source: Some(e), ..
            } => Some(&**e),
            _ => None,
        }
    }
}

impl From<redis::RedisError> for RedisGuardError {
    fn from(e: redis::RedisError) -> Self {
        RedisGuardError::Redis(e)
    }
}
