//! Waiting instead of refusing: guard-std's [`WaitingLimiter`] on the
//! runtime given to
//! [`wait_up_to`](crate::RateLimitLayerBuilder::wait_up_to), its type
//! erased so that the layer stays one type, and the count of this layer's
//! requests in line by key, which decides whether a request may take the
//! fast path past the line.

use std::collections::hash_map::RandomState;
use std::future::{Future, poll_fn};
use std::hash::BuildHasher;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::Poll;
use std::time::{Duration, Instant};

use guard_core::limit::wait::WaitError;
use guard_std::BoxFuture;
use guard_std::ratelimit::{LimitError, RateLimiter, Report};
use guard_std::run::{Runtime, WaitingLimiter};

/// Slots of the count of requests in line, by a hash of their key. Two
/// keys in one slot only cost each other the fast path while one of them
/// has waiters (the line is as correct, one lookup dearer).
const SLOTS: usize = 64;

/// How a wait ended.
pub(crate) enum Waited {
    /// Admitted: the admission's report.
    Admitted(Report),
    /// The waiting limiter's error: a refusal past the deadline, a full
    /// line, or the limiter's own error.
    Ended(WaitError<LimitError>),
    /// The deadline passed before this request's turn came: the requests
    /// ahead of it in line took longer than its whole wait.
    TimedOut,
}

/// A waiting limiter on some runtime.
trait Waiter: Send + Sync {
    /// The runtime's now, which deadlines are on.
    fn now(&self) -> Instant;

    /// Waits in `key`'s line until a request of `cost` is admitted, at
    /// most until `deadline`.
    fn wait<'a>(&'a self, key: &'a str, cost: u32, deadline: Instant) -> BoxFuture<'a, Waited>;
}

/// [`Waiter`] on runtime `R`.
struct OnRuntime<R> {
    limiter: WaitingLimiter<R>,
    runtime: R,
}

impl<R: Runtime> Waiter for OnRuntime<R> {
    fn now(&self) -> Instant {
        self.runtime.now()
    }

    fn wait<'a>(&'a self, key: &'a str, cost: u32, deadline: Instant) -> BoxFuture<'a, Waited> {
        Box::pin(async move {
            let mut admitted = pin!(self.limiter.until_n_ready(key, cost, Some(deadline)));
            // `until_n_ready` bounds its sleeps by the deadline, not the
            // time spent behind earlier waiters: this timer bounds that.
            let mut timer = pin!(self.runtime.sleep_until(deadline));
            poll_fn(|cx| {
                // The wait first: a request admitted at its deadline is
                // admitted, not timed out.
                if let Poll::Ready(result) = admitted.as_mut().poll(cx) {
                    return Poll::Ready(match result {
                        Ok(report) => Waited::Admitted(report),
                        Err(e) => Waited::Ended(e),
                    });
                }
                timer.as_mut().poll(cx).map(|()| Waited::TimedOut)
            })
            .await
        })
    }
}

/// The counts of one layer's requests in line (or about to join), by slot.
struct Counts {
    slots: [AtomicUsize; SLOTS],
    hasher: RandomState,
}

/// A request counted in line; uncounted when dropped, with the response
/// future that holds it (the client went away) or when its wait ends.
pub(crate) struct Entered {
    counts: Arc<Counts>,
    slot: usize,
}

impl Drop for Entered {
    fn drop(&mut self) {
        self.counts.slots[self.slot].fetch_sub(1, Ordering::Release);
    }
}

/// The waiting half of a layer.
pub(crate) struct Wait {
    /// The longest a request waits, from its arrival.
    pub max: Duration,
    waiter: Box<dyn Waiter>,
    counts: Arc<Counts>,
}

impl Wait {
    /// Waiting over `limiter` on `runtime`, at most `max` a request.
    pub fn new<R: Runtime>(limiter: Arc<dyn RateLimiter>, max: Duration, runtime: R) -> Self {
        Wait {
            max,
            waiter: Box::new(OnRuntime {
                limiter: WaitingLimiter::with_runtime(limiter, runtime.clone()),
                runtime,
            }),
            counts: Arc::new(Counts {
                slots: [const { AtomicUsize::new(0) }; SLOTS],
                hasher: RandomState::new(),
            }),
        }
    }

    /// The runtime's now.
    pub fn now(&self) -> Instant {
        self.waiter.now()
    }

    /// The deadline of a request that arrives at `arrival`; a century
    /// ahead for a `max` beyond what an instant can represent.
    pub fn deadline(&self, arrival: Instant) -> Instant {
        arrival
            .checked_add(self.max)
            .unwrap_or_else(|| arrival + Duration::from_secs(100 * 365 * 86_400))
    }

    fn slot(&self, key: &str) -> usize {
        // Reduced modulo the number of slots: always an index.
        (self.counts.hasher.hash_one(key) as usize) % SLOTS
    }

    /// Whether no request of this layer on `key` (or one sharing its slot)
    /// is in line: then a request may be decided at once, as without
    /// waiting, since nobody it would pass is waiting.
    pub fn nobody_waits(&self, key: &str) -> bool {
        self.counts.slots[self.slot(key)].load(Ordering::Acquire) == 0
    }

    /// Counts a request on `key` in line from now on, so that later
    /// arrivals on the key join the line behind it instead of passing.
    pub fn enter(&self, key: &str) -> Entered {
        let slot = self.slot(key);
        self.counts.slots[slot].fetch_add(1, Ordering::AcqRel);
        Entered {
            counts: Arc::clone(&self.counts),
            slot,
        }
    }

    /// Waits in `key`'s line for a request of `cost`, until `deadline`.
    pub fn wait<'a>(
        &'a self,
        key: &'a str,
        cost: u32,
        deadline: Instant,
    ) -> impl Future<Output = Waited> + Send + 'a {
        self.waiter.wait(key, cost, deadline)
    }
}
