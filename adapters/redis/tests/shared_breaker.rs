//! `RedisBreaker`: replicas sharing one breaker through Redis decide as
//! one guard-core breaker given the same calls at the same times; what one
//! replica sees opens it for the others on the server's clock; reports
//! from callers on threads of two replicas are all counted (a write that
//! loses is decided again, never lost); a key holding something else is
//! an error naming it.

use std::time::Duration;

use guard_core::breaker::{BreakerConfig, CircuitBreaker, CountWindow, State, TimeWindow};
use guard_core::time::Instant;
use guard_redis::{RedisBreaker, RedisConnection, Topology};
use guard_testkit::RedisServer;

const TIMEOUT: Duration = Duration::from_secs(2);

fn connect(server: &RedisServer) -> RedisConnection {
    smol::block_on(RedisConnection::connect(
        Topology::Standalone { url: server.url() },
        TIMEOUT,
    ))
    .expect("connect")
}

fn config() -> BreakerConfig {
    BreakerConfig::new()
        .with_minimum_calls(4)
        .with_failure_rate(50)
        .with_slow_call_rate(75)
        .with_slow_call_duration(Duration::from_millis(300))
        .with_half_open_calls(3)
        .with_wait_in_open(Duration::from_secs(2))
        .with_max_wait_in_half_open(Duration::from_secs(10))
}

/// A small deterministic generator, so a failing run can be replayed.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, below: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % below
    }
}

/// `steps` calls, each through one of two replicas chosen at random, at
/// times that move on at random, with random outcomes and durations:
/// every answer equals the one guard-core's breaker gives in memory.
fn two_replicas_decide_as_one<W>(key: &str, window: W, steps: usize)
where
    W: guard_core::breaker::WindowSnapshot + Default + Clone,
{
    let server = RedisServer::start().expect("redis-server");
    let replicas = [
        RedisBreaker::<W>::new(connect(&server), key, config()).unwrap(),
        RedisBreaker::<W>::new(connect(&server), key, config()).unwrap(),
    ];
    let mut memory = CircuitBreaker::new(config(), window).unwrap();
    let mut random = Lcg(7);
    let mut now = Instant::from_secs(1_000_000);
    let mut states = std::collections::BTreeSet::new();
    smol::block_on(async {
        for step in 0..steps {
            now = now + Duration::from_millis(random.next(900));
            let replica = &replicas[random.next(2) as usize];
            let shared = replica.try_acquire_at(now).await.unwrap();
            let local = memory.try_acquire(now);
            match (shared, local) {
                (Ok(shared), Ok(local)) => {
                    let end = now + Duration::from_millis(random.next(500));
                    let failed = random.next(3) == 0;
                    let reporter = &replicas[random.next(2) as usize];
                    assert_eq!(
                        reporter.on_result_at(shared, end, failed).await.unwrap(),
                        memory.on_result(local, end, failed),
                        "step {step}: the same transition"
                    );
                }
                (Err(shared), Err(local)) => {
                    assert_eq!(shared, local, "step {step}: the same refusal")
                }
                (shared, local) => panic!("step {step}: shared {shared:?}, in memory {local:?}"),
            }
            let state = replicas[0].state().await.unwrap();
            assert_eq!(state, memory.state(), "step {step}: the same state");
            states.insert(state.name());
        }
    });
    assert!(
        states.len() >= 3,
        "the sequence went through closed, open and half-open: {states:?}"
    );
}

#[test]
fn two_replicas_with_a_count_window_decide_as_one_breaker_in_memory() {
    two_replicas_decide_as_one("guard:breaker:count", CountWindow::<8>::new(), 600);
}

#[test]
fn two_replicas_with_a_time_window_decide_as_one_breaker_in_memory() {
    two_replicas_decide_as_one("guard:breaker:time", TimeWindow::<3>::new(), 600);
}

#[test]
fn failures_one_replica_sees_open_the_breaker_for_the_other() {
    let server = RedisServer::start().expect("redis-server");
    let key = "guard:breaker:payments";
    let a = RedisBreaker::<CountWindow<10>>::new(connect(&server), key, config()).unwrap();
    let b = RedisBreaker::<CountWindow<10>>::new(connect(&server), key, config()).unwrap();
    smol::block_on(async {
        for _ in 0..4 {
            let permit = a.try_acquire().await.unwrap().expect("closed");
            a.on_result(permit, true).await.unwrap();
        }
        assert_eq!(b.state().await.unwrap(), State::Open);
        let refused = b.try_acquire().await.unwrap().expect_err("open for b too");
        let wait = refused.retry_after.expect("says when");
        assert!(
            wait <= Duration::from_secs(2) && wait > Duration::from_millis(1_500),
            "{wait:?}"
        );
        // A refusal that moves nothing is read, not written: b counts it.
        assert_eq!(
            (b.refused(), b.metrics().await.unwrap().not_permitted),
            (1, 0)
        );
        // On the server's clock, two seconds on, b's trial is permitted.
        smol::Timer::after(Duration::from_millis(2_100)).await;
        let trial = b.try_acquire().await.unwrap().expect("half-open");
        assert_eq!(a.state().await.unwrap(), State::HalfOpen);
        b.on_ignored(trial).await.unwrap();
        assert_eq!(a.close().await.unwrap().to, State::Closed);
    });
}

