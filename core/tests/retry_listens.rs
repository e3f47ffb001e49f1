//! Retry that listens: to the error (a closure classifier, a server's
//! hint), to other callers (a shared budget), and errors that keep their
//! cause.

use std::cell::Cell;
use std::error::Error as _;
use std::fmt;
use std::time::Duration;

use embassy_sync::blocking_mutex::raw::NoopRawMutex;
use guard_core::lock::{LockWithRetryError, UnlockError};
use guard_core::retry::{
    GiveUpReason, RetryAfter, RetryBudget, RetryExecutor, RetryPolicy, SharedRetryBudget,
};
use guard_core::time::Instant;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// An HTTP-like answer: a status and the `Retry-After` it carried.
#[derive(Debug, Clone, PartialEq)]
struct Status {
    code: u16,
    retry_after: Option<Duration>,
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "status {}", self.code)
    }
}

impl std::error::Error for Status {}

fn busy(retry_after: Option<Duration>) -> Status {
    Status {
        code: 503,
        retry_after,
    }
}

/// Runs `answers` in turn (then `Ok`) under `executor`; the waits slept.
fn run<C, B>(
    executor: &mut RetryExecutor<Status, guard_core::retry::WithoutRandom, C, B>,
    answers: &[Status],
) -> (
    Result<u32, guard_core::retry::RetryError<Status>>,
    Vec<Duration>,
)
where
    C: guard_core::retry::Classify<Status>,
    B: guard_core::retry::Budget,
{
    let mut waits = Vec::new();
    let result = executor.run_blocking(
        |wait| {
            waits.push(wait);
            Ok(())
        },
        |attempt| match answers.get(attempt as usize - 1) {
            Some(answer) => Err(answer.clone()),
            None => Ok(attempt),
        },
    );
    (result, waits)
}

#[test]
fn a_classifier_may_be_a_closure_over_what_it_captured() {
    let retryable = [429u16, 503];
    let policy = RetryPolicy::fixed_delay(5, ms(10));
    let mut retry = RetryExecutor::new(policy, |e: &Status| retryable.contains(&e.code)).unwrap();
    let (result, _) = run(&mut retry, &[busy(None), busy(None)]);
    assert_eq!(result.unwrap(), 3);
    let not_found = Status {
        code: 404,
        retry_after: None,
    };
    let (result, waits) = run(&mut retry, &[not_found]);
    let gave_up = result.unwrap_err();
    assert_eq!(
        (gave_up.attempts, gave_up.reason),
        (1, GiveUpReason::NonRetryable)
    );
    assert!(waits.is_empty());
}

#[test]
fn the_next_call_comes_no_sooner_than_the_error_asks_nor_than_the_policy_waits() {
    let policy = RetryPolicy::new()
        .with_initial_delay(ms(100))
        .with_max_attempts(4); // 100, 200, 400, 800 ms
    let mut retry = RetryExecutor::new(policy, |_: &Status| true)
        .unwrap()
        .with_hint(|e: &Status| e.retry_after);
    let answers = [
        busy(Some(ms(1_500))), // longer than the policy's 100 ms
        busy(Some(ms(50))),    // shorter than its 200 ms
        busy(None),
        busy(Some(Duration::ZERO)),
    ];
    let (result, waits) = run(&mut retry, &answers);
    assert_eq!(result.unwrap(), 5);
    assert_eq!(waits, [ms(1_500), ms(200), ms(400), ms(800)]);
}

#[test]
fn a_hint_beyond_the_policys_longest_wait_ends_the_retries_with_the_wait_asked() {
    let policy = RetryPolicy::fixed_delay(3, ms(100)).with_max_delay(Duration::from_secs(10));
    let mut retry = RetryExecutor::new(policy, |_: &Status| true)
        .unwrap()
        .with_hint(|e: &Status| e.retry_after);
    // Exactly the longest wait is still waited.
    let (result, waits) = run(&mut retry, &[busy(Some(Duration::from_secs(10)))]);
    assert_eq!(result.unwrap(), 2);
    assert_eq!(waits, [Duration::from_secs(10)]);
    let hour = Duration::from_secs(3_600);
    let (result, waits) = run(&mut retry, &[busy(None), busy(Some(hour))]);
    let gave_up = result.unwrap_err();
    assert_eq!(gave_up.attempts, 2);
    assert_eq!(
        gave_up.reason,
        GiveUpReason::HintBeyondMaxDelay { retry_after: hour }
    );
    assert_eq!(waits, [ms(100)], "no sleep for the hour");
    assert!(gave_up.to_string().contains("3600000 ms"), "{gave_up}");
}

#[test]
fn a_hint_does_not_extend_a_spent_policy() {
    let mut retry = RetryExecutor::new(RetryPolicy::fixed_delay(1, ms(10)), |_: &Status| true)
        .unwrap()
        .with_hint(|e: &Status| e.retry_after);
    let (result, waits) = run(&mut retry, &[busy(Some(ms(20))), busy(Some(ms(20)))]);
    assert_eq!(result.unwrap_err().reason, GiveUpReason::Exhausted);
    assert_eq!(waits, [ms(20)]);
}

