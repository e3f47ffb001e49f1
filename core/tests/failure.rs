//! FailureStrategy, ReliabilityConfig (B1, B2, B9) and the FailureHandler
//! that applies them.

use std::time::Duration;

use embassy_sync::blocking_mutex::raw::CriticalSectionRawMutex;
use guard_core::dlq::{DeadLetterQueue, SharedDeadLetterQueue};
use guard_core::failure::{
    FailureHandler, FailureStrategy, Handled, ReliabilityConfig, ReliabilityConfigError,
};
use guard_core::retry::{Classifier, Jitter, RetryPolicy};
use guard_core::time::Instant;

const NOW: Instant = Instant::from_secs(100);
type Queue = DeadLetterQueue<u32, &'static str, 4>;

#[test]
fn five_strategies_in_the_original_order_with_its_names() {
    let names: Vec<_> = FailureStrategy::ALL.iter().map(|s| s.name()).collect();
    assert_eq!(
        names,
        ["FAIL_FAST", "RETRY", "SKIP", "DEAD_LETTER_QUEUE", "IGNORE"]
    );
    for (ordinal, s) in FailureStrategy::ALL.iter().enumerate() {
        assert_eq!(
            FailureStrategy::ALL.iter().position(|x| x == s),
            Some(ordinal)
        );
        assert_eq!(s.to_string().parse::<FailureStrategy>(), Ok(*s));
    }
    assert_eq!(
        "dead-letter-queue".parse(),
        Ok(FailureStrategy::DeadLetterQueue)
    );
    assert_eq!("Fail_Fast".parse(), Ok(FailureStrategy::FailFast));
    let err = "RETRY_LATER".parse::<FailureStrategy>().unwrap_err();
    assert!(
        err.to_string()
            .contains("FAIL_FAST, RETRY, SKIP, DEAD_LETTER_QUEUE, IGNORE")
    );
}

#[test]
fn config_defaults_match_the_original() {
    let c: ReliabilityConfig<Queue> = ReliabilityConfig::default();
    assert_eq!(c.failure_strategy, Some(FailureStrategy::Retry));
    assert_eq!(c.retry_policy, Some(RetryPolicy::new()));
    assert!(c.dead_letter_queue.is_none());
    assert!(c.continue_on_failure);
    assert_eq!(c.max_consecutive_failures, 10);
    assert!(c.validate().is_ok());
}

#[test]
fn validation_messages_match_the_original() {
    let mut c: ReliabilityConfig<Queue> = ReliabilityConfig {
        failure_strategy: None,
        ..Default::default()
    };
    assert_eq!(
        c.validate().unwrap_err().to_string(),
        "Failure strategy must be specified"
    );

    c.failure_strategy = Some(FailureStrategy::Retry);
    c.retry_policy = None;
    assert_eq!(
        c.validate().unwrap_err().to_string(),
        "Retry policy must be specified for RETRY strategy"
    );

    c.failure_strategy = Some(FailureStrategy::DeadLetterQueue);
    assert_eq!(
        c.validate().unwrap_err().to_string(),
        "Dead letter queue must be specified for DEAD_LETTER_QUEUE strategy"
    );

    c.failure_strategy = Some(FailureStrategy::Skip);
    c.max_consecutive_failures = 0;
    assert_eq!(
        c.validate(),
        Err(ReliabilityConfigError::MaxConsecutiveFailuresNotPositive)
    );
    assert_eq!(
        ReliabilityConfigError::MaxConsecutiveFailuresNotPositive.to_string(),
        "Max consecutive failures must be positive"
    );
}

#[test]
fn every_strategy_validates_when_complete() {
    for strategy in FailureStrategy::ALL {
        let c = ReliabilityConfig {
            failure_strategy: Some(strategy),
            dead_letter_queue: Some(Queue::new()),
            ..Default::default()
        };
        assert!(c.validate().is_ok(), "{strategy}");
    }
}

