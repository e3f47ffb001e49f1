//! A bulkhead: at most `max` calls at once, the others waiting in
//! arrival order (Resilience4j's semaphore bulkhead, a concurrency limit).
//!
//! # Guarantees
//!
//! - **At most `max` at once.** A [`Permit`] is one call in flight; no
//!   more than `max` permits live at any moment, whatever the
//!   interleaving of acquisitions, releases and cancellations.
//! - **Arrival order.** Waiters ([`Bulkhead::acquire`]) are granted a
//!   permit in the order they first asked; a caller that does not wait
//!   ([`Bulkhead::try_acquire`]) takes a free permit only when nobody
//!   waits, so it never passes a waiter.
//! - **No lost permit.** A permit goes back when it is dropped; a waiter
//!   that gives up (its future dropped, granted or not) leaves at once,
//!   and a permit granted to it passes to the next waiter.
//! - **Bounded memory.** At most `N` waiters; one more is refused
//!   ([`LineFull`]) rather than waiting unseen. Nothing is allocated.
//!
//! The bulkhead does not measure time: a bounded wait is the caller's
//! timer raced against [`Bulkhead::acquire`] (guard-tower's
//! `BulkheadLayer` does so on its runtime).
//!
//! ```
//! use embassy_sync::blocking_mutex::raw::NoopRawMutex;
//! use guard_core::bulkhead::Bulkhead;
//!
//! let bulkhead = Bulkhead::<NoopRawMutex, 8>::new(2)?;
//! let first = Bulkhead::try_acquire(&bulkhead).unwrap();
//! let _second = Bulkhead::try_acquire(&bulkhead).unwrap();
//! assert!(Bulkhead::try_acquire(&bulkhead).is_err(), "two in flight");
//! drop(first);
//! assert!(Bulkhead::try_acquire(&bulkhead).is_ok());
//! # Ok::<(), guard_core::bulkhead::ZeroConcurrency>(())
//! ```

use core::cell::RefCell;
use core::fmt;
use core::future::Future;
use core::marker::PhantomData;
use core::ops::Deref;
use core::pin::Pin;
use core::task::{Context, Poll, Waker};

use embassy_sync::blocking_mutex::raw::RawMutex;
use heapless::Vec;

pub use crate::limit::wait::LineFull;
use crate::sync::{AtomicU64, BlockingMutex, Ordering};

/// A bulkhead of no permits would admit nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct ZeroConcurrency;

impl fmt::Display for ZeroConcurrency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("bulkhead max_concurrent: 0: it must allow at least one call")
    }
}

impl core::error::Error for ZeroConcurrency {}

/// Every permit is out (or others wait for one): the call is not
/// permitted now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Full {
    /// The calls allowed at once.
    pub max: u32,
    /// Waiters ahead, who would be served first.
    pub waiting: usize,
}

impl fmt::Display for Full {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "bulkhead full: {} calls in flight, {} waiting",
            self.max, self.waiting
        )
    }
}

impl core::error::Error for Full {}

struct Waiter {
    ticket: u64,
    waker: Option<Waker>,
    /// A permit was counted for it; it takes it at its next poll.
    granted: bool,
}

/// The line, under the bulkhead's mutex.
struct Line<const N: usize> {
    next_ticket: u64,
    /// In arrival order.
    waiting: Vec<Waiter, N>,
}

/// One waiter in the high half of [`Bulkhead::counts`].
const ONE_WAITER: u64 = 1 << 32;

/// Permits in flight, from [`Bulkhead::counts`].
const fn in_flight_of(counts: u64) -> u32 {
    (counts & 0xffff_ffff) as u32
}

/// Waiters, from [`Bulkhead::counts`].
const fn waiting_of(counts: u64) -> u32 {
    (counts >> 32) as u32
}

