//! Waiting until a limiter admits, on a runtime's timers: guard-core's
//! `limit::wait` over any `RateLimiter` (memory or Redis), one line of
//! waiters per key.

use std::collections::HashMap;
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use embassy_sync::blocking_mutex::raw::CriticalSectionRawMutex;
use guard_core::limit::Report;
use guard_core::limit::wait::{Line, WaitError, until_admitted};

use super::{Runtime, RuntimeClock, RuntimeDelay};
use crate::Clock;
use crate::ratelimit::{LimitError, RateLimiter};

/// The most waiters one key's line holds; one more is refused with
/// `WaitError::LineFull` (24 bytes a waiter, allocated only while the key
/// has waiters).
pub const LINE_CAPACITY: usize = 256;

type KeyLine = Line<CriticalSectionRawMutex, LINE_CAPACITY>;

/// A limiter whose callers can wait until admitted: [`Self::until_ready`]
/// sleeps for each refusal's retry time (plus up to 1/16 of jitter) and
/// asks again, until admitted, the deadline, or the future is dropped.
///
/// Waiters on one key are admitted in the order they called (a line per
/// key; only its head asks the limiter). The order is kept among the
/// waiters of this `WaitingLimiter`: plain `check` calls, and other
/// processes sharing a Redis limiter, are not in the line. Every guarantee
/// is listed in guard-core's `limit::wait`.
///
/// ```no_run
/// # smol::block_on(async {
/// use std::sync::Arc;
/// use std::time::{Duration, Instant};
/// use guard_core::limit::{FullPolicy, Rate, TokenBucket};
/// use guard_smol::WaitingLimiter;
/// use guard_std::ratelimit::MemoryLimiter;
///
/// let bucket = TokenBucket::new(10, Rate::per_second(10))?;
/// let limiter = WaitingLimiter::new(Arc::new(MemoryLimiter::new(bucket, 1024, FullPolicy::DenyNewKeys)));
/// // Waits at most two seconds for a token on this key.
/// let report = limiter.until_ready("tenant-7", Some(Instant::now() + Duration::from_secs(2))).await?;
/// println!("admitted, {} left", report.remaining);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # });
/// ```
pub struct WaitingLimiter<R> {
    limiter: Arc<dyn RateLimiter>,
    /// The lines of keys that have waiters now.
    lines: Mutex<HashMap<String, Arc<KeyLine>>>,
    /// The jitter's randomness: a hash keyed at start-up over a counter.
    random: RandomState,
    draws: AtomicU64,
    /// The runtime's clock, which deadlines are measured on.
    clock: RuntimeClock<R>,
}

impl<R> std::fmt::Debug for WaitingLimiter<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WaitingLimiter")
            .field("quota", &self.limiter.quota())
            .finish_non_exhaustive()
    }
}

impl<R: Runtime + Default> WaitingLimiter<R> {
    /// Waiting over `limiter`, on the default runtime of its type.
    pub fn new(limiter: Arc<dyn RateLimiter>) -> Self {
        Self::with_runtime(limiter, R::default())
    }
}

impl<R: Runtime> WaitingLimiter<R> {
    /// Waiting over `limiter` on `runtime`'s clock and timers.
    pub fn with_runtime(limiter: Arc<dyn RateLimiter>, runtime: R) -> Self {
        WaitingLimiter {
            limiter,
            lines: Mutex::new(HashMap::new()),
            random: RandomState::new(),
            draws: AtomicU64::new(0),
            clock: RuntimeClock::new(runtime),
        }
    }

    /// The limiter it waits on.
    pub fn limiter(&self) -> &Arc<dyn RateLimiter> {
        &self.limiter
    }

    /// Waits until one request for `key` is admitted, or until `deadline`
    /// (an instant on the runtime's timeline: `std::time::Instant` for
    /// async-io, `tokio::time::Instant::into_std` for tokio).
    pub async fn until_ready(
        &self,
        key: &str,
        deadline: Option<std::time::Instant>,
    ) -> Result<Report, WaitError<LimitError>> {
        self.until_n_ready(key, 1, deadline).await
    }

    /// Waits until a request of `cost` units for `key` is admitted (all
    /// at once), or until `deadline`. A cost above the quota ends at once
    /// with the limiter's error.
    pub async fn until_n_ready(
        &self,
        key: &str,
        cost: u32,
        deadline: Option<std::time::Instant>,
    ) -> Result<Report, WaitError<LimitError>> {
        let line = self.line(key);
        let result = until_admitted(
            &line,
            || self.limiter.check_n(key, cost),
            &mut RuntimeDelay(self.clock.runtime().clone()),
            || self.clock.now(),
            deadline.map(|d| self.clock.reading(d)),
            &mut || self.draw(),
        )
        .await;
        self.forget_if_empty(key, line);
        result
    }

    /// Keys that have waiters now.
    pub fn waiting_keys(&self) -> usize {
        self.lines
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    fn line(&self, key: &str) -> Arc<KeyLine> {
        let mut lines = self.lines.lock().unwrap_or_else(PoisonError::into_inner);
        lines.entry(key.to_owned()).or_default().clone()
    }

    /// Drops `key`'s line when nobody else holds it: under the map's lock,
    /// so a caller that takes the line meanwhile keeps it alive.
    fn forget_if_empty(&self, key: &str, line: Arc<KeyLine>) {
        let mut lines = self.lines.lock().unwrap_or_else(PoisonError::into_inner);
        // Ours and the map's: nobody else is waiting or about to.
        if Arc::strong_count(&line) == 2 && line.is_empty() {
            lines.remove(key);
        }
    }

    fn draw(&self) -> u64 {
        self.random
            .hash_one(self.draws.fetch_add(1, Ordering::Relaxed))
    }
}
