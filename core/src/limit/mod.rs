//! Rate limiters: decide `check(now)` for one key or many, allocation-free.
//!
//! Every algorithm is split into its parameters (an [`Algorithm`], validated
//! once) and a small per-key state. [`Limiter`] pairs them for one key,
//! [`Keyed`] keeps a bounded table of states for many keys, and
//! [`AtomicTokenBucket`] keeps the token bucket's state in one atomic word
//! so it can be shared through `&self` between threads or with interrupts.
//!
//! | algorithm | a new key | admits when |
//! |---|---|---|
//! | [`TokenBucket`] | starts full (an initial burst of `capacity`) | a whole token is available |
//! | [`LeakyBucket`] | starts empty | `water + 1 <= capacity` |
//! | [`SlidingWindow`] | has no timestamps | fewer than `limit` timestamps are newer than `now - window` |
//! | [`FixedWindow`] | has used nothing | fewer than `limit` units were used in the aligned window of `now` |
//! | [`Bandwidths`] of any of them | is new in each | every one of its limits admits (all or nothing) |
//!
//! A denial is an outcome, not an error: [`Decision::Denied`] carries the
//! time until the next admission can succeed. Only impossible parameters are
//! errors ([`LimiterError`]), and a cost no key can ever pay
//! ([`CostAboveLimit`]).
//!
//! # Cost, quota and reconfiguration
//!
//! [`Algorithm::check_n`] decides a request that costs `n` units (`n`
//! tokens, `n` units of water, `n` entries in the window), all or nothing,
//! and returns a [`Report`]: the decision with the key's quota (`limit`),
//! what is left of it after the decision (`remaining`) and when the key is
//! back to a new key's state (`reset_after`), the values of redis-cell's
//! reply and of the IETF `RateLimit` header fields. A cost of zero counts
//! nothing and reports where the key stands.
//!
//! [`Algorithm::carry_over`] moves a key's state to new parameters without
//! forgetting it: a bucket keeps the units its key has used (rescaled to
//! the new interval, never more than one full bucket), a sliding window
//! keeps its admissions, measured against the new window and limit, and a
//! fixed window keeps what its key used in the window of the moment.

#[cfg(any(target_has_atomic = "ptr", feature = "critical-section"))]
mod atomic;
mod bandwidths;
#[cfg(any(target_has_atomic = "ptr", feature = "critical-section"))]
pub mod batch;
mod fixed_window;
mod gcra;
mod keyed;
mod sliding_window;
pub mod wait;

#[cfg(any(target_has_atomic = "ptr", feature = "critical-section"))]
pub use atomic::AtomicTokenBucket;
pub use bandwidths::Bandwidths;
pub use fixed_window::{FixedWindow, WindowCount};
pub use gcra::{Bucket, BucketState, LeakyBucket, TokenBucket, Tokens, Water};
pub use keyed::{
    DefaultHashState, FullPolicy, Keyed, KeyedSlot, KeyedSlots, KeyedStats, SharedKeyed,
};
pub use sliding_window::{SlidingWindow, WindowLog};

use core::fmt;
use core::time::Duration;

use crate::time::Instant;

/// The answer of a limiter to one request.
#[must_use = "a rate-limit decision that is not looked at limits nothing"]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Decision {
    /// The request is admitted and has been counted.
    Allowed,
    /// The request is refused and was not counted.
    Denied {
        /// How long until a request can next be admitted (never zero).
        retry_after: Duration,
    },
}

impl Decision {
    /// `true` for [`Decision::Allowed`].
    pub const fn is_allowed(&self) -> bool {
        matches!(self, Decision::Allowed)
    }

    /// `true` for [`Decision::Denied`].
    pub const fn is_denied(&self) -> bool {
        !self.is_allowed()
    }

    /// The wait a denial asks for, `None` when allowed.
    pub const fn retry_after(&self) -> Option<Duration> {
        match self {
            Decision::Allowed => None,
            Decision::Denied { retry_after } => Some(*retry_after),
        }
    }

    /// A denial that asks to wait until `at` (at least one nanosecond).
    pub(crate) fn denied_until(at: Instant, now: Instant) -> Decision {
        let wait = at.saturating_duration_since(now);
        Decision::Denied {
            retry_after: if wait.is_zero() {
                Duration::from_nanos(1)
            } else {
                wait
            },
        }
    }
}