/// At most `max` calls at once, up to `N` waiting in arrival order; `M`
/// is the mutex guarding the line for a few instructions per operation
/// (`CriticalSectionRawMutex` between threads, `NoopRawMutex` within one
/// executor).
///
/// A permit is taken and given back with one compare-and-swap while
/// nobody waits; the line's mutex is taken only once a caller waits.
pub struct Bulkhead<M: RawMutex, const N: usize> {
    /// Permits in flight (granted to waiters included) in the low 32 bits,
    /// waiters in the high 32: one word, so that taking a free permit and
    /// seeing that nobody waits are one step (invariant: a permit is taken
    /// past the line only while its waiters are 0). Waiters change only
    /// under the line's mutex.
    counts: AtomicU64,
    /// The calls allowed at once.
    max: AtomicU64,
    line: BlockingMutex<M, RefCell<Line<N>>>,
}

impl<M: RawMutex, const N: usize> Bulkhead<M, N> {
    /// A bulkhead of `max` permits.
    #[cfg(not(guard_loom))]
    pub const fn new(max: u32) -> Result<Self, ZeroConcurrency> {
        if max == 0 {
            return Err(ZeroConcurrency);
        }
        Ok(Bulkhead {
            counts: AtomicU64::new(0),
            max: AtomicU64::new(max as u64),
            line: BlockingMutex::new(RefCell::new(Line {
                next_ticket: 0,
                waiting: Vec::new(),
            })),
        })
    }

    /// A bulkhead of `max` permits (loom's atomics and mutex have no
    /// `const` constructor).
    #[cfg(guard_loom)]
    pub fn new(max: u32) -> Result<Self, ZeroConcurrency> {
        if max == 0 {
            return Err(ZeroConcurrency);
        }
        Ok(Bulkhead {
            counts: AtomicU64::new(0),
            max: AtomicU64::new(u64::from(max)),
            line: BlockingMutex::new(RefCell::new(Line {
                next_ticket: 0,
                waiting: Vec::new(),
            })),
        })
    }

    /// Runs `f` on the line; `None` only if a waker called back into the
    /// bulkhead while it was held (wakers are woken outside the lock, so
    /// that cannot happen through this module).
    fn with_line<R>(&self, f: impl FnOnce(&mut Line<N>) -> R) -> Option<R> {
        self.line
            .lock(|l| l.try_borrow_mut().ok().map(|mut l| f(&mut l)))
    }

    /// The calls allowed at once.
    pub fn max(&self) -> u32 {
        u32::try_from(self.max.load(Ordering::Acquire)).unwrap_or(u32::MAX)
    }

    /// Permits out now (granted to waiters included).
    pub fn in_flight(&self) -> u32 {
        in_flight_of(self.counts.load(Ordering::Acquire))
    }

    /// Waiters now.
    pub fn waiting(&self) -> usize {
        waiting_of(self.counts.load(Ordering::Acquire)) as usize
    }

    /// Takes a free permit if nobody waits: one compare-and-swap loop.
    /// `Err` with the counts that refused it.
    #[inline]
    fn take_free(&self) -> Result<(), u64> {
        let max = self.max();
        let mut counts = self.counts.load(Ordering::Acquire);
        loop {
            if waiting_of(counts) > 0 || in_flight_of(counts) >= max {
                return Err(counts);
            }
            match self.counts.compare_exchange_weak(
                counts,
                counts.saturating_add(1),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Ok(()),
                Err(now) => counts = now,
            }
        }
    }

    /// Grants the first waiter not yet granted a permit, if one is free;
    /// its waker, to be woken outside the lock. Called with the line held:
    /// while anybody waits no permit is taken past the line, so the free
    /// permit seen here is still free when counted.
    fn grant_next(&self, line: &mut Line<N>) -> Option<Waker> {
        if self.in_flight() >= self.max() {
            return None;
        }
        let waiter = line.waiting.iter_mut().find(|w| !w.granted)?;
        waiter.granted = true;
        self.counts.fetch_add(1, Ordering::AcqRel);
        // Granted before its first poll with a waker: it takes the permit
        // at that poll.
        waiter.waker.take()
    }

