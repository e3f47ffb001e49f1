//! The waits between calls, with optional jitter.

use core::time::Duration;

use super::RetryPolicy;
use crate::time::nanos_saturating;

/// How waits are randomised. Randomness comes from a [`RandomSource`] the
/// caller supplies: core has no global random number generator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub enum Jitter {
    /// The policy's delays exactly.
    #[default]
    None,
    /// "Full jitter": uniform in `[0, delay]`. Spreads a herd of clients
    /// the most; a wait may be zero.
    Full,
    /// "Decorrelated jitter": uniform in `[initial, 3 × previous wait]`,
    /// capped at `max_delay`. Grows like exponential backoff without
    /// synchronising clients; ignores the multiplier.
    Decorrelated,
}

/// Random bits for jitter.
///
/// Any `FnMut() -> u64` is one (for example a closure over a seeded PRNG or
/// a hardware RNG). [`WithoutRandom`] states that there is none.
pub trait RandomSource {
    /// Whether this source yields random bits; a policy with jitter refuses
    /// a source without them rather than silently not jittering.
    const IS_RANDOM: bool = true;

    /// The next 64 random bits.
    fn next_u64(&mut self) -> u64;
}

impl<F: FnMut() -> u64> RandomSource for F {
    fn next_u64(&mut self) -> u64 {
        self()
    }
}

/// No randomness: only valid with [`Jitter::None`].
#[derive(Clone, Copy, Debug, Default)]
pub struct WithoutRandom;

impl RandomSource for WithoutRandom {
    const IS_RANDOM: bool = false;

    fn next_u64(&mut self) -> u64 {
        0
    }
}

/// The sequence of waits of one retried operation.
///
/// Call [`Backoff::next_delay`] after each failed call: it returns the wait
/// before the next call, or `None` once the policy's calls are used up.
#[derive(Clone, Copy, Debug)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Backoff {
    policy: RetryPolicy,
    failures: u32,
    previous: Duration,
}

impl Backoff {
    /// The waits of `policy`, before any call.
    pub const fn new(policy: RetryPolicy) -> Self {
        Backoff {
            policy,
            failures: 0,
            previous: policy.initial_delay(),
        }
    }

    /// Failed calls so far.
    pub const fn failures(&self) -> u32 {
        self.failures
    }

    /// Records a failed call; returns the wait before the next call, or
    /// `None` if that was the last call the policy allows.
    pub fn next_delay(&mut self, random: &mut impl RandomSource) -> Option<Duration> {
        self.failures = self.failures.saturating_add(1);
        if self.failures >= self.policy.total_calls() {
            return None;
        }
        let planned = self.policy.delay_for_attempt(self.failures);
        let wait = match self.policy.jitter() {
            Jitter::None => planned,
            Jitter::Full => uniform(0, nanos_saturating(planned), random.next_u64()),
            Jitter::Decorrelated => {
                let low = nanos_saturating(self.policy.initial_delay());
                let cap = nanos_saturating(self.policy.max_delay());
                let high = nanos_saturating(self.previous).saturating_mul(3).max(low);
                let pick = uniform(low, high, random.next_u64());
                pick.min(Duration::from_nanos(cap))
            }
        };
        self.previous = wait;
        Some(wait)
    }
}

/// A duration uniform in `[low, high]` nanoseconds from 64 random bits.
fn uniform(low: u64, high: u64, bits: u64) -> Duration {
    let (low, high) = if low <= high {
        (low, high)
    } else {
        (high, low)
    };
    let span = high.wrapping_sub(low);
    let offset = match span.checked_add(1) {
        Some(width) => bits.checked_rem(width).unwrap_or(bits),
        None => bits, // the whole u64 range
    };
    Duration::from_nanos(low.saturating_add(offset))
}
