//! A local cache in front of a shared limiter: a replica takes tokens from
//! the shared bucket in batches and admits locally until its batch runs
//! out (Envoy's local-plus-global limit, Bucket4j's batching).
//!
//! [`BatchSize`] is the size of the next batch, adapting to the replica's
//! share of the traffic: a batch should last about `target`, so a busy
//! replica takes more at a time and an idle one less. [`LocalTokens`] is
//! the batch being spent, one atomic word shared by every caller of the
//! replica.
//!
//! # The bound
//!
//! Every token admitted locally was taken from the shared bucket first, so
//! over any window the replicas admit no more than the shared bucket gave
//! out in it, plus what they held when the window began: **at most one
//! batch (at most `max`) per replica beyond the quota, over any window**.
//! A replica takes a new batch only once its batch is spent, and one at a
//! time (the caller doing so holds [`LocalTokens::begin_refill`]'s turn).
//! What a replica holds unspent is kept from the others until spent: the
//! other side of the bound (fewer admitted than the quota, by at most one
//! batch per replica).

use core::fmt;
use core::time::Duration;

use crate::sync::{AtomicU64, Ordering};
use crate::time::Instant;

/// Batch parameters no cache can work with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum InvalidBatch {
    /// `min` must be at least 1 and at most `max`, and `max` below 2^31
    /// (a batch and what is left of the last one fit the 32 bits of
    /// [`LocalTokens`]).
    Bounds {
        /// The smallest batch given.
        min: u32,
        /// The largest batch given.
        max: u32,
    },
    /// `target` must be longer than zero.
    ZeroTarget,
}

impl fmt::Display for InvalidBatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InvalidBatch::Bounds { min, max } => write!(
                f,
                "batch size: min {min}, max {max}: a batch takes at least 1 token, min must \
                 not exceed max, and max must be below 2^31"
            ),
            InvalidBatch::ZeroTarget => {
                f.write_str("batch target: 0: a batch must be meant to last some time")
            }
        }
    }
}

impl core::error::Error for InvalidBatch {}

/// The size of a replica's next batch: between `min` and `max`, doubled
/// when a batch ran out in less than half of `target`, halved when one
/// lasted more than twice `target` or the shared bucket gave less than
/// asked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct BatchSize {
    min: u32,
    max: u32,
    current: u32,
    target: Duration,
}

impl BatchSize {
    /// Batches from `min` to `max` tokens, meant to last about `target`;
    /// the first is `min`.
    pub const fn new(min: u32, max: u32, target: Duration) -> Result<Self, InvalidBatch> {
        if min == 0 || min > max || max >= 1 << 31 {
            return Err(InvalidBatch::Bounds { min, max });
        }
        if target.is_zero() {
            return Err(InvalidBatch::ZeroTarget);
        }
        Ok(BatchSize {
            min,
            max,
            current: min,
            target,
        })
    }

    /// The size of the next batch.
    pub const fn next(&self) -> u32 {
        self.current
    }

    /// The largest batch: what one replica may hold beyond the quota.
    pub const fn max(&self) -> u32 {
        self.max
    }

    /// A batch taken at `taken_at` ran out at `now`: the next one is
    /// doubled if it lasted less than half of `target`, halved if more
    /// than twice.
    pub fn on_spent(&mut self, taken_at: Instant, now: Instant) {
        let lasted = now.saturating_duration_since(taken_at);
        if lasted.saturating_mul(2) < self.target {
            self.current = self.current.saturating_mul(2).min(self.max);
        } else if lasted > self.target.saturating_mul(2) {
            self.current = (self.current / 2).max(self.min);
        }
    }

    /// The shared bucket gave `granted` of the tokens asked: the traffic
    /// is near the quota, so the next batch is no larger than what it
    /// could give (at least `min`).
    pub fn on_short(&mut self, granted: u32) {
        self.current = self.current.min(granted).max(self.min);
    }
}

/// A batch being spent by every caller of one replica: the tokens left in
/// the low 32 bits, a refill turn in bit 32, in one atomic word.
#[derive(Debug)]
pub struct LocalTokens {
    word: AtomicU64,
}