    /// Gives a permit back with the line held: to the next waiter if one
    /// is not granted yet and a permit is free after it.
    fn release_in_line(&self, line: &mut Line<N>) -> Option<Waker> {
        self.counts.fetch_sub(1, Ordering::AcqRel);
        self.grant_next(line)
    }

    /// Allows `max` calls at once from now: raised, the waiters it makes
    /// room for are granted at once; lowered, the calls in flight finish
    /// and no new one starts until fewer than `max` are.
    pub fn set_max(&self, max: u32) -> Result<(), ZeroConcurrency> {
        if max == 0 {
            return Err(ZeroConcurrency);
        }
        self.max.store(u64::from(max), Ordering::Release);
        // One grant a lock, woken outside it.
        while let Some(waker) = self.with_line(|line| self.grant_next(line)).flatten() {
            waker.wake();
        }
        Ok(())
    }

    /// A permit at once, or why not: every permit is out, or others wait
    /// (they come first). `this` is the bulkhead or anything that derefs
    /// to it (`&Bulkhead`, an `Arc`), which the permit keeps.
    pub fn try_acquire<B: Deref<Target = Self>>(this: B) -> Result<Permit<B, M, N>, Full> {
        match this.take_free() {
            Ok(()) => Ok(Permit::of(this)),
            Err(counts) => Err(Full {
                max: this.max(),
                waiting: waiting_of(counts) as usize,
            }),
        }
    }

    /// Waits for a permit in arrival order (arrival is the first poll);
    /// [`LineFull`] if `N` already wait. Dropping the future leaves the
    /// line.
    pub fn acquire<B: Deref<Target = Self>>(this: B) -> Acquire<B, M, N> {
        Acquire {
            bulkhead: Some(this),
            ticket: None,
            mutex: PhantomData,
        }
    }

    /// Gives a permit back: one atomic subtraction, and when somebody
    /// waits, a grant to the head of the line under its mutex. A waiter
    /// counted after the subtraction finds the permit free when it arrives
    /// (its arrival grants the head once it is counted).
    #[inline]
    fn release(&self) {
        let before = self.counts.fetch_sub(1, Ordering::AcqRel);
        if waiting_of(before) > 0 {
            self.grant_to_line();
        }
    }

    /// Grants a freed permit to the head of the line: the slow path of
    /// [`Self::release`], kept out of line so the fast one stays small.
    #[cold]
    #[inline(never)]
    fn grant_to_line(&self) {
        if let Some(waker) = self.with_line(|line| self.grant_next(line)).flatten() {
            waker.wake();
        }
    }

    /// The first poll of a waiter: a free permit if nobody waits, else the
    /// last place in line (its ticket), decided in one step under the
    /// line's mutex.
    fn arrive(&self, waker: &Waker) -> Option<Result<Option<u64>, LineFull>> {
        if self.take_free().is_ok() {
            return Some(Ok(None));
        }
        let arrived = self.with_line(|line| {
            // Again under the lock: a permit freed since is taken, unless
            // others wait; otherwise this caller waits. Waiters change only
            // under this lock.
            if self.take_free().is_ok() {
                return Ok((None, None));
            }
            let ticket = line.next_ticket;
            let waiter = Waiter {
                ticket,
                waker: Some(waker.clone()),
                granted: false,
            };
            line.waiting
                .push(waiter)
                .map_err(|_| LineFull { capacity: N })?;
            line.next_ticket = ticket.wrapping_add(1);
            self.counts.fetch_add(ONE_WAITER, Ordering::AcqRel);
            // A permit given back between the check and the count above
            // went past the line (its giver saw no waiter): it is free now,
            // for the head of the line (this waiter or one ahead).
            Ok((Some(ticket), self.grant_next(line)))
        })?;
        Some(arrived.map(|(ticket, granted)| {
            // Woken outside the lock: a waker may run code of its own.
            if let Some(waker) = granted {
                waker.wake();
            }
            ticket
        }))
    }

