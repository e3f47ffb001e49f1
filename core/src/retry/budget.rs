//! A retry budget: retries at most a fraction of recent calls.
//!
//! Retrying every failure multiplies the load on a server that is already
//! failing: three retries a call is four times the traffic at the worst
//! moment. A budget shared by every caller of one service bounds that:
//! each first call deposits, each retry withdraws, and a retry that finds
//! the budget empty is not made. This is tower's `TpsBudget` (after
//! Finagle's), in integer arithmetic with the time passed in:
//!
//! - a deposit counts for the budget's `ttl`, kept in ten slots of a tenth
//!   of it each, so it is forgotten between `0.9 ttl` and `ttl` after it
//!   was made;
//! - `retry_per_mille` retries may be made per thousand deposits (`200`:
//!   one retry for every five calls; up to `1_000_000`: a thousand a call);
//! - `min_per_sec` retries a second are allowed besides, so that a caller
//!   that makes few calls can still retry: a reserve of `min_per_sec × ttl`
//!   retries, each given back `ttl` after it was taken.
//!
//! The deposits and withdrawals are counted exactly: a budget of `300` per
//! mille allows 3 retries for 10 deposits (tower's, from `1 / 0.3` rounded
//! down, allows one for every 3).
//!
//! ```
//! use core::time::Duration;
//! use guard_core::retry::RetryBudget;
//! use guard_core::time::Instant;
//!
//! // One retry for every five calls over the last ten seconds, and none besides.
//! let mut budget = RetryBudget::new(Duration::from_secs(10), 0, 200)?;
//! let now = Instant::from_secs(1);
//! for _ in 0..5 {
//!     budget.deposit(now);
//! }
//! assert!(budget.withdraw(now));
//! assert!(!budget.withdraw(now));
//! // Ten seconds on, the calls are forgotten.
//! budget.deposit(now + Duration::from_secs(10));
//! assert!(!budget.withdraw(now + Duration::from_secs(10)));
//! # Ok::<(), guard_core::retry::InvalidRetryBudget>(())
//! ```

use core::cell::RefCell;
use core::fmt;
use core::time::Duration;

use embassy_sync::blocking_mutex::Mutex as BlockingMutex;
use embassy_sync::blocking_mutex::raw::RawMutex;

use crate::time::Instant;

/// Slots a budget's `ttl` is kept in.
const SLOTS: usize = 10;
/// What one retry costs, in the units deposits are counted in.
const RETRY_COST: i64 = 1_000;
/// The most retries a call may allow, in thousandths (a thousand a call).
const MAX_PER_MILLE: u32 = 1_000_000;

/// Budget parameters that cannot work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum InvalidRetryBudget {
    /// The `ttl` must be between 1 and 60 seconds (as tower and Finagle
    /// require).
    TtlOutOfRange,
    /// At most a thousand retries a call (`retry_per_mille` ≤ 1,000,000).
    RatioTooLarge,
    /// At most 2³¹ − 1 retries a second besides the calls.
    MinPerSecTooLarge,
}

impl fmt::Display for InvalidRetryBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            InvalidRetryBudget::TtlOutOfRange => {
                "retry budget ttl must be between 1 and 60 seconds"
            }
            InvalidRetryBudget::RatioTooLarge => {
                "retry budget allows at most 1,000 retries a call (retry_per_mille <= 1000000)"
            }
            InvalidRetryBudget::MinPerSecTooLarge => "retry budget min_per_sec must be below 2^31",
        })
    }
}

impl core::error::Error for InvalidRetryBudget {}

/// Retries allowed as a share of recent calls; see the module notes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RetryBudget {
    /// What each deposit adds, in thousandths of a retry.
    per_deposit: i64,
    /// The retries allowed besides deposits over one `ttl`, in thousandths.
    reserve: i64,
    /// Committed slots, one per past tenth of the `ttl`.
    slots: [i64; SLOTS],
    /// The current tenth's deposits less its withdrawals.
    current: i64,
    /// Which slot the current tenth commits to.
    index: usize,
    /// When the current tenth began; `None` before the first reading.
    since: Option<Instant>,
    /// A tenth of the `ttl`.
    tenth: Duration,
}

