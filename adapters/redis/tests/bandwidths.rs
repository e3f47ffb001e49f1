//! Several bandwidths on Redis decide exactly as guard-core's
//! `Bandwidths`: the same trace of (key, time, cost) calls gives the same
//! decisions, waits and per-bandwidth reports, in one round trip each, on
//! a standalone server and on a cluster.

use std::collections::HashMap;
use std::time::Duration;

use guard_core::limit::{Bandwidths, Limiter, Rate, Report, TokenBucket};
use guard_core::time::Instant;
use guard_redis::{Clock, RedisBandwidths, RedisConnection, RedisGuardError, Topology};
use guard_testkit::{RedisCluster, RedisServer};

fn connect(topology: Topology) -> RedisConnection {
    smol::block_on(RedisConnection::connect(topology, Duration::from_secs(2))).expect("connect")
}

/// 4 a second, 10 in ten seconds, 40 a minute (whole-microsecond
/// intervals, as Redis limiters need).
fn policy() -> Bandwidths<TokenBucket, 3> {
    Bandwidths::new([
        TokenBucket::new(4, Rate::per_second(4)).unwrap(),
        TokenBucket::new(10, Rate::per(10, Duration::from_secs(10))).unwrap(),
        TokenBucket::new(40, Rate::per(40, Duration::from_secs(60))).unwrap(),
    ])
}

/// A trace of (key, milliseconds, cost), mostly forward, with bursts.
fn trace(seed: u64, len: usize) -> Vec<(&'static str, u64, u32)> {
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
            now = match r % 8 {
                0..=4 => now,
                5..=6 => now + r % 400,
                _ => now + 1_000 + r % 9_000,
            };
            let cost = ((r >> 16) % 4) as u32;
            (keys[(r >> 32) as usize % keys.len()], now, cost)
        })
        .collect()
}

/// Guard-core's reports, microsecond-rounded as the script answers (its
/// refill intervals are whole microseconds; a wait is at least 1 µs).
fn in_micros(r: Report) -> Report {
    let up = |d: Duration| Duration::from_micros(d.as_nanos().div_ceil(1_000) as u64);
    Report {
        decision: match r.decision {
            guard_core::limit::Decision::Denied { retry_after } => {
                guard_core::limit::Decision::Denied {
                    retry_after: up(retry_after),
                }
            }
            allowed => allowed,
        },
        reset_after: up(r.reset_after),
        ..r
    }
}

#[test]
fn redis_bandwidths_match_guard_core_on_the_same_trace() {
    let server = RedisServer::start().expect("redis-server");
    let conn = connect(Topology::Standalone { url: server.url() });
    let p = policy();
    let (mut admitted, mut refused) = (0, 0);
    for seed in 1..=4u64 {
        let redis = RedisBandwidths::new(conn.clone(), p)
            .unwrap()
            .with_prefix(&format!("bw{seed}"))
            .unwrap();
        let mut local: HashMap<
            &str,
            <Bandwidths<TokenBucket, 3> as guard_core::limit::Algorithm>::State,
        > = HashMap::new();
        for (i, (key, ms, cost)) in trace(seed * 7_919, 400).into_iter().enumerate() {
            let now = Instant::from_millis(ms);
            let state = local
                .entry(key)
                .or_insert(<Bandwidths<TokenBucket, 3> as guard_core::limit::Algorithm>::NEW_STATE);
            let expected: Vec<Report> = p
                .check_each(state, cost, now)
                .unwrap()
                .into_iter()
                .map(in_micros)
                .collect();
            let got = smol::block_on(redis.check_each(key, cost, Clock::Caller(now))).unwrap();
            assert_eq!(
                got, expected,
                "seed {seed}, call {i} ({key}, {ms} ms, cost {cost})"
            );
            if cost > 0 {
                if got[0].is_allowed() {
                    admitted += 1;
                } else {
                    refused += 1;
                }
            }
        }
    }
    assert!(
        admitted > 200 && refused > 200,
        "{admitted} admitted, {refused} refused"
    );
}

