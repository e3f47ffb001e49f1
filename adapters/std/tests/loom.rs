//! loom models of guard-std's shared types, exactly as written (their
//! mutex is loom's under `--cfg guard_loom`):
//! `RUSTFLAGS="--cfg guard_loom" cargo test -p guard-std --test loom`.
#![cfg(guard_loom)]

use std::sync::Arc;
use std::time::Duration;

use guard_core::guard::ActiveConfig;
use guard_core::limit::{FullPolicy, Rate, TokenBucket};
use guard_core::lock::{Ttl, UnlockError};
use guard_core::slot::UnixMillis;
use guard_core::time::Instant;
use guard_std::metered::MeteredDeadLetterQueue;
use guard_std::ratelimit::MemoryLimiter;
use guard_std::{LocalLocker, ManualClock};
use loom::thread;

/// Three threads race for one key: exactly one wins, a loser cannot
/// unlock it, the holder can, and then the key is free.
#[test]
fn local_locker_has_exactly_one_winner_and_only_the_holder_unlocks() {
    let _ = ActiveConfig::new(); // the guard types link under loom too
    loom::model(|| {
        let locker = Arc::new(LocalLocker::new());
        let ttl = Ttl::from_secs(3600).unwrap();
        let threads: Vec<_> = (0..3)
            .map(|_| {
                let locker = locker.clone();
                thread::spawn(move || locker.try_lock_now("k", ttl))
            })
            .collect();
        let tokens: Vec<_> = threads
            .into_iter()
            .filter_map(|t| t.join().unwrap())
            .collect();
        assert_eq!(tokens.len(), 1, "exactly one winner");
        let other = locker.try_lock_now("other", ttl).unwrap();
        assert_eq!(locker.unlock_now("k", &other), Err(UnlockError::NotHeld));
        assert!(locker.unlock_now("k", &tokens[0]).is_ok());
        assert!(locker.try_lock_now("k", ttl).is_some());
    });
}

/// Two producers add two elements each to a queue of two while a consumer
/// polls: never above capacity, nothing lost, FIFO per producer, every
/// refusal handed back.
#[test]
fn the_shared_dead_letter_queue_never_loses_or_reorders() {
    loom::model(|| {
        let dlq: Arc<MeteredDeadLetterQueue<(u8, u8), (), 2>> =
            Arc::new(MeteredDeadLetterQueue::new("loom"));
        let producers: Vec<_> = (0..2u8)
            .map(|p| {
                let dlq = dlq.clone();
                thread::spawn(move || {
                    let mut refused = Vec::new();
                    for i in 0..2u8 {
                        if let Err(back) = dlq.add((p, i), None, 1, Instant::ZERO) {
                            refused.push(back.into_element());
                        }
                    }
                    refused
                })
            })
            .collect();
        let consumer = {
            let dlq = dlq.clone();
            thread::spawn(move || {
                let polled = dlq.poll().map(|f| f.into_element());
                assert!(dlq.len() <= 2);
                polled
            })
        };
        let refused: Vec<(u8, u8)> = producers
            .into_iter()
            .flat_map(|t| t.join().unwrap())
            .collect();
        let mut seen: Vec<(u8, u8)> = consumer.join().unwrap().into_iter().collect();
        while let Some(f) = dlq.poll() {
            seen.push(f.into_element());
        }
        assert!(seen.len() <= 3, "at most two held plus one polled");
        assert_eq!(
            seen.len() + refused.len(),
            4,
            "nothing lost: {seen:?} + refused {refused:?}"
        );
        for p in 0..2 {
            let order: Vec<u8> = seen
                .iter()
                .filter(|(q, _)| *q == p)
                .map(|(_, i)| *i)
                .collect();
            assert!(
                order.windows(2).all(|w| w[0] < w[1]),
                "FIFO per producer: {seen:?}"
            );
        }
    });
}

