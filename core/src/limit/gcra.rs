//! Token bucket and meter-style leaky bucket, both computed by GCRA.
//!
//! A meter-style leaky bucket is the mirror image of a token bucket:
//! `water = capacity - tokens`. "A new token key starts full" and "a new
//! leaky key starts empty" are the same state, and "a whole token is left"
//! is "water + 1 <= capacity". Both are therefore decided by one piece of
//! arithmetic, the generic cell rate algorithm (GCRA), which keeps a whole
//! bucket in one number: the instant at which the bucket has settled
//! (token view: full again; water view: empty again). One `u64` is what
//! lets [`super::AtomicTokenBucket`] update the state with a single
//! compare-and-swap, and the same function decides for every storage.

use core::fmt;
use core::marker::PhantomData;
use core::num::NonZeroU64;
use core::time::Duration;

use super::{Algorithm, CostAboveLimit, Decision, LimiterError, Rate, Report};
use crate::time::Instant;

/// The GCRA parameters shared by both buckets, in nanoseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub(crate) struct Gcra {
    /// Time one unit takes to refill (or drain): `period / amount`, rounded up.
    interval: u64,
    /// How far the settle instant may run ahead of `now` and still admit:
    /// `(capacity - 1) * interval`.
    tolerance: u64,
}

impl Gcra {
    /// Validates the parameters. Invariant established here, on which
    /// every decision relies: `capacity * interval <= BucketState::LATEST`,
    /// so `tolerance` is exact (a saturated tolerance would admit every
    /// call) and a full burst from the origin fits in the state.
    const fn new(capacity: u32, rate: Rate) -> Result<Self, LimiterError> {
        if capacity == 0 {
            return Err(LimiterError::ZeroCapacity);
        }
        let interval = match rate.exact_interval_nanos() {
            Ok(interval) => interval,
            Err(e) => return Err(e),
        };
        let too_long = LimiterError::CapacityTimesIntervalTooLong {
            capacity,
            interval_nanos: interval,
        };
        // An interval is at most about 1.8e28 ns (Duration::MAX), so times a
        // u32 it fits u128; checked all the same, so no input can wrap it.
        let span = match interval.checked_mul(capacity as u128) {
            Some(span) => span,
            None => return Err(too_long),
        };
        if span > BucketState::LATEST.as_nanos() as u128 {
            return Err(too_long);
        }
        #[allow(
            clippy::cast_possible_truncation,
            reason = "interval <= span <= BucketState::LATEST < u64::MAX"
        )]
        let interval = interval as u64;
        #[allow(
            clippy::cast_possible_truncation,
            reason = "tolerance < span <= BucketState::LATEST < u64::MAX"
        )]
        let tolerance = span.saturating_sub(interval as u128) as u64;
        Ok(Gcra {
            interval,
            tolerance,
        })
    }

    /// Decides one unit at `now` given the settle instant `tat`.
    ///
    /// `Ok(new_tat)` admits; `Err(t)` refuses until `t`. A `now` earlier
    /// than a previous one (a clock read out of order) only finds less room:
    /// it never refills and never moves the state backwards, because the new
    /// settle instant is `max(tat, now) + interval`.
    ///
    /// Every admission moves the settle instant forward by a whole
    /// interval, exactly: when `max(tat, now) + interval` would pass
    /// [`BucketState::LATEST`], the call is refused, with `Err(u64::MAX)`
    /// (no later reading can be admitted either). Clamping it instead
    /// would leave the state where the next call finds it refilled, and a
    /// reading at the end of the clock would admit every call.
    #[inline]
    pub(crate) const fn decide(&self, tat: u64, now: u64) -> Result<u64, u64> {
        // One unit: its slack is the tolerance, already computed.
        self.decide_with_slack(tat, now, self.interval, self.tolerance)
    }

    /// Decides `increment` nanoseconds of credit at `now`: `cost ×
    /// interval` for a request of `cost` units, `1 <= cost <= capacity`.
    /// As [`Self::decide`], which is its one-unit case: the request is
    /// admitted when its last unit is, that is when the settle instant
    /// after it, `max(tat, now) + increment`, is at most `capacity ×
    /// interval` ahead of `now`.
    #[inline]
    pub(crate) const fn decide_increment(
        &self,
        tat: u64,
        now: u64,
        increment: u64,
    ) -> Result<u64, u64> {
        // The span `capacity × interval` fits (checked by `new`), and an
        // increment of at most `capacity` units is within it, so `slack`
        // is exact; for one unit it is the tolerance.
        let slack = self
            .tolerance
            .saturating_add(self.interval)
            .saturating_sub(increment);
        self.decide_with_slack(tat, now, increment, slack)
    }

    /// The decision itself: admitted from `tat - slack` on, moving the
    /// settle instant to `max(tat, now) + increment`.
    #[inline]
    const fn decide_with_slack(
        &self,
        tat: u64,
        now: u64,
        increment: u64,
        slack: u64,
    ) -> Result<u64, u64> {
        // tat - slack below zero means the bucket admits at any reading.
        let admit_from = tat.saturating_sub(slack);
        if now < admit_from {
            return Err(admit_from);
        }
        let base = if tat > now { tat } else { now };
        // `base + increment <= LATEST`, compared without the addition: the
        // increment is at most the span, itself at most LATEST.
        if base > BucketState::LATEST.as_nanos().saturating_sub(increment) {
            return Err(u64::MAX);
        }
        Ok(base.saturating_add(increment))
    }

    /// The settle instant `tat`, kept under `previous`, moved to these
    /// parameters at `now`: the units still owed at `now` are the same
    /// (the debt `tat - now` rescaled by the ratio of the intervals,
    /// rounded up so that a key never gains by it), capped at one full
    /// bucket. A settled bucket stays settled.
    const fn carry_over(&self, previous: &Gcra, tat: u64, now: u64) -> u64 {
        let Some(debt) = tat.checked_sub(now) else {
            return tat;
        };
        if debt == 0 {
            return tat;
        }
        // debt and interval are below 2^64, so their product fits u128
        // exactly; previous.interval >= 1 by construction.
        let owed = (debt as u128).saturating_mul(self.interval as u128);
        let scaled = if previous.interval == 0 {
            owed
        } else {
            owed.div_ceil(previous.interval as u128)
        };
        let span = self.tolerance.saturating_add(self.interval) as u128;
        let debt = if scaled < span { scaled } else { span };
        #[allow(
            clippy::cast_possible_truncation,
            reason = "debt <= span <= BucketState::LATEST < u64::MAX"
        )]
        let debt = debt as u64;
        let next = now.saturating_add(debt);
        if next > BucketState::LATEST.as_nanos() {
            BucketState::LATEST.as_nanos()
        } else {
            next
        }
    }

    /// Whole units that could be admitted at `now`.
    const fn room(&self, tat: u64, now: u64, capacity: u32) -> u32 {
        let Some(ahead) = tat.checked_sub(now) else {
            return capacity; // settled before now: full
        };
        let Some(slack) = self.tolerance.checked_sub(ahead) else {
            return 0;
        };
        // interval >= 1 by construction (Rate::interval_nanos rounds up).
        let room = match slack.checked_div(self.interval) {
            Some(units) => units.saturating_add(1),
            None => 0,
        };
        if room < capacity as u64 {
            #[allow(
                clippy::cast_possible_truncation,
                reason = "room < capacity <= u32::MAX"
            )]
            let room = room as u32;
            room
        } else {
            capacity
        }
    }
}

