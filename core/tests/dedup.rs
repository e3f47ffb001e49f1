//! The windowed deduplicator and the Bloom filter (B3, B9), with property
//! tests against a map model and for the Bloom filter's no-false-negative
//! guarantee.

use std::collections::HashMap;
use std::time::Duration;

use guard_core::dedup::{
    BloomError, BloomFilter, BloomParams, CapacityExceeded, Deduplicator, SecretHashState,
    WindowedDeduplicator, ZeroWindow,
};
use guard_core::time::Instant;
use proptest::prelude::*;

const T: Instant = Instant::from_secs(1_000);

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

fn windowed<const N: usize>(window: Duration) -> WindowedDeduplicator<u64, N> {
    WindowedDeduplicator::new(window).unwrap()
}

#[test]
fn a_zero_window_is_refused() {
    assert_eq!(
        WindowedDeduplicator::<u64, 8>::new(Duration::ZERO).unwrap_err(),
        ZeroWindow
    );
    assert_eq!(
        ZeroWindow.to_string(),
        "deduplication window must be positive (got 0)"
    );
}

#[test]
fn an_item_exactly_window_old_is_not_a_duplicate() {
    let mut d = windowed::<8>(secs(30));
    assert_eq!(d.check_and_mark(&1, T), Ok(false));
    assert!(d.is_duplicate(&1, T + secs(30) - Duration::from_nanos(1)));
    assert!(!d.is_duplicate(&1, T + secs(30)), "open boundary");
    assert_eq!(d.check_and_mark(&1, T + secs(30)), Ok(false));
}

#[test]
fn a_duplicate_inside_the_window_refreshes_last_seen() {
    let mut d = windowed::<8>(secs(30));
    assert_eq!(d.check_and_mark(&1, T), Ok(false));
    assert_eq!(d.check_and_mark(&1, T + secs(20)), Ok(true));
    // The window restarted at T + 20 s.
    assert!(d.is_duplicate(&1, T + secs(49)));
    assert!(!d.is_duplicate(&1, T + secs(50)));
}

#[test]
fn is_duplicate_changes_nothing_and_mark_as_seen_marks() {
    let mut d = windowed::<8>(secs(30));
    assert!(!d.is_duplicate(&5, T));
    assert!(!d.is_duplicate(&5, T));
    assert_eq!(d.unique_count(T), 0);
    d.mark_as_seen(&5, T).unwrap();
    assert!(d.is_duplicate(&5, T));
    assert_eq!(d.check_and_mark(&5, T), Ok(true));
    assert_eq!(d.unique_count(T), 1);
}

#[test]
fn items_expire_while_traffic_on_other_items_continues() {
    let mut d = windowed::<64>(Duration::from_millis(300));
    d.mark_as_seen(&0, T).unwrap();
    for i in 1..=70u64 {
        d.mark_as_seen(&(i % 7 + 100), T + Duration::from_millis(i * 10))
            .unwrap();
    }
    let end = T + Duration::from_millis(700);
    assert!(!d.is_duplicate(&0, end), "A expired");
    assert!(d.unique_count(end) <= 8);
    assert_eq!(d.unique_count(T + secs(5)), 0);
}

#[test]
fn a_full_deduplicator_reuses_expired_slots_and_refuses_when_none_has_expired() {
    let mut d = windowed::<8>(secs(10));
    for i in 0..8 {
        assert_eq!(d.check_and_mark(&i, T), Ok(false));
    }
    assert_eq!(d.check_and_mark(&100, T + secs(5)), Err(CapacityExceeded));
    assert!(
        !d.is_duplicate(&100, T + secs(5)),
        "refused items are not remembered"
    );
    for i in 0..8 {
        assert!(d.is_duplicate(&i, T + secs(5)), "live items are kept");
    }
    assert_eq!(
        d.check_and_mark(&100, T + secs(10)),
        Ok(false),
        "an expired slot is reused"
    );
    assert!(d.is_duplicate(&100, T + secs(10)));
}

#[test]
fn a_backwards_clock_never_shortens_a_window() {
    let mut d = windowed::<8>(secs(10));
    d.mark_as_seen(&1, T).unwrap();
    assert_eq!(d.check_and_mark(&1, T - secs(100)), Ok(true));
    assert!(d.is_duplicate(&1, T + secs(9)), "last seen stays at T");
}

#[test]
fn clear_purge_and_forget() {
    let mut d = windowed::<8>(secs(10));
    for i in 0..4 {
        d.mark_as_seen(&i, T + secs(i)).unwrap();
    }
    assert_eq!(d.purge(T + secs(12)), 3, "items 0..=2 have expired");
    assert!(d.forget(&3));
    assert!(!d.forget(&3));
    d.mark_as_seen(&9, T).unwrap();
    d.clear();
    assert_eq!(d.unique_count(T), 0);
}

