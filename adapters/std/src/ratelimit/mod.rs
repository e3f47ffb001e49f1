//! Rate limiting for servers: one trait over every backend, an in-memory
//! keyed limiter, named limiters with metrics, a registry and a sink.
//!
//! The algorithms are guard-core's; this module supplies time, sharing
//! and naming. A Redis backend implements [`RateLimiter`] in guard-redis.
//!
//! Every decision reports the key's quota ([`Report`]: limit, remaining,
//! reset), a request may cost more than one unit ([`RateLimiter::check_n`]),
//! and a limiter's parameters can be replaced while it serves
//! ([`RateLimiter::reconfigure`]) without forgetting its keys.

mod memory;
mod named;
mod quota;
mod sink;

pub use memory::{HASHED_KEY_LEN, MemoryLimiter, SHARD_KEYS, STORED_KEY_LEN};
pub use named::{NamedRateLimiter, RateLimiterRegistry};
pub use quota::{FromQuota, Quota, ReconfigureError};
pub use sink::{DenyPolicy, RateLimitingSink, Sink, SinkError};

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

pub use guard_core::limit::{CostAboveLimit, Decision, Report};

use crate::shared::{BackendError, BoxFuture};

/// The result of one decision: the decision with the key's quota, or why
/// there is none.
pub type LimitResult = Result<Report, LimitError>;

/// Why a limiter gave no decision.
#[derive(Debug)]
pub enum LimitError {
    /// The request costs more than the whole quota: no wait can admit it.
    Cost(CostAboveLimit),
    /// The key cannot be a limiter's key ([`check_key`]): the caller's
    /// input, never the backend's failure, so no fail-open policy applies.
    InvalidKey(InvalidKey),
    /// The backend failed (for example Redis unreachable).
    Backend(BackendError),
}

impl fmt::Display for LimitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LimitError::Cost(e) => write!(f, "rate limiter: {e}"),
            LimitError::InvalidKey(e) => write!(f, "rate limiter: {e}"),
            LimitError::Backend(e) => write!(f, "rate limiter backend: {e}"),
        }
    }
}

impl std::error::Error for LimitError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            LimitError::Cost(e) => Some(e),
            LimitError::InvalidKey(e) => Some(e),
            LimitError::Backend(e) => Some(e),
        }
    }
}

/// The longest key a limiter takes, in bytes: a key is text from outside
/// (an address, a header, a channel name), and every table that holds
/// keys is bounded in bytes as well as in entries.
pub const MAX_KEY_LEN: usize = 1024;

/// A key no limiter takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum InvalidKey {
    /// The key is empty.
    Empty,
    /// The key is longer than [`MAX_KEY_LEN`].
    TooLong {
        /// Its length in bytes.
        len: usize,
    },
}

impl fmt::Display for InvalidKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InvalidKey::Empty => f.write_str("a rate-limit key must not be empty"),
            InvalidKey::TooLong { len } => write!(
                f,
                "a rate-limit key of {len} bytes is longer than the {MAX_KEY_LEN} bytes a limiter takes"
            ),
        }
    }
}

impl std::error::Error for InvalidKey {}

impl From<InvalidKey> for LimitError {
    fn from(e: InvalidKey) -> Self {
        LimitError::InvalidKey(e)
    }
}

/// The rule every limiter applies to a key before it decides: not empty,
/// at most [`MAX_KEY_LEN`] bytes. Any other text is a key (a backend that
/// stores keys encodes them through guard-core's key codec).
pub fn check_key(key: &str) -> Result<(), InvalidKey> {
    if key.is_empty() {
        return Err(InvalidKey::Empty);
    }
    if key.len() > MAX_KEY_LEN {
        return Err(InvalidKey::TooLong { len: key.len() });
    }
    Ok(())
}

impl From<BackendError> for LimitError {
    fn from(e: BackendError) -> Self {
        LimitError::Backend(e)
    }
}

impl From<CostAboveLimit> for LimitError {
    fn from(e: CostAboveLimit) -> Self {
        LimitError::Cost(e)
    }
}

/// The future of one decision: ready at once for in-memory limiters (no
/// allocation), boxed for remote ones.
pub enum LimitFuture<'a> {
    /// Decided already.
    Ready(Option<LimitResult>),
    /// Waiting for a backend.
    Pending(BoxFuture<'a, LimitResult>),
}

impl Future for LimitFuture<'_> {
    type Output = LimitResult;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<LimitResult> {
        match self.get_mut() {
            LimitFuture::Ready(result) => match result.take() {
                Some(result) => Poll::Ready(result),
                None => Poll::Pending, // polled after completion
            },
            LimitFuture::Pending(fut) => fut.as_mut().poll(cx),
        }
    }
}

/// Every bandwidth's report of one decision, in the order of
/// [`RateLimiter::bandwidths`].
pub type EachResult = Result<Vec<Report>, LimitError>;

/// A rate limiter keyed by strings, deciding with the current time.
pub trait RateLimiter: Send + Sync {
    /// Decides a request of `cost` units for `key`, all or nothing, and
    /// reports the key's quota after it (a cost of zero counts nothing
    /// and only reports). A cost above the quota is [`LimitError::Cost`].
    fn check_n<'a>(&'a self, key: &'a str, cost: u32) -> LimitFuture<'a>;

    /// Decides one request for `key`.
    fn check<'a>(&'a self, key: &'a str) -> LimitFuture<'a> {
        self.check_n(key, 1)
    }

    /// The parameters every key is limited by now.
    fn quota(&self) -> Quota;

    /// Replaces the parameters while the limiter serves, keeping every
    /// key's state (guard-core's `Algorithm::carry_over`: a bucket's key
    /// keeps the units it owes, a window's keeps its admissions). A quota
    /// of another kind than the limiter's algorithm is refused.
    fn reconfigure(&self, quota: Quota) -> Result<(), ReconfigureError>;

    /// For a limiter that keeps its keys in this process: the keys it
    /// holds and the most it can hold. `None` for one whose keys live
    /// elsewhere (Redis).
    fn keys_held(&self) -> Option<KeysHeld> {
        None
    }

    /// For a limiter of several bandwidths on one key (guard-core's
    /// `Bandwidths`, all or nothing): each one's quota, in order. `None`,
    /// the default, for a limiter of one quota.
    fn bandwidths(&self) -> Option<Vec<Quota>> {
        None
    }

    /// Decides as [`Self::check_n`] and reports every bandwidth, in the
    /// order of [`Self::bandwidths`]; by default, `check_n`'s one report.
    fn check_each<'a>(&'a self, key: &'a str, cost: u32) -> BoxFuture<'a, EachResult> {
        Box::pin(async move { self.check_n(key, cost).await.map(|report| vec![report]) })
    }
}

/// How full an in-process limiter's table of keys is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeysHeld {
    /// Keys held now.
    pub held: usize,
    /// The most it holds; a new key beyond is refused or shares the
    /// overflow state, by its `FullPolicy`.
    pub capacity: usize,
    /// The most bytes the table takes, keys' text included, however long
    /// the keys (its byte budget).
    pub max_bytes: usize,
}