/// A server's `Retry-After` header, read by `RetryAfter`, as the hint.
#[test]
fn a_retry_after_header_read_against_the_callers_clock_is_the_hint() {
    let now_unix = 784_111_747; // 30 s before the date below
    let header = |e: &Status| -> Option<Duration> {
        let value = if e.code == 429 {
            "Sun, 06 Nov 1994 08:49:37 GMT"
        } else {
            "2"
        };
        RetryAfter::parse(value)
            .ok()
            .map(|r| r.delay_from(now_unix))
    };
    let policy = RetryPolicy::fixed_delay(3, ms(100)).with_max_delay(Duration::from_secs(60));
    let mut retry = RetryExecutor::new(policy, |_: &Status| true)
        .unwrap()
        .with_hint(header);
    let too_many = Status {
        code: 429,
        retry_after: None,
    };
    let (result, waits) = run(&mut retry, &[too_many, busy(None)]);
    assert_eq!(result.unwrap(), 3);
    assert_eq!(waits, [Duration::from_secs(30), Duration::from_secs(2)]);
}

/// A hundred callers of one failing service, three retries each: alone
/// they would make 300 retries; sharing a budget of one retry for every
/// five calls, they make 20.
#[test]
fn callers_sharing_a_budget_retry_at_most_its_share_of_their_calls() {
    let now = Cell::new(Instant::from_secs(1));
    let budget: SharedRetryBudget<NoopRawMutex> =
        SharedRetryBudget::new(RetryBudget::new(Duration::from_secs(10), 0, 200).unwrap());
    let policy = RetryPolicy::fixed_delay(3, ms(10));
    let (mut calls, mut retries) = (0u32, 0u32);
    for _ in 0..100 {
        let mut retry = RetryExecutor::new(policy, |_: &Status| true)
            .unwrap()
            .with_budget(budget.on_clock(|| now.get()));
        let result: Result<(), _> = retry.run_blocking(
            |wait| {
                now.set(now.get() + wait);
                Ok(())
            },
            |attempt| {
                calls += 1;
                retries += u32::from(attempt > 1);
                Err(busy(None))
            },
        );
        let reason = result.unwrap_err().reason;
        assert!(
            matches!(reason, GiveUpReason::Exhausted | GiveUpReason::BudgetSpent),
            "{reason:?}"
        );
    }
    assert_eq!(retries, 20, "{calls} calls");
    assert_eq!(calls, 120);
}

#[test]
fn a_retry_the_error_rules_out_takes_nothing_from_the_budget() {
    let now = Instant::from_secs(1);
    let budget: SharedRetryBudget<NoopRawMutex> =
        SharedRetryBudget::new(RetryBudget::new(Duration::from_secs(10), 1, 0).unwrap());
    let policy = RetryPolicy::fixed_delay(3, ms(10));
    let mut retry = RetryExecutor::new(policy, |e: &Status| e.code == 503)
        .unwrap()
        .with_budget(budget.on_clock(|| now));
    let teapot = Status {
        code: 418,
        retry_after: None,
    };
    let (result, _) = run(&mut retry, &[teapot]);
    assert_eq!(result.unwrap_err().reason, GiveUpReason::NonRetryable);
    assert_eq!(budget.available(now), 10, "the reserve is whole");
}

/// The async executor asks the same budget.
#[test]
fn the_async_executor_honours_the_budget_too() {
    let now = Instant::from_secs(1);
    let budget: SharedRetryBudget<NoopRawMutex> =
        SharedRetryBudget::new(RetryBudget::new(Duration::from_secs(1), 2, 0).unwrap());
    let mut retry = RetryExecutor::new(RetryPolicy::fixed_delay(5, ms(1)), |_: &Status| true)
        .unwrap()
        .with_budget(budget.on_clock(|| now));
    let mut calls = 0;
    let result: Result<(), _> = futures_lite::future::block_on(retry.run_interruptible(
        async |_| Ok(()),
        |_| {
            calls += 1;
            async { Err(busy(None)) }
        },
    ));
    assert_eq!(result.unwrap_err().reason, GiveUpReason::BudgetSpent);
    assert_eq!(calls, 3, "the first call and the reserve's two retries");
}

#[test]
fn errors_keep_their_cause_as_the_source() {
    let retry_error = guard_core::retry::RetryError {
        error: busy(None),
        attempts: 4,
        reason: GiveUpReason::Exhausted,
    };
    let source = retry_error.source().expect("the last call's error");
    assert_eq!(source.to_string(), "status 503");

    let unlock: UnlockError<Status> = UnlockError::Backend(busy(None));
    assert_eq!(
        unlock.source().map(|e| e.to_string()),
        Some("status 503".into())
    );
    assert!(UnlockError::<Status>::NotHeld.source().is_none());
    let mapped = unlock.map_backend(|s| s.code);
    assert_eq!(mapped, UnlockError::Backend(503));

    let lock: LockWithRetryError<Status> = LockWithRetryError::Backend(busy(None));
    assert_eq!(
        lock.source().map(|e| e.to_string()),
        Some("status 503".into())
    );
    assert!(
        LockWithRetryError::<Status>::NotAcquired { attempts: 3 }
            .source()
            .is_none()
    );
}
