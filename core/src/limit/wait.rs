//! Waiting until a limiter admits: a line of waiters served in arrival
//! order, and the loop that sleeps for each refusal's retry time.
//!
//! # Guarantees
//!
//! - **Arrival order.** Waiters that join one [`Line`] are admitted in the
//!   order they joined: only the waiter at the head asks the limiter, the
//!   others wait without polling it. Callers that do not wait (a plain
//!   `check`) and waiters in other lines (other processes sharing a Redis
//!   key) are not in the line and may pass first; the order holds among
//!   the waiters of one line.
//! - **No lost turn.** A waiter that gives up (its deadline, an error, or
//!   its future dropped: cancellation) leaves the line at once and the next
//!   one is woken, so nobody waits behind a waiter that is gone.
//! - **Bounded wait.** With a deadline, a refusal whose retry time ends
//!   after it returns [`WaitError::Deadline`] at once, without sleeping a
//!   wait that could only end in a refusal.
//! - **Jitter.** Each sleep is the retry time plus up to 1/16 of it, drawn
//!   from the caller's [`RandomSource`], so heads of lines in different
//!   processes do not all ask at the same instant. Never less than the
//!   retry time: an earlier call could only be refused. With
//!   [`WithoutRandom`](crate::retry::WithoutRandom) there is no jitter.
//! - **Bounded memory.** A line holds at most `N` waiters; one more gets
//!   [`WaitError::LineFull`] rather than waiting unseen.

use core::cell::RefCell;
use core::fmt;
use core::future::poll_fn;
use core::task::{Poll, Waker};
use core::time::Duration;

use embassy_sync::blocking_mutex::raw::RawMutex;
use embedded_hal_async::delay::DelayNs;
use heapless::Vec;

use super::Report;
use crate::retry::RandomSource;
use crate::sync::BlockingMutex;
use crate::time::{Instant, delay_for};

/// A waiter's place: its ticket and the waker to call when it reaches
/// the head.
struct Waiting {
    ticket: u64,
    waker: Option<Waker>,
}

struct LineState<const N: usize> {
    next_ticket: u64,
    /// In arrival order: the head is the waiter allowed to ask.
    waiting: Vec<Waiting, N>,
}

/// A line of up to `N` waiters on one key, served in arrival order (see
/// the module notes). `M` is the mutex guarding it for a few instructions
/// per operation: `CriticalSectionRawMutex` shared with interrupts or
/// between threads, `NoopRawMutex` within one executor.
pub struct Line<M: RawMutex, const N: usize> {
    state: BlockingMutex<M, RefCell<LineState<N>>>,
}

/// The line already holds its `N` waiters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct LineFull {
    /// The most waiters it holds.
    pub capacity: usize,
}

impl fmt::Display for LineFull {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} waiters are already in line for this key (the most it holds)",
            self.capacity
        )
    }
}

impl core::error::Error for LineFull {}

impl<M: RawMutex, const N: usize> Line<M, N> {
    /// An empty line (usable in a `static`).
    #[cfg(not(guard_loom))]
    pub const fn new() -> Self {
        Line {
            state: BlockingMutex::new(RefCell::new(LineState {
                next_ticket: 0,
                waiting: Vec::new(),
            })),
        }
    }

    /// An empty line (loom's mutex has no `const` constructor).
    #[cfg(guard_loom)]
    pub fn new() -> Self {
        Line {
            state: BlockingMutex::new(RefCell::new(LineState {
                next_ticket: 0,
                waiting: Vec::new(),
            })),
        }
    }

    /// Waiters in line now.
    pub fn len(&self) -> usize {
        self.state
            .lock(|s| s.try_borrow().map_or(0, |s| s.waiting.len()))
    }

    /// Whether nobody waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Takes the last place in line; leaving is dropping the place.
    pub fn join(&self) -> Result<Place<'_, M, N>, LineFull> {
        self.state.lock(|s| {
            let full = LineFull { capacity: N };
            let mut s = s.try_borrow_mut().map_err(|_| full)?;
            let ticket = s.next_ticket;
            s.waiting
                .push(Waiting {
                    ticket,
                    waker: None,
                })
                .map_err(|_| full)?;
            s.next_ticket = ticket.wrapping_add(1);
            Ok(Place { line: self, ticket })
        })
    }

    /// Ready once `ticket` is at the head; otherwise keeps the waker.
    fn poll_turn(&self, ticket: u64, waker: &Waker) -> Poll<()> {
        self.state.lock(|s| {
            let Ok(mut s) = s.try_borrow_mut() else {
                // Only a waker calling back into the line could get here;
                // ask to be polled again rather than lose the turn.
                waker.wake_by_ref();
                return Poll::Pending;
            };
            match s.waiting.iter_mut().position(|w| w.ticket == ticket) {
                // Not in line (cannot happen while its place lives):
                // nothing to wait for.
                None | Some(0) => Poll::Ready(()),
                Some(index) => {
                    if let Some(w) = s.waiting.get_mut(index) {
                        match &w.waker {
                            Some(old) if old.will_wake(waker) => {}
                            _ => w.waker = Some(waker.clone()),
                        }
                    }
                    Poll::Pending
                }
            }
        })
    }

    /// Removes `ticket`; when it was the head, wakes the next waiter.
    fn leave(&self, ticket: u64) {
        let next = self.state.lock(|s| {
            let mut s = s.try_borrow_mut().ok()?;
            let index = s.waiting.iter().position(|w| w.ticket == ticket)?;
            s.waiting.remove(index);
            if index != 0 {
                return None;
            }
            s.waiting.first_mut().and_then(|w| w.waker.take())
        });
        // Woken outside the lock: a waker may run code of its own.
        if let Some(waker) = next {
            waker.wake();
        }
    }
}