/// The refill turn: one caller of the replica is taking a new batch.
const REFILLING: u64 = 1 << 32;

impl LocalTokens {
    /// No tokens, nobody refilling.
    #[cfg(not(guard_loom))]
    pub const fn new() -> Self {
        LocalTokens {
            word: AtomicU64::new(0),
        }
    }

    /// No tokens, nobody refilling (loom's atomics have no `const`
    /// constructor).
    #[cfg(guard_loom)]
    pub fn new() -> Self {
        LocalTokens {
            word: AtomicU64::new(0),
        }
    }

    /// Tokens left now.
    pub fn left(&self) -> u32 {
        (self.word.load(Ordering::Acquire) & 0xffff_ffff) as u32
    }

    /// Spends `cost` tokens if the batch holds them: one compare-and-swap
    /// loop. A cost of zero is always admitted.
    pub fn try_spend(&self, cost: u32) -> bool {
        let mut word = self.word.load(Ordering::Acquire);
        loop {
            let left = (word & 0xffff_ffff) as u32;
            if left < cost {
                return false;
            }
            match self.word.compare_exchange_weak(
                word,
                word.saturating_sub(u64::from(cost)),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return true,
                Err(now) => word = now,
            }
        }
    }

    /// Takes the refill turn if nobody holds it: `true` for the one caller
    /// that is to take a new batch, which then calls [`Self::end_refill`].
    pub fn begin_refill(&self) -> bool {
        self.word.fetch_or(REFILLING, Ordering::AcqRel) & REFILLING == 0
    }

    /// Ends the refill turn, adding `tokens` (a batch the shared limiter
    /// gave; zero if it gave none).
    pub fn end_refill(&self, tokens: u32) {
        // Tokens are only spent meanwhile, never added, and a batch and
        // what is left of the last one are each below 2^31 (`BatchSize`
        // refuses more), so the sum stays in the low 32 bits.
        self.word
            .fetch_add(u64::from(tokens).wrapping_sub(REFILLING), Ordering::AcqRel);
    }
}

impl Default for LocalTokens {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_batch_follows_how_long_a_batch_lasts() {
        let mut size = BatchSize::new(2, 64, Duration::from_millis(100)).unwrap();
        let t = Instant::from_secs(10);
        assert_eq!(size.next(), 2);
        for expected in [4, 8, 16, 32, 64, 64] {
            size.on_spent(t, t + Duration::from_millis(10));
            assert_eq!(size.next(), expected, "spent in 10 ms: doubled");
        }
        size.on_spent(t, t + Duration::from_millis(150));
        assert_eq!(size.next(), 64, "about the target: kept");
        size.on_spent(t, t + Duration::from_millis(500));
        assert_eq!(size.next(), 32, "five times the target: halved");
        size.on_short(5);
        assert_eq!(size.next(), 5);
        size.on_short(0);
        assert_eq!(size.next(), 2, "never below min");
        assert_eq!(
            BatchSize::new(0, 4, Duration::from_secs(1)),
            Err(InvalidBatch::Bounds { min: 0, max: 4 })
        );
        assert_eq!(
            BatchSize::new(5, 4, Duration::from_secs(1)),
            Err(InvalidBatch::Bounds { min: 5, max: 4 })
        );
        assert_eq!(
            BatchSize::new(1, 1 << 31, Duration::from_secs(1)),
            Err(InvalidBatch::Bounds {
                min: 1,
                max: 1 << 31
            })
        );
        assert_eq!(
            BatchSize::new(1, 4, Duration::ZERO),
            Err(InvalidBatch::ZeroTarget)
        );
    }

    #[test]
    fn local_tokens_are_spent_and_refilled_by_one_caller_at_a_time() {
        let local = LocalTokens::new();
        assert!(!local.try_spend(1));
        assert!(local.try_spend(0));
        assert!(local.begin_refill());
        assert!(!local.begin_refill(), "one refill at a time");
        local.end_refill(3);
        assert_eq!(local.left(), 3);
        assert!(local.try_spend(2));
        assert!(!local.try_spend(2), "one left");
        assert!(local.begin_refill(), "the turn is free again");
        local.end_refill(0);
        assert_eq!(local.left(), 1);
    }
}
