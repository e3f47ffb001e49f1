//! The budget every limiter keeps on any clock: no accepted parameters and
//! no sequence of readings (in order, out of order, up to `Instant::MAX`)
//! lets a key through more than its limit allows.
//!
//! For a bucket of `capacity` units and a rate whose interval is
//! `period / amount` (exact, in nanoseconds), the budget of a key whose
//! readings span `min..=max` is `capacity + floor((max - min) / interval)`.
//! For a sliding window of `limit` per `window` it is
//! `limit * (floor((max - min) / window) + 1)`.

use std::collections::HashMap;
use std::time::Duration;

use embassy_sync::blocking_mutex::raw::CriticalSectionRawMutex;
use guard_core::limit::{
    AtomicTokenBucket, FullPolicy, Keyed, KeyedSlot, KeyedSlots, LeakyBucket, Limiter, Rate,
    SharedKeyed, SlidingWindow, TokenBucket,
};
use guard_core::time::Instant;
use proptest::prelude::*;

const YEAR: Duration = Duration::from_secs(365 * 24 * 3600);

/// The exact interval of `rate` in nanoseconds, rounded up (so a budget
/// computed with it is never larger than the exact one).
fn exact_interval(rate: Rate) -> u128 {
    rate.period().as_nanos().div_ceil(u128::from(rate.amount()))
}

/// The budget of a bucket over readings spanning `min..=max`.
fn bucket_budget(capacity: u32, rate: Rate, min: u64, max: u64) -> u128 {
    u128::from(capacity) + u128::from(max - min) / exact_interval(rate)
}

/// The budget of a sliding window over readings spanning `min..=max`.
fn window_budget(limit: u32, window: Duration, min: u64, max: u64) -> u128 {
    u128::from(limit) * (u128::from(max - min) / window.as_nanos() + 1)
}

fn span(readings: &[u64]) -> (u64, u64) {
    let min = readings.iter().copied().min().unwrap_or(0);
    let max = readings.iter().copied().max().unwrap_or(0);
    (min, max)
}

/// Admissions of each bucket kind over `readings` (token, leaky, atomic,
/// keyed, shared keyed), all with the same parameters.
fn admissions_of_every_bucket(
    capacity: u32,
    rate: Rate,
    readings: &[u64],
) -> Vec<(&'static str, u128)> {
    let mut out = Vec::new();
    if let Ok(bucket) = TokenBucket::new(capacity, rate) {
        let mut l = Limiter::new(bucket);
        let atomic = AtomicTokenBucket::new(bucket);
        let mut keyed: Keyed<u8, TokenBucket, 8> = Keyed::new(bucket, FullPolicy::DenyNewKeys);
        let shared: SharedKeyed<CriticalSectionRawMutex, u8, TokenBucket, 8> =
            SharedKeyed::new(Keyed::new(bucket, FullPolicy::DenyNewKeys));
        let mut counts = [0u128; 4];
        for &t in readings {
            let now = Instant::from_nanos(t);
            counts[0] += u128::from(l.check(now).is_allowed());
            counts[1] += u128::from(atomic.check(now).is_allowed());
            counts[2] += u128::from(keyed.check(&1, now).is_allowed());
            counts[3] += u128::from(shared.check(&1, now).is_allowed());
        }
        out.extend([
            ("token", counts[0]),
            ("atomic", counts[1]),
            ("keyed", counts[2]),
            ("shared keyed", counts[3]),
        ]);
    }
    if let Ok(bucket) = LeakyBucket::new(capacity, rate) {
        let mut l = Limiter::new(bucket);
        let n = readings
            .iter()
            .filter(|&&t| l.check(Instant::from_nanos(t)).is_allowed())
            .count();
        out.push(("leaky", n as u128));
    }
    out
}