impl RetryBudget {
    /// A budget over `ttl` (1 to 60 s) that allows `retry_per_mille`
    /// retries per thousand calls, and `min_per_sec` a second besides.
    pub fn new(
        ttl: Duration,
        min_per_sec: u32,
        retry_per_mille: u32,
    ) -> Result<Self, InvalidRetryBudget> {
        if ttl < Duration::from_secs(1) || ttl > Duration::from_secs(60) {
            return Err(InvalidRetryBudget::TtlOutOfRange);
        }
        if retry_per_mille > MAX_PER_MILLE {
            return Err(InvalidRetryBudget::RatioTooLarge);
        }
        if min_per_sec > i32::MAX.unsigned_abs() {
            return Err(InvalidRetryBudget::MinPerSecTooLarge);
        }
        Ok(Self::unchecked(ttl, min_per_sec, retry_per_mille))
    }

    /// A budget from parameters known to be in range.
    fn unchecked(ttl: Duration, min_per_sec: u32, retry_per_mille: u32) -> Self {
        // As tower: the reserve counts whole seconds of the ttl.
        let reserve = i64::from(min_per_sec)
            .saturating_mul(i64::try_from(ttl.as_secs()).unwrap_or(60))
            .saturating_mul(RETRY_COST);
        RetryBudget {
            per_deposit: i64::from(retry_per_mille),
            reserve,
            slots: [0; SLOTS],
            current: 0,
            index: 0,
            since: None,
            tenth: ttl.checked_div(10).unwrap_or(ttl),
        }
    }

    /// Tower's default: a ttl of 10 s, 10 retries a second, and 20% of calls.
    pub fn tower_default() -> Self {
        Self::unchecked(Duration::from_secs(10), 10, 200)
    }

    /// Records a call (a first attempt) made at `now`.
    pub fn deposit(&mut self, now: Instant) {
        self.expire(now);
        self.current = self.current.saturating_add(self.per_deposit);
    }

    /// Takes one retry at `now` if the budget has one; whether it did.
    pub fn withdraw(&mut self, now: Instant) -> bool {
        self.expire(now);
        if self.balance() < RETRY_COST {
            return false;
        }
        self.current = self.current.saturating_sub(RETRY_COST);
        true
    }

    /// Retries the budget would allow at `now`, whole (a reading; nothing
    /// is taken).
    pub fn available(&mut self, now: Instant) -> u64 {
        self.expire(now);
        u64::try_from(self.balance() / RETRY_COST).unwrap_or(0)
    }

    /// Deposits less withdrawals over the last `ttl`, plus the reserve, in
    /// thousandths of a retry.
    fn balance(&self) -> i64 {
        self.slots
            .iter()
            .fold(self.current, |sum, slot| sum.saturating_add(*slot))
            .saturating_add(self.reserve)
    }

    /// Moves the current tenth on to the one `now` falls in: the current
    /// one is committed to its slot, and each slot the move passes
    /// (including the new current one, which held the tenth a whole `ttl`
    /// ago) is emptied. A reading earlier than the current tenth's start
    /// counts in the current tenth.
    fn expire(&mut self, now: Instant) {
        let since = *self.since.get_or_insert(now);
        let elapsed = now.saturating_duration_since(since);
        let tenths = elapsed
            .as_nanos()
            .checked_div(self.tenth.as_nanos())
            .unwrap_or(0);
        if tenths == 0 {
            return;
        }
        if let Some(slot) = self.slots.get_mut(self.index) {
            *slot = self.current;
        }
        self.current = 0;
        // At most every slot is emptied, however long the pause.
        let passed = usize::try_from(tenths.min(SLOTS as u128)).unwrap_or(SLOTS);
        for _ in 0..passed {
            self.index = self.index.wrapping_add(1) % SLOTS;
            if let Some(slot) = self.slots.get_mut(self.index) {
                *slot = 0;
            }
        }
        // Past a whole turn, the index lands where the tenths say.
        let beyond = tenths
            .saturating_sub(SLOTS as u128)
            .checked_rem(SLOTS as u128)
            .unwrap_or(0);
        self.index = self
            .index
            .wrapping_add(usize::try_from(beyond).unwrap_or(0))
            % SLOTS;
        let moved = u32::try_from(tenths).unwrap_or(u32::MAX);
        self.since = Some(
            self.tenth
                .checked_mul(moved)
                .and_then(|d| since.checked_add(d))
                .unwrap_or(now),
        );
    }
}

