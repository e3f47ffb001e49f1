//! Costs, reports and new parameters on Redis, decided exactly as
//! guard-core decides them: the same trace of (key, time, cost) calls gives
//! the same five values (admitted, limit, remaining, retry after, reset
//! after), in one round trip, across a change of parameters.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant as StdInstant};

use guard_core::limit::{
    Algorithm, CostAboveLimit, FixedWindow, LeakyBucket, Limiter, Rate, Report, SlidingWindow,
    TokenBucket,
};
use guard_core::time::Instant;
use guard_redis::{
    Clock, Parameter, RedisConnection, RedisFixedWindow, RedisGuardError, RedisLeakyBucket,
    RedisSlidingWindow, RedisTokenBucket, Topology,
};
use guard_std::ratelimit::{LimitError, Quota, RateLimiter, ReconfigureError};
use guard_testkit::RedisServer;

fn connect(server: &RedisServer) -> RedisConnection {
    smol::block_on(RedisConnection::connect(
        Topology::Standalone { url: server.url() },
        Duration::from_secs(2),
    ))
    .expect("connect")
}

/// A trace of (key, milliseconds, cost): bursts, steps forward, idle
/// times and steps backwards, costs from 0 to 4.
fn trace(seed: u64, len: usize) -> Vec<(&'static str, u64, u32)> {
    let mut s = seed;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let keys = ["alpha", "beta", "gamma"];
    let mut now = 1_700_000_000_000u64;
    (0..len)
        .map(|_| {
            let r = next();
            now = match r % 10 {
                0..=3 => now,
                4..=7 => now + r % 300,
                8 => now + 1_000 + r % 2_000,
                _ => now.saturating_sub(r % 200),
            };
            let cost = ((r >> 20) % 5) as u32;
            (keys[(r >> 32) as usize % keys.len()], now, cost)
        })
        .collect()
}

