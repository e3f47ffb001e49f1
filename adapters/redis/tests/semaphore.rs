//! RedisLocker passes the Semaphore contract, on a standalone server and
//! a 3-master cluster, with the permits laid out as guard-core documents;
//! replicas on connections of their own, each with callers on threads of
//! their own, never hold more permits together than the semaphore has.

use std::time::Duration;

use guard_core::lock::{Scope, Ttl, semaphore_key};
use guard_core::semaphore::{Permits, Semaphore};
use guard_redis::{RedisConnection, RedisLocker, Topology, lock_keys};
use guard_testkit::{RedisCluster, RedisServer, semaphore};

const TIMEOUT: Duration = Duration::from_secs(2);

fn connect(topology: Topology) -> RedisLocker {
    RedisLocker::new(smol::block_on(RedisConnection::connect(topology, TIMEOUT)).expect("connect"))
}

#[test]
fn standalone_passes_the_semaphore_contract() {
    let server = RedisServer::start().expect("redis-server");
    let locker = connect(Topology::Standalone { url: server.url() });
    smol::block_on(semaphore::run_all(
        &locker,
        "guard:semaphore:t",
        20,
        1,
        smol::Timer::after,
    ));
}

#[test]
fn cluster_passes_the_semaphore_contract_without_crossslot_errors() {
    let cluster = RedisCluster::start().expect("redis cluster");
    let locker = connect(Topology::Cluster {
        nodes: cluster.urls(),
    });
    smol::block_on(semaphore::run_all(
        &locker,
        "guard:semaphore:c",
        20,
        1,
        smol::Timer::after,
    ));
}

#[test]
fn permits_are_a_hash_of_lease_ends_and_a_foreign_field_is_an_error_naming_the_key() {
    let server = RedisServer::start().expect("redis-server");
    let locker = connect(Topology::Standalone { url: server.url() })
        .with_prefix("prod1")
        .unwrap();
    let key = semaphore_key("guard:", &Scope::new("exports").unwrap()).unwrap();
    let permits = Permits::new(2).unwrap();
    let token = smol::block_on(locker.try_acquire(&key, permits, Ttl::from_secs(30).unwrap()))
        .unwrap()
        .expect("a permit");
    let (hash, fence) = lock_keys("prod1:", &key).unwrap();
    assert_eq!(hash, "prod1:{guard:semaphore}:exports");
    let until = server
        .command(&format!("HGET {hash} {}", token.id()))
        .unwrap();
    let until: i64 = until.trim().parse().expect("a lease end in ms");
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    assert!(
        (until - now_ms - 30_000).abs() < 2_000,
        "the lease ends 30 s from now on the server's clock: {until} at {now_ms}"
    );
    let ttl: i64 = server
        .command(&format!("PTTL {hash}"))
        .unwrap()
        .trim()
        .trim_start_matches(':')
        .parse()
        .unwrap();
    assert!(
        ttl > 28_000 && ttl <= 30_000,
        "the hash expires with its lease: {ttl}"
    );
    let counter: u64 = server
        .command(&format!("GET {fence}"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_eq!(counter, token.fence(), "the fence is the domain's counter");

    // A lease no Lua number holds exactly is refused before any write.
    let endless = Ttl::from_secs(u64::MAX / 1_000).unwrap();
    let error = smol::block_on(locker.try_acquire(&key, permits, endless))
        .unwrap_err()
        .to_string();
    assert!(error.contains("a lease is 1 ms to 2^53 ms"), "{error}");
    let after: u64 = server
        .command(&format!("GET {fence}"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_eq!(after, counter, "no fence drawn for a refused lease");
    assert_eq!(smol::block_on(locker.holders(&key)).unwrap(), 1);

    server
        .command(&format!("HSET {hash} intruder not-a-number"))
        .expect("a foreign field");
    let error = smol::block_on(locker.try_acquire(&key, permits, Ttl::from_secs(1).unwrap()))
        .unwrap_err()
        .to_string();
    assert!(
        error.contains(&hash) && error.contains("not a lease end"),
        "{error}"
    );
}

#[test]
fn replicas_with_callers_on_threads_never_hold_more_permits_than_there_are() {
    let server = RedisServer::start().expect("redis-server");
    let replicas: Vec<_> = (0..2)
        .map(|_| connect(Topology::Standalone { url: server.url() }))
        .collect();
    let seen = semaphore::held_at_once(
        &replicas,
        4,
        "guard:semaphore:threads",
        Permits::new(3).unwrap(),
        Duration::from_secs(2),
    );
    assert!(seen.most <= 3, "at most 3 holders at once: {seen:?}");
    assert_eq!(seen.most, 3, "8 callers for 3 permits fill them: {seen:?}");
    assert!(seen.runs > 100, "the permits went round: {seen:?}");
}
