//! A request's cost, the quota reported with each decision, and new
//! parameters at run time.
//!
//! - `check_n(cost)` decides as `cost` single checks at the same reading
//!   would, all or nothing: admitted exactly when all of them would be,
//!   and then in the same state; refused with nothing counted otherwise.
//! - A refusal's `retry_after` is exact: at that reading the same cost is
//!   admitted, one nanosecond earlier it is not.
//! - `remaining` is the number of single checks that would be admitted
//!   next at the same reading; `reset_after` is when the key is new again.
//! - A cost above the quota is an error; a cost of zero changes nothing.
//! - `carry_over` keeps what a key has used: raising a limit gives room at
//!   once, lowering it never does.

use std::time::Duration;

use embassy_sync::blocking_mutex::raw::CriticalSectionRawMutex;
use guard_core::limit::{
    Algorithm, AtomicTokenBucket, CostAboveLimit, FixedWindow, FullPolicy, Keyed, LeakyBucket,
    Limiter, Rate, SharedKeyed, SlidingWindow, TokenBucket, WindowLog,
};
use guard_core::time::Instant;
use proptest::prelude::*;

/// How many single checks at `now` would be admitted in a row, from a copy
/// of `state`.
fn singles_admitted<A: Algorithm>(algorithm: &A, state: &A::State, now: Instant) -> u32
where
    A::State: Clone,
{
    let mut copy = state.clone();
    let mut n = 0;
    while n <= algorithm.limit() && algorithm.check(&mut copy, now).is_allowed() {
        n += 1;
    }
    n
}