#[test]
fn the_report_is_the_tightest_and_a_refusal_counts_in_no_bucket() {
    let server = RedisServer::start().expect("redis-server");
    let conn = connect(Topology::Standalone { url: server.url() });
    let redis = RedisBandwidths::new(conn, policy()).unwrap();
    let mut local = Limiter::new(policy());
    let t = Instant::from_secs(1_000);
    let at = Clock::Caller(t);
    for _ in 0..4 {
        let got = smol::block_on(redis.check_n("k", 1, at)).unwrap();
        assert_eq!(got, in_micros(local.check_n(1, t).unwrap()));
    }
    // The second's bucket is empty; the others keep what they had.
    let each = smol::block_on(redis.check_each("k", 1, at)).unwrap();
    assert!(each.iter().all(|r| r.is_denied()));
    assert_eq!(
        each.iter().map(|r| r.remaining).collect::<Vec<_>>(),
        [0, 6, 36]
    );
    let report = smol::block_on(redis.check_n("k", 1, at)).unwrap();
    assert_eq!((report.limit, report.remaining), (4, 0));
    // A cost above the smallest capacity is refused before anything is sent.
    let err = smol::block_on(redis.check_n("k", 5, at)).unwrap_err();
    assert!(matches!(err, RedisGuardError::InvalidInput { .. }), "{err}");
    assert!(err.to_string().contains("cost"), "{err}");
}

#[test]
fn every_decision_is_one_round_trip_and_runs_on_a_cluster() {
    let server = RedisServer::start().expect("redis-server");
    let conn = connect(Topology::Standalone { url: server.url() });
    let redis = RedisBandwidths::new(conn, policy()).unwrap();
    let _ = smol::block_on(redis.check("warm", Clock::Server)).unwrap();
    server.command("CONFIG RESETSTAT").unwrap();
    for i in 0..100 {
        let _ = smol::block_on(redis.check(&format!("k{i}"), Clock::Server)).unwrap();
    }
    assert_eq!(
        server.command_calls("evalsha").unwrap(),
        100,
        "one EVALSHA per decision"
    );
    assert_eq!(server.command_calls("eval").unwrap(), 0);

    let cluster = RedisCluster::start().expect("redis cluster");
    let conn = connect(Topology::Cluster {
        nodes: cluster.urls(),
    });
    let redis = RedisBandwidths::new(conn, policy()).unwrap();
    let now = Clock::Caller(Instant::from_secs(10));
    for i in 0..30 {
        let key = format!("client:{i}");
        assert!(
            smol::block_on(redis.check(&key, now)).unwrap().is_allowed(),
            "no CROSSSLOT"
        );
    }
}

/// Through guard-std's `RateLimiter` (what guard-tower's layer calls): every
/// bucket's report on the server's clock, the bandwidths' quotas, and one
/// quota refused as a new policy.
#[test]
fn as_a_rate_limiter_it_reports_every_bandwidth() {
    use guard_std::ratelimit::{Quota, RateLimiter, ReconfigureError};
    let server = RedisServer::start().expect("redis-server");
    let conn = connect(Topology::Standalone { url: server.url() });
    let redis = RedisBandwidths::new(conn, policy()).unwrap();
    let limiter: &dyn RateLimiter = &redis;
    let quotas = limiter.bandwidths().unwrap();
    assert_eq!(quotas.len(), 3);
    assert_eq!(
        quotas[1],
        Quota::TokenBucket {
            capacity: 10,
            rate: Rate::per(10, Duration::from_secs(10)),
        }
    );
    assert_eq!(limiter.quota(), quotas[0]);
    let each = smol::block_on(limiter.check_each("k", 2)).unwrap();
    assert_eq!(
        each.iter()
            .map(|r| (r.limit, r.remaining))
            .collect::<Vec<_>>(),
        [(4, 2), (10, 8), (40, 38)]
    );
    let tightest = smol::block_on(limiter.check_n("k", 2)).unwrap();
    assert_eq!((tightest.limit, tightest.remaining), (4, 0));
    let err = limiter.reconfigure(quotas[0]).unwrap_err();
    assert!(matches!(
        err,
        ReconfigureError::SeveralBandwidths { bandwidths: 3 }
    ));
    assert!(err.to_string().contains("3 bandwidths"), "{err}");
}