/// The whole state of one bucket: the instant at which it has settled
/// (a token bucket is full again, a leaky bucket empty again).
///
/// The default value is a new key. Eight bytes per key, with a niche:
/// `Option<(u64, BucketState)>` is 16 bytes, so a keyed table of integer
/// keys spends 16 bytes a slot. The niche costs the last nanosecond of the
/// clock: a state settles at [`BucketState::LATEST`] at the latest.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct BucketState {
    /// The bitwise complement of the settle instant in nanoseconds. It is
    /// never zero because the latest settle instant stored is one
    /// nanosecond before `Instant::MAX` (584 years from the origin), and
    /// that zero is the niche `Option` uses.
    inverted: NonZeroU64,
}

impl BucketState {
    /// A new key's state: settled since the origin.
    const NEW: BucketState = BucketState::settling_at(Instant::ZERO);

    /// The latest settle instant a state can hold, one nanosecond before
    /// [`Instant::MAX`]. A bucket never moves its state past it: an
    /// admission that would is refused.
    pub const LATEST: Instant = Instant::from_nanos(u64::MAX - 1);

    /// A state that settles at `at` (for storage layers that persist it).
    /// `Instant::MAX` is stored one nanosecond earlier, as
    /// [`BucketState::LATEST`].
    pub const fn settling_at(at: Instant) -> Self {
        let inverted = match NonZeroU64::new(!at.as_nanos()) {
            Some(inverted) => inverted,
            None => NonZeroU64::MIN,
        };
        BucketState { inverted }
    }