/// Runs `calls` of `(cost, step)` through `algorithm`, checking each
/// `check_n` against `cost` single checks on a copy of the state.
///
/// States are compared by `seen`, what of them can still change a decision
/// at a reading.
fn check_n_matches_singles<A>(
    algorithm: &A,
    calls: &[(u32, u64)],
    seen: impl Fn(&A::State, Instant) -> String,
) where
    A: Algorithm,
    A::State: Clone + core::fmt::Debug,
{
    let mut state = A::NEW_STATE;
    let mut now = 1_000_000_000u64;
    for &(cost, step) in calls {
        now += step;
        let at = Instant::from_nanos(now);
        let cost = cost % (algorithm.limit() + 1);
        let mut singles = state.clone();
        let all = (0..cost).all(|_| algorithm.check(&mut singles, at).is_allowed());
        let before = state.clone();
        let report = algorithm
            .check_n(&mut state, cost, at)
            .expect("cost <= limit");
        assert_eq!(report.is_allowed(), all, "cost {cost} at {now}");
        if all {
            assert_eq!(
                seen(&state, at),
                seen(&singles, at),
                "an admission counts `cost` units"
            );
        } else {
            assert_eq!(
                seen(&state, at),
                seen(&before, at),
                "a refusal counts nothing"
            );
            let wait = report.retry_after().expect("refused");
            let mut later = state.clone();
            let admitted_then = algorithm
                .check_n(&mut later, cost, at + wait)
                .expect("<= limit");
            assert!(admitted_then.is_allowed(), "admitted after retry_after");
            let mut earlier = state.clone();
            let just_before = at + wait - Duration::from_nanos(1);
            if just_before >= at {
                let refused = algorithm
                    .check_n(&mut earlier, cost, just_before)
                    .expect("<= limit");
                assert!(refused.is_denied(), "retry_after is the earliest reading");
            }
        }
        assert_eq!(report.limit, algorithm.limit());
        assert_eq!(
            report.remaining,
            singles_admitted(algorithm, &state, at),
            "remaining counts the next single admissions"
        );
        // reset_after: from then on, the key decides as a new key.
        let reset = at + report.reset_after;
        let fresh = algorithm.fresh_at(&state).expect("within the clock");
        assert!(fresh <= reset.max(at), "new again by reset_after");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn a_bucket_decides_a_cost_as_that_many_single_checks(
        capacity in 1u32..20,
        per_ms in 1u64..50,
        calls in prop::collection::vec((0u32..25, 0u64..40_000_000), 1..60),
    ) {
        let bucket = TokenBucket::new(capacity, Rate::per(1, Duration::from_millis(per_ms)))
            .expect("valid");
        check_n_matches_singles(&bucket, &calls, |s, _| format!("{s:?}"));
        let leaky = LeakyBucket::new(capacity, Rate::per(1, Duration::from_millis(per_ms)))
            .expect("valid");
        check_n_matches_singles(&leaky, &calls, |s, _| format!("{s:?}"));
    }

    #[test]
    fn a_sliding_window_decides_a_cost_as_that_many_single_checks(
        limit in 1u32..16,
        window_ms in 1u64..200,
        calls in prop::collection::vec((0u32..20, 0u64..60_000_000), 1..60),
    ) {
        let window = SlidingWindow::<16>::new(Duration::from_millis(window_ms), limit)
            .expect("valid");
        let inside = |log: &WindowLog<16>, at: Instant| {
            let held: Vec<_> = log
                .iter()
                .filter(|&&t| t + window.window() > at)
                .collect();
            format!("{held:?}")
        };
        check_n_matches_singles(&window, &calls, inside);
    }

    #[test]
    fn a_fixed_window_decides_a_cost_as_that_many_single_checks(
        limit in 1u32..16,
        period_ms in 1u64..200,
        offset_ms in 0u64..400,
        calls in prop::collection::vec((0u32..20, 0u64..60_000_000), 1..60),
    ) {
        let window = FixedWindow::new(Duration::from_millis(period_ms), limit)
            .expect("valid")
            .with_offset(Duration::from_millis(offset_ms));
        let charged = |count: &guard_core::limit::WindowCount, at: Instant| {
            if window.is_fresh(count, at) {
                "new".to_owned()
            } else {
                format!("{count:?}")
            }
        };
        check_n_matches_singles(&window, &calls, charged);
    }

    #[test]
    fn the_atomic_bucket_and_the_keyed_tables_report_as_the_limiter(
        capacity in 1u32..20,
        calls in prop::collection::vec((0u32..25, 0u64..400_000_000), 1..60),
    ) {
        let bucket = TokenBucket::new(capacity, Rate::per_second(10)).expect("valid");
        let mut limiter = Limiter::new(bucket);
        let atomic = AtomicTokenBucket::new(bucket);
        let mut keyed: Keyed<u8, TokenBucket, 4> = Keyed::new(bucket, FullPolicy::DenyNewKeys);
        let shared: SharedKeyed<CriticalSectionRawMutex, u8, TokenBucket, 4> =
            SharedKeyed::new(Keyed::new(bucket, FullPolicy::DenyNewKeys));
        let mut now = 0u64;
        for (cost, step) in calls {
            now += step;
            let at = Instant::from_nanos(now);
            let expected = limiter.check_n(cost, at);
            prop_assert_eq!(atomic.check_n(cost, at), expected);
            prop_assert_eq!(keyed.check_n(&1, cost, at), expected);
            prop_assert_eq!(shared.check_n(&1, cost, at), expected);
        }
    }
}

#[test]
fn a_cost_above_the_quota_is_an_error_for_every_limiter() {
    let bucket = TokenBucket::new(5, Rate::per_second(5)).unwrap();
    let window = SlidingWindow::<8>::new(Duration::from_secs(1), 3).unwrap();
    let now = Instant::from_secs(1);
    let err = CostAboveLimit { cost: 6, limit: 5 };
    assert_eq!(Limiter::new(bucket).check_n(6, now), Err(err));
    assert_eq!(AtomicTokenBucket::new(bucket).check_n(6, now), Err(err));
    let mut keyed: Keyed<u8, TokenBucket, 4> = Keyed::new(bucket, FullPolicy::DenyNewKeys);
    assert_eq!(keyed.check_n(&1, 6, now), Err(err));
    assert!(keyed.is_empty(), "an impossible cost stores no key");
    assert_eq!(
        Limiter::new(window).check_n(4, now),
        Err(CostAboveLimit { cost: 4, limit: 3 })
    );
    assert_eq!(
        err.to_string(),
        "a cost of 6 exceeds the limit of 5: no wait can ever admit it"
    );
}

#[test]
fn a_cost_of_zero_reports_without_counting() {
    let bucket = TokenBucket::new(4, Rate::per_second(4)).unwrap();
    let mut keyed: Keyed<u8, TokenBucket, 4> = Keyed::new(bucket, FullPolicy::DenyNewKeys);
    let now = Instant::from_secs(3);
    let report = keyed.check_n(&1, 0, now).unwrap();
    assert!(report.is_allowed());
    assert_eq!((report.remaining, report.reset_after), (4, Duration::ZERO));
    assert!(keyed.is_empty(), "a peek stores no new key");
    assert!(keyed.check_n(&1, 3, now).unwrap().is_allowed());
    let report = keyed.check_n(&1, 0, now).unwrap();
    assert_eq!(report.remaining, 1);
    assert_eq!(report.reset_after, Duration::from_millis(750));
    assert_eq!(
        keyed.check_n(&1, 0, now).unwrap(),
        report,
        "still unchanged"
    );
}

#[test]
fn reports_give_limit_remaining_and_reset() {
    let mut window = Limiter::new(SlidingWindow::<8>::new(Duration::from_secs(10), 5).unwrap());
    let t = Instant::from_secs(100);
    let r = window.check_n(2, t).unwrap();
    assert_eq!(
        (r.limit, r.remaining, r.reset_after),
        (5, 3, Duration::from_secs(10))
    );
    let r = window.check_n(3, t + Duration::from_secs(4)).unwrap();
    assert_eq!((r.remaining, r.reset_after), (0, Duration::from_secs(10)));
    // Two more need the two oldest (at t) to leave: at t + 10 s.
    let r = window.check_n(2, t + Duration::from_secs(5)).unwrap();
    assert_eq!(r.retry_after(), Some(Duration::from_secs(5)));
    assert_eq!((r.remaining, r.reset_after), (0, Duration::from_secs(9)));
    // Four need the three at t + 4 s to leave as well: at t + 14 s.
    let r = window.check_n(4, t + Duration::from_secs(5)).unwrap();
    assert_eq!(r.retry_after(), Some(Duration::from_secs(9)));

    let mut leaky = Limiter::new(LeakyBucket::new(10, Rate::per_second(2)).unwrap());
    let r = leaky.check_n(10, t).unwrap();
    assert_eq!((r.remaining, r.reset_after), (0, Duration::from_secs(5)));
    let r = leaky.check_n(3, t + Duration::from_millis(500)).unwrap();
    assert_eq!(r.retry_after(), Some(Duration::from_secs(1)));
    assert_eq!(
        (r.remaining, r.reset_after),
        (1, Duration::from_millis(4500))
    );
}

#[test]
fn raising_a_bucket_gives_room_at_once_and_lowering_it_never_does() {
    let t = Instant::from_secs(50);
    let old = TokenBucket::new(10, Rate::per_second(10)).unwrap();
    // Emptied at t.
    let mut l = Limiter::new(old);
    assert!(l.check_n(10, t).unwrap().is_allowed());

    // Twice the capacity at the same rate: the 10 used are still used,
    // the 10 new are there at once.
    let mut raised = l.clone();
    raised.reconfigure(TokenBucket::new(20, Rate::per_second(10)).unwrap(), t);
    assert_eq!(raised.check_n(0, t).unwrap().remaining, 10);

    // A tenth of the rate: the 10 used take ten times longer to come back.
    let mut slowed = l.clone();
    slowed.reconfigure(TokenBucket::new(10, Rate::per_second(1)).unwrap(), t);
    let r = slowed.check_n(0, t).unwrap();
    assert_eq!((r.remaining, r.reset_after), (0, Duration::from_secs(10)));
    assert!(slowed.check(t + Duration::from_millis(999)).is_denied());
    assert!(slowed.check(t + Duration::from_secs(1)).is_allowed());

    // A smaller bucket: the key owes at most one full bucket of it.
    let mut shrunk = l.clone();
    shrunk.reconfigure(TokenBucket::new(2, Rate::per_second(10)).unwrap(), t);
    let r = shrunk.check_n(0, t).unwrap();
    assert_eq!(
        (r.remaining, r.reset_after),
        (0, Duration::from_millis(200))
    );

    // Half used, then ten times the rate: still half used.
    let mut half = Limiter::new(old);
    assert!(half.check_n(5, t).unwrap().is_allowed());
    half.reconfigure(TokenBucket::new(10, Rate::per_second(100)).unwrap(), t);
    let r = half.check_n(0, t).unwrap();
    assert_eq!((r.remaining, r.reset_after), (5, Duration::from_millis(50)));

    // A key that is new stays new.
    let mut fresh = Limiter::new(old);
    fresh.reconfigure(TokenBucket::new(3, Rate::per_second(1)).unwrap(), t);
    assert_eq!(fresh.check_n(0, t).unwrap().remaining, 3);
}

#[test]
fn a_lowered_window_limit_refuses_until_enough_admissions_leave() {
    let t = Instant::from_secs(10);
    let mut l = Limiter::new(SlidingWindow::<8>::new(Duration::from_secs(1), 6).unwrap());
    for i in 0..6 {
        assert!(l.check(t + Duration::from_millis(100 * i)).is_allowed());
    }
    let now = t + Duration::from_millis(600);
    l.reconfigure(
        SlidingWindow::<8>::new(Duration::from_secs(1), 2).unwrap(),
        now,
    );
    // Six held, two allowed: five must leave, the fifth (at t + 400 ms)
    // leaves at t + 1400 ms.
    let r = l.check_n(1, now).unwrap();
    assert_eq!(r.retry_after(), Some(Duration::from_millis(800)));
    assert!(l.check(t + Duration::from_millis(1399)).is_denied());
    assert!(l.check(t + Duration::from_millis(1400)).is_allowed());
    // A longer window keeps the admissions longer.
    l.reconfigure(
        SlidingWindow::<8>::new(Duration::from_secs(5), 2).unwrap(),
        now,
    );
    assert!(l.check(t + Duration::from_secs(4)).is_denied());
}

#[test]
fn a_keyed_table_keeps_every_key_through_a_reconfiguration() {
    let t = Instant::from_secs(1);
    let old = TokenBucket::new(4, Rate::per_second(4)).unwrap();
    let mut keyed: Keyed<u32, TokenBucket, 64> = Keyed::new(old, FullPolicy::DenyNewKeys);
    for key in 0..40 {
        assert!(keyed.check_n(&key, 4, t).unwrap().is_allowed());
    }
    keyed.reconfigure(TokenBucket::new(8, Rate::per_second(4)).unwrap(), t);
    assert_eq!(keyed.len(), 40);
    for key in 0..40 {
        let r = keyed.check_n(&key, 0, t).unwrap();
        assert_eq!((r.limit, r.remaining), (8, 4), "key {key}");
    }
    assert_eq!(keyed.check_n(&99, 0, t).unwrap().remaining, 8);
}
