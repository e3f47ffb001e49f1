//! Several limits on one key, all or nothing: Bucket4j's bandwidths, for
//! a policy such as "10 a second and 1,000 an hour".
//!
//! [`Bandwidths`] is itself an [`Algorithm`], so it goes wherever one
//! limit goes ([`super::Limiter`], [`super::Keyed`]). Its guarantees:
//!
//! - **All or nothing.** A request is admitted only if every bandwidth
//!   admits it, and then it is counted in every one; a refused request is
//!   counted in none (each bandwidth decides on a copy of its state, and
//!   the copies are kept only when all admitted).
//! - **Each bound holds.** The admissions of a key are, at every reading,
//!   a sequence each bandwidth alone would have admitted: no bandwidth is
//!   ever passed.
//! - **The wait is exact.** A refusal asks for the longest of the refusing
//!   bandwidths' waits: each bandwidth's state is left as it was, and each
//!   one's room only grows with time, so after that wait every bandwidth
//!   admits the same request.
//! - **The report is the tightest bandwidth's**: the one with the fewest
//!   units left after the decision (of two with as few, the one that takes
//!   longer to reset), as Bucket4j reports the least remaining;
//!   [`Bandwidths::check_each`] gives every bandwidth's report, for one
//!   `RateLimit` field entry per bandwidth.
//!
//! ```
//! use core::time::Duration;
//! use guard_core::limit::{Algorithm, Bandwidths, Limiter, Rate, TokenBucket};
//! use guard_core::time::Instant;
//!
//! // 10 a second, and 20 a minute.
//! let policy = Bandwidths::new([
//!     TokenBucket::new(10, Rate::per_second(10))?,
//!     TokenBucket::new(20, Rate::per(20, Duration::from_secs(60)))?,
//! ]);
//! let mut key = Limiter::new(policy);
//! let t = Instant::from_secs(1);
//! let admitted = (0..15).filter(|_| key.check(t).is_allowed()).count();
//! assert_eq!(admitted, 10, "the second's bandwidth");
//! let later = t + Duration::from_secs(1);
//! let admitted = (0..15).filter(|_| key.check(later).is_allowed()).count();
//! assert_eq!(admitted, 10, "the minute's bandwidth has 10 left of its 20");
//! assert!(key.check(later + Duration::from_secs(1)).is_denied());
//! # Ok::<(), guard_core::limit::LimiterError>(())
//! ```

use core::array;
use core::time::Duration;

use super::{Algorithm, CostAboveLimit, Decision, Report};
use crate::time::Instant;

/// `N` limits on one key, all or nothing; see the module notes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Bandwidths<A, const N: usize> {
    limits: [A; N],
}

impl<A, const N: usize> Bandwidths<A, N> {
    /// A policy of `limits`, each validated by its own constructor. `N`
    /// must be positive.
    pub const fn new(limits: [A; N]) -> Self {
        const { assert!(N > 0, "a policy of no bandwidths limits nothing") };
        Bandwidths { limits }
    }

    /// The bandwidths, in the order given.
    pub const fn limits(&self) -> &[A; N] {
        &self.limits
    }
}

impl<A: Algorithm, const N: usize> Bandwidths<A, N>
where
    A::State: Clone,
{
    /// Decides `cost` units at `now`, all or nothing, and reports every
    /// bandwidth after the decision, in the order given. A cost above any
    /// bandwidth's quota is [`CostAboveLimit`] naming that quota.
    pub fn check_each(
        &self,
        state: &mut [A::State; N],
        cost: u32,
        now: Instant,
    ) -> Result<[Report; N], CostAboveLimit> {
        let mut next = state.clone();
        let mut reports = [Report {
            decision: Decision::Allowed,
            limit: 0,
            remaining: 0,
            reset_after: Duration::ZERO,
        }; N];
        let mut wait: Option<Duration> = None;
        for ((limit, s), report) in self.limits.iter().zip(&mut next).zip(&mut reports) {
            *report = limit.check_n(s, cost, now)?;
            if let Some(retry_after) = report.retry_after() {
                wait = Some(wait.map_or(retry_after, |w| w.max(retry_after)));
            }
        }
        let Some(retry_after) = wait else {
            *state = next;
            return Ok(reports);
        };
        // Refused: nothing is counted, so each bandwidth stands where it
        // stood, as a cost of zero reports it.
        for ((limit, s), report) in self.limits.iter().zip(state.iter_mut()).zip(&mut reports) {
            let mut unchanged = s.clone();
            let standing = limit.check_n(&mut unchanged, 0, now)?;
            *report = Report {
                decision: Decision::Denied { retry_after },
                ..standing
            };
        }
        Ok(reports)
    }
}

