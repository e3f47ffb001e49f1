//! A refused key or a failed connection is a typed `RedisGuardError`:
//! callers match what was refused, and `source()` returns the cause.

use std::error::Error;
use std::time::Duration;

use guard_core::lock::redis::InvalidRedisKey;
use guard_redis::{Parameter, RedisConnection, RedisGuardError, Topology, lock_keys};
use guard_testkit::free_port;

#[test]
fn an_invalid_lock_key_has_guard_core_s_reason_as_its_source() {
    let err = lock_keys("prod1:", "").unwrap_err();
    match &err {
        RedisGuardError::InvalidInput {
            parameter: Parameter::LockKey,
            value,
            ..
        } => assert_eq!(value, ""),
        other => panic!("not an invalid lock key: {other:?}"),
    }
    assert_eq!(
        err.to_string(),
        "invalid lock key \"\": a lock key must not be empty"
    );
    let source = err.source().expect("guard-core's reason");
    assert_eq!(
        source.downcast_ref::<InvalidRedisKey>(),
        Some(&InvalidRedisKey::Empty)
    );
}

#[test]
fn a_prefix_with_a_brace_is_named_as_the_prefix() {
    let err = lock_keys("a{b}", "job").unwrap_err();
    assert!(
        matches!(
            &err,
            RedisGuardError::InvalidInput { parameter: Parameter::LockerPrefix, value, .. }
                if value == "a{b}"
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("\"a{b}\""), "{err}");
    assert_eq!(
        err.source()
            .and_then(|s| s.downcast_ref::<InvalidRedisKey>()),
        Some(&InvalidRedisKey::BraceInPrefix)
    );
}

#[test]
fn a_server_that_does_not_answer_has_the_redis_error_as_its_source() {
    let port = free_port().unwrap();
    let err = smol::block_on(RedisConnection::connect(
        Topology::Standalone {
            url: format!("redis://127.0.0.1:{port}/"),
        },
        Duration::from_millis(500),
    ))
    .unwrap_err();
    match &err {
        RedisGuardError::Redis(_) => {
            let source = err.source().expect("the redis error");
            assert!(
                source.downcast_ref::<redis::RedisError>().is_some(),
                "{source:?}"
            );
        }
        // Nothing answered within the timeout: no cause to keep.
        RedisGuardError::Timeout(_) => assert!(err.source().is_none()),
        other => panic!("not a connection failure: {other:?}"),
    }
}
