//! RetryPolicy and executor cases from the original (seed-originals B1, B9),
//! jitter bounds, the async executor, and overflow-freedom properties.

use std::cell::RefCell;
use std::time::Duration;

use guard_core::retry::{
    Backoff, Classifier, GiveUpReason, Interrupted, Jitter, JitterNeedsRandom, Multiplier,
    RetryExecutor, RetryPolicy, WithoutRandom,
};
use proptest::prelude::*;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A stand-in for an exception hierarchy: `Socket` and `SocketTimeout` are
/// kinds of `Io`, as SocketException is an IOException.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Failure {
    Io(&'static str),
    Socket,
    SocketTimeout,
    IllegalArgument,
    NullPointer,
    Runtime,
    Plain,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Io(what) => write!(f, "io error: {what}"),
            other => write!(f, "{other:?}"),
        }
    }
}

fn is_io(e: &Failure) -> bool {
    matches!(e, Failure::Io(_) | Failure::Socket | Failure::SocketTimeout)
}

fn is_bad_argument(e: &Failure) -> bool {
    matches!(e, Failure::IllegalArgument | Failure::NullPointer)
}

#[test]
fn defaults_match_the_original() {
    let p = RetryPolicy::default();
    assert_eq!(p.max_attempts(), 3);
    assert_eq!(p.total_calls(), 4);
    assert_eq!(p.initial_delay(), ms(100));
    assert_eq!(p.max_delay(), Duration::from_secs(10));
    assert_eq!(p.multiplier(), Multiplier::whole(2));
    assert!(p.is_exponential());
    assert_eq!(p.jitter(), Jitter::None);
    assert_eq!(RetryPolicy::new(), p);
}

#[test]
fn builder_values_are_kept() {
    let p = RetryPolicy::new()
        .with_max_attempts(7)
        .with_initial_delay(ms(5))
        .with_max_delay(ms(50))
        .with_multiplier(Multiplier::per_mille(1500))
        .with_exponential(false)
        .with_jitter(Jitter::Full);
    assert_eq!(p.max_attempts(), 7);
    assert_eq!(p.initial_delay(), ms(5));
    assert_eq!(p.max_delay(), ms(50));
    assert_eq!(p.multiplier().as_per_mille(), 1500);
    assert!(!p.is_exponential());
    assert_eq!(p.jitter(), Jitter::Full);
}

#[test]
fn delay_for_attempt_zero_is_zero_and_one_is_initial() {
    let p = RetryPolicy::new();
    assert_eq!(p.delay_for_attempt(0), Duration::ZERO);
    assert_eq!(p.delay_for_attempt(1), ms(100));
}

#[test]
fn exponential_delays_double() {
    let p = RetryPolicy::new();
    let waits: Vec<_> = (1..=5).map(|n| p.delay_for_attempt(n)).collect();
    assert_eq!(waits, [100, 200, 400, 800, 1600].map(ms));
}

#[test]
fn multiplier_three_is_capped_at_max_delay() {
    let p = RetryPolicy::new()
        .with_multiplier(Multiplier::whole(3))
        .with_max_delay(ms(500));
    let waits: Vec<_> = (1..=4).map(|n| p.delay_for_attempt(n)).collect();
    assert_eq!(waits, [100, 300, 500, 500].map(ms));
}

#[test]
fn fractional_multiplier_is_exact_in_eighths() {
    let p = RetryPolicy::new().with_multiplier(Multiplier::per_mille(1500));
    let waits: Vec<_> = (1..=4).map(|n| p.delay_for_attempt(n)).collect();
    assert_eq!(
        waits,
        [100_000, 150_000, 225_000, 337_500].map(Duration::from_micros)
    );
}

#[test]
fn fixed_delay_stays_fixed_up_to_attempt_ten() {
    let p = RetryPolicy::fixed_delay(10, ms(200));
    for n in 1..=10 {
        assert_eq!(p.delay_for_attempt(n), ms(200), "attempt {n}");
    }
    assert_eq!(p.max_attempts(), 10);
    assert!(!p.is_exponential());
}

#[test]
fn factories_match_the_original() {
    assert_eq!(RetryPolicy::no_retry().max_attempts(), 0);
    assert_eq!(RetryPolicy::no_retry().total_calls(), 1);
    let fixed = RetryPolicy::fixed_delay(2, ms(30));
    assert_eq!((fixed.max_attempts(), fixed.initial_delay()), (2, ms(30)));
}