#[test]
fn bloom_sizing_is_validated() {
    assert_eq!(
        BloomParams::for_capacity(0, 0.03),
        Err(BloomError::ZeroExpectedInsertions)
    );
    for p in [0.0, 1.0, -0.1, 1.5, f64::NAN] {
        assert_eq!(
            BloomParams::for_capacity(1000, p),
            Err(BloomError::FalsePositiveRateOutOfRange),
            "{p}"
        );
    }
    assert!(BloomParams::for_capacity(1000, 0.000_001).is_ok());
    assert!(BloomParams::for_capacity(1000, 0.9999).is_ok());
    assert_eq!(BloomParams::DEFAULT_FALSE_POSITIVE_RATE, 0.03);
    let p = BloomParams::for_capacity(1_000_000, 0.03).unwrap();
    // The textbook figures: about 7.3 bits per item and 5 hash functions.
    assert_eq!((p.bits, p.hashes), (7_298_441, 5));
    assert_eq!(
        BloomFilter::<4>::new(0).unwrap_err(),
        BloomError::HashesOutOfRange { hashes: 0 }
    );
    assert!(BloomFilter::<4>::new(33).is_err());
    assert_eq!(
        BloomFilter::<4>::with_params(p).unwrap_err().to_string(),
        "filter has 256 bits but the parameters need 7298441"
    );
}

#[test]
fn bloom_counts_only_new_marks_and_clear_resets() {
    let mut b: BloomFilter<64> = BloomFilter::new(4).unwrap();
    assert_eq!(b.check_and_mark("b", T), Ok(false));
    assert_eq!(b.check_and_mark("b", T), Ok(true));
    assert!(!b.is_duplicate("c", T));
    assert_eq!(b.unique_count(), 1, "is_duplicate does not mark");
    assert_eq!(b.check_and_mark("c", T), Ok(false));
    assert_eq!(b.unique_count(), 2);
    b.clear();
    assert_eq!(b.unique_count(), 0);
    assert!(!b.is_duplicate("b", T));
    assert_eq!(b.check_and_mark("b", T), Ok(false), "usable after clear");
}

#[test]
fn bloom_false_positive_rate_stays_near_the_sizing() {
    let params = BloomParams::for_capacity(2_000, 0.01).unwrap();
    let mut b: BloomFilter<300> = BloomFilter::with_params(params).unwrap();
    for i in 0..2_000u64 {
        b.mark_as_seen(&i, T).unwrap();
    }
    let false_positives = (1_000_000..1_100_000u64)
        .filter(|i| b.is_duplicate(i, T))
        .count();
    assert!(
        false_positives < 2_000,
        "{false_positives} false positives in 100,000"
    );
}

#[test]
fn a_keyed_bloom_filter_keeps_its_rate_and_replicas_sharing_the_key_decide_alike() {
    let params = BloomParams::for_capacity(2_000, 0.01).unwrap();
    let key = [0x5a; 16];
    let mut a: BloomFilter<300, SecretHashState> = BloomFilter::with_key(params, key).unwrap();
    let mut b: BloomFilter<300, SecretHashState> = BloomFilter::with_key(params, key).unwrap();
    let mut other: BloomFilter<300, SecretHashState> =
        BloomFilter::with_key(params, [0xa5; 16]).unwrap();
    for i in 0..2_000u64 {
        assert_eq!(a.check_and_mark(&i, T), b.check_and_mark(&i, T));
        other.mark_as_seen(&i, T).unwrap();
    }
    let probes = 1_000_000..1_100_000u64;
    let false_positives = probes.clone().filter(|i| a.is_duplicate(i, T)).count();
    assert!(false_positives < 2_000, "{false_positives} in 100,000");
    assert!(
        probes
            .clone()
            .all(|i| a.is_duplicate(&i, T) == b.is_duplicate(&i, T))
    );
    // Another key puts items on other bits: the false positives differ.
    let disagree = probes
        .filter(|i| a.is_duplicate(i, T) != other.is_duplicate(i, T))
        .count();
    assert!(disagree > 0, "another key, other bits");
    assert!(!format!("{a:?}").contains("5a"), "the key is never shown");
}

proptest! {
    /// Against a map of last-seen instants (room for every item).
    #[test]
    fn windowed_matches_a_map_model(
        window_ms in 1u64..5_000,
        calls in prop::collection::vec((0u64..40, 0u64..1_000, any::<bool>()), 1..300),
    ) {
        let window = Duration::from_millis(window_ms);
        let mut real: WindowedDeduplicator<u64, 64> = WindowedDeduplicator::new(window).unwrap();
        let mut model: HashMap<u64, Instant> = HashMap::new();
        let mut now = T;
        for (item, step_ms, mark) in calls {
            now = now + Duration::from_millis(step_ms);
            let dup = model.get(&item).is_some_and(|&seen| now.saturating_duration_since(seen) < window);
            prop_assert_eq!(real.is_duplicate(&item, now), dup);
            if mark {
                prop_assert_eq!(real.check_and_mark(&item, now), Ok(dup));
                model.insert(item, now);
            }
            let live = model.values().filter(|&&seen| now.saturating_duration_since(seen) < window).count();
            prop_assert_eq!(real.unique_count(now), live);
        }
    }

    /// A marked item is always found.
    #[test]
    fn bloom_has_no_false_negatives(items in prop::collection::vec(any::<u64>(), 1..500), hashes in 1u32..=32) {
        let mut b: BloomFilter<16> = BloomFilter::new(hashes).unwrap();
        for i in &items {
            b.mark_as_seen(i, T).unwrap();
        }
        for i in &items {
            prop_assert!(b.is_duplicate(i, T));
            prop_assert_eq!(b.check_and_mark(i, T), Ok(true));
        }
    }
}