/// Rates whose interval times the capacity overflows 64 bits of
/// nanoseconds used to saturate the bucket's tolerance, and then every
/// call was admitted.
#[test]
fn buckets_with_huge_intervals_are_refused_or_limit() {
    for (capacity, rate) in [
        (2, Rate::per(1, Duration::MAX)),
        (3, Rate::per(1, YEAR * 300)),
        (10, Rate::per(1, YEAR * 100)),
        (2, Rate::per(2, Duration::MAX)),
    ] {
        let t = Instant::from_secs(1);
        let at_once: Vec<u64> = vec![t.as_nanos(); 1_000];
        for (kind, admitted) in admissions_of_every_bucket(capacity, rate, &at_once) {
            assert!(
                admitted <= u128::from(capacity),
                "{kind} bucket ({capacity}, {rate:?}) admitted {admitted} of 1000 at one instant"
            );
        }
        // Across the whole clock: no more than one refill per interval.
        let spread: Vec<u64> = (0..1_000u64).map(|i| i * (u64::MAX / 999)).collect();
        let (min, max) = span(&spread);
        for (kind, admitted) in admissions_of_every_bucket(capacity, rate, &spread) {
            let budget = bucket_budget(capacity, rate, min, max);
            assert!(
                admitted <= budget,
                "{kind} bucket ({capacity}, {rate:?}) admitted {admitted} over the clock's range, budget {budget}"
            );
        }
    }
}

/// Readings at or near the end of the clock used to saturate the settle
/// instant, which then never moved past them: every call was admitted.
#[test]
fn readings_at_the_end_of_the_clock_never_over_admit() {
    for (capacity, rate) in [
        (1, Rate::per_second(1)),
        (2, Rate::per_second(1)),
        (5, Rate::per(1, Duration::from_nanos(1))),
        (3, Rate::per(1, YEAR)),
    ] {
        let near = u64::MAX - 100;
        let cases: [(&str, Vec<u64>); 3] = [
            ("at Instant::MAX", vec![u64::MAX; 1_000]),
            (
                "100 ns before it, then at it",
                [vec![near; 500], vec![u64::MAX; 500]].concat(),
            ),
            (
                "at it, then 100 ns before it",
                [vec![u64::MAX; 500], vec![near; 500]].concat(),
            ),
        ];
        for (case, readings) in cases {
            let (min, max) = span(&readings);
            let budget = bucket_budget(capacity, rate, min, max);
            for (kind, admitted) in admissions_of_every_bucket(capacity, rate, &readings) {
                assert!(
                    admitted <= budget,
                    "{kind} bucket ({capacity}, {rate:?}) {case}: admitted {admitted}, budget {budget}"
                );
            }
        }
    }
}

/// A sliding window's forget-time `newest + window` used to saturate at
/// `Instant::MAX`, so a keyed table forgot a busy window at that reading
/// and the key started again.
#[test]
fn a_busy_window_is_not_forgotten_at_the_end_of_the_clock() {
    let window = SlidingWindow::<2>::new(Duration::from_secs(60), 2).unwrap();
    let mut table: Keyed<u8, SlidingWindow<2>, 1> = Keyed::new(window, FullPolicy::DenyNewKeys);
    let now = Instant::MAX;
    let mut admitted = 0;
    for round in 0..10 {
        admitted += (0..2).filter(|_| table.check(&1, now).is_allowed()).count();
        // Another key asks for the only slot at the same reading.
        let _ = table.check(&(2 + round), now);
    }
    assert!(
        admitted <= 2,
        "key 1 admitted {admitted} times at one instant, limit 2"
    );
}

/// A window longer than the clock (here `Duration::MAX`) must not let an
/// admission leave it at the clock's last reading.
#[test]
fn a_window_longer_than_the_clock_never_empties() {
    let mut l = Limiter::new(SlidingWindow::<2>::new(Duration::MAX, 2).unwrap());
    let readings = [0, 0, u64::MAX, u64::MAX, u64::MAX];
    let admitted = readings
        .iter()
        .filter(|&&t| l.check(Instant::from_nanos(t)).is_allowed())
        .count();
    assert_eq!(admitted, 2, "2 per Duration::MAX");
}