/// A budget that callers on several tasks or threads share: a
/// [`RetryBudget`] behind an `embassy_sync` blocking mutex (a critical
/// section on a microcontroller, a thread mutex on a server).
pub struct SharedRetryBudget<M: RawMutex> {
    inner: BlockingMutex<M, RefCell<RetryBudget>>,
}

impl<M: RawMutex> SharedRetryBudget<M> {
    /// Shares `budget`.
    pub const fn new(budget: RetryBudget) -> Self {
        SharedRetryBudget {
            inner: BlockingMutex::new(RefCell::new(budget)),
        }
    }

    /// [`RetryBudget::deposit`].
    pub fn deposit(&self, now: Instant) {
        self.inner.lock(|b| {
            if let Ok(mut budget) = b.try_borrow_mut() {
                budget.deposit(now);
            }
        });
    }

    /// [`RetryBudget::withdraw`]; `false` should the budget be in use by a
    /// caller on the same thread (a re-entrant call), rather than a panic.
    pub fn withdraw(&self, now: Instant) -> bool {
        self.inner.lock(|b| {
            b.try_borrow_mut()
                .is_ok_and(|mut budget| budget.withdraw(now))
        })
    }

    /// [`RetryBudget::available`].
    pub fn available(&self, now: Instant) -> u64 {
        self.inner.lock(|b| {
            b.try_borrow_mut()
                .map_or(0, |mut budget| budget.available(now))
        })
    }

    /// This budget read through `clock`, for an executor
    /// ([`crate::retry::RetryExecutor::with_budget`]).
    pub const fn on_clock<C: Fn() -> Instant>(&self, clock: C) -> BudgetOnClock<'_, M, C> {
        BudgetOnClock {
            budget: self,
            clock,
        }
    }
}

impl<M: RawMutex> fmt::Debug for SharedRetryBudget<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedRetryBudget").finish_non_exhaustive()
    }
}

/// What a retry executor asks of a budget: it deposits before each first
/// call and withdraws before each retry, which it makes only if that
/// succeeds. The implementation reads the time.
pub trait Budget {
    /// A first call is about to be made.
    fn deposit(&self);
    /// A retry is about to be made: whether the budget allows it.
    fn withdraw(&self) -> bool;
}

/// No budget: every retry the policy allows is made.
#[derive(Clone, Copy, Debug, Default)]
pub struct Unbudgeted;

impl Budget for Unbudgeted {
    fn deposit(&self) {}

    fn withdraw(&self) -> bool {
        true
    }
}

/// A [`SharedRetryBudget`] and the clock it is read with; see
/// [`SharedRetryBudget::on_clock`].
pub struct BudgetOnClock<'a, M: RawMutex, C> {
    budget: &'a SharedRetryBudget<M>,
    clock: C,
}

impl<M: RawMutex, C: Fn() -> Instant> Budget for BudgetOnClock<'_, M, C> {
    fn deposit(&self) {
        self.budget.deposit((self.clock)());
    }

    fn withdraw(&self) -> bool {
        self.budget.withdraw((self.clock)())
    }
}