#[test]
fn without_filters_everything_is_retryable() {
    let c = Classifier::<Failure>::retry_all();
    for e in [Failure::Io("x"), Failure::Runtime, Failure::Plain] {
        assert!(c.is_retryable(&e));
    }
}

#[test]
fn whitelist_matches_subtypes_only() {
    let c = Classifier::retry_all().only(is_io);
    assert!(c.is_retryable(&Failure::Socket));
    assert!(c.is_retryable(&Failure::SocketTimeout), "inheritance");
    assert!(!c.is_retryable(&Failure::Runtime));
}

#[test]
fn blacklist_excludes_and_wins_over_whitelist() {
    let black = Classifier::retry_all().never(is_bad_argument);
    assert!(black.is_retryable(&Failure::Io("x")));
    assert!(black.is_retryable(&Failure::Runtime));
    assert!(!black.is_retryable(&Failure::NullPointer));

    let both = Classifier::retry_all()
        .only(|e| is_io(e) || *e == Failure::IllegalArgument)
        .never(is_bad_argument);
    assert!(
        !both.is_retryable(&Failure::IllegalArgument),
        "blacklist wins"
    );
    assert!(!both.is_retryable(&Failure::Plain), "not in the whitelist");
    assert!(both.is_retryable(&Failure::Socket));
}

fn executor(policy: RetryPolicy, c: Classifier<Failure>) -> RetryExecutor<Failure> {
    RetryExecutor::new(policy, c).unwrap()
}

#[test]
fn success_on_first_call() {
    let mut calls = 0;
    let r = executor(RetryPolicy::new(), Classifier::retry_all()).run_blocking(
        |_| panic!("no sleep after a success"),
        |_| {
            calls += 1;
            Ok::<_, Failure>(42)
        },
    );
    assert_eq!((r, calls), (Ok(42), 1));
}

#[test]
fn succeeds_on_the_third_call() {
    let mut calls = 0;
    let r = executor(RetryPolicy::fixed_delay(3, ms(1)), Classifier::retry_all()).run_blocking(
        |_| Ok(()),
        |attempt| {
            calls += 1;
            if attempt < 3 {
                Err(Failure::Io("flaky"))
            } else {
                Ok(attempt)
            }
        },
    );
    assert_eq!((r, calls), (Ok(3), 3));
}

#[test]
fn three_retries_make_four_calls_then_return_the_last_error() {
    let mut calls = 0;
    let err = executor(RetryPolicy::new(), Classifier::retry_all())
        .run_blocking(
            |_| Ok(()),
            |attempt| -> Result<(), Failure> {
                calls += 1;
                Err(if attempt == 4 {
                    Failure::Io("iofail")
                } else {
                    Failure::Runtime
                })
            },
        )
        .unwrap_err();
    assert_eq!(calls, 4);
    assert_eq!(err.attempts, 4);
    assert_eq!(err.reason, GiveUpReason::Exhausted);
    assert_eq!(
        err.error,
        Failure::Io("iofail"),
        "the last error, not a wrapper"
    );
}

#[test]
fn a_non_retryable_error_stops_after_one_call() {
    let mut calls = 0;
    let err = executor(RetryPolicy::new(), Classifier::retry_all().only(is_io))
        .run_blocking(
            |_| Ok(()),
            |_| -> Result<(), Failure> {
                calls += 1;
                Err(Failure::Runtime)
            },
        )
        .unwrap_err();
    assert_eq!(
        (calls, err.attempts, err.reason),
        (1, 1, GiveUpReason::NonRetryable)
    );
}

#[test]
fn fixed_delays_are_slept_between_calls_only() {
    let mut slept = vec![];
    let _ = executor(RetryPolicy::fixed_delay(5, ms(10)), Classifier::retry_all()).run_blocking(
        |d| {
            slept.push(d);
            Ok(())
        },
        |_| Err::<(), _>(Failure::Plain),
    );
    assert_eq!(slept, vec![ms(10); 5], "no sleep after the last call");
}

