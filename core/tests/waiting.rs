//! Waiting until admitted (`limit::wait`), in simulated time: the order
//! waiters are served in, the rate they are admitted at, deadlines,
//! cancellation, a full line and the jitter.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use embassy_sync::blocking_mutex::raw::NoopRawMutex;
use futures_lite::future::poll_once;
use guard_core::limit::wait::{Line, LineFull, WaitError, jittered, until_admitted};
use guard_core::limit::{CostAboveLimit, Limiter, Rate, TokenBucket};
use guard_core::retry::WithoutRandom;
use guard_core::time::Instant;

/// Simulated time: a clock that moves only when every task waits.
#[derive(Clone, Default)]
struct SimTime {
    now: Rc<Cell<u64>>,
    timers: Rc<RefCell<Vec<u64>>>,
}

impl SimTime {
    fn now(&self) -> Instant {
        Instant::from_nanos(self.now.get())
    }
}

/// A delay on simulated time.
struct SimDelay(SimTime);

impl embedded_hal_async::delay::DelayNs for SimDelay {
    async fn delay_ns(&mut self, ns: u32) {
        let until = self.0.now.get() + u64::from(ns);
        self.0.timers.borrow_mut().push(until);
        std::future::poll_fn(|_| {
            if self.0.now.get() >= until {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
        .await;
    }
}

type Task<'a, T> = Pin<Box<dyn Future<Output = T> + 'a>>;

/// Runs every task to the end, polling all of them each round and moving
/// the clock to the next timer when none can go on.
fn run_all<'a, T>(time: &SimTime, mut tasks: Vec<Task<'a, T>>) -> Vec<T> {
    let mut cx = Context::from_waker(Waker::noop());
    let mut results: Vec<Option<T>> = tasks.iter().map(|_| None).collect();
    loop {
        let mut progressed = false;
        for (task, result) in tasks.iter_mut().zip(results.iter_mut()) {
            if result.is_none()
                && let Poll::Ready(out) = task.as_mut().poll(&mut cx)
            {
                *result = Some(out);
                progressed = true;
            }
        }
        if results.iter().all(Option::is_some) {
            return results.into_iter().map(Option::unwrap).collect();
        }
        if !progressed {
            let now = time.now.get();
            let next = time
                .timers
                .borrow()
                .iter()
                .copied()
                .filter(|&t| t > now)
                .min();
            time.timers.borrow_mut().retain(|&t| t > now);
            match next {
                Some(t) => time.now.set(t),
                None => panic!("every task waits and no timer is set: a lost wake-up"),
            }
        }
    }
}

#[test]
fn waiters_are_admitted_in_arrival_order_at_the_limiter_s_rate() {
    let time = SimTime::default();
    time.now.set(1_000_000_000);
    // 50 a second, no burst beyond one.
    let limiter = RefCell::new(Limiter::new(
        TokenBucket::new(1, Rate::per_second(50)).unwrap(),
    ));
    let line: Line<NoopRawMutex, 64> = Line::new();
    let admitted = RefCell::new(Vec::new());
    let tasks: Vec<Task<'_, ()>> = (0..32)
        .map(|i| {
            let (time, limiter, line, admitted) = (&time, &limiter, &line, &admitted);
            Box::pin(async move {
                let mut delay = SimDelay(time.clone());
                let mut random = {
                    let mut s = 0x9e37_79b9_7f4a_7c15u64 ^ i;
                    move || {
                        s ^= s << 13;
                        s ^= s >> 7;
                        s ^= s << 17;
                        s
                    }
                };
                let report = until_admitted(
                    line,
                    || async { limiter.borrow_mut().check_n(1, time.now()) },
                    &mut delay,
                    || time.now(),
                    None,
                    &mut random,
                )
                .await
                .expect("admitted");
                assert!(report.is_allowed());
                admitted.borrow_mut().push((i, time.now()));
            }) as Task<'_, ()>
        })
        .collect();
    run_all(&time, tasks);
    let admitted = admitted.into_inner();
    let order: Vec<u64> = admitted.iter().map(|(i, _)| *i).collect();
    assert_eq!(order, (0..32).collect::<Vec<_>>(), "arrival order");
    // 31 intervals of 20 ms after the first, each stretched by at most
    // 1/16 of jitter: within [620 ms, 660 ms].
    let span = admitted[31].1.saturating_duration_since(admitted[0].1);
    assert!(
        span >= Duration::from_millis(620) && span <= Duration::from_millis(660),
        "32 admissions at 50/s took {span:?}"
    );
    assert!(line.is_empty(), "everyone left the line");
}

#[test]
fn a_waiter_that_gives_up_or_is_dropped_hands_its_turn_on() {
    let line: Line<NoopRawMutex, 4> = Line::new();
    let a = line.join().unwrap();
    let b = line.join().unwrap();
    let c = line.join().unwrap();
    let d = line.join().unwrap();
    assert_eq!(
        line.join().err(),
        Some(LineFull { capacity: 4 }),
        "a fifth waiter is told, not queued unseen"
    );
    futures_lite::future::block_on(async {
        assert!(poll_once(a.turn()).await.is_some(), "the head's turn");
        assert!(poll_once(c.turn()).await.is_none(), "c waits for a and b");
        drop(b); // cancelled before its turn
        assert!(poll_once(c.turn()).await.is_none(), "c still waits for a");
        drop(a);
        assert!(
            poll_once(c.turn()).await.is_some(),
            "c is next once a leaves"
        );
        assert!(poll_once(d.turn()).await.is_none());
        drop(c);
        assert!(poll_once(d.turn()).await.is_some());
    });
    drop(d);
    assert!(line.is_empty());
}

#[test]
fn a_deadline_before_the_retry_time_ends_the_wait_at_once() {
    let time = SimTime::default();
    time.now.set(5_000_000_000);
    let limiter = RefCell::new(Limiter::new(
        TokenBucket::new(2, Rate::per_second(1)).unwrap(),
    ));
    assert!(
        limiter
            .borrow_mut()
            .check_n(2, time.now())
            .unwrap()
            .is_allowed()
    );
    let line: Line<NoopRawMutex, 4> = Line::new();
    let wait = |deadline: Duration| -> Task<'_, Result<_, WaitError<CostAboveLimit>>> {
        let (time, limiter, line) = (&time, &limiter, &line);
        Box::pin(async move {
            until_admitted(
                line,
                || async { limiter.borrow_mut().check_n(1, time.now()) },
                &mut SimDelay(time.clone()),
                || time.now(),
                Some(time.now() + deadline),
                &mut WithoutRandom,
            )
            .await
        })
    };
    // The first asks 500 ms before a token is back: refused at once; the
    // second may wait 2 s and is admitted after 1 s, not after the first
    // one's deadline.
    let started = time.now();
    let results = run_all(
        &time,
        vec![
            wait(Duration::from_millis(500)),
            wait(Duration::from_secs(2)),
        ],
    );
    match &results[0] {
        Err(WaitError::Deadline(report)) => {
            assert_eq!(report.retry_after(), Some(Duration::from_secs(1)));
        }
        other => panic!("expected the deadline, got {other:?}"),
    }
    assert!(
        results[1]
            .as_ref()
            .is_ok_and(guard_core::limit::Report::is_allowed)
    );
    assert_eq!(
        time.now().saturating_duration_since(started),
        Duration::from_secs(1),
        "no sleep was wasted"
    );
}

#[test]
fn a_cost_above_the_quota_ends_the_wait_with_the_limiter_s_error() {
    let time = SimTime::default();
    let limiter = RefCell::new(Limiter::new(
        TokenBucket::new(2, Rate::per_second(1)).unwrap(),
    ));
    let line: Line<NoopRawMutex, 4> = Line::new();
    let result = futures_lite::future::block_on(until_admitted(
        &line,
        || async { limiter.borrow_mut().check_n(3, time.now()) },
        &mut SimDelay(time.clone()),
        || time.now(),
        None,
        &mut WithoutRandom,
    ));
    assert_eq!(
        result,
        Err(WaitError::Limiter(CostAboveLimit { cost: 3, limit: 2 }))
    );
    assert!(line.is_empty());
}

#[test]
fn the_jitter_only_lengthens_a_sleep_by_at_most_a_sixteenth() {
    let retry = Duration::from_millis(160);
    assert_eq!(jittered(retry, &mut WithoutRandom), retry);
    let mut s = 1u64;
    let mut random = move || {
        s = s.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        s
    };
    let sleeps: Vec<Duration> = (0..1_000).map(|_| jittered(retry, &mut random)).collect();
    assert!(
        sleeps
            .iter()
            .all(|&d| d >= retry && d <= retry + retry / 16)
    );
    let distinct: std::collections::HashSet<_> = sleeps.iter().collect();
    assert!(
        distinct.len() > 900,
        "waiters are spread: {}",
        distinct.len()
    );
}