impl<M: RawMutex, const N: usize> Default for Line<M, N> {
    fn default() -> Self {
        Self::new()
    }
}

/// A place in a [`Line`]; dropping it leaves the line.
pub struct Place<'a, M: RawMutex, const N: usize> {
    line: &'a Line<M, N>,
    ticket: u64,
}

impl<M: RawMutex, const N: usize> Place<'_, M, N> {
    /// Resolves when every waiter that joined earlier has left.
    pub async fn turn(&self) {
        poll_fn(|cx| self.line.poll_turn(self.ticket, cx.waker())).await;
    }
}

impl<M: RawMutex, const N: usize> Drop for Place<'_, M, N> {
    fn drop(&mut self) {
        self.line.leave(self.ticket);
    }
}

/// Why waiting ended without an admission.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum WaitError<E> {
    /// The limiter refuses until after the deadline: the last refusal,
    /// whose `retry_after` says how long past it.
    Deadline(Report),
    /// The line was full.
    LineFull(LineFull),
    /// The limiter gave no decision (a cost above its quota, a backend
    /// failure).
    Limiter(E),
}

impl<E: fmt::Display> fmt::Display for WaitError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WaitError::Deadline(report) => write!(
                f,
                "not admitted before the deadline: the limiter asks to wait {:?} more",
                report.retry_after().unwrap_or_default()
            ),
            WaitError::LineFull(e) => write!(f, "{e}"),
            WaitError::Limiter(e) => write!(f, "{e}"),
        }
    }
}

impl<E: core::error::Error + 'static> core::error::Error for WaitError<E> {
    fn source(&self) -> Option<&(dyn core::error::Error + 'static)> {
        match self {
            WaitError::Deadline(_) => None,
            WaitError::LineFull(e) => Some(e),
            WaitError::Limiter(e) => Some(e),
        }
    }
}

/// The sleep after a refusal asking for `retry`: `retry` plus up to 1/16
/// of it.
pub fn jittered(retry: Duration, random: &mut impl RandomSource) -> Duration {
    let spread = u64::try_from(retry.as_nanos() / 16).unwrap_or(u64::MAX);
    // Uniform enough: the bias of a 64-bit draw reduced modulo a bound
    // far below 2^64 is negligible for spreading wake-ups.
    let extra = random
        .next_u64()
        .checked_rem(spread.saturating_add(1))
        .unwrap_or(0);
    retry.saturating_add(Duration::from_nanos(extra))
}

/// Waits in `line` until `decide` admits, then returns its report.
///
/// `decide` makes one decision (a `check_n` of the caller's cost) and is
/// called only at this waiter's turn; `delay` sleeps and `now` reads the
/// clock the deadline is on. Every guarantee is in the module notes.
/// Cancellation is dropping the future: the place in line goes with it.
pub async fn until_admitted<M, const N: usize, E, F, Fut>(
    line: &Line<M, N>,
    mut decide: F,
    delay: &mut impl DelayNs,
    mut now: impl FnMut() -> Instant,
    deadline: Option<Instant>,
    random: &mut impl RandomSource,
) -> Result<Report, WaitError<E>>
where
    M: RawMutex,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Report, E>>,
{
    let place = line.join().map_err(WaitError::LineFull)?;
    place.turn().await;
    loop {
        let report = decide().await.map_err(WaitError::Limiter)?;
        let Some(retry) = report.retry_after() else {
            return Ok(report);
        };
        let mut sleep = jittered(retry, random);
        if let Some(deadline) = deadline {
            let left = deadline.saturating_duration_since(now());
            if retry > left {
                return Err(WaitError::Deadline(report));
            }
            sleep = sleep.min(left);
        }
        delay_for(delay, sleep).await;
    }
}