#[test]
fn a_real_sleep_waits_at_least_the_delays() {
    let start = std::time::Instant::now();
    let _ = executor(RetryPolicy::fixed_delay(5, ms(10)), Classifier::retry_all()).run_blocking(
        |d| {
            std::thread::sleep(d);
            Ok(())
        },
        |_| Err::<(), _>(Failure::Plain),
    );
    assert!(start.elapsed() >= ms(50));
}

#[test]
fn an_interrupted_sleep_stops_with_the_last_error() {
    let mut calls = 0;
    let err = executor(RetryPolicy::new(), Classifier::retry_all())
        .run_blocking(
            |_| Err(Interrupted),
            |_| -> Result<(), Failure> {
                calls += 1;
                Err(Failure::Io("down"))
            },
        )
        .unwrap_err();
    assert_eq!(calls, 1);
    assert_eq!(err.reason, GiveUpReason::Interrupted);
    assert_eq!(err.error, Failure::Io("down"));
    assert_eq!(
        err.to_string(),
        "gave up after 1 attempt(s), retry interrupted: io error: down"
    );
}

#[test]
fn a_zero_delay_policy_retries_without_sleeping() {
    let mut calls = 0;
    let _ = executor(
        RetryPolicy::fixed_delay(3, Duration::ZERO),
        Classifier::retry_all(),
    )
    .run_blocking(
        |_| panic!("zero waits do not sleep"),
        |_| -> Result<(), Failure> {
            calls += 1;
            Err(Failure::Plain)
        },
    );
    assert_eq!(calls, 4);
}

#[test]
fn jitter_without_a_random_source_is_refused() {
    let p = RetryPolicy::new().with_jitter(Jitter::Full);
    assert_eq!(
        RetryExecutor::<Failure, WithoutRandom>::new(p, Classifier::retry_all()).unwrap_err(),
        JitterNeedsRandom
    );
    let mut seed = 1u64;
    let rng = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    assert!(RetryExecutor::with_random(p, Classifier::<Failure>::retry_all(), rng).is_ok());
}

fn xorshift(mut s: u64) -> impl FnMut() -> u64 {
    move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    }
}

#[test]
fn full_jitter_stays_within_zero_and_the_planned_delay() {
    let policy = RetryPolicy::new()
        .with_max_attempts(8)
        .with_jitter(Jitter::Full);
    let mut rng = xorshift(7);
    let mut distinct = std::collections::HashSet::new();
    for _ in 0..200 {
        let mut b = Backoff::new(policy);
        for n in 1..=8 {
            let wait = b.next_delay(&mut rng).unwrap();
            assert!(wait <= policy.delay_for_attempt(n));
            distinct.insert(wait);
        }
        assert_eq!(b.next_delay(&mut rng), None);
    }
    assert!(distinct.len() > 1000, "waits are actually spread");
}

#[test]
fn decorrelated_jitter_stays_between_initial_and_three_times_previous() {
    let policy = RetryPolicy::new()
        .with_max_attempts(50)
        .with_max_delay(ms(2_000))
        .with_jitter(Jitter::Decorrelated);
    let mut rng = xorshift(99);
    let mut b = Backoff::new(policy);
    let mut previous = policy.initial_delay();
    while let Some(wait) = b.next_delay(&mut rng) {
        assert!(wait >= policy.initial_delay().min(policy.max_delay()));
        assert!(
            wait <= (previous * 3).min(ms(2_000)),
            "{wait:?} after {previous:?}"
        );
        previous = wait;
    }
    assert_eq!(b.failures(), 51);
}

/// A `DelayNs` that records what it was asked to wait, in microseconds.
struct RecordingDelay(RefCell<Vec<u64>>);

impl embedded_hal_async::delay::DelayNs for RecordingDelay {
    async fn delay_ns(&mut self, ns: u32) {
        self.0.borrow_mut().push(u64::from(ns).div_ceil(1000));
    }
    async fn delay_us(&mut self, us: u32) {
        self.0.borrow_mut().push(u64::from(us));
    }
}