/// A decision with the key's quota: what a caller needs to tell its own
/// client how much is left (the `RateLimit` header fields, redis-cell's
/// five values).
///
/// ```
/// use guard_core::limit::{Algorithm, Rate, TokenBucket};
/// use guard_core::time::Instant;
///
/// let bucket = TokenBucket::new(10, Rate::per_second(10))?;
/// let mut state = TokenBucket::NEW_STATE;
/// let report = bucket.check_n(&mut state, 4, Instant::from_secs(1))?;
/// assert!(report.is_allowed());
/// assert_eq!((report.limit, report.remaining), (10, 6));
/// // Four tokens at ten per second: full again in 400 ms.
/// assert_eq!(report.reset_after.as_millis(), 400);
/// # Ok::<(), Box<dyn core::error::Error>>(())
/// ```
#[must_use = "a rate-limit decision that is not looked at limits nothing"]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Report {
    /// Admitted (and counted) or refused (and not counted).
    pub decision: Decision,
    /// The key's quota: a bucket's capacity, a window's limit.
    pub limit: u32,
    /// Units that could still be admitted at the same reading, after this
    /// decision (whole units, rounded down).
    pub remaining: u32,
    /// How long until the key is back to a new key's state: a bucket full
    /// again, a window empty. Zero when it is already.
    pub reset_after: Duration,
}

impl Report {
    /// `true` when admitted.
    pub const fn is_allowed(&self) -> bool {
        self.decision.is_allowed()
    }

    /// `true` when refused.
    pub const fn is_denied(&self) -> bool {
        self.decision.is_denied()
    }

    /// The wait a denial asks for, `None` when admitted.
    pub const fn retry_after(&self) -> Option<Duration> {
        self.decision.retry_after()
    }

    /// The tightest of several limits' reports on one request (see
    /// [`Bandwidths`]): the fewest units left, of two with as few the one
    /// that takes longer to reset, the first of equals; `None` for none.
    pub fn tightest(reports: &[Report]) -> Option<Report> {
        reports.iter().copied().reduce(|tight, r| {
            let tighter = r.remaining < tight.remaining
                || (r.remaining == tight.remaining && r.reset_after > tight.reset_after);
            if tighter { r } else { tight }
        })
    }
}

/// A request costs more than the key's whole quota, so no wait can ever
/// admit it: refused as a whole, as an error rather than a denial (a
/// denial would ask the caller to retry forever).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct CostAboveLimit {
    /// The cost asked for.
    pub cost: u32,
    /// The quota: a bucket's capacity, a window's limit.
    pub limit: u32,
}

impl fmt::Display for CostAboveLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "a cost of {} exceeds the limit of {}: no wait can ever admit it",
            self.cost, self.limit
        )
    }
}

impl core::error::Error for CostAboveLimit {}

/// Parameters that no limiter can honour.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum LimiterError {
    /// A bucket capacity of zero admits nothing.
    ZeroCapacity,
    /// A rate must add or drain at least one unit per period.
    ZeroRateAmount,
    /// A rate's period must be at least one nanosecond.
    ZeroRatePeriod,
    /// A sliding window must be at least one nanosecond wide.
    ZeroWindow,
    /// A sliding-window limit of zero admits nothing.
    ZeroLimit,
    /// The sliding-window limit exceeds the log's const capacity.
    LimitAboveMaximum {
        /// The limit asked for.
        limit: u32,
        /// The largest limit this type can store (its const parameter).
        maximum: usize,
    },
    /// A window's alignment is as long as the window or longer (a time
    /// zone's offset from UTC of a day or more).
    OffsetAboveWindow {
        /// The offset asked for, in seconds.
        offset_secs: i64,
        /// The window's length, in seconds.
        window_secs: u64,
    },
    /// A bucket's capacity times its interval (the time an emptied bucket
    /// takes to refill) does not fit in the clock's range: it must not
    /// exceed [`BucketState::LATEST`] (about 584 years in nanoseconds). The
    /// bucket's state is the instant at which it has refilled, so such a
    /// bucket could not record one full burst, and its arithmetic would
    /// overflow. [`Rate::interval_nanos`] reports a single interval beyond
    /// 64 bits of nanoseconds as capacity 1.
    CapacityTimesIntervalTooLong {
        /// The capacity asked for.
        capacity: u32,
        /// The interval of the rate, `period / amount` rounded up, in
        /// nanoseconds.
        interval_nanos: u128,
    },
}

