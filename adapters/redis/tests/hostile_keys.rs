//! A client chooses a limiter's key (a header, a channel name): every
//! Redis limiter limits a key with braces, `%`, NUL or line breaks under
//! a key of its own, and refuses an empty or over-long key as invalid
//! input, never as the backend's failure (so no fail-open reaches it).

use std::sync::Arc;
use std::time::Duration;

use guard_core::limit::batch::BatchSize;
use guard_core::limit::{Bandwidths, FixedWindow, LeakyBucket, Rate, SlidingWindow, TokenBucket};
use guard_redis::{
    RedisBandwidths, RedisBatchedBucket, RedisConnection, RedisFixedWindow, RedisLeakyBucket,
    RedisSlidingWindow, RedisTokenBucket, Topology,
};
use guard_std::ratelimit::{InvalidKey, LimitError, MAX_KEY_LEN, RateLimiter};
use guard_testkit::RedisServer;

fn connect(server: &RedisServer) -> RedisConnection {
    smol::block_on(RedisConnection::connect(
        Topology::Standalone { url: server.url() },
        Duration::from_secs(2),
    ))
    .expect("connect")
}

/// Each Redis limiter, admitting one request a key a minute.
fn limiters(conn: &RedisConnection) -> Vec<(&'static str, Arc<dyn RateLimiter>)> {
    let minute = Duration::from_secs(60);
    vec![
        (
            "token bucket",
            Arc::new(
                RedisTokenBucket::new(
                    conn.clone(),
                    TokenBucket::new(1, Rate::per(1, minute)).unwrap(),
                )
                .unwrap(),
            ),
        ),
        (
            "leaky bucket",
            Arc::new(
                RedisLeakyBucket::new(
                    conn.clone(),
                    LeakyBucket::new(1, Rate::per(1, minute)).unwrap(),
                )
                .unwrap(),
            ),
        ),
        (
            "sliding window",
            Arc::new(
                RedisSlidingWindow::new(conn.clone(), SlidingWindow::<4>::new(minute, 1).unwrap())
                    .unwrap(),
            ),
        ),
        (
            "fixed window",
            Arc::new(
                RedisFixedWindow::new(conn.clone(), FixedWindow::new(minute, 1).unwrap()).unwrap(),
            ),
        ),
        (
            "bandwidths",
            Arc::new(
                RedisBandwidths::new(
                    conn.clone(),
                    Bandwidths::new([TokenBucket::new(1, Rate::per(1, minute)).unwrap()]),
                )
                .unwrap(),
            ),
        ),
    ]
}

#[test]
fn braced_and_control_keys_are_limited_under_keys_of_their_own() {
    let server = RedisServer::start().expect("redis-server");
    let conn = connect(&server);
    // Each pair differs only where the codec escapes: `}` beside its own
    // escape written by hand, NUL beside `%00`.
    let hostile = [
        "a}b",
        "a%7Db",
        "{x}",
        "x\0y",
        "x%00y",
        "line\nbreak",
        "é:{}",
    ];
    for (name, limiter) in limiters(&conn) {
        for key in hostile {
            let first = smol::block_on(limiter.check(key));
            assert!(
                matches!(&first, Ok(r) if r.decision.is_allowed()),
                "{name}: the first request of {key:?} is admitted, got {first:?}"
            );
        }
        for key in hostile {
            let second = smol::block_on(limiter.check(key));
            assert!(
                matches!(&second, Ok(r) if r.decision.is_denied()),
                "{name}: {key:?} is limited, got {second:?}"
            );
        }
    }
    let listed = std::process::Command::new("redis-cli")
        .args(["-u", &server.url(), "--raw", "KEYS", "*"])
        .output()
        .expect("redis-cli");
    let keys: Vec<String> = String::from_utf8(listed.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(
        keys.len(),
        7 * 6,
        "a key a limiter and key (two for the window): {keys:?}"
    );
    assert!(
        keys.iter()
            .all(|k| k.matches('{').count() == 1 && k.matches('}').count() == 1),
        "one hash tag a key: {keys:?}"
    );
}

#[test]
fn empty_and_over_long_keys_are_invalid_input_not_backend_failures() {
    let server = RedisServer::start().expect("redis-server");
    let conn = connect(&server);
    let long = "k".repeat(MAX_KEY_LEN + 1);
    let longest = "k".repeat(MAX_KEY_LEN);
    for (name, limiter) in limiters(&conn) {
        match smol::block_on(limiter.check("")) {
            Err(LimitError::InvalidKey(InvalidKey::Empty)) => {}
            other => panic!("{name}: an empty key is invalid input, got {other:?}"),
        }
        match smol::block_on(limiter.check(&long)) {
            Err(LimitError::InvalidKey(InvalidKey::TooLong { len })) => {
                assert_eq!(len, MAX_KEY_LEN + 1, "{name}");
            }
            other => panic!("{name}: an over-long key is invalid input, got {other:?}"),
        }
        let each = smol::block_on(limiter.check_each(&long, 1));
        assert!(
            matches!(each, Err(LimitError::InvalidKey(_))),
            "{name}: check_each too, got {each:?}"
        );
        assert!(
            smol::block_on(limiter.check(&longest)).is_ok(),
            "{name}: a key of exactly {MAX_KEY_LEN} bytes is taken"
        );
    }
}

#[test]
fn a_refused_key_takes_no_place_in_the_batched_cache() {
    let server = RedisServer::start().expect("redis-server");
    let conn = connect(&server);
    let remote =
        RedisTokenBucket::new(conn, TokenBucket::new(10, Rate::per_second(10)).unwrap()).unwrap();
    let sizing = BatchSize::new(1, 4, Duration::from_millis(100)).unwrap();
    let cached = RedisBatchedBucket::new(remote, sizing, 16);
    for i in 0..100 {
        let key = format!("{i}{}", "k".repeat(MAX_KEY_LEN));
        let refused = smol::block_on(cached.check(&key)).unwrap_err();
        assert!(refused.to_string().contains("longer than"), "{refused}");
    }
    assert_eq!(cached.cached_keys(), 0);
    // A braced key is a key like any other: limited, and cached.
    assert!(smol::block_on(cached.check("a}b")).unwrap().is_allowed());
    assert_eq!(cached.cached_keys(), 1);
}
