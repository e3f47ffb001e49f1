//! The original module's in-memory limiter cases (seed-originals B4, B9),
//! as named tests, plus parameter validation.

use std::sync::Arc;
use std::thread;
use std::time::Duration;

use embassy_sync::blocking_mutex::raw::CriticalSectionRawMutex;
use guard_core::limit::{
    AtomicTokenBucket, Decision, FullPolicy, Keyed, LeakyBucket, Limiter, LimiterError, Rate,
    SharedKeyed, SlidingWindow, TokenBucket,
};
use guard_core::time::Instant;

const T: Instant = Instant::from_millis(1_700_000_000_000);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn token(capacity: u32, per_second: u32) -> Limiter<TokenBucket> {
    Limiter::new(TokenBucket::new(capacity, Rate::per_second(per_second)).unwrap())
}

fn admitted(l: &mut Limiter<TokenBucket>, at: Instant, calls: usize) -> usize {
    (0..calls).filter(|_| l.check(at).is_allowed()).count()
}

#[test]
fn sliding_window_allows_three_then_denies_within_window() {
    let mut l = Limiter::new(SlidingWindow::<8>::new(ms(1000), 3).unwrap());
    assert!(l.check(T).is_allowed());
    assert!(l.check(T + ms(10)).is_allowed());
    assert!(l.check(T + ms(20)).is_allowed());
    assert!(l.check(T + ms(30)).is_denied());
}

#[test]
fn sliding_window_evicts_at_inclusive_boundary() {
    let mut l = Limiter::new(SlidingWindow::<2>::new(ms(1000), 2).unwrap());
    assert!(l.check(T).is_allowed());
    assert!(l.check(T + ms(100)).is_allowed());
    assert!(l.check(T + ms(200)).is_denied());
    assert!(l.check(T + ms(1001)).is_allowed(), "t has left the window");
    assert!(l.check(T + ms(1002)).is_denied());
}

#[test]
fn sliding_window_boundary_equal_to_now_minus_window_is_evicted() {
    let mut l = Limiter::new(SlidingWindow::<1>::new(ms(1000), 1).unwrap());
    assert!(l.check(T).is_allowed());
    assert_eq!(
        l.check(T + ms(999)),
        Decision::Denied { retry_after: ms(1) }
    );
    assert!(
        l.check(T + ms(1000)).is_allowed(),
        "timestamp == now - window is dropped"
    );
}

#[test]
fn sliding_window_denial_is_not_recorded() {
    let mut l = Limiter::new(SlidingWindow::<1>::new(ms(100), 1).unwrap());
    assert!(l.check(T).is_allowed());
    for i in 1..100 {
        assert!(l.check(T + Duration::from_micros(i * 10)).is_denied());
    }
    assert!(l.check(T + ms(100)).is_allowed());
}

#[test]
fn token_bucket_bursts_to_capacity_then_one_more_after_a_second() {
    let mut l = token(3, 1);
    assert_eq!(admitted(&mut l, T, 5), 3);
    assert_eq!(admitted(&mut l, T + ms(1000), 5), 1);
}

#[test]
fn token_bucket_new_key_starts_full() {
    let mut l = token(2, 1);
    assert_eq!(admitted(&mut l, T, 3), 2);
}

#[test]
fn token_bucket_state_persists_across_calls_with_exact_counts() {
    let mut l = token(10, 5);
    assert_eq!(admitted(&mut l, T, 20), 10);
    assert_eq!(admitted(&mut l, T + ms(1000), 20), 5);
    assert_eq!(admitted(&mut l, T + ms(2000), 20), 5);
}

#[test]
fn token_bucket_fractional_accumulation_never_exceeds_capacity() {
    let mut l = token(2, 2); // one token per 500 ms
    assert_eq!(admitted(&mut l, T, 2), 2);
    assert!(
        l.check(T + ms(250)).is_denied(),
        "half a token is not a token"
    );
    assert!(l.check(T + ms(500)).is_allowed());
    // A long idle refills to capacity, never beyond.
    assert_eq!(admitted(&mut l, T + Duration::from_secs(3600), 10), 2);
}

