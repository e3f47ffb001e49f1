//! Named limiters, the registry, the rate-limiting sink (seed-originals B6,
//! B9) and the metrics they record.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_lite::future::block_on;
use guard_core::limit::{FullPolicy, Rate, SlidingWindow, TokenBucket};
use guard_core::slot::UnixMillis;
use std::error::Error;

use guard_std::metrics::{RL_ALLOWED, RL_DENIED, SINK_DROPPED};
use guard_std::ratelimit::{
    DenyPolicy, LimitError, LimitFuture, MemoryLimiter, Quota, RateLimiter, RateLimiterRegistry,
    RateLimitingSink, ReconfigureError, Sink, SinkError,
};
use guard_std::{BackendError, ManualClock};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};

fn bucket(capacity: u32) -> Arc<dyn RateLimiter> {
    Arc::new(MemoryLimiter::new(
        TokenBucket::new(capacity, Rate::per(1, Duration::from_secs(3600))).unwrap(),
        64,
        FullPolicy::DenyNewKeys,
    ))
}

/// Counter values by (metric, name label).
fn counters(snapshot: metrics_util::debugging::Snapshot) -> HashMap<(String, String), u64> {
    snapshot
        .into_vec()
        .into_iter()
        .filter_map(|(key, _, _, value)| {
            let DebugValue::Counter(n) = value else {
                return None;
            };
            let label = key
                .key()
                .labels()
                .find(|l| l.key() == "name")?
                .value()
                .to_owned();
            Some(((key.key().name().to_owned(), label), n))
        })
        .collect()
}

#[test]
fn named_limiters_count_and_record_metrics_by_name() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let registry = RateLimiterRegistry::new([
        ("api1".to_owned(), bucket(2)),
        ("api2".to_owned(), bucket(1)),
    ]);
    metrics::with_local_recorder(&recorder, || {
        block_on(async {
            let api1 = registry.get("api1").unwrap();
            for _ in 0..3 {
                let _ = api1.check("user").await.unwrap();
            }
            let _ = registry.get("api2").unwrap().check("user").await.unwrap();
        })
    });
    let api1 = registry.get("api1").unwrap();
    assert_eq!((api1.allowed(), api1.denied()), (2, 1));
    let seen = counters(snapshotter.snapshot());
    assert_eq!(seen[&(RL_ALLOWED.to_owned(), "api1".to_owned())], 2);
    assert_eq!(seen[&(RL_DENIED.to_owned(), "api1".to_owned())], 1);
    assert_eq!(seen[&(RL_ALLOWED.to_owned(), "api2".to_owned())], 1);
}

#[test]
fn the_registry_is_fixed_once_built() {
    let mut source: HashMap<String, Arc<dyn RateLimiter>> = HashMap::new();
    source.insert("a".into(), bucket(1));
    let registry = RateLimiterRegistry::new(source.clone());
    source.insert("b".into(), bucket(1));
    assert!(registry.get("a").is_some());
    assert!(
        registry.get("b").is_none(),
        "later changes to the source have no effect"
    );
    assert!(registry.get("missing").is_none());
    assert_eq!(registry.names(), ["a"]);
    assert_eq!(registry.get("a").unwrap().name(), "a");
}

/// A sink that records what reaches it.
#[derive(Default)]
struct Collect(Mutex<Vec<(String, u32)>>);

impl Sink<(String, u32)> for Collect {
    async fn send(&self, value: (String, u32)) -> Result<(), SinkError> {
        self.0.lock().unwrap().push(value);
        Ok(())
    }
}

#[test]
fn the_sink_forwards_allowed_elements_and_passes_the_selected_key() {
    let sink = RateLimitingSink::new(
        "uplink",
        bucket(1),
        |v: &(String, u32)| v.0.clone(),
        Collect::default(),
        DenyPolicy::Drop,
    );
    block_on(async {
        sink.send(("a".into(), 1)).await.unwrap();
        sink.send(("b".into(), 2)).await.unwrap();
    });
    assert_eq!(
        sink.inner().0.lock().unwrap().len(),
        2,
        "keys a and b each have their own bucket"
    );
}