/// A key used at reading 10 s is forgotten by an insert at a later reading
/// (20 s, when it had settled); a call for it whose reading (10.5 s) was
/// taken before that insert, but arrives after it, must not find a new
/// bucket: the key would then get two admissions in half a second from a
/// bucket of one per second.
#[test]
fn a_key_forgotten_at_a_later_reading_is_not_new_at_an_earlier_one() {
    let bucket = TokenBucket::new(1, Rate::per_second(1)).unwrap();
    let mut table: Keyed<&str, TokenBucket, 2> = Keyed::new(bucket, FullPolicy::DenyNewKeys);
    let s = Instant::from_secs;
    assert!(table.check(&"busy", s(10)).is_allowed());
    assert!(table.check(&"idle", s(4)).is_allowed());
    // Both slots are taken; at 20 s "busy" has settled and makes room.
    assert!(table.check(&"other", s(20)).is_allowed());
    // The late call for "busy", read at 10.5 s.
    let late = table.check(&"busy", s(10) + Duration::from_millis(500));
    assert!(
        late.is_denied(),
        "busy admitted twice within 0.5 s from a bucket of 1 per second"
    );
    assert_eq!(late.retry_after(), Some(Duration::from_millis(500)));
}

/// The literal case: a key used at a late reading, then another key
/// inserted at an earlier one; the busy key keeps its state.
#[test]
fn an_insert_at_an_earlier_reading_never_resets_a_busy_key() {
    let bucket = TokenBucket::new(2, Rate::per_second(1)).unwrap();
    let mut table: Keyed<u32, TokenBucket, 1> = Keyed::new(bucket, FullPolicy::DenyNewKeys);
    let late = Instant::from_secs(100);
    assert!(table.check(&1, late).is_allowed());
    assert!(table.check(&1, late).is_allowed());
    let _ = table.check(&2, Instant::from_secs(50));
    assert!(table.check(&1, late).is_denied(), "key 1 got a new bucket");
}

/// A single reading a century ahead moves a bucket's state there: later
/// calls at ordinary readings are denied, each denial says how long (until
/// that reading), and forgetting the state recovers the key.
#[test]
fn a_far_future_reading_delays_a_key_until_then_and_says_so() {
    let bucket = TokenBucket::new(2, Rate::per_second(1)).unwrap();
    let t = Instant::from_secs(1_000);
    let far = t + YEAR * 100;
    let later = t + Duration::from_secs(10);
    // A token bucket of 2 per second admits at `far`, settling at far + 1 s;
    // a call is next admitted at far (one interval of tolerance).
    let wait = far.saturating_duration_since(later);

    let mut single = Limiter::new(bucket);
    assert!(single.check(t).is_allowed());
    assert!(single.check(far).is_allowed());
    assert_eq!(single.check(later).retry_after(), Some(wait));
    single.reset();
    assert!(single.check(later).is_allowed());

    let atomic = AtomicTokenBucket::new(bucket);
    assert!(atomic.check(far).is_allowed());
    assert_eq!(atomic.check(later).retry_after(), Some(wait));
    atomic.reset();
    assert!(atomic.check(later).is_allowed());

    let mut table: Keyed<u8, TokenBucket, 1> = Keyed::new(bucket, FullPolicy::DenyNewKeys);
    assert!(table.check(&1, far).is_allowed());
    assert_eq!(table.check(&1, later).retry_after(), Some(wait));
    // The far state keeps its slot: another key finds no room until then.
    assert_eq!(
        table.check(&2, later).retry_after(),
        Some(wait + Duration::from_secs(1))
    );
    assert!(table.forget(&1));
    assert!(table.check(&1, later).is_allowed());

    let shared: SharedKeyed<CriticalSectionRawMutex, u8, TokenBucket, 1> =
        SharedKeyed::new(Keyed::new(bucket, FullPolicy::DenyNewKeys));
    assert!(shared.check(&1, far).is_allowed());
    assert_eq!(shared.check(&1, later).retry_after(), Some(wait));
    assert!(shared.forget(&1));
    assert!(shared.check(&1, later).is_allowed());

    let window = SlidingWindow::<1>::new(Duration::from_secs(1), 1).unwrap();
    let mut log = Limiter::new(window);
    assert!(log.check(far).is_allowed());
    // Recorded at `far`, the admission leaves the window at far + 1 s.
    assert_eq!(
        log.check(later).retry_after(),
        Some(wait + Duration::from_secs(1))
    );
}

