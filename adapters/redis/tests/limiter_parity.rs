//! The Redis limiters decide exactly as guard-core's: the same trace of
//! (key, time) calls gives the same decisions and the same retry hints.

use std::collections::HashMap;
use std::time::Duration;

use guard_core::limit::{
    Decision, FixedWindow, LeakyBucket, Limiter, LimiterError, Rate, SlidingWindow, TokenBucket,
};
use guard_core::time::Instant;
use guard_redis::{
    CALLER_OFFSET_BOUND, CALLER_RATE_BOUND_PPM, Clock, Parameter, RedisConnection,
    RedisFixedWindow, RedisGuardError, RedisLeakyBucket, RedisSlidingWindow, RedisTokenBucket,
    Topology,
};
use guard_testkit::{RedisCluster, RedisServer};

fn connect(topology: Topology) -> RedisConnection {
    smol::block_on(RedisConnection::connect(topology, Duration::from_secs(2))).expect("connect")
}

/// A trace: (key, milliseconds). Mostly forward, with bursts at one
/// instant and some steps backwards.
fn trace(seed: u64, len: usize) -> Vec<(&'static str, u64)> {
    let mut s = seed;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let keys = ["alpha", "beta:1", "用户"];
    let mut now = 1_700_000_000_000u64;
    (0..len)
        .map(|_| {
            let r = next();
            now = match r % 10 {
                0..=3 => now,                     // burst
                4..=7 => now + r % 400,           // forward
                8 => now + 2_000 + r % 3_000,     // idle
                _ => now.saturating_sub(r % 250), // backwards
            };
            (keys[(r >> 32) as usize % keys.len()], now)
        })
        .collect()
}

/// The seed's in-memory limiter cases as a vector, for every limiter.
fn seed_vector() -> Vec<(&'static str, u64)> {
    let t = 1_700_000_000_000;
    [
        0, 10, 20, 30, 100, 200, 1_000, 1_001, 1_002, 2_000, 2_000, 2_000, 5_000,
    ]
    .iter()
    .map(|d| ("seed", t + d))
    .collect()
}