#[test]
fn the_drop_policy_counts_what_it_drops() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let sink = RateLimitingSink::new(
        "uplink",
        bucket(1),
        |v: &(String, u32)| v.0.clone(),
        Collect::default(),
        DenyPolicy::Drop,
    );
    metrics::with_local_recorder(&recorder, || {
        block_on(async {
            for i in 0..3 {
                sink.send(("k".into(), i)).await.unwrap();
            }
        })
    });
    assert_eq!(*sink.inner().0.lock().unwrap(), [("k".to_owned(), 0)]);
    assert_eq!(sink.dropped(), 2);
    assert_eq!(
        counters(snapshotter.snapshot())[&(SINK_DROPPED.to_owned(), "uplink".to_owned())],
        2
    );
}

#[test]
fn the_error_policy_names_the_key() {
    let sink = RateLimitingSink::new(
        "uplink",
        bucket(1),
        |v: &(String, u32)| v.0.clone(),
        Collect::default(),
        DenyPolicy::Error,
    );
    block_on(sink.send(("sensor-7".into(), 1))).unwrap();
    let err = block_on(sink.send(("sensor-7".into(), 2))).unwrap_err();
    assert!(matches!(&err, SinkError::RateLimited { key, .. } if key == "sensor-7"));
    assert!(
        err.to_string()
            .starts_with("Rate limited for key: sensor-7"),
        "{err}"
    );
}

/// A backend that cannot be reached.
#[derive(Debug, PartialEq)]
struct Unreachable;

impl std::fmt::Display for Unreachable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("backend unreachable")
    }
}

impl std::error::Error for Unreachable {}

/// A limiter whose backend always fails.
struct Failing;

impl RateLimiter for Failing {
    fn check_n<'a>(&'a self, _key: &'a str, _cost: u32) -> LimitFuture<'a> {
        LimitFuture::Ready(Some(Err(BackendError::new(Unreachable).into())))
    }

    fn quota(&self) -> Quota {
        Quota::SlidingWindow {
            limit: 1,
            window: Duration::from_secs(1),
        }
    }

    fn reconfigure(&self, _quota: Quota) -> Result<(), ReconfigureError> {
        Ok(())
    }
}

#[test]
fn a_failing_backend_is_the_source_of_the_sink_s_error() {
    let sink = RateLimitingSink::new(
        "uplink",
        Arc::new(Failing),
        |v: &(String, u32)| v.0.clone(),
        Collect::default(),
        DenyPolicy::Error,
    );
    let err = block_on(sink.send(("sensor-7".into(), 1))).unwrap_err();
    assert!(matches!(&err, SinkError::Limiter(_)), "{err:?}");
    assert_eq!(err.to_string(), "rate limiter backend: backend unreachable");
    let limiter = err.source().expect("the limiter's error");
    assert!(matches!(
        limiter.downcast_ref(),
        Some(LimitError::Backend(_))
    ));
    let wrapped = limiter
        .source()
        .expect("the backend error")
        .downcast_ref::<BackendError>()
        .expect("a BackendError");
    assert_eq!(wrapped.downcast_ref::<Unreachable>(), Some(&Unreachable));
    assert_eq!(
        wrapped
            .source()
            .and_then(|e| e.downcast_ref::<Unreachable>()),
        Some(&Unreachable)
    );
    assert!(sink.inner().0.lock().unwrap().is_empty());
}

