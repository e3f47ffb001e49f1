//! Waiting instead of refusing: guard-std's [`WaitingLimiter`] on the
//! runtime given to
//! [`wait_up_to`](crate::RateLimitLayerBuilder::wait_up_to), its type
//! erased so that the layer stays one type, and this layer's own line per
//! key, joined in `Service::call`: the order of arrival is the order of
//! the calls, which the waiting limiter's line (joined when a wait first
//! runs) cannot see. Only the head of a key's line waits on the limiter;
//! the count of waiters by slot decides whether a request may take the
//! fast path past the line.

use std::collections::hash_map::RandomState;
use std::collections::{HashMap, VecDeque};
use std::future::{Future, poll_fn};
use std::hash::BuildHasher;
use std::pin::pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

use guard_core::limit::wait::{LineFull, WaitError};
use guard_std::BoxFuture;
use guard_std::ratelimit::{LimitError, RateLimiter, Report};
use guard_std::run::{LINE_CAPACITY, Runtime, WaitingLimiter};

/// Slots of the lines, by a hash of their key: each with its own lock and
/// its count of waiters. Two keys in one slot only cost each other the
/// fast path while one of them has waiters (the line is as correct, one
/// lookup dearer).
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

    /// Waits for `place`'s turn, then until a request of `cost` is
    /// admitted, all of it at most until `deadline`.
    fn wait<'a>(&'a self, place: &'a Place, cost: u32, deadline: Instant) -> BoxFuture<'a, Waited>;
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

    fn wait<'a>(&'a self, place: &'a Place, cost: u32, deadline: Instant) -> BoxFuture<'a, Waited> {
        Box::pin(async move {
            // Only the head of this layer's line asks, so the waiting
            // limiter's own line for the key holds at most this request.
            let mut admitted = pin!(async move {
                place.turn().await;
                self.limiter
                    .until_n_ready(place.key(), cost, Some(deadline))
                    .await
            });
            // `until_n_ready` bounds its sleeps by the deadline, not the
            // time spent behind earlier arrivals: this timer bounds that.
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

/// One place in a key's line.
struct Entry {
    ticket: u64,
    /// Waiting for its turn; otherwise held while the limiter decides:
    /// later arrivals still ask the limiter instead of joining the line
    /// (only waiters count in [`Slot::waiting`]), and waiters behind it
    /// wait until it is decided.
    waiting: bool,
    /// Called when it reaches the head.
    waker: Option<Waker>,
}

/// One key's line: this layer's requests on the key, in arrival order.
#[derive(Default)]
struct KeyLine {
    next_ticket: u64,
    entries: VecDeque<Entry>,
    /// Entries that wait: at most [`LINE_CAPACITY`].
    waiting: usize,
}

impl KeyLine {
    /// Whether the line holds its [`LINE_CAPACITY`] waiters.
    fn full(&self) -> bool {
        self.waiting >= LINE_CAPACITY
    }

    /// Takes the last place.
    fn push(&mut self, waiting: bool) -> u64 {
        let ticket = self.next_ticket;
        self.next_ticket = ticket.wrapping_add(1);
        self.entries.push_back(Entry {
            ticket,
            waiting,
            waker: None,
        });
        self.waiting += usize::from(waiting);
        ticket
    }

    /// Makes `ticket`'s held place a waiting one: whether it was held.
    fn wait(&mut self, ticket: u64) -> bool {
        match self.entries.iter_mut().find(|e| e.ticket == ticket) {
            Some(entry) if !entry.waiting => {
                entry.waiting = true;
                self.waiting += 1;
                true
            }
            _ => false,
        }
    }

    /// Whether `ticket` is at the head (or gone: nothing to wait for);
    /// otherwise keeps `waker` to be woken when it gets there.
    fn turn(&mut self, ticket: u64, waker: &Waker) -> bool {
        match self.entries.iter().position(|e| e.ticket == ticket) {
            None | Some(0) => true,
            Some(index) => {
                if let Some(entry) = self.entries.get_mut(index) {
                    match &entry.waker {
                        Some(old) if old.will_wake(waker) => {}
                        _ => entry.waker = Some(waker.clone()),
                    }
                }
                false
            }
        }
    }

    /// Removes `ticket`: whether it was waiting, and the waker of the new
    /// head when it was the head.
    fn leave(&mut self, ticket: u64) -> (bool, Option<Waker>) {
        let Some(index) = self.entries.iter().position(|e| e.ticket == ticket) else {
            return (false, None);
        };
        let waiting = self.entries.remove(index).is_some_and(|e| e.waiting);
        self.waiting -= usize::from(waiting);
        let next = match index {
            0 => self.entries.front_mut().and_then(|e| e.waker.take()),
            _ => None,
        };
        (waiting, next)
    }
}

/// The lines of the keys that hash to one slot.
struct Slot {
    /// Waiting entries in these lines, changed under `lines`' lock and
    /// read without it by [`Wait::nobody_waits`], on every request.
    waiting: AtomicUsize,
    /// Keys with at least one place taken.
    lines: Mutex<HashMap<String, KeyLine>>,
}

/// One layer's lines, by slot.
struct Lines {
    slots: [Slot; SLOTS],
    hasher: RandomState,
}

impl Lines {
    /// Runs `f` on `key`'s line in `slot` and the slot's count of
    /// waiters, under the slot's lock. A line left without places is
    /// removed: the map holds only keys with requests in line.
    fn with_line<T>(
        &self,
        slot: usize,
        key: &str,
        f: impl FnOnce(&mut KeyLine, &AtomicUsize) -> T,
    ) -> T {
        let slot = &self.slots[slot];
        let mut lines = slot.lines.lock().unwrap_or_else(PoisonError::into_inner);
        let (result, empty) = match lines.get_mut(key) {
            Some(line) => {
                let result = f(line, &slot.waiting);
                (result, line.entries.is_empty())
            }
            None => {
                let mut line = KeyLine::default();
                let result = f(&mut line, &slot.waiting);
                if !line.entries.is_empty() {
                    lines.insert(key.to_owned(), line);
                }
                (result, false)
            }
        };
        if empty {
            lines.remove(key);
        }
        result
    }
}

/// A request's place in its key's line, taken in `Service::call`: the
/// line is in the order of the calls, whatever order the response futures
/// are first polled in. Dropping it (the response future dropped, polled
/// or not, or its wait over) leaves the line and wakes the new head, so
/// nobody waits behind a request that is gone.
pub(crate) struct Place {
    lines: Arc<Lines>,
    slot: usize,
    key: String,
    ticket: u64,
}

impl Place {
    /// The key whose line this is.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Turns a held place into a waiting one (its request was refused):
    /// later arrivals on the key join the line behind it instead of being
    /// decided first. `Err` when the line already holds its
    /// [`LINE_CAPACITY`] waiters.
    pub fn wait(&self) -> Result<(), LineFull> {
        self.lines.with_line(self.slot, &self.key, |line, waiting| {
            if line.full() {
                return Err(LineFull {
                    capacity: LINE_CAPACITY,
                });
            }
            if line.wait(self.ticket) {
                waiting.fetch_add(1, Ordering::AcqRel);
            }
            Ok(())
        })
    }

    /// Resolves once every request that arrived earlier on the key has
    /// left the line (admitted, answered or gone).
    async fn turn(&self) {
        poll_fn(|cx| {
            let head = self.lines.with_line(self.slot, &self.key, |line, _| {
                line.turn(self.ticket, cx.waker())
            });
            if head { Poll::Ready(()) } else { Poll::Pending }
        })
        .await;
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let next = self.lines.with_line(self.slot, &self.key, |line, waiting| {
            let (was_waiting, next) = line.leave(self.ticket);
            if was_waiting {
                waiting.fetch_sub(1, Ordering::AcqRel);
            }
            next
        });
        // Woken outside the lock: a waker may run code of its own.
        if let Some(waker) = next {
            waker.wake();
        }
    }
}

/// The waiting half of a layer.
pub(crate) struct Wait {
    /// The longest a request waits, from its arrival.
    pub max: Duration,
    waiter: Box<dyn Waiter>,
    lines: Arc<Lines>,
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
            lines: Arc::new(Lines {
                slots: std::array::from_fn(|_| Slot {
                    waiting: AtomicUsize::new(0),
                    lines: Mutex::new(HashMap::new()),
                }),
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
        (self.lines.hasher.hash_one(key) as usize) % SLOTS
    }

    /// Whether no request of this layer on `key` (or one sharing its slot)
    /// waits in line: then a request may be decided at once, as without
    /// waiting, since nobody it would pass is waiting.
    pub fn nobody_waits(&self, key: &str) -> bool {
        self.lines.slots[self.slot(key)]
            .waiting
            .load(Ordering::Acquire)
            == 0
    }

    /// A place at the end of `key`'s line, waiting for its turn: later
    /// arrivals on the key join the line behind it instead of passing.
    /// `Err` when the line already holds its [`LINE_CAPACITY`] waiters.
    pub fn enter(&self, key: &str) -> Result<Place, LineFull> {
        let slot = self.slot(key);
        let ticket = self.lines.with_line(slot, key, |line, waiting| {
            if line.full() {
                return Err(LineFull {
                    capacity: LINE_CAPACITY,
                });
            }
            waiting.fetch_add(1, Ordering::AcqRel);
            Ok(line.push(true))
        })?;
        Ok(self.place(slot, key, ticket))
    }

    /// A place at the end of `key`'s line, held while the limiter decides
    /// (it waits for its backend): later arrivals still ask the limiter
    /// meanwhile, and a refusal makes it a waiting place
    /// ([`Place::wait`]) ahead of every later arrival. The capacity
    /// bounds waiters only: held places are bounded by the requests in
    /// flight.
    pub fn hold(&self, key: &str) -> Place {
        let slot = self.slot(key);
        let ticket = self.lines.with_line(slot, key, |line, _| line.push(false));
        self.place(slot, key, ticket)
    }

    fn place(&self, slot: usize, key: &str, ticket: u64) -> Place {
        Place {
            lines: Arc::clone(&self.lines),
            slot,
            key: key.to_owned(),
            ticket,
        }
    }

    /// Waits at `place` for a request of `cost`, until `deadline`.
    pub fn wait<'a>(
        &'a self,
        place: &'a Place,
        cost: u32,
        deadline: Instant,
    ) -> impl Future<Output = Waited> + Send + 'a {
        self.waiter.wait(place, cost, deadline)
    }
}