    /// A later poll of waiter `ticket`: `Some(true)` when it leaves the
    /// line with its permit, `Some(false)` while it waits.
    fn poll_place(&self, ticket: u64, waker: &Waker) -> Option<bool> {
        self.with_line(|line| {
            let index = line.waiting.iter().position(|w| w.ticket == ticket)?;
            let waiter = line.waiting.get_mut(index)?;
            if waiter.granted {
                line.waiting.remove(index);
                self.counts.fetch_sub(ONE_WAITER, Ordering::AcqRel);
                return Some(true);
            }
            match &waiter.waker {
                Some(old) if old.will_wake(waker) => {}
                _ => waiter.waker = Some(waker.clone()),
            }
            Some(false)
        })
        .flatten()
    }

    /// Waiter `ticket` gives up: out of the line, and a permit granted to
    /// it passes on.
    fn leave(&self, ticket: u64) {
        let next = self.with_line(|line| {
            let index = line.waiting.iter().position(|w| w.ticket == ticket)?;
            let left = line.waiting.remove(index);
            self.counts.fetch_sub(ONE_WAITER, Ordering::AcqRel);
            if left.granted {
                return self.release_in_line(line);
            }
            None
        });
        if let Some(waker) = next.flatten() {
            waker.wake();
        }
    }
}

/// One call in flight; dropping it gives the permit back.
#[must_use = "a permit is given back when dropped: hold it for the call"]
pub struct Permit<B, M, const N: usize>
where
    B: Deref<Target = Bulkhead<M, N>>,
    M: RawMutex,
{
    bulkhead: B,
    mutex: PhantomData<fn() -> M>,
}

impl<B, M, const N: usize> Permit<B, M, N>
where
    B: Deref<Target = Bulkhead<M, N>>,
    M: RawMutex,
{
    fn of(bulkhead: B) -> Self {
        Permit {
            bulkhead,
            mutex: PhantomData,
        }
    }

    /// The bulkhead the permit is of.
    pub fn bulkhead(&self) -> &Bulkhead<M, N> {
        &self.bulkhead
    }
}

impl<B, M, const N: usize> Drop for Permit<B, M, N>
where
    B: Deref<Target = Bulkhead<M, N>>,
    M: RawMutex,
{
    fn drop(&mut self) {
        self.bulkhead.release();
    }
}

impl<B, M, const N: usize> fmt::Debug for Permit<B, M, N>
where
    B: Deref<Target = Bulkhead<M, N>>,
    M: RawMutex,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permit").finish_non_exhaustive()
    }
}

/// The future of [`Bulkhead::acquire`]: a permit in arrival order.
#[must_use = "a future does nothing unless polled"]
pub struct Acquire<B, M, const N: usize>
where
    B: Deref<Target = Bulkhead<M, N>>,
    M: RawMutex,
{
    /// Taken when the permit is handed out.
    bulkhead: Option<B>,
    /// Its place, once it waits.
    ticket: Option<u64>,
    mutex: PhantomData<fn() -> M>,
}

impl<B, M, const N: usize> Future for Acquire<B, M, N>
where
    B: Deref<Target = Bulkhead<M, N>> + Unpin,
    M: RawMutex,
{
    type Output = Result<Permit<B, M, N>, LineFull>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let Some(bulkhead) = this.bulkhead.as_ref() else {
            // Polled after it completed.
            return Poll::Pending;
        };
        let granted = match this.ticket {
            None => match bulkhead.arrive(cx.waker()) {
                Some(Ok(None)) => true,
                Some(Ok(Some(ticket))) => {
                    this.ticket = Some(ticket);
                    false
                }
                Some(Err(full)) => {
                    this.bulkhead = None;
                    return Poll::Ready(Err(full));
                }
                // Only a waker calling back in could get here: poll again.
                None => {
                    cx.waker().wake_by_ref();
                    false
                }
            },
            Some(ticket) => match bulkhead.poll_place(ticket, cx.waker()) {
                Some(granted) => granted,
                // Not in line (cannot happen while it waits): ask again as
                // a new arrival rather than hang.
                None => {
                    this.ticket = None;
                    cx.waker().wake_by_ref();
                    false
                }
            },
        };
        if !granted {
            return Poll::Pending;
        }
        this.ticket = None;
        match this.bulkhead.take() {
            Some(bulkhead) => Poll::Ready(Ok(Permit::of(bulkhead))),
            None => Poll::Pending,
        }
    }
}