#[test]
fn token_bucket_backwards_timestamp_neither_refills_nor_breaks() {
    let mut l = token(2, 1);
    assert_eq!(admitted(&mut l, T, 2), 2);
    // Earlier than the last call: no refill, no panic, a finite retry hint.
    for back in [1, 500, 10_000] {
        let d = l.check(T - ms(back));
        assert!(d.is_denied());
        assert!(d.retry_after().unwrap() <= ms(1000 + back));
    }
    // And time moving forward again works as if nothing happened.
    assert_eq!(admitted(&mut l, T + ms(1000), 5), 1);
    assert_eq!(admitted(&mut l, T + ms(2000), 5), 1);
}

#[test]
fn token_bucket_timestamp_zero_works() {
    let mut l = token(1, 1);
    assert!(l.check(Instant::ZERO).is_allowed());
    assert!(l.check(Instant::ZERO).is_denied());
    assert!(l.check(Instant::from_secs(1)).is_allowed());
}

#[test]
fn token_bucket_high_and_low_rates() {
    let mut fast = token(1, 1_000_000); // one per microsecond
    assert!(fast.check(T).is_allowed());
    assert!(fast.check(T).is_denied());
    assert!(fast.check(T + Duration::from_micros(1)).is_allowed());

    let mut slow =
        Limiter::new(TokenBucket::new(1, Rate::per(1, Duration::from_secs(3600))).unwrap());
    assert!(slow.check(T).is_allowed());
    assert!(slow.check(T + Duration::from_secs(3599)).is_denied());
    assert!(slow.check(T + Duration::from_secs(3600)).is_allowed());
}

#[test]
fn token_bucket_capacity_one_and_large_capacity() {
    let mut one = token(1, 10);
    assert_eq!(admitted(&mut one, T, 3), 1);
    let mut large = token(1_000_000, 1);
    assert_eq!(admitted(&mut large, T, 1_000_001), 1_000_000);
}

#[test]
fn token_bucket_denial_says_when_the_next_token_arrives() {
    let mut l = token(1, 4); // one per 250 ms
    assert!(l.check(T).is_allowed());
    assert_eq!(l.check(T + ms(100)).retry_after(), Some(ms(150)));
}

#[test]
fn token_bucket_reports_available_tokens() {
    let bucket = TokenBucket::new(3, Rate::per_second(1)).unwrap();
    let mut l = Limiter::new(bucket);
    assert_eq!(bucket.available(l.state(), T), 3);
    assert!(l.check(T).is_allowed());
    assert_eq!(bucket.available(l.state(), T), 2);
    assert_eq!(bucket.available(l.state(), T + ms(999)), 2);
    assert_eq!(bucket.available(l.state(), T + ms(1000)), 3);
}

#[test]
fn leaky_bucket_allows_two_denies_third_and_drains_one_per_second() {
    let mut l = Limiter::new(LeakyBucket::new(2, Rate::per_second(1)).unwrap());
    assert!(l.check(T).is_allowed());
    assert!(l.check(T).is_allowed());
    assert!(l.check(T).is_denied());
    assert!(l.check(T + ms(1000)).is_allowed());
    assert!(l.check(T + ms(1000)).is_denied());
}

#[test]
fn leaky_bucket_new_key_starts_empty_and_reports_water() {
    let bucket = LeakyBucket::new(2, Rate::per_second(1)).unwrap();
    let mut l = Limiter::new(bucket);
    assert_eq!(bucket.water(l.state(), T), 0);
    assert!(l.check(T).is_allowed());
    assert_eq!(bucket.water(l.state(), T), 1);
    assert_eq!(bucket.water(l.state(), T + ms(500)), 1, "rounded up");
    assert_eq!(bucket.water(l.state(), T + ms(1000)), 0);
}