#[test]
fn factories_match_the_original() {
    let retry: ReliabilityConfig<Queue> = ReliabilityConfig::with_retry();
    assert_eq!(retry.failure_strategy, Some(FailureStrategy::Retry));
    let dlq = ReliabilityConfig::with_dead_letter_queue(Queue::new());
    assert_eq!(dlq.failure_strategy, Some(FailureStrategy::DeadLetterQueue));
    assert_eq!(
        dlq.dead_letter_queue.as_ref().map(|q| q.capacity()),
        Some(4)
    );
    let fast: ReliabilityConfig<Queue> = ReliabilityConfig::fail_fast();
    assert_eq!(fast.failure_strategy, Some(FailureStrategy::FailFast));
    assert!(!fast.continue_on_failure);
}

fn handler(
    strategy: FailureStrategy,
    queue: Option<&mut Queue>,
) -> FailureHandler<&mut Queue, &'static str> {
    let config = ReliabilityConfig {
        failure_strategy: Some(strategy),
        retry_policy: Some(RetryPolicy::fixed_delay(2, Duration::from_millis(1))),
        dead_letter_queue: queue,
        continue_on_failure: true,
        max_consecutive_failures: 3,
    };
    FailureHandler::new(config, Classifier::retry_all()).unwrap()
}