impl<A: Algorithm, const N: usize> Algorithm for Bandwidths<A, N>
where
    A::State: Clone,
{
    type State = [A::State; N];

    const NEW_STATE: [A::State; N] = [A::NEW_STATE; N];

    fn check(&self, state: &mut [A::State; N], now: Instant) -> Decision {
        let mut next = state.clone();
        let mut wait: Option<Duration> = None;
        for (limit, s) in self.limits.iter().zip(&mut next) {
            if let Decision::Denied { retry_after } = limit.check(s, now) {
                wait = Some(wait.map_or(retry_after, |w| w.max(retry_after)));
            }
        }
        match wait {
            None => {
                *state = next;
                Decision::Allowed
            }
            Some(retry_after) => Decision::Denied { retry_after },
        }
    }

    /// The smallest quota: a cost above it can never be admitted.
    fn limit(&self) -> u32 {
        self.limits.iter().map(A::limit).min().unwrap_or(0)
    }

    fn check_n(
        &self,
        state: &mut [A::State; N],
        cost: u32,
        now: Instant,
    ) -> Result<Report, CostAboveLimit> {
        let reports = self.check_each(state, cost, now)?;
        // N > 0 (checked at construction), so there is a tightest one.
        Ok(Report::tightest(&reports).unwrap_or(Report {
            decision: Decision::Allowed,
            limit: 0,
            remaining: 0,
            reset_after: Duration::ZERO,
        }))
    }

    /// Each bandwidth carries its own state over.
    fn carry_over(&self, previous: &Self, state: &mut [A::State; N], now: Instant) {
        for ((limit, was), s) in self.limits.iter().zip(&previous.limits).zip(state) {
            limit.carry_over(was, s, now);
        }
    }

    /// New again once every bandwidth is.
    fn fresh_at(&self, state: &[A::State; N]) -> Option<Instant> {
        self.limits
            .iter()
            .zip(state)
            .try_fold(Instant::from_nanos(0), |latest, (limit, s)| {
                limit.fresh_at(s).map(|at| latest.max(at))
            })
    }

    fn state_settled_at(&self, at: Instant) -> [A::State; N] {
        let mut limits = self.limits.iter();
        array::from_fn(|_| match limits.next() {
            Some(limit) => limit.state_settled_at(at),
            None => A::NEW_STATE,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::{Limiter, Rate, SlidingWindow, TokenBucket};

    fn policy() -> Bandwidths<TokenBucket, 2> {
        Bandwidths::new([
            TokenBucket::new(3, Rate::per_second(3)).unwrap(),
            TokenBucket::new(5, Rate::per(5, Duration::from_secs(10))).unwrap(),
        ])
    }

    #[test]
    fn a_refusal_counts_in_no_bandwidth_and_asks_for_the_longest_wait() {
        let p = policy();
        let mut state = Bandwidths::<TokenBucket, 2>::NEW_STATE;
        let t = Instant::from_secs(100);
        for _ in 0..3 {
            assert!(p.check(&mut state, t).is_allowed());
        }
        let before = state;
        // The second's bucket is empty (next token in 1/3 s); the ten
        // seconds' one has two left.
        let refused = p.check(&mut state, t);
        assert_eq!(state, before, "nothing counted");
        assert_eq!(
            refused.retry_after(),
            Some(Duration::from_nanos(333_333_334))
        );
        // Two more after a second, then the ten seconds' bucket is empty:
        // its next token comes 2 s after the first was taken.
        let t1 = t + Duration::from_secs(1);
        assert!(p.check(&mut state, t1).is_allowed());
        assert!(p.check(&mut state, t1).is_allowed());
        let refused = p.check(&mut state, t1);
        assert_eq!(refused.retry_after(), Some(Duration::from_secs(1)));
        assert!(p.check(&mut state, t + Duration::from_secs(2)).is_allowed());
    }

    #[test]
    fn the_report_is_the_tightest_bandwidths_and_each_can_be_had() {
        let p = policy();
        let mut state = Bandwidths::<TokenBucket, 2>::NEW_STATE;
        let t = Instant::from_secs(100);
        let each = p.check_each(&mut state, 2, t).unwrap();
        assert_eq!((each[0].limit, each[0].remaining), (3, 1));
        assert_eq!((each[1].limit, each[1].remaining), (5, 3));
        let report = p.check_n(&mut state, 1, t).unwrap();
        assert_eq!((report.limit, report.remaining), (3, 0));
        // Refused: each bandwidth where it stood, the longest wait on all.
        let each = p.check_each(&mut state, 2, t).unwrap();
        assert_eq!(each[0].remaining, 0);
        assert_eq!(each[1].remaining, 2);
        assert!(
            each.iter()
                .all(|r| r.retry_after() == each[0].retry_after())
        );
        assert_eq!(
            p.check_n(&mut state, 4, t),
            Err(CostAboveLimit { cost: 4, limit: 3 })
        );
        assert_eq!(p.limit(), 3);
    }

    #[test]
    fn a_key_is_new_again_once_every_bandwidth_is() {
        let p = policy();
        let mut key = Limiter::new(p);
        let t = Instant::from_secs(100);
        assert!(key.check(t).is_allowed());
        // One token: back in 1/3 s in the first, 2 s in the second.
        assert_eq!(
            p.fresh_at(key.state()),
            Some(t + Duration::from_secs(2)),
            "the later of the two"
        );
        let settled = p.state_settled_at(t + Duration::from_secs(2));
        assert_eq!(p.fresh_at(&settled), Some(t + Duration::from_secs(2)));
    }

    #[test]
    fn windows_combine_too() {
        let p = Bandwidths::new([
            SlidingWindow::<4>::new(Duration::from_secs(1), 2).unwrap(),
            SlidingWindow::<4>::new(Duration::from_secs(10), 3).unwrap(),
        ]);
        let mut key = Limiter::new(p);
        let t = Instant::from_secs(5);
        assert!(key.check(t).is_allowed());
        assert!(key.check(t).is_allowed());
        assert!(key.check(t).is_denied());
        let t1 = t + Duration::from_secs(1);
        assert!(key.check(t1).is_allowed());
        let refused = key.check(t1);
        // The ten seconds' window frees its first entry at t + 10 s.
        assert_eq!(refused.retry_after(), Some(Duration::from_secs(9)));
    }
}
