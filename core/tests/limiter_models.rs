//! Every limiter against a brute-force reference model over random traces.
//!
//! The models are written the way the original module states the
//! algorithms (tokens and a last-refill time; water and a last-drain time;
//! a full history of admissions), independently of guard-core's GCRA and
//! ring-buffer implementations.

use std::time::Duration;

use guard_core::limit::{
    AtomicTokenBucket, LeakyBucket, Limiter, Rate, SlidingWindow, TokenBucket,
};
use guard_core::time::Instant;
use proptest::prelude::*;

mod models;
use models::{LeakyModel, TokenModel, WindowModel};

/// Steps of a trace: mostly small, sometimes zero (bursts at one instant),
/// sometimes large (idle periods).
fn forward_steps() -> impl Strategy<Value = Vec<u64>> {
    prop::collection::vec(
        prop_oneof![
            3 => Just(0u64),
            5 => 0u64..2_000_000,
            1 => 0u64..5_000_000_000,
        ],
        1..200,
    )
}

fn forward_trace(start: u64, steps: &[u64]) -> Vec<u64> {
    steps
        .iter()
        .scan(start, |t, s| {
            *t = t.saturating_add(*s);
            Some(*t)
        })
        .collect()
}

proptest! {
    #[test]
    fn token_bucket_matches_model(
        capacity in 1u32..20,
        amount in 1u32..50,
        period_ms in 1u64..2_000,
        start in 0u64..1_000_000_000_000,
        steps in forward_steps(),
    ) {
        let bucket = TokenBucket::new(capacity, Rate::per(amount, Duration::from_millis(period_ms))).unwrap();
        let interval = bucket.interval().as_nanos() as u64;
        let mut real = Limiter::new(bucket);
        let shared = AtomicTokenBucket::new(bucket);
        let mut model = TokenModel::new(capacity, interval);
        for now in forward_trace(start, &steps) {
            let expected = model.check(now);
            let decision = real.check(Instant::from_nanos(now));
            prop_assert_eq!(decision.is_allowed(), expected, "at {}", now);
            prop_assert_eq!(shared.check(Instant::from_nanos(now)), decision, "atomic bucket differs at {}", now);
            if let Some(wait) = decision.retry_after() {
                // The hint is exact: one nanosecond earlier is still too early,
                // at the hint the next call is admitted.
                let mut probe = real.clone();
                let at = Instant::from_nanos(now) + wait;
                prop_assert!(probe.check(at - Duration::from_nanos(1)).is_denied() || wait == Duration::from_nanos(1));
                prop_assert!(probe.check(at).is_allowed());
            }
        }
    }

    #[test]
    fn leaky_bucket_matches_model(
        capacity in 1u32..20,
        amount in 1u32..50,
        period_ms in 1u64..2_000,
        start in 0u64..1_000_000_000_000,
        steps in forward_steps(),
    ) {
        let bucket = LeakyBucket::new(capacity, Rate::per(amount, Duration::from_millis(period_ms))).unwrap();
        let interval = bucket.interval().as_nanos() as u64;
        let mut real = Limiter::new(bucket);
        let mut model = LeakyModel::new(capacity, interval);
        for now in forward_trace(start, &steps) {
            prop_assert_eq!(real.check(Instant::from_nanos(now)).is_allowed(), model.check(now), "at {}", now);
            prop_assert!(bucket.water(real.state(), Instant::from_nanos(now)) <= capacity);
        }
    }

    #[test]
    fn sliding_window_matches_model_even_with_backwards_clock(
        limit in 1u32..16,
        window_ms in 1u64..3_000,
        start in 0u64..10_000_000_000,
        times in prop::collection::vec((any::<bool>(), 0u64..4_000_000_000), 1..200),
    ) {
        let window = Duration::from_millis(window_ms);
        let mut real = Limiter::new(SlidingWindow::<16>::new(window, limit).unwrap());
        let mut model = WindowModel { window: window.as_nanos(), limit: limit as usize, admitted: vec![] };
        let mut now = start;
        for (back, step) in times {
            // One step in four goes backwards.
            now = if back && step % 4 == 0 { now.saturating_sub(step / 8) } else { now.saturating_add(step / 4) };
            let expected = model.check(now);
            prop_assert_eq!(real.check(Instant::from_nanos(now)).is_allowed(), expected, "at {}", now);
        }
    }

    /// Whatever the clock does (backwards, repeated, huge jumps), a token
    /// bucket never admits more than `capacity` plus one token per interval
    /// spanned by the calls.
    #[test]
    fn token_bucket_never_exceeds_its_budget_on_any_clock(
        capacity in 1u32..10,
        per_ms in 1u64..100,
        times in prop::collection::vec(0u64..10_000_000_000, 1..300),
    ) {
        let bucket = TokenBucket::new(capacity, Rate::per(1, Duration::from_millis(per_ms))).unwrap();
        let mut real = Limiter::new(bucket);
        let admitted = times.iter().filter(|&&t| real.check(Instant::from_nanos(t)).is_allowed()).count() as u64;
        let span = times.iter().max().unwrap() - times.iter().min().unwrap();
        let budget = u64::from(capacity) + span / (per_ms * 1_000_000);
        prop_assert!(admitted <= budget, "{} admitted, budget {}", admitted, budget);
    }

    /// A clock read out of order never frees room: the bucket holds no more
    /// tokens after a backwards call than before it.
    #[test]
    fn backwards_calls_never_refill(
        capacity in 1u32..10,
        now in 1_000_000_000u64..2_000_000_000,
        back in 1u64..1_000_000_000,
        used in 0u32..10,
    ) {
        let bucket = TokenBucket::new(capacity, Rate::per_second(1)).unwrap();
        let mut real = Limiter::new(bucket);
        let at = Instant::from_nanos(now);
        for _ in 0..used { let _ = real.check(at); }
        let before = bucket.available(real.state(), at);
        let earlier = Instant::from_nanos(now - back);
        let allowed = real.check(earlier).is_allowed();
        let after = bucket.available(real.state(), at);
        prop_assert_eq!(after + u32::from(allowed), before);
    }
}