fn calls_made<D>(
    h: &mut FailureHandler<D, &'static str>,
    element: u32,
    fail: bool,
) -> (Handled<u32, u32, &'static str>, u32)
where
    D: guard_core::dlq::DeadLetterSink<u32, &'static str>,
{
    let mut calls = 0;
    let out = h.process(
        element,
        NOW,
        |_| Ok(()),
        |e, _| {
            calls += 1;
            if fail { Err("down") } else { Ok(*e * 2) }
        },
    );
    (out, calls)
}

#[test]
fn retry_strategy_retries_then_hands_the_element_back() {
    let mut h = handler(FailureStrategy::Retry, None);
    let (out, calls) = calls_made(&mut h, 7, true);
    assert_eq!(calls, 3);
    let Handled::Failed(failed) = out else {
        panic!("{out:?}")
    };
    assert_eq!(
        (*failed.element(), failed.attempts(), failed.failed_at()),
        (7, 3, NOW)
    );
    assert_eq!(
        calls_made(&mut h, 7, false).0,
        Handled::Succeeded {
            value: 14,
            attempts: 1
        }
    );
}

#[test]
fn fail_fast_skip_and_ignore_make_one_call() {
    for strategy in [
        FailureStrategy::FailFast,
        FailureStrategy::Skip,
        FailureStrategy::Ignore,
    ] {
        let mut h = handler(strategy, None);
        let (out, calls) = calls_made(&mut h, 1, true);
        assert_eq!(calls, 1, "{strategy}");
        let (kind, counted) = match out {
            Handled::Failed(_) => ("failed", true),
            Handled::Skipped(_) => ("skipped", true),
            Handled::Ignored(_) => ("ignored", false),
            other => panic!("{other:?}"),
        };
        assert_eq!(
            h.consecutive_failures(),
            u32::from(counted),
            "{strategy} {kind}"
        );
    }
}

#[test]
fn dead_letter_strategy_retries_then_queues_and_hands_back_when_full() {
    let mut queue = Queue::new();
    let mut h = handler(FailureStrategy::DeadLetterQueue, Some(&mut queue));
    for element in 0..2 {
        let (out, calls) = calls_made(&mut h, element, true);
        assert_eq!((out, calls), (Handled::DeadLettered { attempts: 3 }, 3));
        // A success in between keeps the handler going.
        assert!(matches!(
            calls_made(&mut h, 9, false).0,
            Handled::Succeeded { .. }
        ));
    }
    assert_eq!(queue.len(), 2);
    queue.add(90, None, 1, NOW).unwrap();
    queue.add(91, None, 1, NOW).unwrap();
    let mut h = handler(FailureStrategy::DeadLetterQueue, Some(&mut queue));
    let Handled::DeadLetterRefused(back) = calls_made(&mut h, 5, true).0 else {
        panic!()
    };
    assert_eq!(*back.element(), 5, "a full queue hands the element back");
}

#[test]
fn a_shared_queue_is_a_sink_too() {
    let queue: SharedDeadLetterQueue<CriticalSectionRawMutex, u32, &str, 2> =
        SharedDeadLetterQueue::new();
    let config = ReliabilityConfig::with_dead_letter_queue(&queue);
    let mut h = FailureHandler::new(config, Classifier::retry_all()).unwrap();
    let out: Handled<(), u32, &str> = h.process(3, NOW, |_| Ok(()), |_, _| Err("x"));
    assert_eq!(out, Handled::DeadLettered { attempts: 4 });
    assert_eq!(queue.len(), 1);
}

#[test]
fn consecutive_failures_halt_the_handler_until_resumed() {
    let mut h = handler(FailureStrategy::Skip, None);
    for _ in 0..3 {
        assert!(matches!(calls_made(&mut h, 1, true).0, Handled::Skipped(_)));
    }
    assert!(h.is_halted());
    let (out, calls) = calls_made(&mut h, 4, false);
    assert_eq!(
        (out, calls),
        (Handled::Halted(4), 0),
        "not called while halted"
    );
    h.resume();
    assert_eq!(
        calls_made(&mut h, 4, false).0,
        Handled::Succeeded {
            value: 8,
            attempts: 1
        }
    );
}

#[test]
fn a_success_resets_the_consecutive_count() {
    let mut h = handler(FailureStrategy::Skip, None);
    for _ in 0..10 {
        calls_made(&mut h, 1, true);
        calls_made(&mut h, 1, true);
        calls_made(&mut h, 1, false);
    }
    assert!(!h.is_halted());
    assert_eq!(h.consecutive_failures(), 0);
}

#[test]
fn ignored_failures_never_halt() {
    let mut h = handler(FailureStrategy::Ignore, None);
    for _ in 0..10 {
        assert!(matches!(calls_made(&mut h, 1, true).0, Handled::Ignored(_)));
    }
    assert!(!h.is_halted());
}

#[test]
fn without_continue_on_failure_the_first_failure_halts() {
    let config: ReliabilityConfig<&mut Queue> = ReliabilityConfig::fail_fast();
    let mut h = FailureHandler::new(config, Classifier::retry_all()).unwrap();
    assert!(matches!(calls_made(&mut h, 1, true).0, Handled::Failed(_)));
    assert!(h.is_halted());
}

#[test]
fn an_invalid_config_or_jitter_without_randomness_is_refused() {
    let config: ReliabilityConfig<&mut Queue> = ReliabilityConfig {
        failure_strategy: Some(FailureStrategy::DeadLetterQueue),
        ..Default::default()
    };
    assert_eq!(
        FailureHandler::new(config, Classifier::<&str>::retry_all()).unwrap_err(),
        ReliabilityConfigError::DeadLetterWithoutQueue
    );
    let jittery: ReliabilityConfig<&mut Queue> = ReliabilityConfig {
        retry_policy: Some(RetryPolicy::new().with_jitter(Jitter::Full)),
        ..Default::default()
    };
    assert_eq!(
        FailureHandler::new(jittery, Classifier::<&str>::retry_all()).unwrap_err(),
        ReliabilityConfigError::JitterWithoutRandom
    );
}

struct NoWait;

impl embedded_hal_async::delay::DelayNs for NoWait {
    async fn delay_ns(&mut self, _ns: u32) {}
}

#[test]
fn the_async_handler_applies_the_same_strategy() {
    let mut queue = Queue::new();
    let mut h = handler(FailureStrategy::DeadLetterQueue, Some(&mut queue));
    let out: Handled<(), u32, &str> =
        futures_lite::future::block_on(
            h.process_async(11, NOW, &mut NoWait, |_, _| async { Err("down") }),
        );
    assert_eq!(out, Handled::DeadLettered { attempts: 3 });
    assert_eq!(queue.poll().map(|f| f.into_element()), Some(11));
}