/// If a state settled far ahead is forgotten (an insert at a reading past
/// it), every key the table does not hold starts from that far instant:
/// such keys are denied at ordinary readings, saying until when, and
/// `clear` recovers the table.
#[test]
fn a_forgotten_far_future_state_holds_back_untracked_keys_until_cleared() {
    let bucket = TokenBucket::new(1, Rate::per_second(1)).unwrap();
    let mut table: Keyed<u8, TokenBucket, 1> = Keyed::new(bucket, FullPolicy::DenyNewKeys);
    let t = Instant::from_secs(1_000);
    let far = t + YEAR * 100;
    assert!(table.check(&1, far).is_allowed());
    // Key 2 at a reading after key 1 settled (far + 1 s) replaces it.
    assert!(table.check(&2, far + Duration::from_secs(2)).is_allowed());
    let d = table.check(&3, t);
    assert_eq!(
        d.retry_after(),
        Some(far.saturating_duration_since(t) + Duration::from_secs(1))
    );
    table.clear();
    assert!(table.check(&3, t).is_allowed());
}

/// At the end of the clock a bucket admits only what its state can record,
/// and at `Instant::MAX` nothing; a denial there asks to wait to the end of
/// the clock.
#[test]
fn at_the_end_of_the_clock_a_bucket_admits_only_what_it_can_record() {
    let bucket = TokenBucket::new(3, Rate::per_second(1)).unwrap();
    let mut l = Limiter::new(bucket);
    let near = Instant::MAX - Duration::from_secs(10);
    assert_eq!((0..10).filter(|_| l.check(near).is_allowed()).count(), 3);
    let d = l.check(near);
    assert_eq!(d.retry_after(), Some(Duration::from_secs(1)));
    // Eight more seconds refill... but no admission may settle past
    // BucketState::LATEST (one nanosecond before Instant::MAX).
    let end = Instant::MAX - Duration::from_secs(1);
    assert_eq!((0..10).filter(|_| l.check(end).is_allowed()).count(), 0);
    assert_eq!(
        l.check(end).retry_after(),
        Some(Duration::from_secs(1)),
        "until Instant::MAX"
    );
    let mut fresh = Limiter::new(bucket);
    assert!(fresh.check(Instant::MAX).is_denied());
    assert!(
        fresh
            .check(Instant::MAX - Duration::from_secs(1))
            .is_denied()
    );
    assert!(
        fresh
            .check(Instant::MAX - Duration::from_millis(1_000) - Duration::from_nanos(1))
            .is_allowed()
    );
}

// --- properties -----------------------------------------------------------

/// A period anywhere from a nanosecond to `Duration::MAX`, weighted
/// towards the edges of the 64-bit nanosecond range.
fn period() -> impl Strategy<Value = Duration> {
    prop_oneof![
        2 => (1u64..5_000_000_000).prop_map(Duration::from_nanos),
        2 => any::<u64>().prop_map(|n| Duration::from_nanos(n.max(1))),
        1 => (u64::MAX / 2..=u64::MAX).prop_map(Duration::from_nanos),
        1 => any::<u64>().prop_map(Duration::from_secs),
        1 => Just(Duration::MAX),
    ]
}

fn capacity() -> impl Strategy<Value = u32> {
    prop_oneof![4 => 1u32..5, 2 => 1u32..1_000, 1 => 1u32..=u32::MAX]
}

fn amount() -> impl Strategy<Value = u32> {
    prop_oneof![4 => 1u32..4, 1 => 1u32..=u32::MAX]
}

/// One reading: anywhere, near either end of the clock, or at it.
fn reading() -> impl Strategy<Value = u64> {
    prop_oneof![
        3 => any::<u64>(),
        2 => 0u64..10_000_000_000,
        2 => u64::MAX - 10_000_000_000..=u64::MAX,
        1 => Just(u64::MAX),
        1 => Just(0u64),
    ]
}