/// Three threads on one key of the shared keyed limiter: exactly the
/// bucket's capacity is admitted.
#[test]
fn the_shared_keyed_limiter_admits_exactly_its_capacity() {
    // Small shards: loom's threads have small stacks, and a shard is built
    // on the stack before it is boxed.
    loom::model(|| {
        let limiter: Arc<MemoryLimiter<_, _, 8>> = Arc::new(MemoryLimiter::with_clock(
            TokenBucket::new(2, Rate::per(1, Duration::from_secs(60))).unwrap(),
            1,
            FullPolicy::DenyNewKeys,
            ManualClock::new(UnixMillis(0)),
        ));
        let threads: Vec<_> = (0..3)
            .map(|_| {
                let limiter = limiter.clone();
                thread::spawn(move || limiter.check_now("client").is_allowed())
            })
            .collect();
        let admitted = threads
            .into_iter()
            .map(|t| t.join().unwrap())
            .filter(|a| *a)
            .count();
        assert_eq!(admitted, 2);
    });
}

/// A reconfiguration races the first key of a shard (which builds the
/// shard's table): whichever comes first, the table ends limited by the
/// new parameters.
#[test]
fn a_shard_built_during_a_reconfiguration_ends_with_the_new_parameters() {
    loom::model(|| {
        let limiter: Arc<MemoryLimiter<_, _, 8>> = Arc::new(MemoryLimiter::with_clock(
            TokenBucket::new(1, Rate::per(1, Duration::from_secs(60))).unwrap(),
            1,
            FullPolicy::DenyNewKeys,
            ManualClock::new(UnixMillis(0)),
        ));
        let first_key = {
            let limiter = limiter.clone();
            thread::spawn(move || limiter.check_now("client").is_allowed())
        };
        limiter
            .reconfigure_with(TokenBucket::new(3, Rate::per(1, Duration::from_secs(60))).unwrap());
        assert!(first_key.join().unwrap());
        // Three in all under the new capacity, the first included.
        assert!(limiter.check_now("client").is_allowed());
        assert!(limiter.check_now("client").is_allowed());
        assert!(!limiter.check_now("client").is_allowed());
    });
}

/// Two threads decide through one named limiter of a registry: the
/// limiter admits exactly its capacity and its counters (loom's atomics)
/// add up to every decision.
#[test]
fn a_registry_s_named_limiter_counts_every_decision() {
    use guard_std::ratelimit::{RateLimiter, RateLimiterRegistry};
    loom::model(|| {
        let limiter: Arc<dyn RateLimiter> = Arc::new(MemoryLimiter::<_, _, 8>::with_clock(
            TokenBucket::new(1, Rate::per(1, Duration::from_secs(60))).unwrap(),
            1,
            FullPolicy::DenyNewKeys,
            ManualClock::new(UnixMillis(0)),
        ));
        let registry = Arc::new(RateLimiterRegistry::new([("api".to_owned(), limiter)]));
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let registry = registry.clone();
                thread::spawn(move || {
                    let named = registry.get("api").unwrap();
                    futures_lite::future::block_on(named.check("client"))
                        .unwrap()
                        .is_allowed()
                })
            })
            .collect();
        let admitted = threads
            .into_iter()
            .map(|t| t.join().unwrap())
            .filter(|a| *a)
            .count();
        assert_eq!(admitted, 1);
        let named = registry.get("api").unwrap();
        assert_eq!((named.allowed(), named.denied()), (1, 1));
    });
}

/// Two reconfigurations race on a built shard: the parameters the
/// limiter reports (which a shard built later starts with) and those the
/// built shard decides with end the same, the last one's.
#[test]
fn two_reconfigurations_leave_the_built_shards_on_the_last_parameters() {
    use guard_std::ratelimit::{Quota, RateLimiter};
    let bucket =
        |capacity| TokenBucket::new(capacity, Rate::per(1, Duration::from_secs(60))).unwrap();
    loom::model(move || {
        // Eight keys: one shard, built by the first key.
        let limiter: Arc<MemoryLimiter<_, _, 8>> = Arc::new(MemoryLimiter::with_clock(
            bucket(1),
            8,
            FullPolicy::DenyNewKeys,
            ManualClock::new(UnixMillis(0)),
        ));
        assert!(limiter.check_now("built").is_allowed());
        let threads: Vec<_> = [2, 3]
            .into_iter()
            .map(|capacity| {
                let limiter = limiter.clone();
                thread::spawn(move || limiter.reconfigure_with(bucket(capacity)))
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let Quota::TokenBucket { capacity, .. } = RateLimiter::quota(&*limiter) else {
            panic!("a token bucket");
        };
        let admitted = (0..4)
            .filter(|_| limiter.check_now("fresh").is_allowed())
            .count();
        assert_eq!(
            admitted, capacity as usize,
            "the shard decides with other parameters"
        );
    });
}
