//! A replica that cannot start says why, and keeps the cause: its
//! `GatewayError` names what failed and returns the backend's error from
//! `source()`.

use std::error::Error;
use std::sync::Arc;

use guard_gateway::config::Config;
use guard_gateway::replica::{self, Event, GatewayError};
use guard_redis::RedisGuardError;
use guard_testkit::free_port;

fn start(config: &Config) -> Result<(), GatewayError> {
    // Every case fails while connecting, before anything runs: the
    // replica never needs to be stopped.
    let (_handle, control) = guard_smol::control();
    let emit: Arc<dyn Fn(Event) + Send + Sync> = Arc::new(|_| {});
    smol::block_on(replica::run(
        config,
        "replica-1",
        control,
        emit,
        Arc::new(guard_gateway::readiness::Readiness::new()),
    ))
}

#[test]
fn an_unreachable_redis_locker_has_the_redis_error_as_its_source() {
    let port = free_port().unwrap();
    let config = Config::from_toml(&format!(
        "[locker]\nkind = \"redis\"\nurl = \"redis://127.0.0.1:{port}/\"\nrequest_timeout_ms = 300\n\n[[active]]\nname = \"sensors\"\n"
    ))
    .unwrap();
    let err = start(&config).unwrap_err();
    assert!(matches!(err, GatewayError::LockerUnreachable(_)), "{err:?}");
    assert!(
        err.to_string()
            .starts_with("cannot reach the Redis locker: "),
        "{err}"
    );
    let source = err.source().expect("the Redis error");
    assert!(
        source.downcast_ref::<RedisGuardError>().is_some(),
        "{source:?}"
    );
}

#[test]
fn an_endpoint_that_cannot_connect_names_itself_and_keeps_the_cause() {
    let port = free_port().unwrap();
    let config = Config::from_toml(&format!(
        "[locker]\nkind = \"local\"\n\n[[endpoints]]\nname = \"orders\"\nkind = \"redis-stream\"\nurl = \"redis://127.0.0.1:{port}/\"\nstream = \"orders\"\ngroup = \"billing\"\n"
    ))
    .unwrap();
    let err = start(&config).unwrap_err();
    assert!(
        matches!(&err, GatewayError::Endpoint { name, .. } if name == "orders"),
        "{err:?}"
    );
    assert!(err.to_string().starts_with("endpoint orders: "), "{err}");
    let source = err.source().expect("the Redis error");
    assert!(
        source.downcast_ref::<RedisGuardError>().is_some(),
        "{source:?}"
    );
}

#[test]
fn a_limiter_without_a_redis_connection_is_refused_by_the_configuration() {
    let text = "[locker]\nkind = \"local\"\n\n[[active]]\nname = \"sensors\"\n\n[ratelimit]\nenabled = true\n\n[ratelimit.policies.uplink]\nalgorithm = \"token-bucket\"\nbackend = \"redis\"\ncapacity = 20\nrate_per_second = 5\n";
    let err = Config::from_toml(text).unwrap_err().to_string();
    assert!(
        err.contains("`ratelimit.policies.uplink.backend` = \"redis\""),
        "{err}"
    );
    // With the fallback allowed, the replica starts on memory.
    let config = Config::from_toml(&text.replace(
        "enabled = true",
        "enabled = true\nfallback_to_memory = true",
    ))
    .unwrap();
    let built = smol::block_on(replica::build(&config)).expect("builds on memory");
    assert_eq!(built.limiters.names(), ["default", "uplink"]);
}
