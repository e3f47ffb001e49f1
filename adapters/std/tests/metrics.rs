//! Every metric family is recorded: once-guard outcomes, active-guard
//! transitions and the leader gauge, dead-letter queue size, retries.

use std::time::Duration;

use futures_lite::future::block_on;
use guard_core::guard::{DemoteReason, OnceGuard};
use guard_core::lock::Scope;
use guard_core::retry::{Classifier, RetryExecutor, RetryPolicy};
use guard_core::time::Instant;
use guard_std::LocalLocker;
use guard_std::metered::{MeteredDeadLetterQueue, retry_blocking};
use guard_std::metrics::{
    ACTIVE_LEADER, ACTIVE_TRANSITIONS, DLQ_BYTES, DLQ_SIZE, ONCE_OUTCOMES, RETRY_ATTEMPTS,
    record_demoted, record_promoted,
};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};

/// (name, labels "k=v,...", value) for every recorded metric.
fn recorded(recorder: &DebuggingRecorder) -> Vec<(String, String, f64)> {
    let mut out: Vec<_> = recorder
        .snapshotter()
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, value)| {
            let labels: Vec<String> = key
                .key()
                .labels()
                .map(|l| format!("{}={}", l.key(), l.value()))
                .collect();
            let value = match value {
                DebugValue::Counter(n) => n as f64,
                DebugValue::Gauge(g) => g.into_inner(),
                DebugValue::Histogram(h) => h.len() as f64,
            };
            (key.key().name().to_owned(), labels.join(","), value)
        })
        .collect();
    out.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
    out
}

#[test]
fn once_outcomes_are_counted_by_scope_and_outcome() {
    let recorder = DebuggingRecorder::new();
    let locker = LocalLocker::new();
    let guard = OnceGuard::new(Some(&locker), Scope::new("jobs").unwrap())
        .with_observer(guard_std::metrics::record_once);
    metrics::with_local_recorder(&recorder, || {
        block_on(async {
            guard.allow("1").await.unwrap();
            guard.allow("1").await.unwrap();
            guard.allow("2").await.unwrap();
        })
    });
    let seen = recorded(&recorder);
    assert!(
        seen.contains(&(ONCE_OUTCOMES.into(), "scope=jobs,outcome=won".into(), 2.0)),
        "{seen:?}"
    );
    assert!(
        seen.contains(&(ONCE_OUTCOMES.into(), "scope=jobs,outcome=lost".into(), 1.0)),
        "{seen:?}"
    );
}

#[test]
fn active_transitions_and_the_leader_gauge() {
    let recorder = DebuggingRecorder::new();
    metrics::with_local_recorder(&recorder, || {
        record_promoted("guard:active:x");
        record_demoted("guard:active:x", DemoteReason::RenewDeadline);
    });
    let seen = recorded(&recorder);
    assert!(
        seen.contains(&(ACTIVE_LEADER.into(), "key=guard:active:x".into(), 0.0)),
        "{seen:?}"
    );
    assert!(seen.contains(&(
        ACTIVE_TRANSITIONS.into(),
        "key=guard:active:x,transition=promoted,reason=".into(),
        1.0
    )));
    assert!(seen.contains(&(
        ACTIVE_TRANSITIONS.into(),
        "key=guard:active:x,transition=demoted,reason=renew_deadline".into(),
        1.0
    )));
}

#[test]
fn the_dead_letter_queue_size_follows_every_change() {
    let recorder = DebuggingRecorder::new();
    let size = || {
        recorded(&recorder)
            .into_iter()
            .find(|m| m.0 == DLQ_SIZE && m.1 == "topic=uplink")
            .map(|m| m.2)
    };
    metrics::with_local_recorder(&recorder, || {
        let dlq: MeteredDeadLetterQueue<u32, &str, 2> = MeteredDeadLetterQueue::new("uplink");
        assert_eq!(size(), Some(0.0));
        dlq.add(1, Some("e"), 1, Instant::ZERO).unwrap();
        dlq.add(2, Some("e"), 1, Instant::ZERO).unwrap();
        assert_eq!(
            dlq.add(3, Some("e"), 1, Instant::ZERO)
                .map_err(|f| f.into_element()),
            Err(3)
        );
        assert_eq!(size(), Some(2.0));
        dlq.poll();
        assert_eq!(size(), Some(1.0));
        dlq.clear();
        assert_eq!(size(), Some(0.0));
    });
}

#[test]
fn a_dead_letter_queue_bounded_in_bytes_hands_back_what_would_pass_its_bound() {
    let recorder = DebuggingRecorder::new();
    let bytes = || {
        recorded(&recorder)
            .into_iter()
            .find(|m| m.0 == DLQ_BYTES && m.1 == "topic=uplink")
            .map(|m| m.2)
    };
    metrics::with_local_recorder(&recorder, || {
        // Room for 100 letters but 1,000 bytes: a producer's long names or
        // large payloads fill the bytes long before the count.
        let dlq: MeteredDeadLetterQueue<Vec<u8>, String, 100> =
            MeteredDeadLetterQueue::bounded_in_bytes("uplink", 1000, |f| {
                f.element().len() + f.error().map_or(0, String::len)
            });
        assert_eq!(bytes(), Some(0.0));
        dlq.add(vec![0; 600], Some("why".into()), 1, Instant::ZERO)
            .unwrap();
        assert_eq!(dlq.bytes(), 603);
        let handed_back = dlq
            .add(vec![1; 400], Some("why".into()), 1, Instant::ZERO)
            .map_err(|f| f.into_element().len());
        assert_eq!(handed_back, Err(400), "603 + 403 is over 1,000");
        dlq.add(vec![2; 390], Some("why".into()), 1, Instant::ZERO)
            .unwrap();
        assert_eq!((dlq.len(), dlq.bytes()), (2, 996));
        assert_eq!(bytes(), Some(996.0));
        // One larger than the whole bound never fits, even when empty.
        dlq.clear();
        assert_eq!(bytes(), Some(0.0));
        assert!(
            dlq.add(vec![3; 1001], None, 1, Instant::ZERO).is_err(),
            "over the bound alone"
        );
        dlq.add(vec![4; 1000], None, 1, Instant::ZERO).unwrap();
        assert_eq!(dlq.poll().map(|f| f.into_element().len()), Some(1000));
        assert_eq!((dlq.len(), dlq.bytes()), (0, 0));
        assert_eq!(bytes(), Some(0.0));
    });
}

#[test]
fn retry_attempts_are_counted_on_success_and_on_giving_up() {
    let recorder = DebuggingRecorder::new();
    let mut executor = RetryExecutor::new(
        RetryPolicy::fixed_delay(3, Duration::ZERO),
        Classifier::retry_all(),
    )
    .unwrap();
    metrics::with_local_recorder(&recorder, || {
        let ok = retry_blocking(
            "uplink",
            &mut executor,
            |_| Ok(()),
            |attempt| if attempt < 2 { Err("x") } else { Ok(attempt) },
        );
        assert_eq!(ok, Ok(2));
        let failed: Result<(), _> =
            retry_blocking("uplink", &mut executor, |_| Ok(()), |_| Err("down"));
        assert_eq!(failed.unwrap_err().attempts, 4);
    });
    assert!(recorded(&recorder).contains(&(RETRY_ATTEMPTS.into(), "name=uplink".into(), 6.0)));
}