    /// When the bucket is back to the state of a new key.
    pub const fn settles_at(&self) -> Instant {
        Instant::from_nanos(!self.inverted.get())
    }
}

impl Default for BucketState {
    fn default() -> Self {
        BucketState::NEW
    }
}

impl fmt::Debug for BucketState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BucketState")
            .field("settles_at", &self.settles_at())
            .finish()
    }
}

/// A GCRA bucket of `capacity` units at a `rate`, seen through `V`:
/// [`TokenBucket`] (tokens, a new key starts full) or [`LeakyBucket`]
/// (water, a new key starts empty). Both decide identically; see the
/// module notes.
///
/// # The budget, on any clock
///
/// Over calls whose readings span `min..=max`, in any order, a key is
/// admitted at most `capacity + (max - min) / interval` times (integer
/// division), where `interval` is the rate's `period / amount`. This holds
/// for every parameter the constructor accepts and every reading up to
/// [`Instant::MAX`]:
///
/// - The constructor refuses a capacity times interval beyond the clock's
///   range ([`LimiterError::CapacityTimesIntervalTooLong`]), so no bucket
///   arithmetic saturates.
/// - The state is the instant at which the bucket has settled, and it
///   never moves backwards. An admission whose settle instant would pass
///   [`BucketState::LATEST`] is refused: nothing is admitted at
///   [`Instant::MAX`], and near it only what the state can record. Such a
///   denial's `retry_after` reaches to the end of the clock.
///
/// # A reading far in the future
///
/// A single reading far ahead of the clock (a faulty clock source, a
/// corrupted timestamp) moves the settle instant there, as any reading
/// would. Every later call at an ordinary reading is then denied until the
/// clock reaches it, and each denial says so: its `retry_after` is the
/// time until that far reading (plus the intervals admitted at it), not a
/// short wait. Nothing recovers the key on its own, because an earlier
/// reading is indistinguishable from a clock read out of order; forget the
/// state to recover it ([`super::Limiter::reset`],
/// [`super::AtomicTokenBucket::reset`], [`super::Keyed::forget`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Bucket<V> {
    capacity: u32,
    rate: Rate,
    gcra: Gcra,
    view: PhantomData<V>,
}

/// The token view of a [`Bucket`]: tokens available, refilled at the rate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Tokens;

/// The water view of a [`Bucket`]: water held, drained at the rate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Water;

/// A token bucket: `capacity` tokens, refilled at a rate; a new key starts
/// full, so it admits an initial burst of `capacity`.
///
/// ```
/// use core::time::Duration;
/// use guard_core::limit::{Limiter, Rate, TokenBucket};
/// use guard_core::time::Instant;
///
/// let mut l = Limiter::new(TokenBucket::new(2, Rate::per_second(1))?);
/// let t = Instant::from_secs(10);
/// assert!(l.check(t).is_allowed());
/// assert!(l.check(t).is_allowed());
/// assert!(l.check(t).is_denied());
/// assert!(l.check(t + Duration::from_secs(1)).is_allowed());
/// # Ok::<(), guard_core::limit::LimiterError>(())
/// ```
pub type TokenBucket = Bucket<Tokens>;

/// A meter-style leaky bucket: each admission adds one unit of water, the
/// bucket drains at a rate, and a request is admitted if `water + 1 <=
/// capacity`. A new key starts empty.
///
/// It decides exactly as a [`TokenBucket`] of the same capacity and rate;
/// it reports its state as water instead of tokens.
pub type LeakyBucket = Bucket<Water>;

impl<V> Bucket<V> {
    /// A bucket of `capacity` units that refills (token view) or drains
    /// (water view) at `rate`.
    ///
    /// Errors on a zero capacity, a zero amount, a zero period, or a
    /// capacity times interval beyond the clock's range (about 584 years).
    pub const fn new(capacity: u32, rate: Rate) -> Result<Self, LimiterError> {
        match Gcra::new(capacity, rate) {
            Ok(gcra) => Ok(Bucket {
                capacity,
                rate,
                gcra,
                view: PhantomData,
            }),
            Err(e) => Err(e),
        }
    }