/// Runs `calls` through guard-core and through `redis`, switching both to
/// `after` half way. guard-core's keys are carried over at their next
/// decision, as the Redis scripts do (the documented Redis semantics).
fn compare<A: Algorithm + Clone>(
    name: &str,
    before: A,
    after: A,
    calls: &[(&'static str, u64, u32)],
    mut redis: impl FnMut(&str, Instant, u32) -> Report,
    mut reconfigure: impl FnMut(),
) -> [usize; 2] {
    let mut local: HashMap<&str, (Limiter<A>, bool)> = HashMap::new();
    let mut counts = [0usize; 2];
    for (i, &(key, ms, cost)) in calls.iter().enumerate() {
        let switched = i >= calls.len() / 2;
        if i == calls.len() / 2 {
            reconfigure();
        }
        let now = Instant::from_millis(ms);
        let (limiter, carried) = local
            .entry(key)
            .or_insert_with(|| (Limiter::new(before.clone()), false));
        if switched && !*carried {
            limiter.reconfigure(after.clone(), now);
            *carried = true;
        }
        let expected = limiter.check_n(cost, now).expect("cost within the quota");
        let got = redis(key, now, cost);
        assert_eq!(
            got, expected,
            "{name}: call {i} ({key}, {ms} ms, cost {cost})"
        );
        counts[usize::from(got.is_denied())] += 1;
    }
    counts
}

#[test]
fn costs_and_reports_match_guard_core_across_new_parameters() {
    let server = RedisServer::start().expect("redis-server");
    let conn = connect(&server);
    let token = TokenBucket::new(4, Rate::per_second(5)).unwrap();
    let token_after = TokenBucket::new(6, Rate::per(1, Duration::from_millis(700))).unwrap();
    let leaky = LeakyBucket::new(4, Rate::per(1, Duration::from_millis(300))).unwrap();
    let leaky_after = LeakyBucket::new(5, Rate::per(1, Duration::from_millis(600))).unwrap();
    let window = SlidingWindow::<8>::new(Duration::from_millis(1_000), 4).unwrap();
    let window_after = SlidingWindow::<8>::new(Duration::from_millis(1_500), 5).unwrap();
    let fixed = FixedWindow::new(Duration::from_millis(700), 4)
        .unwrap()
        .with_offset(Duration::from_millis(250));
    let fixed_after = FixedWindow::new(Duration::from_millis(1_100), 5)
        .unwrap()
        .with_offset(Duration::from_millis(100));
    let mut totals = [[0usize; 2]; 4];
    for seed in 1..=4u64 {
        let calls = trace(seed * 7_919, 400);
        let rt = RedisTokenBucket::new(conn.clone(), token)
            .unwrap()
            .with_prefix(&format!("tb{seed}"))
            .unwrap();
        let rl = RedisLeakyBucket::new(conn.clone(), leaky)
            .unwrap()
            .with_prefix(&format!("lb{seed}"))
            .unwrap();
        let rw = RedisSlidingWindow::new(conn.clone(), window)
            .unwrap()
            .with_prefix(&format!("rl{seed}"))
            .unwrap();
        let rf = RedisFixedWindow::new(conn.clone(), fixed)
            .unwrap()
            .with_prefix(&format!("fw{seed}"))
            .unwrap();
        let counts = [
            compare(
                "token bucket",
                token,
                token_after,
                &calls,
                |k, now, cost| smol::block_on(rt.check_n(k, cost, Clock::Caller(now))).unwrap(),
                || rt.reconfigure(token_after).unwrap(),
            ),
            compare(
                "leaky bucket",
                leaky,
                leaky_after,
                &calls,
                |k, now, cost| smol::block_on(rl.check_n(k, cost, Clock::Caller(now))).unwrap(),
                || rl.reconfigure(leaky_after).unwrap(),
            ),
            compare(
                "sliding window",
                window,
                window_after,
                &calls,
                |k, now, cost| smol::block_on(rw.check_n(k, cost, Clock::Caller(now))).unwrap(),
                || rw.reconfigure(window_after).unwrap(),
            ),
            compare(
                "fixed window",
                fixed,
                fixed_after,
                &calls,
                |k, now, cost| smol::block_on(rf.check_n(k, cost, Clock::Caller(now))).unwrap(),
                || rf.reconfigure(fixed_after).unwrap(),
            ),
        ];
        for (total, count) in totals.iter_mut().zip(counts) {
            total[0] += count[0];
            total[1] += count[1];
        }
    }
    for (name, [allowed, denied]) in ["token", "leaky", "window", "fixed"].iter().zip(totals) {
        assert!(
            allowed > 200 && denied > 200,
            "{name}: {allowed} allowed, {denied} denied: the traces exercise both"
        );
    }
}

#[test]
fn a_cost_above_the_quota_is_refused_before_anything_is_sent() {
    let server = RedisServer::start().expect("redis-server");
    let conn = connect(&server);
    let bucket = RedisTokenBucket::new(
        conn.clone(),
        TokenBucket::new(5, Rate::per_second(5)).unwrap(),
    )
    .unwrap();
    let now = Clock::Caller(Instant::from_secs(1));
    let err = smol::block_on(bucket.check_n("k", 6, now)).unwrap_err();
    assert!(
        matches!(
            err,
            RedisGuardError::InvalidInput {
                parameter: Parameter::Cost,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "invalid cost 6: a cost of 6 exceeds the limit of 5: no wait can ever admit it"
    );
    let window = RedisSlidingWindow::new(
        conn,
        SlidingWindow::<4>::new(Duration::from_secs(1), 3).unwrap(),
    )
    .unwrap();
    let dynamic: &dyn RateLimiter = &window;
    match smol::block_on(dynamic.check_n("k", 4)) {
        Err(LimitError::Cost(cost)) => assert_eq!(cost, CostAboveLimit { cost: 4, limit: 3 }),
        other => panic!("expected the cost error, got {other:?}"),
    }
    let mut redis = redis::Client::open(server.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut redis).unwrap();
    assert!(keys.is_empty(), "nothing was written: {keys:?}");
}

#[test]
fn a_quota_of_another_algorithm_or_unrepresentable_is_refused_and_the_old_one_kept() {
    let server = RedisServer::start().expect("redis-server");
    let conn = connect(&server);
    let token = TokenBucket::new(5, Rate::per_second(5)).unwrap();
    let bucket = RedisTokenBucket::new(conn, token).unwrap();
    let limiter: &dyn RateLimiter = &bucket;
    let window = Quota::SlidingWindow {
        limit: 3,
        window: Duration::from_secs(1),
    };
    let err = limiter.reconfigure(window).unwrap_err();
    assert!(
        matches!(err, ReconfigureError::OtherAlgorithm { .. }),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "a token bucket limiter cannot take a sliding window quota: a limiter changes its \
         parameters, not its algorithm"
    );
    // A rate whose interval is not a whole number of microseconds.
    let odd = Quota::TokenBucket {
        capacity: 5,
        rate: Rate::per(3, Duration::from_micros(10)),
    };
    let err = limiter.reconfigure(odd).unwrap_err();
    assert!(matches!(err, ReconfigureError::Backend(_)), "{err:?}");
    assert!(
        err.to_string()
            .contains("whole, positive number of microseconds"),
        "{err}"
    );
    assert_eq!(
        limiter.quota(),
        Quota::TokenBucket {
            capacity: 5,
            rate: Rate::per_second(5)
        }
    );
}

/// Admissions of `workers` threads hammering one key through `limiter`
/// for `run`, counted apart before and after `switch`, called at `run / 2`.
fn hammer(
    limiter: &dyn RateLimiter,
    workers: usize,
    run: Duration,
    switch: impl FnOnce(),
) -> [u64; 2] {
    let admitted = [AtomicU64::new(0), AtomicU64::new(0)];
    let phase = AtomicUsize::new(0);
    let start = StdInstant::now();
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| {
                while start.elapsed() < run {
                    let report = smol::block_on(limiter.check("hot")).expect("decision");
                    if report.is_allowed() {
                        admitted[phase.load(Ordering::SeqCst)].fetch_add(1, Ordering::SeqCst);
                    }
                }
            });
        }
        std::thread::sleep(run / 2);
        phase.store(1, Ordering::SeqCst);
        switch();
    });
    admitted.map(AtomicU64::into_inner)
}

