//! A sink that rate-limits what passes through it.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use guard_core::limit::Decision;

use super::{LimitError, RateLimiter};
use crate::metrics::SINK_DROPPED;
use crate::sync::{AtomicU64, Ordering};

/// Somewhere elements go (a stream, a socket, an uplink).
#[allow(async_fn_in_trait, reason = "Send-ness follows the concrete sink")]
pub trait Sink<T> {
    /// Delivers `value`.
    async fn send(&self, value: T) -> Result<(), SinkError>;
}

/// Why an element was not delivered.
#[derive(Debug)]
#[non_exhaustive]
pub enum SinkError {
    /// Refused by the limiter under [`DenyPolicy::Error`]; names the key.
    RateLimited {
        /// The limiter key.
        key: String,
        /// When the key admits again.
        retry_after: Duration,
    },
    /// The limiter gave no decision: its backend failed, or the element
    /// costs more than the quota (the limiter's error is the source).
    Limiter(LimitError),
    /// The downstream sink failed.
    Downstream(Box<dyn std::error::Error + Send + Sync>),
}

impl fmt::Display for SinkError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SinkError::RateLimited { key, retry_after } => {
                write!(
                    f,
                    "Rate limited for key: {key} (retry after {retry_after:?})"
                )
            }
            SinkError::Limiter(e) => write!(f, "{e}"),
            SinkError::Downstream(e) => write!(f, "downstream sink: {e}"),
        }
    }
}

impl std::error::Error for SinkError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SinkError::RateLimited { .. } => None,
            SinkError::Limiter(e) => Some(e),
            SinkError::Downstream(e) => Some(&**e),
        }
    }
}

/// What a [`RateLimitingSink`] does with a refused element.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DenyPolicy {
    /// Drop it: counted (`guard_sink_dropped_total{name}`) and logged at
    /// debug, never silent.
    #[default]
    Drop,
    /// Return [`SinkError::RateLimited`], naming the key.
    Error,
}

/// Passes elements to `inner` while the limiter admits their key.
pub struct RateLimitingSink<T, S> {
    name: String,
    limiter: Arc<dyn RateLimiter>,
    key_of: Box<dyn Fn(&T) -> String + Send + Sync>,
    inner: S,
    policy: DenyPolicy,
    dropped: AtomicU64,
}

impl<T, S> RateLimitingSink<T, S> {
    /// Limits `inner` by `limiter`, keyed by `key_of(element)`.
    pub fn new(
        name: impl Into<String>,
        limiter: Arc<dyn RateLimiter>,
        key_of: impl Fn(&T) -> String + Send + Sync + 'static,
        inner: S,
        policy: DenyPolicy,
    ) -> Self {
        RateLimitingSink {
            name: name.into(),
            limiter,
            key_of: Box::new(key_of),
            inner,
            policy,
            dropped: AtomicU64::new(0),
        }
    }

    /// Elements dropped so far.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// The downstream sink.
    pub fn inner(&self) -> &S {
        &self.inner
    }
}

impl<T, S: Sink<T>> Sink<T> for RateLimitingSink<T, S> {
    async fn send(&self, value: T) -> Result<(), SinkError> {
        let key = (self.key_of)(&value);
        match self
            .limiter
            .check(&key)
            .await
            .map_err(SinkError::Limiter)?
            .decision
        {
            Decision::Allowed => self.inner.send(value).await,
            Decision::Denied { retry_after } => match self.policy {
                DenyPolicy::Drop => {
                    self.dropped.fetch_add(1, Ordering::Relaxed);
                    metrics::counter!(SINK_DROPPED, "name" => self.name.clone()).increment(1);
                    tracing::debug!(
                        "sink {}: dropped an element rate-limited on key {key}",
                        self.name
                    );
                    Ok(())
                }
                DenyPolicy::Error => Err(SinkError::RateLimited { key, retry_after }),
            },
        }
    }
}