#[test]
fn reports_from_callers_on_threads_of_two_replicas_are_all_counted() {
    let server = RedisServer::start().expect("redis-server");
    let key = "guard:breaker:threads";
    // A window larger than every call, a minimum no run reaches: it only counts.
    let config = BreakerConfig::new()
        .with_minimum_calls(10_000)
        .with_max_wait_in_half_open(Duration::from_secs(60));
    let replicas: Vec<_> = (0..2)
        .map(|_| RedisBreaker::<CountWindow<1024>>::new(connect(&server), key, config).unwrap())
        .collect();
    const CALLS: u32 = 40;
    std::thread::scope(|s| {
        for replica in &replicas {
            for _ in 0..4 {
                s.spawn(move || {
                    smol::block_on(async {
                        for i in 0..CALLS {
                            let permit = replica.try_acquire().await.unwrap().expect("closed");
                            replica.on_result(permit, i % 4 == 0).await.unwrap();
                        }
                    })
                });
            }
        }
    });
    let metrics = smol::block_on(replicas[0].metrics()).unwrap();
    assert_eq!(metrics.tally.calls, 8 * CALLS, "every report counted once");
    assert_eq!(metrics.tally.failures, 8 * CALLS / 4);
}

#[test]
fn a_key_holding_something_else_is_an_error_naming_it() {
    let server = RedisServer::start().expect("redis-server");
    let key = "guard:breaker:other";
    server.command(&format!("SET {key} hello")).unwrap();
    let breaker = RedisBreaker::<CountWindow<10>>::new(connect(&server), key, config()).unwrap();
    let error = smol::block_on(breaker.try_acquire())
        .unwrap_err()
        .to_string();
    assert!(error.contains(key) && error.contains("snapshot"), "{error}");
    // Another window's state is not this one's.
    let time =
        RedisBreaker::<TimeWindow<3>>::new(connect(&server), "guard:breaker:w", config()).unwrap();
    let permit = smol::block_on(time.try_acquire()).unwrap().unwrap();
    smol::block_on(time.on_ignored(permit)).unwrap();
    let count = RedisBreaker::<CountWindow<10>>::new(connect(&server), "guard:breaker:w", config())
        .unwrap();
    let error = smol::block_on(count.state()).unwrap_err().to_string();
    assert!(error.contains("guard:breaker:w"), "{error}");
    // The way out: a fresh breaker written over it.
    smol::block_on(count.reset()).unwrap();
    assert_eq!(smol::block_on(count.state()).unwrap(), State::Closed);
    let refused = RedisBreaker::<CountWindow<10>>::new(connect(&server), "", config())
        .unwrap_err()
        .to_string();
    assert!(refused.contains("circuit breaker key"), "{refused}");
    let unbounded = RedisBreaker::<CountWindow<10>>::new(
        connect(&server),
        "guard:breaker:x",
        BreakerConfig::new(),
    )
    .unwrap_err()
    .to_string();
    assert!(unbounded.contains("max_wait_in_half_open"), "{unbounded}");
}

#[test]
fn callers_on_threads_of_two_replicas_get_no_more_trials_than_a_half_open_breaker_has() {
    let server = RedisServer::start().expect("redis-server");
    let key = "guard:breaker:trials";
    let replicas: Vec<_> = (0..2)
        .map(|_| RedisBreaker::<CountWindow<10>>::new(connect(&server), key, config()).unwrap())
        .collect();
    smol::block_on(replicas[0].open()).unwrap();
    // Every caller asks a minute on, past the open wait, all at once.
    let unix_now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    let later = Instant::from_secs(unix_now.as_secs() + 60);
    let granted = std::sync::atomic::AtomicU32::new(0);
    std::thread::scope(|s| {
        for replica in &replicas {
            for _ in 0..4 {
                let granted = &granted;
                s.spawn(move || {
                    smol::block_on(async {
                        for _ in 0..5 {
                            if replica.try_acquire_at(later).await.unwrap().is_ok() {
                                granted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                            }
                        }
                    })
                });
            }
        }
    });
    assert_eq!(
        granted.into_inner(),
        3,
        "40 asks of 8 callers on two replicas: exactly the 3 trials"
    );
    assert_eq!(
        smol::block_on(replicas[1].state()).unwrap(),
        State::HalfOpen
    );
}
