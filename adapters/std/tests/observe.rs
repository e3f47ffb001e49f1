//! The spans and latency histograms of lock calls and limiter decisions
//! (`guard_std::observe`), seen by a subscriber and a recorder of the
//! test's own.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use guard_core::limit::{FullPolicy, Rate, TokenBucket};
use guard_core::lock::{SendLocker as _, Ttl};
use guard_smol::LockWatchdog;
use guard_std::ratelimit::{
    KeysHeld, LimitFuture, MemoryLimiter, NamedRateLimiter, Quota, RateLimiter, ReconfigureError,
};
use guard_std::{LocalLocker, SharedLocker};
use guard_testkit::SpanLog;
use metrics_util::debugging::{DebugValue, DebuggingRecorder};

/// Observations of each histogram by name and sorted labels.
type Histograms = BTreeMap<(String, Vec<(String, String)>), usize>;

/// [`Histograms`] from one snapshot (a snapshot drains what a histogram
/// held).
fn histograms(recorder: &DebuggingRecorder) -> Histograms {
    let mut counts = BTreeMap::new();
    for (key, _, _, value) in recorder.snapshotter().snapshot().into_vec() {
        if let DebugValue::Histogram(values) = value {
            let mut labels: Vec<(String, String)> = key
                .key()
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            labels.sort();
            *counts
                .entry((key.key().name().to_owned(), labels))
                .or_default() += values.len();
        }
    }
    counts
}

/// Histogram `name`'s observations with exactly `labels` (sorted).
fn observations(histograms: &Histograms, name: &str, labels: [(&str, &str); 2]) -> usize {
    let labels = labels.map(|(k, v)| (k.to_owned(), v.to_owned())).to_vec();
    histograms
        .get(&(name.to_owned(), labels))
        .copied()
        .unwrap_or(0)
}

/// A lock held across renewals and released, and an acquisition that
/// finds it taken: each call is a span with its key, fence and outcome,
/// timed in `guard_lock_seconds{op, outcome}`.
#[test]
fn lock_calls_are_spans_with_key_fence_and_outcome_and_are_timed() {
    let log = SpanLog::new();
    let recorder = DebuggingRecorder::new();
    let locker = SharedLocker::new(LocalLocker::new());
    let ttl = Ttl::from_millis(1500).unwrap();
    let watchdog = LockWatchdog::new(locker.clone(), ttl).unwrap();
    let held_elsewhere = tracing::subscriber::with_default(log.subscriber(), || {
        metrics::with_local_recorder(&recorder, || {
            smol::block_on(async {
                watchdog
                    .run("report:nightly", |_hold| async {
                        // Past one renewal (every ttl / 3).
                        async_io::Timer::after(Duration::from_millis(700)).await;
                        locker.try_lock("report:nightly", ttl).await
                    })
                    .await
            })
        })
    });
    assert_eq!(held_elsewhere.unwrap().unwrap().unwrap(), None);

    let acquired = log.closed("acquire");
    let mine: Vec<_> = acquired
        .iter()
        .filter(|s| s.field("outcome") == Some("acquired"))
        .collect();
    assert_eq!(mine.len(), 1, "{acquired:?}");
    assert_eq!(mine[0].field("key"), Some("report:nightly"));
    assert_eq!(mine[0].field("ttl_ms"), Some("1500"));
    let fence = mine[0].field("fence").expect("the acquisition's fence");
    assert!(
        acquired
            .iter()
            .any(|s| s.field("outcome") == Some("held_elsewhere") && s.field("fence").is_none()),
        "{acquired:?}"
    );
    let renewed = log.closed("renew");
    assert!(!renewed.is_empty(), "{:?}", log.all());
    for renewal in &renewed {
        assert_eq!(renewal.field("key"), Some("report:nightly"));
        assert_eq!(
            renewal.field("fence"),
            Some(fence),
            "renewed under its fence"
        );
        assert_eq!(renewal.field("outcome"), Some("held"));
    }
    let released = log.closed("release");
    assert_eq!(released.len(), 1, "{:?}", log.all());
    assert_eq!(released[0].field("outcome"), Some("released"));
    assert_eq!(released[0].field("fence"), Some(fence));

    let histograms = histograms(&recorder);
    let timed = |op, outcome| {
        observations(
            &histograms,
            "guard_lock_seconds",
            [("op", op), ("outcome", outcome)],
        )
    };
    assert_eq!(timed("acquire", "acquired"), 1);
    assert_eq!(timed("acquire", "held_elsewhere"), 1);
    assert_eq!(timed("renew", "held"), renewed.len());
    assert_eq!(timed("release", "released"), 1);
}

/// A limiter whose keys live elsewhere (as on Redis): a memory limiter
/// that does not say how many keys it holds.
struct Elsewhere(MemoryLimiter<TokenBucket>);

impl RateLimiter for Elsewhere {
    fn check_n<'a>(&'a self, key: &'a str, cost: u32) -> LimitFuture<'a> {
        self.0.check_n(key, cost)
    }
    fn quota(&self) -> Quota {
        self.0.quota()
    }
    fn reconfigure(&self, quota: Quota) -> Result<(), ReconfigureError> {
        self.0.reconfigure(quota)
    }
    fn keys_held(&self) -> Option<KeysHeld> {
        None
    }
}

/// Each decision is a span `limit` with the limiter's name, the key, the
/// cost and the outcome; only a limiter on a shared backend is timed in
/// `guard_rl_decision_seconds` (one in memory decides in nanoseconds).
#[test]
fn limiter_decisions_are_spans_and_a_shared_backends_are_timed() {
    let bucket = || TokenBucket::new(1, Rate::per(1, Duration::from_secs(60))).unwrap();
    let memory = NamedRateLimiter::new(
        "local",
        Arc::new(MemoryLimiter::new(bucket(), 16, FullPolicy::DenyNewKeys)),
    );
    let shared = NamedRateLimiter::new(
        "shared",
        Arc::new(Elsewhere(MemoryLimiter::new(
            bucket(),
            16,
            FullPolicy::DenyNewKeys,
        ))),
    );
    let log = SpanLog::new();
    let recorder = DebuggingRecorder::new();
    tracing::subscriber::with_default(log.subscriber(), || {
        metrics::with_local_recorder(&recorder, || {
            smol::block_on(async {
                for limiter in [&memory, &shared] {
                    assert!(limiter.check("sensor-7").await.unwrap().is_allowed());
                    assert!(!limiter.check("sensor-7").await.unwrap().is_allowed());
                }
            })
        })
    });

    let decided = log.closed("limit");
    let outcomes: Vec<_> = decided
        .iter()
        .map(|s| (s.field("name").unwrap(), s.field("outcome").unwrap()))
        .collect();
    assert_eq!(
        outcomes,
        [
            ("local", "allowed"),
            ("local", "denied"),
            ("shared", "allowed"),
            ("shared", "denied")
        ]
    );
    assert!(
        decided
            .iter()
            .all(|s| s.field("key") == Some("sensor-7") && s.field("cost") == Some("1"))
    );
    let histograms = histograms(&recorder);
    let timed = |name, outcome| {
        observations(
            &histograms,
            "guard_rl_decision_seconds",
            [("name", name), ("outcome", outcome)],
        )
    };
    assert_eq!(
        (timed("shared", "allowed"), timed("shared", "denied")),
        (1, 1)
    );
    assert_eq!(
        (timed("local", "allowed"), timed("local", "denied")),
        (0, 0)
    );
}