#[test]
fn async_executor_waits_on_the_delay_and_returns_the_last_error() {
    let policy = RetryPolicy::new().with_max_attempts(2);
    let mut delay = RecordingDelay(RefCell::new(vec![]));
    let mut calls = 0;
    let err = futures_lite::future::block_on(executor(policy, Classifier::retry_all()).run(
        &mut delay,
        |attempt| {
            calls += 1;
            async move { Err::<(), _>(Failure::Io(if attempt == 3 { "last" } else { "early" })) }
        },
    ))
    .unwrap_err();
    assert_eq!(
        (calls, err.attempts, err.error),
        (3, 3, Failure::Io("last"))
    );
    assert_eq!(*delay.0.borrow(), vec![100_000, 200_000]);
}

#[test]
fn async_executor_splits_long_waits_and_rounds_partial_microseconds_up() {
    let two_hours = Duration::from_secs(7_200);
    let policy = RetryPolicy::fixed_delay(1, two_hours + Duration::from_nanos(1))
        .with_max_delay(Duration::from_secs(100_000));
    let mut delay = RecordingDelay(RefCell::new(vec![]));
    let _ = futures_lite::future::block_on(
        executor(policy, Classifier::retry_all())
            .run(&mut delay, |_| async { Err::<(), _>(Failure::Plain) }),
    );
    let waits = delay.0.borrow();
    assert_eq!(waits.len(), 2, "two hours exceed one u32 of microseconds");
    assert_eq!(waits.iter().sum::<u64>(), 7_200_000_001);
}

#[test]
fn async_executor_succeeds_after_a_retry() {
    let mut delay = RecordingDelay(RefCell::new(vec![]));
    let r =
        futures_lite::future::block_on(executor(RetryPolicy::new(), Classifier::retry_all()).run(
            &mut delay,
            |attempt| async move {
                if attempt == 2 {
                    Ok(attempt)
                } else {
                    Err(Failure::Socket)
                }
            },
        ));
    assert_eq!(r, Ok(2));
}

proptest! {
    /// No parameters make the delay computation panic, exceed the cap, or
    /// shrink between attempts when the multiplier is at least 1.
    #[test]
    fn delays_never_panic_exceed_the_cap_or_shrink(
        initial in any::<u64>(),
        cap in any::<u64>(),
        per_mille in 1000u32..=u32::MAX,
        attempts in prop::collection::vec(any::<u32>(), 1..20),
    ) {
        let p = RetryPolicy::new()
            .with_initial_delay(Duration::from_nanos(initial))
            .with_max_delay(Duration::from_nanos(cap))
            .with_multiplier(Multiplier::per_mille(per_mille));
        let mut sorted = attempts.clone();
        sorted.sort_unstable();
        let mut last = Duration::ZERO;
        for n in sorted {
            let d = p.delay_for_attempt(n);
            prop_assert!(d <= Duration::from_nanos(cap));
            if n > 0 { prop_assert!(d >= last, "attempt {} shrank", n); last = d; }
        }
    }

    /// For whole multipliers the fixed-point power is exact.
    #[test]
    fn whole_multipliers_are_exact(initial_ms in 0u64..10_000, factor in 1u32..6, n in 1u32..40) {
        let p = RetryPolicy::new()
            .with_initial_delay(ms(initial_ms))
            .with_max_delay(Duration::MAX)
            .with_multiplier(Multiplier::whole(factor));
        let exact = u128::from(initial_ms) * 1_000_000 * u128::from(factor).pow(n - 1);
        let expected = Duration::from_nanos(exact.min(u128::from(u64::MAX)) as u64);
        prop_assert_eq!(p.delay_for_attempt(n), expected);
    }

    /// Jittered waits never panic and respect the cap, for any parameters.
    #[test]
    fn jitter_never_panics(
        initial in any::<u64>(), cap in any::<u64>(), per_mille in any::<u32>(),
        retries in 0u32..50, seed in 1u64.., full in any::<bool>(),
    ) {
        let p = RetryPolicy::new()
            .with_max_attempts(retries)
            .with_initial_delay(Duration::from_nanos(initial))
            .with_max_delay(Duration::from_nanos(cap))
            .with_multiplier(Multiplier::per_mille(per_mille))
            .with_jitter(if full { Jitter::Full } else { Jitter::Decorrelated });
        let mut b = Backoff::new(p);
        let mut rng = xorshift(seed);
        let mut n = 0;
        while let Some(d) = b.next_delay(&mut rng) {
            n += 1;
            prop_assert!(d <= Duration::from_nanos(cap), "{:?} above the cap", d);
        }
        prop_assert_eq!(n, retries);
    }
}