/// Readings, each repeated up to four times (bursts at one instant).
fn readings() -> impl Strategy<Value = Vec<u64>> {
    prop::collection::vec((reading(), 1usize..5), 1..80).prop_map(|v| {
        v.into_iter()
            .flat_map(|(t, n)| std::iter::repeat_n(t, n))
            .collect()
    })
}

/// Readings in the order given and sorted (a clock that only moves forward).
fn both_orders(readings: Vec<u64>) -> [Vec<u64>; 2] {
    let mut sorted = readings.clone();
    sorted.sort_unstable();
    [readings, sorted]
}

proptest! {
    // 512 cases unless PROPTEST_CASES asks for more (or fewer).
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(512),
        ..ProptestConfig::default()
    })]

    #[test]
    fn every_bucket_stays_within_its_budget_on_any_clock(
        capacity in capacity(),
        amount in amount(),
        period in period(),
        readings in readings(),
    ) {
        let rate = Rate::per(amount, period);
        for readings in both_orders(readings) {
            let (min, max) = span(&readings);
            let budget = bucket_budget(capacity, rate, min, max);
            for (kind, admitted) in admissions_of_every_bucket(capacity, rate, &readings) {
                prop_assert!(
                    admitted <= budget,
                    "{} bucket ({}, {:?}): {} admitted, budget {}", kind, capacity, rate, admitted, budget
                );
            }
        }
    }

    /// Many keys in a table small enough that they evict each other, on
    /// readings in any order: each key, taken alone, stays within the
    /// budget of its own readings.
    #[test]
    fn every_key_of_a_keyed_table_stays_within_its_budget(
        capacity in prop_oneof![1u32..4, capacity()],
        amount in amount(),
        period in period(),
        calls in prop::collection::vec((0u8..6, reading(), 1usize..4), 1..120),
    ) {
        let rate = Rate::per(amount, period);
        let Ok(bucket) = TokenBucket::new(capacity, rate) else { return Ok(()); };
        for ordered in [false, true] {
            let mut calls = calls.clone();
            if ordered {
                calls.sort_by_key(|c| c.1);
            }
            let mut deny: Keyed<u8, TokenBucket, 4> = Keyed::new(bucket, FullPolicy::DenyNewKeys);
            let mut overflow: Keyed<u8, TokenBucket, 4> = Keyed::new(bucket, FullPolicy::SharedOverflow);
            let mut per_key: HashMap<u8, (u64, u64, u128, u128)> = HashMap::new();
            for &(key, t, repeat) in &calls {
                for _ in 0..repeat {
                    let now = Instant::from_nanos(t);
                    let e = per_key.entry(key).or_insert((t, t, 0, 0));
                    e.0 = e.0.min(t);
                    e.1 = e.1.max(t);
                    e.2 += u128::from(deny.check(&key, now).is_allowed());
                    e.3 += u128::from(overflow.check(&key, now).is_allowed());
                }
            }
            let all = span(&calls.iter().map(|c| c.1).collect::<Vec<_>>());
            let mut over_own_budgets = 0u128;
            for (key, (min, max, denied_table, overflow_table)) in per_key {
                let budget = bucket_budget(capacity, rate, min, max);
                prop_assert!(
                    denied_table <= budget,
                    "key {} ({}, {:?}): {} admitted, budget {}", key, capacity, rate, denied_table, budget
                );
                over_own_budgets += overflow_table.saturating_sub(budget);
            }
            // Crowded-out keys together get at most one key's allowance.
            let shared = bucket_budget(capacity, rate, all.0, all.1);
            prop_assert!(
                over_own_budgets <= shared,
                "shared overflow let keys exceed their own budgets by {}, more than {}", over_own_budgets, shared
            );
        }
    }

    #[test]
    fn sliding_windows_stay_within_their_budget_on_any_clock(
        limit in 1u32..5,
        window in period(),
        calls in prop::collection::vec((0u8..6, reading(), 1usize..4), 1..100),
    ) {
        let Ok(algorithm) = SlidingWindow::<4>::new(window, limit) else { return Ok(()); };
        for ordered in [false, true] {
            let mut calls = calls.clone();
            if ordered {
                calls.sort_by_key(|c| c.1);
            }
            let mut single = Limiter::new(algorithm);
            let mut table: Keyed<u8, SlidingWindow<4>, 4> = Keyed::new(algorithm, FullPolicy::DenyNewKeys);
            let mut per_key: HashMap<u8, (u64, u64, u128)> = HashMap::new();
            let mut single_admitted = 0u128;
            for &(key, t, repeat) in &calls {
                for _ in 0..repeat {
                    let now = Instant::from_nanos(t);
                    single_admitted += u128::from(single.check(now).is_allowed());
                    let e = per_key.entry(key).or_insert((t, t, 0));
                    e.0 = e.0.min(t);
                    e.1 = e.1.max(t);
                    e.2 += u128::from(table.check(&key, now).is_allowed());
                }
            }
            let all = span(&calls.iter().map(|c| c.1).collect::<Vec<_>>());
            let budget = window_budget(limit, window, all.0, all.1);
            prop_assert!(single_admitted <= budget, "one window: {} admitted, budget {}", single_admitted, budget);
            for (key, (min, max, admitted)) in per_key {
                let budget = window_budget(limit, window, min, max);
                prop_assert!(admitted <= budget, "key {}: {} admitted, budget {}", key, admitted, budget);
            }
        }
    }

    /// Where a table's slots live changes no decision: tables over boxed
    /// slots and over a borrowed array decide every call, purge and forget
    /// exactly as the inline table does, with the same counters, under
    /// either policy and on readings in any order.
    #[test]
    fn a_keyed_table_decides_alike_wherever_its_slots_live(
        capacity in 1u32..4,
        amount in amount(),
        period in period(),
        shared_overflow in any::<bool>(),
        calls in prop::collection::vec((0u8..24, reading(), 0u8..8), 1..150),
    ) {
        let Ok(bucket) = TokenBucket::new(capacity, Rate::per(amount, period)) else { return Ok(()); };
        let policy = if shared_overflow { FullPolicy::SharedOverflow } else { FullPolicy::DenyNewKeys };
        let mut inline: Keyed<u8, TokenBucket, 16> = Keyed::new(bucket, policy);
        let boxed_slots: Box<KeyedSlots<u8, TokenBucket, 16>> = Box::new([const { KeyedSlot::EMPTY }; 16]);
        let mut boxed = Keyed::with_storage(bucket, policy, boxed_slots);
        let mut array: KeyedSlots<u8, TokenBucket, 16> = [const { KeyedSlot::EMPTY }; 16];
        let mut borrowed = Keyed::with_storage(bucket, policy, &mut array);
        for &(key, t, action) in &calls {
            let now = Instant::from_nanos(t);
            match action {
                0 => {
                    let purged = inline.purge(now);
                    prop_assert_eq!(boxed.purge(now), purged);
                    prop_assert_eq!(borrowed.purge(now), purged);
                }
                1 => {
                    let forgot = inline.forget(&key);
                    prop_assert_eq!(boxed.forget(&key), forgot);
                    prop_assert_eq!(borrowed.forget(&key), forgot);
                }
                _ => {
                    let decision = inline.check(&key, now);
                    prop_assert_eq!(boxed.check(&key, now), decision);
                    prop_assert_eq!(borrowed.check(&key, now), decision);
                }
            }
            prop_assert_eq!(boxed.len(), inline.len());
            prop_assert_eq!(borrowed.len(), inline.len());
        }
        prop_assert_eq!(boxed.stats(), inline.stats());
        prop_assert_eq!(borrowed.stats(), inline.stats());
        for key in 0..24u8 {
            prop_assert_eq!(boxed.state(&key), inline.state(&key));
            prop_assert_eq!(borrowed.state(&key), inline.state(&key));
        }
    }
}