impl<B, M, const N: usize> Drop for Acquire<B, M, N>
where
    B: Deref<Target = Bulkhead<M, N>>,
    M: RawMutex,
{
    /// Leaves the line; a permit granted meanwhile passes to the next
    /// waiter.
    fn drop(&mut self) {
        if let (Some(bulkhead), Some(ticket)) = (self.bulkhead.as_ref(), self.ticket) {
            bulkhead.leave(ticket);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::task::Waker;
    use embassy_sync::blocking_mutex::raw::NoopRawMutex;

    type B = Bulkhead<NoopRawMutex, 4>;

    fn poll<F: Future + Unpin>(f: &mut F) -> Poll<F::Output> {
        let mut cx = Context::from_waker(Waker::noop());
        Pin::new(f).poll(&mut cx)
    }

    #[test]
    fn waiters_are_granted_in_arrival_order_and_never_passed() {
        let b = B::new(1).unwrap();
        let held = B::try_acquire(&b).unwrap();
        let mut first = B::acquire(&b);
        let mut second = B::acquire(&b);
        assert!(poll(&mut first).is_pending());
        assert!(poll(&mut second).is_pending());
        assert_eq!(b.waiting(), 2);
        drop(held);
        // Granted to the first; a newcomer does not pass it.
        assert_eq!(B::try_acquire(&b).unwrap_err(), Full { max: 1, waiting: 2 });
        assert!(poll(&mut second).is_pending());
        let Poll::Ready(Ok(p1)) = poll(&mut first) else {
            panic!("the first waiter has the permit")
        };
        assert_eq!(b.in_flight(), 1);
        drop(p1);
        let Poll::Ready(Ok(_p2)) = poll(&mut second) else {
            panic!("then the second")
        };
        assert_eq!(b.waiting(), 0);
    }

    #[test]
    fn a_waiter_that_gives_up_passes_its_permit_on() {
        let b = B::new(1).unwrap();
        let held = B::try_acquire(&b).unwrap();
        let mut first = B::acquire(&b);
        let mut second = B::acquire(&b);
        assert!(poll(&mut first).is_pending());
        assert!(poll(&mut second).is_pending());
        drop(held); // granted to the first, which is dropped untaken
        drop(first);
        assert_eq!(b.in_flight(), 1, "now the second's");
        let Poll::Ready(Ok(p)) = poll(&mut second) else {
            panic!("the second has it")
        };
        drop(p);
        assert_eq!((b.in_flight(), b.waiting()), (0, 0));
    }

    #[test]
    fn a_full_line_refuses_and_raising_max_grants_waiters() {
        let b = Bulkhead::<NoopRawMutex, 1>::new(1).unwrap();
        let _held = Bulkhead::try_acquire(&b).unwrap();
        let mut first = Bulkhead::acquire(&b);
        assert!(poll(&mut first).is_pending());
        let mut second = Bulkhead::acquire(&b);
        assert!(matches!(
            poll(&mut second),
            Poll::Ready(Err(LineFull { capacity: 1 }))
        ));
        b.set_max(2).unwrap();
        assert!(matches!(poll(&mut first), Poll::Ready(Ok(_))));
        assert_eq!(b.set_max(0), Err(ZeroConcurrency));
        assert!(B::new(0).is_err());
    }
}