fn compare<A: guard_core::limit::Algorithm + Clone>(
    name: &str,
    algorithm: A,
    calls: &[(&'static str, u64)],
    mut redis: impl FnMut(&str, Instant) -> Decision,
) -> (usize, usize) {
    let mut local: HashMap<&str, Limiter<A>> = HashMap::new();
    let mut allowed = 0;
    for (i, (key, ms)) in calls.iter().enumerate() {
        let now = Instant::from_millis(*ms);
        let expected = local
            .entry(key)
            .or_insert_with(|| Limiter::new(algorithm.clone()))
            .check(now);
        let got = redis(key, now);
        assert_eq!(got, expected, "{name}: call {i} ({key}, {ms} ms) differs");
        allowed += usize::from(got.is_allowed());
    }
    (allowed, calls.len() - allowed)
}

#[test]
fn redis_limiters_match_guard_core_on_shared_vectors() {
    let server = RedisServer::start().expect("redis-server");
    let conn = connect(Topology::Standalone { url: server.url() });
    let token = TokenBucket::new(3, Rate::per_second(5)).unwrap();
    let leaky = LeakyBucket::new(2, Rate::per(1, Duration::from_millis(300))).unwrap();
    let window = SlidingWindow::<8>::new(Duration::from_millis(1_000), 3).unwrap();
    let fixed = FixedWindow::new(Duration::from_millis(700), 3)
        .unwrap()
        .with_offset(Duration::from_millis(250));
    let mut vectors = vec![seed_vector()];
    vectors.extend((1..=5).map(|seed| trace(seed * 7919, 400)));
    let mut totals = [(0, 0); 4];
    let mut add = |i: usize, (a, d): (usize, usize)| {
        totals[i].0 += a;
        totals[i].1 += d;
    };
    for (n, calls) in vectors.iter().enumerate() {
        // A fresh key space per vector.
        let prefix = |p: &str| format!("{p}{n}");
        let rt = RedisTokenBucket::new(conn.clone(), token)
            .unwrap()
            .with_prefix(&prefix("tb"))
            .unwrap();
        let rl = RedisLeakyBucket::new(conn.clone(), leaky)
            .unwrap()
            .with_prefix(&prefix("lb"))
            .unwrap();
        let rw = RedisSlidingWindow::new(conn.clone(), window)
            .unwrap()
            .with_prefix(&prefix("rl"))
            .unwrap();
        let rf = RedisFixedWindow::new(conn.clone(), fixed)
            .unwrap()
            .with_prefix(&prefix("fw"))
            .unwrap();
        add(
            0,
            compare("token bucket", token, calls, |k, now| {
                smol::block_on(rt.check(k, Clock::Caller(now))).unwrap()
            }),
        );
        add(
            1,
            compare("leaky bucket", leaky, calls, |k, now| {
                smol::block_on(rl.check(k, Clock::Caller(now))).unwrap()
            }),
        );
        add(
            2,
            compare("sliding window", window, calls, |k, now| {
                smol::block_on(rw.check(k, Clock::Caller(now))).unwrap()
            }),
        );
        add(
            3,
            compare("fixed window", fixed, calls, |k, now| {
                smol::block_on(rf.check(k, Clock::Caller(now))).unwrap()
            }),
        );
    }
    for (name, (allowed, denied)) in ["token", "leaky", "window", "fixed"].iter().zip(totals) {
        assert!(
            allowed > 100 && denied > 100,
            "{name}: {allowed} allowed, {denied} denied: the vectors exercise both"
        );
    }
}

#[test]
fn server_time_limits_clients_whatever_their_clocks() {
    let server = RedisServer::start().expect("redis-server");
    let conn = connect(Topology::Standalone { url: server.url() });
    let bucket = RedisTokenBucket::new(
        conn.clone(),
        TokenBucket::new(3, Rate::per(1, Duration::from_secs(60))).unwrap(),
    )
    .unwrap();
    let allowed = (0..10)
        .filter(|_| {
            smol::block_on(bucket.check("k", Clock::Server))
                .unwrap()
                .is_allowed()
        })
        .count();
    assert_eq!(allowed, 3);
    let window = RedisSlidingWindow::new(
        conn,
        SlidingWindow::<4>::new(Duration::from_secs(60), 2).unwrap(),
    )
    .unwrap();
    let allowed = (0..5)
        .filter(|_| {
            smol::block_on(window.check("k", Clock::Server))
                .unwrap()
                .is_allowed()
        })
        .count();
    assert_eq!(allowed, 2);
    // A day's window on the server's clock: epoch-aligned, so the count
    // is the day's, whoever asks.
    let day = RedisFixedWindow::new(
        connect(Topology::Standalone { url: server.url() }),
        FixedWindow::days_at_utc_offset(0, 4).unwrap(),
    )
    .unwrap();
    let report = smol::block_on(day.check_n("k", 3, Clock::Server)).unwrap();
    let since_midnight = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        % 86_400;
    let until_midnight = 86_400 - since_midnight;
    assert!(
        report.reset_after.as_secs().abs_diff(until_midnight) <= 2,
        "the window ends at the next midnight UTC: {:?}, expected about {until_midnight} s",
        report.reset_after
    );
    assert_eq!(report.remaining, 1);
    assert!(
        smol::block_on(day.check_n("k", 2, Clock::Server))
            .unwrap()
            .is_denied()
    );
}

#[test]
fn bad_keys_and_parameters_are_clear_errors() {
    let server = RedisServer::start().expect("redis-server");
    let conn = connect(Topology::Standalone { url: server.url() });
    let bucket = RedisTokenBucket::new(
        conn.clone(),
        TokenBucket::new(1, Rate::per_second(1)).unwrap(),
    )
    .unwrap();
    let now = Clock::Caller(Instant::from_secs(1));
    let empty = smol::block_on(bucket.check("", now))
        .unwrap_err()
        .to_string();
    assert!(empty.contains("must not be empty"), "{empty}");
    assert!(
        smol::block_on(bucket.check("a{b}", now))
            .unwrap()
            .is_allowed(),
        "braces are escaped into a key of their own"
    );
    assert!(
        smol::block_on(bucket.check("user:42:api", now))
            .unwrap()
            .is_allowed(),
        "colons are fine"
    );
    // Zero or missing parameters are refused by the shared constructors.
    assert_eq!(
        TokenBucket::new(0, Rate::per_second(1)).unwrap_err(),
        LimiterError::ZeroCapacity
    );
    assert_eq!(
        TokenBucket::new(1, Rate::per_second(0)).unwrap_err(),
        LimiterError::ZeroRateAmount
    );
    assert_eq!(
        SlidingWindow::<4>::new(Duration::ZERO, 1).unwrap_err(),
        LimiterError::ZeroWindow
    );
    // An interval that is not whole microseconds cannot be decided alike.
    let thirds = RedisTokenBucket::new(
        conn.clone(),
        TokenBucket::new(1, Rate::per_second(3)).unwrap(),
    )
    .unwrap_err();
    assert!(thirds.to_string().contains("microseconds"), "{thirds}");
    assert!(
        matches!(
            thirds,
            RedisGuardError::InvalidInput {
                parameter: Parameter::RefillInterval,
                ..
            }
        ),
        "{thirds}"
    );
    let prefix = RedisTokenBucket::new(conn, TokenBucket::new(1, Rate::per_second(1)).unwrap())
        .unwrap()
        .with_prefix("{x}");
    assert!(
        matches!(
            prefix,
            Err(RedisGuardError::InvalidInput {
                parameter: Parameter::LimiterPrefix,
                ..
            })
        ),
        "{prefix:?}"
    );
}

#[test]
fn limiter_keys_share_a_slot_and_run_on_a_cluster() {
    let cluster = RedisCluster::start().expect("redis cluster");
    let conn = connect(Topology::Cluster {
        nodes: cluster.urls(),
    });
    let window = RedisSlidingWindow::new(
        conn.clone(),
        SlidingWindow::<4>::new(Duration::from_secs(1), 2).unwrap(),
    )
    .unwrap();
    let bucket =
        RedisTokenBucket::new(conn, TokenBucket::new(2, Rate::per_second(1)).unwrap()).unwrap();
    let now = Clock::Caller(Instant::from_secs(10));
    for i in 0..30 {
        let key = format!("client:{i}");
        assert!(
            smol::block_on(window.check(&key, now))
                .unwrap()
                .is_allowed(),
            "no CROSSSLOT"
        );
        assert!(
            smol::block_on(bucket.check(&key, now))
                .unwrap()
                .is_allowed()
        );
    }
    let (log, seq) = window.redis_keys("client:1").unwrap();
    let node = &cluster.nodes()[0];
    assert_eq!(
        node.command(&format!("CLUSTER KEYSLOT {log}")).unwrap(),
        node.command(&format!("CLUSTER KEYSLOT {seq}")).unwrap()
    );
}

#[test]
fn bucket_keys_expire_once_settled() {
    let server = RedisServer::start().expect("redis-server");
    let conn = connect(Topology::Standalone { url: server.url() });
    let bucket = RedisTokenBucket::new(
        conn,
        TokenBucket::new(2, Rate::per(1, Duration::from_millis(100))).unwrap(),
    )
    .unwrap();
    assert!(
        smol::block_on(bucket.check("k", Clock::Server))
            .unwrap()
            .is_allowed()
    );
    let key = bucket.redis_key("k").unwrap();
    let ttl: i64 = server
        .command(&format!("PTTL {key}"))
        .unwrap()
        .trim_start_matches(':')
        .trim()
        .parse()
        .unwrap();
    assert!(
        (1..=100).contains(&ttl),
        "the key lives until the bucket has refilled: {ttl} ms"
    );
}

/// Calls of `command` since the last `CONFIG RESETSTAT`, from `INFO commandstats`.

#[test]
fn each_decision_and_each_acquisition_is_one_round_trip() {
    use guard_core::lock::{Locker, Ttl};
    let server = RedisServer::start().expect("redis-server");
    let conn = connect(Topology::Standalone { url: server.url() });
    let bucket = RedisTokenBucket::new(
        conn.clone(),
        TokenBucket::new(5, Rate::per_second(5)).unwrap(),
    )
    .unwrap();
    let window = RedisSlidingWindow::new(
        conn.clone(),
        SlidingWindow::<8>::new(Duration::from_secs(1), 3).unwrap(),
    )
    .unwrap();
    let locker = guard_redis::RedisLocker::new(conn);
    // Warm up: the first call of a script loads it (EVALSHA, then EVAL on NOSCRIPT).
    smol::block_on(async {
        let _ = bucket.check("warm", Clock::Server).await.unwrap();
        let _ = window.check("warm", Clock::Server).await.unwrap();
        let _ = locker
            .try_lock("warm", Ttl::from_secs(1).unwrap())
            .await
            .unwrap();
    });
    server.command("CONFIG RESETSTAT").unwrap();
    smol::block_on(async {
        for i in 0..100 {
            let _ = bucket.check(&format!("k{i}"), Clock::Server).await.unwrap();
            let _ = window.check(&format!("k{i}"), Clock::Server).await.unwrap();
            let _ = locker
                .try_lock(&format!("k{i}"), Ttl::from_secs(1).unwrap())
                .await
                .unwrap();
        }
    });
    assert_eq!(
        server.command_calls("evalsha").unwrap(),
        300,
        "one EVALSHA per decision"
    );
    assert_eq!(server.command_calls("eval").unwrap(), 0);
}

/// A caller's clock: `offset` from real time, running `ppm` slower.
#[derive(Clone, Copy)]
struct CallerClock {
    offset_ms: i64,
    slow_ppm: u64,
}

impl CallerClock {
    fn read(&self, base_ms: u64, elapsed: Duration) -> Instant {
        let us = elapsed.as_micros() as u64 * (1_000_000 - self.slow_ppm) / 1_000_000;
        Instant::from_micros((base_ms as i64 + self.offset_ms) as u64 * 1_000 + us)
    }
}

/// Calls every limiter at `now` and checks Redis against guard-core.
struct Parity {
    token: (Limiter<TokenBucket>, RedisTokenBucket),
    leaky: (Limiter<LeakyBucket>, RedisLeakyBucket),
    window: (Limiter<SlidingWindow<8>>, RedisSlidingWindow),
    fixed: (Limiter<FixedWindow>, RedisFixedWindow),
}

impl Parity {
    fn new(conn: &RedisConnection, interval: Duration, prefix: &str) -> Self {
        let token = TokenBucket::new(2, Rate::per(1, interval)).unwrap();
        let leaky = LeakyBucket::new(2, Rate::per(1, interval)).unwrap();
        let window = SlidingWindow::<8>::new(interval, 2).unwrap();
        let fixed = FixedWindow::new(interval, 2).unwrap();
        Parity {
            fixed: (
                Limiter::new(fixed),
                RedisFixedWindow::new(conn.clone(), fixed)
                    .unwrap()
                    .with_prefix(&format!("{prefix}fw"))
                    .unwrap(),
            ),
            token: (
                Limiter::new(token),
                RedisTokenBucket::new(conn.clone(), token)
                    .unwrap()
                    .with_prefix(&format!("{prefix}tb"))
                    .unwrap(),
            ),
            leaky: (
                Limiter::new(leaky),
                RedisLeakyBucket::new(conn.clone(), leaky)
                    .unwrap()
                    .with_prefix(&format!("{prefix}lb"))
                    .unwrap(),
            ),
            window: (
                Limiter::new(window),
                RedisSlidingWindow::new(conn.clone(), window)
                    .unwrap()
                    .with_prefix(&format!("{prefix}rl"))
                    .unwrap(),
            ),
        }
    }

    fn check(&mut self, what: &str, now: Instant) {
        let clock = Clock::Caller(now);
        let token = smol::block_on(self.token.1.check("k", clock)).unwrap();
        assert_eq!(token, self.token.0.check(now), "token bucket: {what}");
        let leaky = smol::block_on(self.leaky.1.check("k", clock)).unwrap();
        assert_eq!(leaky, self.leaky.0.check(now), "leaky bucket: {what}");
        let window = smol::block_on(self.window.1.check("k", clock)).unwrap();
        assert_eq!(window, self.window.0.check(now), "sliding window: {what}");
        let fixed = smol::block_on(self.fixed.1.check("k", clock)).unwrap();
        assert_eq!(fixed, self.fixed.0.check(now), "fixed window: {what}");
    }
}

#[test]
fn a_caller_clock_at_the_slow_bound_decides_as_guard_core() {
    let server = RedisServer::start().expect("redis-server");
    let conn = connect(Topology::Standalone { url: server.url() });
    // 1% slow: after 3 s of real time it reads 2.97 s, so state that
    // settles 3 s (caller) after the first calls must still be there.
    let slow = CallerClock {
        offset_ms: 0,
        slow_ppm: CALLER_RATE_BOUND_PPM,
    };
    let mut parity = Parity::new(&conn, Duration::from_secs(3), "slow");
    let base = 1_700_000_000_000;
    let start = std::time::Instant::now();
    for i in 0..3 {
        parity.check(&format!("burst call {i}"), slow.read(base, start.elapsed()));
    }
    std::thread::sleep(Duration::from_millis(3_005));
    let elapsed = start.elapsed();
    assert!(
        elapsed < Duration::from_millis(3_030),
        "overslept: {elapsed:?}"
    );
    parity.check(
        "after the state settled on the server's clock but not the caller's",
        slow.read(base, elapsed),
    );
}

#[test]
fn callers_with_skewed_clocks_decide_as_guard_core_on_the_same_trace() {
    let server = RedisServer::start().expect("redis-server");
    let conn = connect(Topology::Standalone { url: server.url() });
    let bound = CALLER_OFFSET_BOUND.as_millis() as i64;
    // Replicas up to the bound either side of the server, sharing keys;
    // guard-core sees the same trace of their readings.
    let replicas = [
        CallerClock {
            offset_ms: bound,
            slow_ppm: 0,
        },
        CallerClock {
            offset_ms: -bound,
            slow_ppm: CALLER_RATE_BOUND_PPM,
        },
        CallerClock {
            offset_ms: 5_000,
            slow_ppm: 0,
        },
        CallerClock {
            offset_ms: 0,
            slow_ppm: CALLER_RATE_BOUND_PPM / 2,
        },
    ];
    let mut parity = Parity::new(&conn, Duration::from_millis(100), "skew");
    let base = 1_700_000_000_000;
    let start = std::time::Instant::now();
    let mut s = 0x9e37_79b9_7f4a_7c15_u64;
    for i in 0..60 {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        let replica = replicas[(s % replicas.len() as u64) as usize];
        // Real time passes: beyond an interval, so keys written on the
        // caller's clock would have expired on the server's.
        std::thread::sleep(Duration::from_millis(s % 150));
        parity.check(&format!("call {i}"), replica.read(base, start.elapsed()));
    }
}
