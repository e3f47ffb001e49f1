//! Waiting on embassy-time (its std driver on the host): 32 waiters on one
//! atomic bucket are admitted in arrival order at its rate, and a deadline
//! shorter than the wait ends it at once.

use std::time::Duration;

use embassy_sync::blocking_mutex::raw::CriticalSectionRawMutex;
use guard_core::limit::wait::{Line, WaitError};
use guard_core::limit::{AtomicTokenBucket, Rate, TokenBucket};
use guard_core::retry::WithoutRandom;
use guard_embassy::until_admitted;

static BUCKET: AtomicTokenBucket =
    AtomicTokenBucket::new(match TokenBucket::new(1, Rate::per_second(100)) {
        Ok(bucket) => bucket,
        Err(_) => panic!("invalid bucket"),
    });
static LINE: Line<CriticalSectionRawMutex, 32> = Line::new();

#[test]
fn waiters_on_a_device_are_admitted_in_arrival_order_at_the_rate() {
    let finished = guard_testkit::finish_order(32, |i| async move {
        let mut s = 0x2545_f491_4f6c_dd1du64 ^ i as u64;
        let mut random = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        let report = until_admitted(&LINE, |now| BUCKET.check_n(1, now), None, &mut random)
            .await
            .expect("admitted");
        assert!(report.is_allowed());
    });
    assert_eq!(finished.order, (0..32).collect::<Vec<_>>(), "arrival order");
    let span = finished.span;
    assert!(span >= Duration::from_millis(310), "too fast: {span:?}");
    assert!(span <= Duration::from_millis(600), "too slow: {span:?}");
    assert!(LINE.is_empty());
}

#[test]
fn a_deadline_shorter_than_the_wait_ends_it_at_once() {
    let bucket = AtomicTokenBucket::new(TokenBucket::new(1, Rate::per_second(1)).unwrap());
    let line: Line<CriticalSectionRawMutex, 4> = Line::new();
    smol::block_on(async {
        let first = until_admitted(
            &line,
            |now| bucket.check_n(1, now),
            None,
            &mut WithoutRandom,
        )
        .await
        .unwrap();
        assert!(first.is_allowed());
        let asked = embassy_time::Instant::now();
        let deadline = asked + embassy_time::Duration::from_millis(200);
        let second = until_admitted(
            &line,
            |now| bucket.check_n(1, now),
            Some(deadline),
            &mut WithoutRandom,
        )
        .await;
        assert!(matches!(second, Err(WaitError::Deadline(_))), "{second:?}");
        assert!(asked.elapsed() < embassy_time::Duration::from_millis(100));
    });
}
