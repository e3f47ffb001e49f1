//! loom models of guard-core's lock-free type: run with
//! `RUSTFLAGS="--cfg guard_loom" cargo test -p guard-core --test loom`
//! (the test script does, with a bounded number of preemptions).
#![cfg(guard_loom)]

use std::sync::Arc;
use std::time::Duration;

use guard_core::limit::{AtomicTokenBucket, Rate, TokenBucket};
use guard_core::time::Instant;
use loom::thread;

/// Three threads race for a bucket of two tokens at one instant: in every
/// interleaving exactly two are admitted.
#[test]
fn concurrent_admissions_never_exceed_the_tokens_available() {
    loom::model(|| {
        let bucket = Arc::new(AtomicTokenBucket::new(
            TokenBucket::new(2, Rate::per_second(1)).unwrap(),
        ));
        let now = Instant::from_secs(5);
        let threads: Vec<_> = (0..3)
            .map(|_| {
                let bucket = bucket.clone();
                thread::spawn(move || bucket.check(now).is_allowed())
            })
            .collect();
        let admitted = threads
            .into_iter()
            .map(|t| t.join().unwrap())
            .filter(|a| *a)
            .count();
        assert_eq!(admitted, 2);
        assert_eq!(bucket.available(now), 0);
    });
}

/// Threads whose clock readings straddle a refill: whatever the order in
/// which their compare-and-swaps land, admissions stay within the tokens
/// the bucket held at the latest instant seen, and the state never moves
/// backwards.
#[test]
fn admissions_across_a_refill_stay_within_the_budget() {
    loom::model(|| {
        let bucket = Arc::new(AtomicTokenBucket::new(
            TokenBucket::new(1, Rate::per(1, Duration::from_secs(1))).unwrap(),
        ));
        let t0 = Instant::from_secs(10);
        assert!(bucket.check(t0).is_allowed());
        let times = [t0, t0 + Duration::from_secs(1), t0 + Duration::from_secs(1)];
        let threads: Vec<_> = times
            .into_iter()
            .map(|t| {
                let bucket = bucket.clone();
                thread::spawn(move || bucket.check(t).is_allowed())
            })
            .collect();
        let admitted = threads
            .into_iter()
            .map(|t| t.join().unwrap())
            .filter(|a| *a)
            .count();
        // One refill happened between t0 and t0 + 1 s: one more admission.
        assert_eq!(admitted, 1);
        assert!(bucket.state().settles_at() >= t0 + Duration::from_secs(2));
    });
}
