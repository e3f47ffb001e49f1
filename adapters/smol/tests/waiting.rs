//! `WaitingLimiter` on smol, in real time: 32 concurrent waiters on one key
//! are admitted in arrival order at the limiter's rate; a deadline ends a
//! wait that could only fail; a cancelled waiter hands its turn on.

use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use guard_testkit::finish_order;

use guard_core::limit::wait::WaitError;
use guard_core::limit::{FullPolicy, Rate, TokenBucket};
use guard_smol::WaitingLimiter;
use guard_std::ratelimit::{LimitError, MemoryLimiter};

fn waiting(capacity: u32, rate: Rate) -> Rc<WaitingLimiter> {
    let bucket = TokenBucket::new(capacity, rate).unwrap();
    Rc::new(WaitingLimiter::new(Arc::new(MemoryLimiter::new(
        bucket,
        64,
        FullPolicy::DenyNewKeys,
    ))))
}

#[test]
fn thirty_two_waiters_are_admitted_in_arrival_order_at_the_rate() {
    let limiter = waiting(1, Rate::per_second(100));
    let finished = finish_order(32, |_| async {
        let report = limiter.until_ready("hot", None).await.expect("admitted");
        assert!(report.is_allowed());
    });
    assert_eq!(finished.order, (0..32).collect::<Vec<_>>(), "arrival order");
    // The first at once, then one each 10 ms: 310 ms, stretched by the
    // jitter (at most 1/16) and the timers' resolution, and by a loaded
    // machine's scheduling.
    let span = finished.span;
    assert!(span >= Duration::from_millis(310), "too fast: {span:?}");
    assert!(span <= Duration::from_millis(600), "too slow: {span:?}");
    let rate = 31.0 / span.as_secs_f64();
    eprintln!("32 waiters at 100/s: {rate:.1} admitted per second over {span:?}");
    assert_eq!(limiter.waiting_keys(), 0, "no line is left behind");
}

#[test]
fn a_deadline_shorter_than_the_wait_fails_at_once_and_a_dropped_waiter_hands_its_turn_on() {
    let limiter = waiting(1, Rate::per(1, Duration::from_millis(500)));
    smol::block_on(async {
        assert!(limiter.until_ready("k", None).await.unwrap().is_allowed());
        // The next token is 500 ms away: a 100 ms deadline fails now.
        let asked = Instant::now();
        let err = limiter
            .until_ready("k", Some(Instant::now() + Duration::from_millis(100)))
            .await
            .unwrap_err();
        assert!(matches!(err, WaitError::Deadline(_)), "{err:?}");
        assert!(asked.elapsed() < Duration::from_millis(50), "no sleep");
        assert!(
            err.to_string()
                .starts_with("not admitted before the deadline"),
            "{err}"
        );

        // A first waiter is cancelled (dropped after 100 ms); the second,
        // which joined after it, is admitted when the token is back.
        let first = limiter.until_ready("k", None);
        let second = limiter.until_ready("k", None);
        let cancelled = futures_lite::future::or(async { Some(first.await) }, async {
            async_io::Timer::after(Duration::from_millis(100)).await;
            None
        });
        let (cancelled, second) = futures_lite::future::zip(cancelled, second).await;
        assert!(cancelled.is_none(), "the first waiter was dropped");
        assert!(second.unwrap().is_allowed());
    });
    assert_eq!(limiter.waiting_keys(), 0);
}

#[test]
fn a_cost_above_the_quota_is_the_limiter_s_error() {
    let limiter = waiting(4, Rate::per_second(4));
    let err = smol::block_on(limiter.until_n_ready("k", 5, None)).unwrap_err();
    assert!(
        matches!(err, WaitError::Limiter(LimitError::Cost(_))),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "rate limiter: a cost of 5 exceeds the limit of 4: no wait can ever admit it"
    );
    let report = smol::block_on(limiter.until_n_ready("k", 4, None)).unwrap();
    assert_eq!(report.remaining, 0);
}