    /// The burst size (token view) or the most water held (water view).
    pub const fn capacity(&self) -> u32 {
        self.capacity
    }

    /// The refill (token view) or drain (water view) rate.
    pub const fn rate(&self) -> Rate {
        self.rate
    }

    /// Time for one unit to refill or drain.
    pub const fn interval(&self) -> Duration {
        Duration::from_nanos(self.gcra.interval)
    }

    /// Units that could be admitted at `now`.
    const fn room(&self, state: &BucketState, now: Instant) -> u32 {
        self.gcra
            .room(state.settles_at().as_nanos(), now.as_nanos(), self.capacity)
    }

    #[cfg_attr(
        not(any(target_has_atomic = "ptr", feature = "critical-section")),
        allow(dead_code, reason = "only the atomic bucket uses it")
    )]
    pub(crate) const fn gcra(&self) -> &Gcra {
        &self.gcra
    }
}

impl Bucket<Tokens> {
    /// Whole tokens available at `now`.
    pub const fn available(&self, state: &BucketState, now: Instant) -> u32 {
        self.room(state, now)
    }
}

impl Bucket<Water> {
    /// Water in the bucket at `now`, rounded up to whole units.
    pub const fn water(&self, state: &BucketState, now: Instant) -> u32 {
        self.capacity.saturating_sub(self.room(state, now))
    }
}

impl<V> Algorithm for Bucket<V> {
    type State = BucketState;
    const NEW_STATE: BucketState = BucketState::NEW;

    fn check(&self, state: &mut BucketState, now: Instant) -> Decision {
        match self
            .gcra
            .decide(state.settles_at().as_nanos(), now.as_nanos())
        {
            Ok(next) => {
                *state = BucketState::settling_at(Instant::from_nanos(next));
                Decision::Allowed
            }
            Err(admit_from) => Decision::denied_until(Instant::from_nanos(admit_from), now),
        }
    }

    fn limit(&self) -> u32 {
        self.capacity
    }

    /// `cost` units, all or nothing: one admission that moves the settle
    /// instant by `cost` intervals, so it keeps the same budget as `cost`
    /// single calls at the same reading (and is refused where the last of
    /// them would be).
    fn check_n(
        &self,
        state: &mut BucketState,
        cost: u32,
        now: Instant,
    ) -> Result<Report, CostAboveLimit> {
        if cost > self.capacity {
            return Err(CostAboveLimit {
                cost,
                limit: self.capacity,
            });
        }
        let decision = if cost == 0 {
            Decision::Allowed
        } else {
            // cost <= capacity, and capacity × interval fits (checked by
            // the constructor), so the increment is exact.
            let increment = u64::from(cost).saturating_mul(self.gcra.interval);
            match self.gcra.decide_increment(
                state.settles_at().as_nanos(),
                now.as_nanos(),
                increment,
            ) {
                Ok(next) => {
                    *state = BucketState::settling_at(Instant::from_nanos(next));
                    Decision::Allowed
                }
                Err(admit_from) => Decision::denied_until(Instant::from_nanos(admit_from), now),
            }
        };
        Ok(Report {
            decision,
            limit: self.capacity,
            remaining: self.room(state, now),
            reset_after: state.settles_at().saturating_duration_since(now),
        })
    }

    /// Keeps the units the key owes at `now` (see the module notes of
    /// [`super`]): raising the capacity gives the key the new room at
    /// once, lowering the rate makes what it owes take longer to refill,
    /// and a key never owes more than one full bucket of the new size.
    fn carry_over(&self, previous: &Self, state: &mut BucketState, now: Instant) {
        let tat = self.gcra.carry_over(
            &previous.gcra,
            state.settles_at().as_nanos(),
            now.as_nanos(),
        );
        *state = BucketState::settling_at(Instant::from_nanos(tat));
    }

    fn fresh_at(&self, state: &BucketState) -> Option<Instant> {
        Some(state.settles_at())
    }

    /// Settled exactly at `at`: a state that settled earlier has at least
    /// as much room at every reading.
    fn state_settled_at(&self, at: Instant) -> BucketState {
        BucketState::settling_at(at)
    }
}
