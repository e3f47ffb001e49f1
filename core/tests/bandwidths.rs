//! Several bandwidths on one key: on any trace of readings (in order) and
//! costs, every bandwidth's bound holds, a refusal counts nowhere, its wait
//! is exact, and the decisions are those of the bandwidths judged one by
//! one with only the requests all of them admitted counted.

use std::time::Duration;

use guard_core::limit::{
    Algorithm, Bandwidths, FullPolicy, Keyed, Limiter, Rate, SlidingWindow, TokenBucket,
};
use guard_core::time::Instant;
use proptest::prelude::*;

/// (capacity, period in ms) of three token buckets.
fn buckets() -> impl Strategy<Value = [(u32, u64); 3]> {
    [
        (1u32..8, 1u64..2_000),
        (1u32..40, 1u64..60_000),
        (1u32..200, 1u64..600_000),
    ]
}

fn policy(params: [(u32, u64); 3]) -> Bandwidths<TokenBucket, 3> {
    Bandwidths::new(params.map(|(capacity, period_ms)| {
        TokenBucket::new(
            capacity,
            Rate::per(capacity, Duration::from_millis(period_ms)),
        )
        .unwrap()
    }))
}

/// A trace: (milliseconds since the last request, cost).
fn trace() -> impl Strategy<Value = Vec<(u64, u32)>> {
    prop::collection::vec((0u64..500, 0u32..4), 1..300)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// The decisions equal the bandwidths judged one by one, each on a
    /// copy, the copies kept only when all admitted; each bandwidth's own
    /// budget (`capacity + span / interval`) is never passed.
    #[test]
    fn every_bound_holds_and_a_refusal_counts_nowhere(params in buckets(), trace in trace()) {
        let p = policy(params);
        let mut key = Limiter::new(p);
        let mut model = p.limits().map(Limiter::new);
        let start = Instant::from_secs(1_000);
        let mut now = start;
        let mut admitted_units = 0u64;
        for (gap, cost) in trace {
            now = now + Duration::from_millis(gap);
            let got = key.check_n(cost, now);
            let mut trial = model.clone();
            let each: Vec<_> = trial.iter_mut().map(|l| l.check_n(cost, now)).collect();
            if let Some(Err(e)) = each.iter().find(|r| r.is_err()) {
                prop_assert_eq!(got, Err(*e));
                continue;
            }
            let all = each.iter().all(|r| r.as_ref().is_ok_and(|r| r.is_allowed()));
            let got = got.unwrap();
            prop_assert_eq!(got.is_allowed(), all);
            if all {
                model = trial;
                admitted_units += u64::from(cost);
            }
            for (l, s) in model.iter().zip(key.state()) {
                prop_assert_eq!(l.state(), s, "the states agree");
            }
        }
        let span = now.saturating_duration_since(start).as_nanos();
        for bucket in p.limits() {
            let interval = bucket.interval().as_nanos();
            let budget = u128::from(bucket.capacity()) + span / interval;
            prop_assert!(u128::from(admitted_units) <= budget);
        }
    }

    /// After a refusal the same request is admitted exactly when its wait
    /// is over: not a nanosecond before.
    #[test]
    fn a_refusals_wait_is_exact(params in buckets(), trace in trace(), cost in 1u32..4) {
        let p = policy(params);
        let mut state = Bandwidths::<TokenBucket, 3>::NEW_STATE;
        let mut now = Instant::from_secs(1_000);
        for (gap, c) in trace {
            now = now + Duration::from_millis(gap);
            let _ = p.check_n(&mut state, c, now);
        }
        if cost > p.limit() {
            return Ok(());
        }
        let mut probe = state;
        let report = p.check_n(&mut probe, cost, now).unwrap();
        if let Some(wait) = report.retry_after() {
            let mut early = state;
            let before = now + wait - Duration::from_nanos(1);
            prop_assert!(p.check_n(&mut early, cost, before).unwrap().is_denied());
            let mut on_time = state;
            prop_assert!(p.check_n(&mut on_time, cost, now + wait).unwrap().is_allowed());
        }
    }
}

/// "10 a second and 1,000 an hour" for many keys in one bounded table:
/// a key that keeps to 10 a second is stopped once it has had its 1,000,
/// and another key is not.
#[test]
fn ten_a_second_and_a_thousand_an_hour_in_a_keyed_table() {
    let policy = Bandwidths::new([
        TokenBucket::new(10, Rate::per_second(10)).unwrap(),
        TokenBucket::new(1_000, Rate::per(1_000, Duration::from_secs(3_600))).unwrap(),
    ]);
    let mut table: Keyed<u32, _, 64> = Keyed::new(policy, FullPolicy::DenyNewKeys);
    let mut now = Instant::from_secs(10);
    let mut admitted = 0;
    // Ten a second for 110 s: 1,100 asked.
    for _ in 0..110 {
        for _ in 0..10 {
            admitted += usize::from(table.check(&7, now).is_allowed());
        }
        now = now + Duration::from_secs(1);
    }
    // The hour's bucket refills 1,000 an hour: 30 more in those 110 s.
    assert_eq!(admitted, 1_030);
    assert!(table.check(&8, now).is_allowed(), "another key is new");
    let refused = table.check(&7, now);
    assert!(refused.retry_after().unwrap() > Duration::from_secs(1));
}

/// Bandwidths of sliding windows: at most 2 a second and 3 in ten seconds.
#[test]
fn sliding_windows_keep_every_bound() {
    let policy = Bandwidths::new([
        SlidingWindow::<8>::new(Duration::from_secs(1), 2).unwrap(),
        SlidingWindow::<8>::new(Duration::from_secs(10), 3).unwrap(),
    ]);
    let mut key = Limiter::new(policy);
    let t = Instant::from_secs(50);
    let admitted: Vec<u64> = (0..40)
        .map(|i| t + Duration::from_millis(250 * i))
        .filter(|&at| key.check(at).is_allowed())
        .map(|at| at.saturating_duration_since(t).as_millis() as u64)
        .collect();
    // Two at once, a third after a second, then the ten seconds are full
    // until the first two leave at 10 s.
    assert_eq!(admitted, vec![0, 250, 1_000]);
}