#[test]
fn the_memory_limiter_is_bounded_and_shared_between_threads() {
    let clock = ManualClock::new(UnixMillis(0));
    let limiter: Arc<MemoryLimiter<_, _>> = Arc::new(MemoryLimiter::with_clock(
        SlidingWindow::<10>::new(Duration::from_secs(1), 10).unwrap(),
        3_000,
        FullPolicy::DenyNewKeys,
        clock,
    ));
    assert_eq!(limiter.capacity(), 3 * 1024);
    let admitted: usize = std::thread::scope(|s| {
        (0..8)
            .map(|_| {
                let limiter = limiter.clone();
                s.spawn(move || {
                    (0..100)
                        .filter(|_| limiter.check_now("shared").is_allowed())
                        .count()
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|h| h.join().unwrap())
            .sum()
    });
    assert_eq!(admitted, 10, "exactly the limit across threads");
    for i in 0..10_000 {
        let _ = limiter.check_now(&format!("key-{i}"));
    }
    assert!(limiter.len() <= limiter.capacity());
}

/// The stack a test thread gets here: far below one shard of
/// sliding-window logs of 4096 instants (32 MiB), so a shard that passed
/// through the stack on its way to the heap would overflow it.
const SMALL_STACK: usize = 256 * 1024;

#[test]
fn a_memory_limiter_of_large_sliding_windows_is_built_and_used_on_a_small_stack() {
    std::thread::Builder::new()
        .stack_size(SMALL_STACK)
        .spawn(|| {
            let clock = Arc::new(ManualClock::new(UnixMillis(0)));
            let limiter: MemoryLimiter<_, _> = MemoryLimiter::with_clock(
                SlidingWindow::<4096>::new(Duration::from_secs(1), 3).unwrap(),
                3_000,
                FullPolicy::DenyNewKeys,
                clock.clone(),
            );
            assert_eq!(limiter.capacity(), 3 * 1024);
            let keys: Vec<String> = (0..2_500).map(|i| format!("client-{i}")).collect();
            for key in &keys {
                for _ in 0..3 {
                    assert!(limiter.check_now(key).is_allowed(), "{key}");
                }
                assert_eq!(
                    limiter.check_now(key).retry_after(),
                    Some(Duration::from_secs(1)),
                    "{key}"
                );
            }
            assert_eq!(limiter.len(), keys.len());
            // One window later every key has its full limit again.
            clock.advance(Duration::from_secs(1));
            for key in &keys {
                assert!(limiter.check_now(key).is_allowed(), "{key}");
            }
        })
        .unwrap()
        .join()
        .unwrap();
}

/// Threads spin on one key of a memory limiter while the clock steps 1 ms
/// at a time; after each step the test waits until they have taken every
/// token, so each phase admits exactly what its quota allows. Half way the
/// quota is raised through the trait, as a running server would.
#[test]
fn a_memory_limiter_reconfigured_under_load_keeps_its_keys_and_admits_by_each_quota() {
    let clock = Arc::new(ManualClock::new(UnixMillis(0)));
    let limiter: Arc<MemoryLimiter<_, _>> = Arc::new(MemoryLimiter::with_clock(
        TokenBucket::new(10, Rate::per(1, Duration::from_millis(1))).unwrap(),
        64,
        FullPolicy::DenyNewKeys,
        clock.clone(),
    ));
    // Held for reading across each decision and its count, for writing
    // across the switch: no decision straddles it.
    let phase = std::sync::RwLock::new(0usize);
    let admitted = [AtomicU64::new(0), AtomicU64::new(0)];
    let stop = AtomicBool::new(false);
    let exhausted = || limiter.check_n_now("hot", 0).unwrap().remaining == 0;
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                while !stop.load(Ordering::SeqCst) {
                    let phase = phase.read().unwrap();
                    if limiter.check_now("hot").is_allowed() {
                        admitted[*phase].fetch_add(1, Ordering::SeqCst);
                    }
                }
            });
        }
        let step = |steps: usize| {
            for _ in 0..steps {
                while !exhausted() {
                    std::thread::yield_now();
                }
                clock.advance(Duration::from_millis(1));
            }
            while !exhausted() {
                std::thread::yield_now();
            }
        };
        step(200);
        {
            let mut switched = phase.write().unwrap();
            *switched = 1;
            let dynamic: &dyn RateLimiter = &*limiter;
            dynamic
                .reconfigure(Quota::TokenBucket {
                    capacity: 40,
                    rate: Rate::per(2, Duration::from_millis(1)),
                })
                .unwrap();
        }
        step(200);
        stop.store(true, Ordering::SeqCst);
    });
    let [first, second] = admitted.map(AtomicU64::into_inner);
    // The burst of 10, then one a millisecond for 200 ms.
    assert_eq!(first, 10 + 200);
    // The key owed its whole old bucket (10 units) at the switch, so 30 of
    // the new 40 were there at once; then two a millisecond for 200 ms.
    assert_eq!(second, 30 + 400);
    assert_eq!(limiter.len(), 1, "the key was kept, not forgotten");
}