#[test]
fn a_bucket_reconfigured_under_load_limits_by_the_old_rate_then_the_new() {
    let server = RedisServer::start().expect("redis-server");
    let conn = connect(&server);
    // 50 a second with a burst of 10, then 200 a second with a burst of 40.
    let bucket =
        RedisTokenBucket::new(conn, TokenBucket::new(10, Rate::per_second(50)).unwrap()).unwrap();
    let run = Duration::from_secs(4);
    let [first, second] = hammer(&bucket, 16, run, || {
        let quota = Quota::TokenBucket {
            capacity: 40,
            rate: Rate::per_second(200),
        };
        RateLimiter::reconfigure(&bucket, quota).unwrap();
    });
    // The budget of each half (capacity + rate × time, with the time
    // measured by this client, so a margin of a few hundred ms of rate
    // each way for scheduling on a loaded machine), and the raised quota's
    // room at the switch.
    assert!(first <= 10 + 50 * 2 + 25, "first half: {first}");
    assert!(
        first >= 50 * 2 / 2,
        "first half admitted at the old rate: {first}"
    );
    assert!(second <= 30 + 200 * 2 + 100, "second half: {second}");
    assert!(
        second >= 200 * 2 / 2,
        "second half admitted at the new rate: {second}"
    );
}

/// guard-smol's waiting limiter over a Redis bucket: 32 waiters on one key
/// are admitted in arrival order at the bucket's rate, each admission one
/// more round trip after its sleep.
#[test]
fn thirty_two_waiters_on_a_redis_bucket_are_admitted_in_arrival_order_at_its_rate() {
    let server = RedisServer::start().expect("redis-server");
    let conn = connect(&server);
    let bucket =
        RedisTokenBucket::new(conn, TokenBucket::new(1, Rate::per_second(50)).unwrap()).unwrap();
    let limiter = guard_smol::WaitingLimiter::new(std::sync::Arc::new(bucket));
    let finished = guard_testkit::finish_order(32, |_| async {
        let report = limiter.until_ready("hot", None).await.expect("admitted");
        assert!(report.is_allowed());
    });
    assert_eq!(finished.order, (0..32).collect::<Vec<_>>(), "arrival order");
    let span = finished.span;
    eprintln!(
        "32 waiters at 50/s on Redis: {:.1} admitted per second",
        31.0 / span.as_secs_f64()
    );
    assert!(span >= Duration::from_millis(600), "too fast: {span:?}");
    assert!(span <= Duration::from_millis(1_000), "too slow: {span:?}");
}
