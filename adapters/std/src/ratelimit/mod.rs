//! Rate limiting for servers: one trait over every backend, an in-memory
//! keyed limiter, named limiters with metrics, a registry and a sink.
//!
//! The algorithms are guard-core's; this module supplies time, sharing
//! and naming. A Redis backend implements [`RateLimiter`] in guard-redis.

mod memory;
mod named;
mod sink;

pub use memory::{MemoryLimiter, SHARD_KEYS};
pub use named::{NamedRateLimiter, RateLimiterRegistry};
pub use sink::{DenyPolicy, RateLimitingSink, Sink, SinkError};

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use guard_core::limit::Decision;

use crate::shared::{BackendError, BoxFuture};

/// The result of one decision: a backend failure behind a limiter (for
/// example Redis unreachable) is a [`BackendError`].
pub type LimitResult = Result<Decision, BackendError>;

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

/// A rate limiter keyed by strings, deciding with the current time.
pub trait RateLimiter: Send + Sync {
    /// Decides one request for `key`.
    fn check<'a>(&'a self, key: &'a str) -> LimitFuture<'a>;

    /// For a limiter that keeps its keys in this process: the keys it
    /// holds and the most it can hold. `None` for one whose keys live
    /// elsewhere (Redis).
    fn keys_held(&self) -> Option<KeysHeld> {
        None
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
}