#[test]
fn keys_are_independent_including_empty_special_and_chinese_keys() {
    let bucket = TokenBucket::new(1, Rate::per_second(1)).unwrap();
    let mut keyed: Keyed<&str, TokenBucket, 16> = Keyed::new(bucket, FullPolicy::DenyNewKeys);
    for key in ["", "a", "user:1/{x}", "用户-甲", "🚦"] {
        assert!(keyed.check(&key, T).is_allowed(), "{key:?} first call");
    }
    for key in ["", "a", "user:1/{x}", "用户-甲", "🚦"] {
        assert!(keyed.check(&key, T).is_denied(), "{key:?} second call");
    }
    assert_eq!(keyed.len(), 5);
}

#[test]
fn ten_threads_times_ten_calls_share_limiters_without_errors() {
    let bucket = TokenBucket::new(50, Rate::per_second(1)).unwrap();
    let atomic = Arc::new(AtomicTokenBucket::new(bucket));
    let keyed: Arc<SharedKeyed<CriticalSectionRawMutex, u32, TokenBucket, 64>> = Arc::new(
        SharedKeyed::new(Keyed::new(bucket, FullPolicy::DenyNewKeys)),
    );
    let handles: Vec<_> = (0..10)
        .map(|_| {
            let (atomic, keyed) = (atomic.clone(), keyed.clone());
            thread::spawn(move || {
                let mut allowed = (0, 0);
                for _ in 0..10 {
                    allowed.0 += usize::from(atomic.check(T).is_allowed());
                    allowed.1 += usize::from(keyed.check(&1, T).is_allowed());
                }
                allowed
            })
        })
        .collect();
    let (a, k) = handles
        .into_iter()
        .map(|h| h.join().unwrap())
        .fold((0, 0), |acc, x| (acc.0 + x.0, acc.1 + x.1));
    assert_eq!(a, 50, "exactly the capacity is admitted at one instant");
    assert_eq!(k, 50);
}

#[test]
fn constructors_reject_impossible_parameters_with_clear_messages() {
    let per_sec = Rate::per_second(1);
    assert_eq!(
        TokenBucket::new(0, per_sec),
        Err(LimiterError::ZeroCapacity)
    );
    assert_eq!(
        TokenBucket::new(1, Rate::per_second(0)),
        Err(LimiterError::ZeroRateAmount)
    );
    assert_eq!(
        LeakyBucket::new(1, Rate::per(1, Duration::ZERO)),
        Err(LimiterError::ZeroRatePeriod)
    );
    assert_eq!(
        LeakyBucket::new(0, per_sec),
        Err(LimiterError::ZeroCapacity)
    );
    assert_eq!(
        SlidingWindow::<4>::new(Duration::ZERO, 1),
        Err(LimiterError::ZeroWindow)
    );
    assert_eq!(
        SlidingWindow::<4>::new(ms(1), 0),
        Err(LimiterError::ZeroLimit)
    );
    let too_many = SlidingWindow::<4>::new(ms(1), 5).unwrap_err();
    assert_eq!(
        too_many,
        LimiterError::LimitAboveMaximum {
            limit: 5,
            maximum: 4
        }
    );
    assert_eq!(
        too_many.to_string(),
        "limit 5 exceeds the maximum 4 this sliding window can store"
    );
    assert_eq!(
        LimiterError::ZeroCapacity.to_string(),
        "capacity must be positive (got 0)"
    );
}

