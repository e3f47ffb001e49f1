//! The original's LocalLocker tests (seed-originals A1, A2).

use std::sync::Arc;
use std::time::{Duration, Instant as StdInstant};

use futures_lite::future::block_on;
use guard_core::lock::{
    LeaseRenewer, LockWithRetryError, Locker, LockerExt, Renewal, Ttl, UnlockError,
};
use guard_core::slot::UnixMillis;
use guard_std::{LocalLocker, ManualClock};

/// An `embedded_hal_async` delay on async-io timers.
struct TimerDelay;

impl embedded_hal_async::delay::DelayNs for TimerDelay {
    async fn delay_ns(&mut self, ns: u32) {
        async_io::Timer::after(Duration::from_nanos(u64::from(ns))).await;
    }
}

fn ttl(ms: u64) -> Ttl {
    Ttl::from_millis(ms).unwrap()
}

#[test]
fn lock_unlock_wrong_token_and_a_new_token_after_relock() {
    let l = LocalLocker::new();
    let t1 = block_on(l.try_lock("k", ttl(1000))).unwrap().unwrap();
    assert_eq!(t1.id().to_string().len(), 32, "32 lowercase hex digits");
    let other = block_on(l.try_lock("other", ttl(1000))).unwrap().unwrap();
    assert_eq!(block_on(l.unlock("k", &other)), Err(UnlockError::NotHeld));
    block_on(l.unlock("k", &t1)).unwrap();
    let t2 = block_on(l.try_lock("k", ttl(1000))).unwrap().unwrap();
    assert_ne!(t1.id(), t2.id());
}

#[test]
fn a_key_is_free_again_exactly_at_its_expiry() {
    let clock = ManualClock::new(UnixMillis(0));
    let l = LocalLocker::with_clock(clock.clone());
    assert!(l.try_lock_now("k", ttl(30)).is_some());
    clock.advance(Duration::from_millis(29));
    assert!(l.try_lock_now("k", ttl(30)).is_none());
    clock.advance(Duration::from_millis(1));
    assert!(
        l.try_lock_now("k", ttl(30)).is_some(),
        "at expires_at the key counts as free"
    );
}

#[test]
fn expiry_in_real_time() {
    let l = LocalLocker::new();
    assert!(block_on(l.try_lock("k", ttl(30))).unwrap().is_some());
    std::thread::sleep(Duration::from_millis(50));
    assert!(block_on(l.try_lock("k", ttl(30))).unwrap().is_some());
}

#[test]
fn renew_extends_and_a_wrong_token_gets_lost_not_an_error() {
    let clock = ManualClock::new(UnixMillis(0));
    let l = LocalLocker::with_clock(clock.clone());
    let t = l.try_lock_now("k", ttl(100)).unwrap();
    clock.advance(Duration::from_millis(50));
    assert_eq!(block_on(l.renew("k", &t, ttl(60_000))), Ok(Renewal::Held));
    clock.advance(Duration::from_millis(100));
    assert!(
        l.try_lock_now("k", ttl(100)).is_none(),
        "renewed past the first TTL"
    );
    let other = l.try_lock_now("x", ttl(100)).unwrap();
    assert_eq!(block_on(l.renew("k", &other, ttl(100))), Ok(Renewal::Lost));
}

#[test]
fn lock_with_retry_exhausts_after_max_retries_plus_one_attempts() {
    let l = LocalLocker::new();
    let _held = block_on(l.try_lock("k", ttl(10_000))).unwrap().unwrap();
    let start = StdInstant::now();
    let err = block_on(l.lock_with_retry(
        "k",
        ttl(1000),
        Duration::from_millis(10),
        3,
        &mut TimerDelay,
    ))
    .unwrap_err();
    assert_eq!(err, LockWithRetryError::NotAcquired { attempts: 4 });
    assert!(
        start.elapsed() >= Duration::from_millis(30),
        "three waits between four attempts"
    );
    assert_eq!(err.to_string(), "lock not acquired after 4 attempt(s)");
}

#[test]
fn max_retries_zero_is_one_attempt_without_waiting() {
    let l = LocalLocker::new();
    let start = StdInstant::now();
    assert!(
        block_on(l.lock_with_retry(
            "free",
            ttl(1000),
            Duration::from_secs(5),
            0,
            &mut TimerDelay
        ))
        .is_ok()
    );
    let _held = block_on(l.try_lock("held", ttl(10_000))).unwrap();
    let err = block_on(l.lock_with_retry(
        "held",
        ttl(1000),
        Duration::from_secs(5),
        0,
        &mut TimerDelay,
    ))
    .unwrap_err();
    assert_eq!(err, LockWithRetryError::NotAcquired { attempts: 1 });
    assert!(start.elapsed() < Duration::from_millis(30));
}

#[test]
fn lock_blocks_until_unlock() {
    let l = Arc::new(LocalLocker::new());
    let held = block_on(l.try_lock("k", ttl(10_000))).unwrap().unwrap();
    let waiter = {
        let l = l.clone();
        std::thread::spawn(move || {
            let token = block_on(l.lock("k", ttl(1000), Duration::from_millis(5), &mut TimerDelay))
                .unwrap();
            (StdInstant::now(), token)
        })
    };
    std::thread::sleep(Duration::from_millis(100));
    // Compared as instants, not as the waiter's own elapsed time: its
    // thread may start late on a loaded machine.
    let unlocking = StdInstant::now();
    block_on(l.unlock("k", &held)).unwrap();
    let (acquired, token) = waiter.join().unwrap();
    assert!(acquired >= unlocking, "acquired before the unlock");
    assert!(token.fence() > held.fence());
}

#[test]
fn the_sweep_leaves_only_live_keys() {
    let clock = ManualClock::new(UnixMillis(0));
    let l = LocalLocker::with_clock(clock.clone()).with_sweep_interval(Duration::from_millis(10));
    for i in 0..100 {
        assert!(l.try_lock_now(&format!("slot:{i}"), ttl(30)).is_some());
    }
    assert_eq!(l.stored_keys(), 100);
    clock.advance(Duration::from_millis(40));
    assert!(l.try_lock_now("trigger", ttl(30)).is_some());
    assert_eq!(l.stored_keys(), 1, "expired keys were swept");
}

#[test]
fn the_sweep_runs_at_most_once_per_interval() {
    let clock = ManualClock::new(UnixMillis(0));
    let l = LocalLocker::with_clock(clock.clone());
    assert!(l.try_lock_now("a", ttl(1)).is_some());
    clock.advance(Duration::from_millis(5));
    assert!(l.try_lock_now("b", ttl(1)).is_some());
    assert_eq!(l.stored_keys(), 2, "no sweep within the default minute");
    clock.advance(Duration::from_secs(60));
    assert!(l.try_lock_now("c", ttl(1)).is_some());
    assert_eq!(l.stored_keys(), 1);
}