/// A limiter's memory follows its keys: built with room for 65,536, it
/// builds a shard's table only when a key arrives in it, and one
/// reconfigured before a shard is built limits that shard's keys by the
/// new parameters.
#[test]
fn a_memory_limiter_builds_a_shard_when_its_first_key_arrives() {
    let limiter = MemoryLimiter::new(
        TokenBucket::new(1, Rate::per(1, Duration::from_secs(60))).unwrap(),
        65_536,
        FullPolicy::DenyNewKeys,
    );
    assert_eq!(limiter.capacity(), 65_536);
    assert_eq!(limiter.shards_built(), 0, "nothing built before a key");
    assert!(limiter.check_now("a").is_allowed());
    assert_eq!(limiter.shards_built(), 1);
    assert_eq!(limiter.len(), 1);
    limiter.reconfigure_with(TokenBucket::new(3, Rate::per(1, Duration::from_secs(60))).unwrap());
    // Keys in shards built after: the new capacity of 3.
    let fresh: Vec<String> = (0..200).map(|i| format!("k{i}")).collect();
    for key in &fresh {
        for _ in 0..3 {
            assert!(limiter.check_now(key).is_allowed(), "{key}");
        }
        assert!(!limiter.check_now(key).is_allowed(), "{key}");
    }
    assert!(limiter.shards_built() > 1);
}

/// Fixed windows on the wall clock: a day's window ends at the next
/// midnight UTC, the quota names the algorithm, and new parameters keep
/// what a key used in the day.
#[test]
fn an_aligned_fixed_window_ends_at_midnight_and_takes_new_quotas() {
    use guard_core::limit::FixedWindow;
    let day = FixedWindow::days_at_utc_offset(0, 10).unwrap();
    let limiter = MemoryLimiter::aligned(day, 64, FullPolicy::DenyNewKeys);
    let report = limiter.check_n_now("uplink", 4).unwrap();
    let since_midnight = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        % 86_400;
    assert!(
        report
            .reset_after
            .as_secs()
            .abs_diff(86_400 - since_midnight)
            <= 2,
        "{:?} until the window ends, {since_midnight} s since midnight UTC",
        report.reset_after
    );
    let dynamic: &dyn RateLimiter = &limiter;
    assert_eq!(
        dynamic.quota(),
        Quota::FixedWindow {
            limit: 10,
            period: Duration::from_secs(86_400),
            offset: Duration::ZERO,
        }
    );
    dynamic
        .reconfigure(Quota::FixedWindow {
            limit: 6,
            period: Duration::from_secs(86_400),
            offset: Duration::ZERO,
        })
        .unwrap();
    let report = limiter.check_n_now("uplink", 0).unwrap();
    assert_eq!(report.remaining, 2, "4 of the day's 6 already used");
    let other = dynamic
        .reconfigure(Quota::SlidingWindow {
            limit: 6,
            window: Duration::from_secs(1),
        })
        .unwrap_err();
    assert_eq!(
        other.to_string(),
        "a fixed window limiter cannot take a sliding window quota: a limiter changes its \
         parameters, not its algorithm"
    );
}
