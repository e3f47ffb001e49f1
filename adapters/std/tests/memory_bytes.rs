//! A memory limiter's table stays within its byte budget however long the
//! keys a client sends, and a long key is still limited as itself.

use std::sync::Mutex;
use std::time::Duration;

use guard_core::limit::{FullPolicy, Rate, SlidingWindow, TokenBucket};
use guard_std::ratelimit::{MAX_KEY_LEN, MemoryLimiter, RateLimiter, SHARD_KEYS, STORED_KEY_LEN};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

/// Counts the bytes asked of the allocator.
#[global_allocator]
static ALLOCATOR: &StatsAlloc<std::alloc::System> = &INSTRUMENTED_SYSTEM;

/// The tests of this file one at a time, so that one's allocations never
/// count in another's measure.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// The bytes asked of the allocator since `region` began and not given
/// back.
fn grown(region: &Region<'_, std::alloc::System>) -> usize {
    let change = region.change();
    (change.bytes_allocated as isize - change.bytes_deallocated as isize + change.bytes_reallocated)
        as usize
}

fn bucket() -> TokenBucket {
    TokenBucket::new(1, Rate::per(1, Duration::from_secs(3600))).unwrap()
}

/// A distinct key of exactly `len` bytes, in one allocation of its own
/// size (so that the measure sees it given back whole).
fn key(i: usize, len: usize) -> String {
    let mut key = String::with_capacity(len);
    let mut digits = i;
    for _ in 0..8 {
        key.push(char::from(b'0' + (digits % 10) as u8));
        digits /= 10;
    }
    key.extend(std::iter::repeat_n('k', len - key.len()));
    key
}

#[test]
fn a_flood_of_the_longest_keys_stays_within_the_byte_budget() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let region = Region::new(ALLOCATOR);
    let limiter = MemoryLimiter::new(bucket(), 2 * SHARD_KEYS, FullPolicy::DenyNewKeys);
    // Ten times the table's keys, each as long as any limiter takes: kept
    // as they came, their text alone would be 2 MiB.
    for i in 0..10 * limiter.capacity() {
        let _ = limiter.check_now(&key(i, MAX_KEY_LEN));
    }
    let grown = grown(&region);
    let held = limiter.keys_held().unwrap();
    eprintln!(
        "{} keys held of {}: {grown} bytes asked of the allocator, budget {} ({} a key)",
        held.held,
        held.capacity,
        held.max_bytes,
        MemoryLimiter::<TokenBucket>::bytes_per_key()
    );
    assert!(
        held.held >= limiter.capacity() * 8 / 10,
        "the flood filled the table: {} of {}",
        held.held,
        held.capacity
    );
    assert!(
        grown <= held.max_bytes,
        "{grown} bytes against a budget of {}",
        held.max_bytes
    );
    assert!(
        held.max_bytes < limiter.capacity() * MAX_KEY_LEN / 4,
        "the budget is far below the keys' own text"
    );
}

#[test]
fn the_budget_holds_for_a_sliding_window_too() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let window = SlidingWindow::<16>::new(Duration::from_secs(60), 10).unwrap();
    let region = Region::new(ALLOCATOR);
    let limiter = MemoryLimiter::new(window, SHARD_KEYS, FullPolicy::DenyNewKeys);
    for i in 0..5 * limiter.capacity() {
        let _ = limiter.check_now(&key(i, 3 * STORED_KEY_LEN));
    }
    let grown = grown(&region);
    assert!(
        grown <= limiter.max_bytes(),
        "{grown} > {}",
        limiter.max_bytes()
    );
}

#[test]
fn keys_stored_as_they_are_at_the_longest_stay_within_the_budget_too() {
    // The worst case for the text: every key exactly as long as a key
    // stored as it is (a longer one costs only its hash).
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let region = Region::new(ALLOCATOR);
    let limiter = MemoryLimiter::new(bucket(), 2 * SHARD_KEYS, FullPolicy::DenyNewKeys);
    for i in 0..10 * limiter.capacity() {
        let _ = limiter.check_now(&key(i, STORED_KEY_LEN));
    }
    let grown = grown(&region);
    assert!(
        limiter.len() >= limiter.capacity() * 8 / 10,
        "the flood filled the table: {}",
        limiter.len()
    );
    assert!(
        grown <= limiter.max_bytes(),
        "{grown} > {}",
        limiter.max_bytes()
    );
}

#[test]
fn keys_within_a_size_build_a_table_of_at_most_that_size() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let bytes = 3 * 1024 * 1024 + 12_345;
    let keys = MemoryLimiter::<TokenBucket>::keys_within(bytes);
    assert!(
        keys >= SHARD_KEYS && keys.is_multiple_of(SHARD_KEYS),
        "{keys}"
    );
    let limiter = MemoryLimiter::new(bucket(), keys, FullPolicy::DenyNewKeys);
    assert_eq!(limiter.capacity(), keys);
    assert!(limiter.max_bytes() <= bytes);
    // One more shard would not fit.
    assert!(
        (keys + SHARD_KEYS) * MemoryLimiter::<TokenBucket>::bytes_per_key() > bytes,
        "{keys} keys is the most"
    );
    assert_eq!(MemoryLimiter::<TokenBucket>::keys_within(1000), 0);
}

#[test]
fn a_long_key_is_limited_as_itself() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let limiter = MemoryLimiter::new(bucket(), SHARD_KEYS, FullPolicy::DenyNewKeys);
    // Two long keys that differ only in their last byte, and the short
    // keys their stored forms could be mistaken for.
    let long = "x".repeat(STORED_KEY_LEN * 4);
    let other = format!("{}y", &long[..long.len() - 1]);
    assert!(limiter.check_now(&long).is_allowed());
    assert!(!limiter.check_now(&long).is_allowed(), "the same long key");
    assert!(limiter.check_now(&other).is_allowed(), "another long key");
    assert!(!limiter.check_now(&other).is_allowed());
    assert!(limiter.check_now(&long[..STORED_KEY_LEN]).is_allowed());
    assert!(limiter.check_now(&long[..STORED_KEY_LEN + 1]).is_allowed());
    assert!(limiter.check_now("\0").is_allowed());
    // A key at the bound is stored as it is, one byte over as its hash:
    // both decide as themselves.
    assert!(!limiter.check_now(&long[..STORED_KEY_LEN]).is_allowed());
    assert!(!limiter.check_now(&long[..STORED_KEY_LEN + 1]).is_allowed());
}

#[test]
fn two_limiters_hash_long_keys_under_secrets_of_their_own() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    // Each limiter's secret is its own: a long key exhausted in one is
    // fresh in another, and in each it stays limited.
    let long = "z".repeat(500);
    let a = MemoryLimiter::new(bucket(), SHARD_KEYS, FullPolicy::DenyNewKeys);
    let b = MemoryLimiter::new(bucket(), SHARD_KEYS, FullPolicy::DenyNewKeys);
    assert!(a.check_now(&long).is_allowed());
    assert!(b.check_now(&long).is_allowed());
    assert!(!a.check_now(&long).is_allowed());
    assert!(!b.check_now(&long).is_allowed());
}