/// A capacity times interval beyond the clock's range used to saturate the
/// bucket's arithmetic and admit every call; it is refused, and the
/// largest one that fits is accepted.
#[test]
fn buckets_whose_capacity_times_interval_overflows_the_clock_are_refused() {
    let year = Duration::from_secs(365 * 24 * 3600);
    for (capacity, rate, interval_nanos) in [
        (2, Rate::per(1, Duration::MAX), Duration::MAX.as_nanos()),
        (3, Rate::per(1, year * 300), (year * 300).as_nanos()),
        (10, Rate::per(1, year * 100), (year * 100).as_nanos()),
        (
            1,
            Rate::per(1, Duration::from_nanos(u64::MAX)),
            u128::from(u64::MAX),
        ),
    ] {
        let refused = LimiterError::CapacityTimesIntervalTooLong {
            capacity,
            interval_nanos,
        };
        assert_eq!(TokenBucket::new(capacity, rate), Err(refused));
        assert_eq!(LeakyBucket::new(capacity, rate), Err(refused));
    }
    assert_eq!(
        TokenBucket::new(3, Rate::per(1, year * 300))
            .unwrap_err()
            .to_string(),
        "capacity 3 times the interval of 9460800000000000000 ns must fit in the clock's \
         range of 18446744073709551614 ns (about 584 years): lower the capacity or raise the rate"
    );
    // A period beyond 64 bits of nanoseconds is divided exactly, never
    // shortened to fit.
    assert_eq!(
        Rate::per(1, Duration::MAX).interval_nanos(),
        Err(LimiterError::CapacityTimesIntervalTooLong {
            capacity: 1,
            interval_nanos: Duration::MAX.as_nanos()
        })
    );
    assert_eq!(
        Rate::per(u32::MAX, Duration::MAX).interval_nanos(),
        Ok(Duration::MAX.as_nanos().div_ceil(u128::from(u32::MAX)) as u64)
    );
    // The largest that fit.
    assert!(TokenBucket::new(1, Rate::per(1, Duration::from_nanos(u64::MAX - 1))).is_ok());
    assert!(TokenBucket::new(2, Rate::per(1, Duration::from_nanos((u64::MAX - 1) / 2))).is_ok());
    assert!(TokenBucket::new(u32::MAX, Rate::per(1, Duration::from_nanos(1 << 32))).is_ok());
    assert!(TokenBucket::new(u32::MAX, Rate::per(1, Duration::from_nanos((1 << 32) + 2))).is_err());
}

#[test]
fn rate_interval_rounds_up_so_limiters_never_run_fast() {
    assert_eq!(
        Rate::per(3, Duration::from_secs(1)).interval_nanos(),
        Ok(333_333_334)
    );
    assert_eq!(
        Rate::per(u32::MAX, Duration::from_nanos(1)).interval_nanos(),
        Ok(1)
    );
}

#[test]
fn extreme_instants_do_not_panic() {
    let mut b = token(u32::MAX, u32::MAX);
    let mut s = Limiter::new(SlidingWindow::<2>::new(Duration::MAX, 2).unwrap());
    // The slowest bucket accepted: one unit per clock range.
    let mut k = Limiter::new(
        LeakyBucket::new(1, Rate::per(1, Duration::from_nanos(u64::MAX - 1))).unwrap(),
    );
    for now in [
        Instant::ZERO,
        Instant::MAX,
        Instant::from_nanos(1),
        Instant::MAX,
    ] {
        let _ = b.check(now);
        let _ = s.check(now);
        let _ = k.check(now);
    }
}

#[test]
fn per_key_state_sizes() {
    use guard_core::limit::{BucketState, WindowLog};
    use std::mem::size_of;
    // The numbers quoted in the README: a bucket is one u64, a window log
    // N instants plus its ring indices, a keyed u64 slot 16 bytes (the
    // state's niche holds the slot's occupancy).
    assert_eq!(size_of::<BucketState>(), 8);
    assert_eq!(size_of::<AtomicTokenBucket>(), size_of::<TokenBucket>() + 8);
    assert!(size_of::<WindowLog<16>>() <= 16 * 8 + 3 * size_of::<usize>());
    assert_eq!(size_of::<Option<(u64, BucketState)>>(), 16);
    assert_eq!(BucketState::default().settles_at(), Instant::ZERO);
    let latest = BucketState::settling_at(Instant::MAX).settles_at();
    assert_eq!(latest.as_nanos(), u64::MAX - 1, "stored a nanosecond early");
    assert_eq!(
        size_of::<Keyed<u64, TokenBucket, 1024>>(),
        1024 * 16 + size_of::<Keyed<u64, TokenBucket, 8>>() - 8 * 16
    );
}