impl fmt::Display for LimiterError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LimiterError::ZeroCapacity => f.write_str("capacity must be positive (got 0)"),
            LimiterError::ZeroRateAmount => {
                f.write_str("rate amount must be positive (got 0 per period)")
            }
            LimiterError::ZeroRatePeriod => {
                f.write_str("rate period must be at least 1 ns (got 0)")
            }
            LimiterError::ZeroWindow => f.write_str("window must be at least 1 ns (got 0)"),
            LimiterError::ZeroLimit => f.write_str("limit must be positive (got 0)"),
            LimiterError::LimitAboveMaximum { limit, maximum } => write!(
                f,
                "limit {limit} exceeds the maximum {maximum} this sliding window can store"
            ),
            LimiterError::OffsetAboveWindow {
                offset_secs,
                window_secs,
            } => write!(
                f,
                "an offset of {offset_secs} s must be shorter than the window of {window_secs} s"
            ),
            LimiterError::CapacityTimesIntervalTooLong {
                capacity,
                interval_nanos,
            } => write!(
                f,
                "capacity {capacity} times the interval of {interval_nanos} ns must fit in the \
                 clock's range of {} ns (about 584 years): lower the capacity or raise the rate",
                BucketState::LATEST.as_nanos()
            ),
        }
    }
}

impl core::error::Error for LimiterError {}

/// A rate: `amount` units per `period`, in integer arithmetic.
///
/// `Rate::per(5, Duration::from_secs(1))` is five per second. The interval
/// between two units is `period / amount` rounded **up** to a whole
/// nanosecond, so a limiter never runs faster than asked (the error is below
/// one nanosecond per unit). The division is exact for every `Duration`,
/// so a period beyond the 64-bit nanosecond range is never shortened to
/// fit it: such a rate is refused instead.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct Rate {
    amount: u32,
    period: Duration,
}

impl Rate {
    /// `amount` per `period`; validated by the limiter that uses it.
    pub const fn per(amount: u32, period: Duration) -> Rate {
        Rate { amount, period }
    }

    /// `amount` per second.
    pub const fn per_second(amount: u32) -> Rate {
        Rate::per(amount, Duration::from_secs(1))
    }

    /// The units added (or drained) per period.
    pub const fn amount(&self) -> u32 {
        self.amount
    }

    /// The period.
    pub const fn period(&self) -> Duration {
        self.period
    }

    /// Nanoseconds between two units, rounded up; validates the rate.
    ///
    /// Errors on a zero amount, a zero period, or an interval beyond 64
    /// bits of nanoseconds (reported as
    /// [`LimiterError::CapacityTimesIntervalTooLong`] with capacity 1).
    pub const fn interval_nanos(&self) -> Result<u64, LimiterError> {
        let interval = match self.exact_interval_nanos() {
            Ok(interval) => interval,
            Err(e) => return Err(e),
        };
        if interval > u64::MAX as u128 {
            return Err(LimiterError::CapacityTimesIntervalTooLong {
                capacity: 1,
                interval_nanos: interval,
            });
        }
        #[allow(
            clippy::cast_possible_truncation,
            reason = "interval <= u64::MAX was checked"
        )]
        let interval = interval as u64;
        Ok(interval)
    }

    /// `period / amount` in nanoseconds, rounded up, without saturating:
    /// a `Duration` holds up to about 1.8e28 ns, which `u128` holds.
    pub(crate) const fn exact_interval_nanos(&self) -> Result<u128, LimiterError> {
        if self.amount == 0 {
            return Err(LimiterError::ZeroRateAmount);
        }
        let period = self.period.as_nanos();
        if period == 0 {
            return Err(LimiterError::ZeroRatePeriod);
        }
        Ok(period.div_ceil(self.amount as u128))
    }
}

