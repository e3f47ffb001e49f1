//! An in-memory keyed limiter for servers: sharded tables of guard-core's
//! bounded `Keyed`.

use std::hash::BuildHasher;
use std::sync::PoisonError;

use guard_core::limit::{Algorithm, Decision, FullPolicy, Keyed};

use super::{LimitFuture, RateLimiter};
use crate::clock::{Clock, SystemClock};
use crate::sync::Mutex;

/// Keys per shard by default.
pub const SHARD_KEYS: usize = 1024;

type Shard<A, const S: usize> = Mutex<Box<Keyed<String, A, S>>>;

/// Many keys in bounded memory, shared between threads.
///
/// The keys are spread over shards of guard-core's [`Keyed`] table
/// (`S` keys each, [`SHARD_KEYS`] by default), each behind its own mutex, so threads on
/// different keys rarely contend. Memory is fixed at construction: only
/// keys whose state equals a new key's are ever replaced, and a full shard
/// applies the [`FullPolicy`].
pub struct MemoryLimiter<A: Algorithm, C: Clock = SystemClock, const S: usize = SHARD_KEYS> {
    shards: Box<[Shard<A, S>]>,
    router: std::collections::hash_map::RandomState,
    clock: C,
}

impl<A> MemoryLimiter<A, SystemClock, SHARD_KEYS>
where
    A: Algorithm + Clone,
{
    /// Room for at least `capacity` keys (rounded up to whole shards).
    pub fn new(algorithm: A, capacity: usize, policy: FullPolicy) -> Self {
        Self::with_clock(algorithm, capacity, policy, SystemClock::new())
    }
}

impl<A, C, const S: usize> MemoryLimiter<A, C, S>
where
    A: Algorithm + Clone,
    C: Clock,
{
    /// As [`MemoryLimiter::new`], on `clock`.
    pub fn with_clock(algorithm: A, capacity: usize, policy: FullPolicy, clock: C) -> Self {
        let shards = capacity.div_ceil(S).max(1);
        MemoryLimiter {
            shards: (0..shards)
                .map(|_| Mutex::new(Box::new(Keyed::new(algorithm.clone(), policy))))
                .collect(),
            router: std::collections::hash_map::RandomState::new(),
            clock,
        }
    }

    /// The most keys it tracks.
    pub fn capacity(&self) -> usize {
        self.shards.len() * S
    }

    /// Keys currently tracked.
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(PoisonError::into_inner).len())
            .sum()
    }

    /// Whether no key is tracked.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Decides one request for `key` now.
    pub fn check_now(&self, key: &str) -> Decision {
        // There is at least one shard, and the index is reduced modulo
        // their number.
        let shard = &self.shards[(self.router.hash_one(key) as usize) % self.shards.len()];
        let now = self.clock.now();
        shard
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .check_borrowed(key, || key.to_owned(), now)
    }
}

impl<A, C, const S: usize> RateLimiter for MemoryLimiter<A, C, S>
where
    A: Algorithm + Clone + Send,
    A::State: Send,
    C: Clock,
{
    fn check<'a>(&'a self, key: &'a str) -> LimitFuture<'a> {
        LimitFuture::Ready(Some(Ok(self.check_now(key))))
    }
}