impl<M: RawMutex, C> fmt::Debug for BudgetOnClock<'_, M, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BudgetOnClock").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    //! tower's own `TpsBudget` tests, ported, and the differences.
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn tps_empty() {
        let mut budget = RetryBudget::new(Duration::from_secs(1), 0, 1_000).unwrap();
        assert!(!budget.withdraw(Instant::from_secs(0)));
    }

    #[test]
    fn tps_leaky() {
        let mut budget = RetryBudget::new(Duration::from_secs(1), 0, 1_000).unwrap();
        let t = Instant::from_secs(5);
        budget.deposit(t);
        assert!(!budget.withdraw(t + Duration::from_secs(3)));
    }

    #[test]
    fn tps_slots() {
        let mut budget = RetryBudget::new(Duration::from_secs(1), 0, 500).unwrap();
        let mut t = Instant::from_secs(5);
        budget.deposit(t);
        budget.deposit(t);
        t = t + ms(901);
        // 900 ms later, the deposits still count.
        assert!(budget.withdraw(t));
        // A blank slate.
        t = t + ms(2001);
        budget.deposit(t);
        t = t + ms(301);
        budget.deposit(t);
        t = t + ms(801);
        budget.deposit(t);
        // The first of these three has expired; the second counts with the third.
        assert!(budget.withdraw(t));
        assert!(!budget.withdraw(t));
    }

    #[test]
    fn tps_reserve() {
        let mut budget = RetryBudget::new(Duration::from_secs(1), 5, 1_000).unwrap();
        let t = Instant::from_secs(5);
        for _ in 0..5 {
            assert!(budget.withdraw(t));
        }
        assert!(!budget.withdraw(t));
        // The reserve's retries come back a ttl after they were taken.
        assert!(!budget.withdraw(t + ms(899)));
        assert!(budget.withdraw(t + Duration::from_secs(1)));
    }

    #[test]
    fn ratios_are_exact_and_above_one_a_call_allowed() {
        let t = Instant::from_secs(5);
        let mut budget = RetryBudget::new(Duration::from_secs(10), 0, 300).unwrap();
        for _ in 0..10 {
            budget.deposit(t);
        }
        assert_eq!(budget.available(t), 3);
        let mut budget = RetryBudget::new(Duration::from_secs(10), 0, 2_500).unwrap();
        budget.deposit(t);
        budget.deposit(t);
        assert_eq!(budget.available(t), 5);
        let mut budget = RetryBudget::new(Duration::from_secs(10), 0, 0).unwrap();
        budget.deposit(t);
        assert!(!budget.withdraw(t));
    }

    #[test]
    fn a_deposit_counts_for_nine_to_ten_tenths_of_the_ttl() {
        let t = Instant::from_secs(5);
        for offset in [0, 50, 99] {
            let mut budget = RetryBudget::new(Duration::from_secs(1), 0, 1_000).unwrap();
            // The tenths start at the first reading, t.
            budget.available(t);
            budget.deposit(t + ms(offset));
            assert_eq!(budget.available(t + ms(899)), 1, "deposit at +{offset} ms");
            assert_eq!(
                budget.available(t + ms(1_000)),
                0,
                "deposit at +{offset} ms"
            );
        }
    }

    #[test]
    fn a_long_pause_empties_every_slot_in_bounded_work() {
        let mut budget = RetryBudget::new(Duration::from_secs(1), 0, 1_000).unwrap();
        let t = Instant::from_secs(5);
        for i in 0..20 {
            budget.deposit(t + ms(i * 50));
        }
        assert_eq!(budget.available(t + ms(950)), 20);
        let later = t + Duration::from_secs(86_400 * 365);
        assert_eq!(budget.available(later), 0);
        budget.deposit(later + ms(150));
        assert_eq!(budget.available(later + ms(1_000)), 1);
        assert_eq!(budget.available(later + ms(1_100)), 0);
    }

    #[test]
    fn a_reading_out_of_order_counts_in_the_current_tenth() {
        let mut budget = RetryBudget::new(Duration::from_secs(1), 0, 1_000).unwrap();
        let t = Instant::from_secs(5);
        budget.deposit(t);
        budget.deposit(t - ms(500));
        assert_eq!(budget.available(t), 2);
    }

    #[test]
    fn parameters_outside_the_range_are_refused() {
        let new = |ttl, min, ratio| RetryBudget::new(ttl, min, ratio).err();
        assert_eq!(new(ms(999), 0, 0), Some(InvalidRetryBudget::TtlOutOfRange));
        assert_eq!(
            new(Duration::from_secs(61), 0, 0),
            Some(InvalidRetryBudget::TtlOutOfRange)
        );
        assert_eq!(
            new(Duration::from_secs(1), 0, 1_000_001),
            Some(InvalidRetryBudget::RatioTooLarge)
        );
        assert_eq!(
            new(Duration::from_secs(1), 1 << 31, 0),
            Some(InvalidRetryBudget::MinPerSecTooLarge)
        );
        assert!(new(Duration::from_secs(60), (1 << 31) - 1, 1_000_000).is_none());
    }

    #[test]
    fn tower_default_is_ten_seconds_ten_a_second_and_a_fifth() {
        assert_eq!(
            RetryBudget::tower_default(),
            RetryBudget::new(Duration::from_secs(10), 10, 200).unwrap()
        );
    }
}