/// A rate-limiting algorithm: validated parameters plus the rules that move
/// one key's state.
///
/// Implementations are pure: the same state, parameters and `now` always
/// give the same decision. Storage (a field, a table slot, an atomic word,
/// a Redis hash) belongs to the caller.
pub trait Algorithm {
    /// One key's state.
    type State;

    /// The state of a key that has never been seen.
    const NEW_STATE: Self::State;

    /// Decides one request at `now`, counting it in `state` if admitted.
    ///
    /// Decides exactly as `check_n(state, 1, now)`; it exists because the
    /// single-unit decision is the hot path and needs no report.
    fn check(&self, state: &mut Self::State, now: Instant) -> Decision;

    /// The quota of every key: a bucket's capacity, a window's limit.
    fn limit(&self) -> u32;

    /// Decides a request that costs `cost` units at `now`, all or nothing,
    /// and reports the key's quota after it.
    ///
    /// A cost above [`Self::limit`] is [`CostAboveLimit`]: no wait could
    /// admit it. A cost of zero is admitted, counts nothing and leaves the
    /// state as it was: it reports where the key stands.
    fn check_n(
        &self,
        state: &mut Self::State,
        cost: u32,
        now: Instant,
    ) -> Result<Report, CostAboveLimit>;

    /// Moves `state`, kept under `previous` parameters, to these, at `now`.
    ///
    /// What carries over is each algorithm's to document; for the built-in
    /// ones see the module notes. A state that was new stays new.
    fn carry_over(&self, previous: &Self, state: &mut Self::State, now: Instant);

    /// From this instant on, `state` decides exactly as [`Self::NEW_STATE`]
    /// would, so a table may forget the key without changing any decision;
    /// `None` if that instant lies beyond [`Instant::MAX`] (the state never
    /// becomes new within the clock's range).
    fn fresh_at(&self, state: &Self::State) -> Option<Instant>;

    /// Whether `state` is indistinguishable from a new key at `now`.
    fn is_fresh(&self, state: &Self::State, now: Instant) -> bool {
        self.fresh_at(state).is_some_and(|at| now >= at)
    }

    /// The most restrictive state that is fresh at `at`: at every reading,
    /// it admits no more than any state whose [`Self::fresh_at`] is `at` or
    /// earlier, and from `at` on it decides as a new key.
    ///
    /// A table that forgot a key whose state had settled by `at` starts the
    /// key from this state should it come back with a reading before `at`
    /// (a clock read out of order): the key can then never find itself
    /// newer than it was when forgotten.
    fn state_settled_at(&self, at: Instant) -> Self::State;
}

/// One key's limiter: an [`Algorithm`] and its state, driven through
/// `&mut self`.
///
/// `const fn new` lets it live in a `static` (inside a mutex) on a
/// microcontroller.
#[derive(Clone, Debug)]
pub struct Limiter<A: Algorithm> {
    algorithm: A,
    state: A::State,
}

impl<A: Algorithm> Limiter<A> {
    /// A limiter whose key starts as new.
    pub const fn new(algorithm: A) -> Self {
        Limiter {
            algorithm,
            state: A::NEW_STATE,
        }
    }

    /// Decides one request at `now`.
    pub fn check(&mut self, now: Instant) -> Decision {
        self.algorithm.check(&mut self.state, now)
    }

    /// The parameters.
    pub const fn algorithm(&self) -> &A {
        &self.algorithm
    }

    /// The current state.
    pub const fn state(&self) -> &A::State {
        &self.state
    }

    /// Decides a request of `cost` units at `now`; see
    /// [`Algorithm::check_n`].
    pub fn check_n(&mut self, cost: u32, now: Instant) -> Result<Report, CostAboveLimit> {
        self.algorithm.check_n(&mut self.state, cost, now)
    }

    /// Replaces the parameters at `now`, carrying the key's state over
    /// ([`Algorithm::carry_over`]).
    pub fn reconfigure(&mut self, algorithm: A, now: Instant) {
        algorithm.carry_over(&self.algorithm, &mut self.state, now);
        self.algorithm = algorithm;
    }

    /// Forgets all history: the key behaves as new.
    pub fn reset(&mut self) {
        self.state = A::NEW_STATE;
    }
}
