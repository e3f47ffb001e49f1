//! RedisLocker passes the same Locker contract as LocalLocker, on a real
//! standalone server, a 3-master cluster and a sentinel set-up.

use std::time::Duration;

use guard_redis::{RedisConnection, RedisLocker, Topology, lock_keys};
use guard_testkit::{RedisCluster, RedisSentinel, RedisServer, SENTINEL_SERVICE, contract};

const TIMEOUT: Duration = Duration::from_secs(2);

fn connect(topology: Topology) -> RedisLocker {
    RedisLocker::new(smol::block_on(RedisConnection::connect(topology, TIMEOUT)).expect("connect"))
}

/// The whole contract; Redis expires keys on its own clock, so the suite
/// waits in real time.
fn run_contract(locker: &RedisLocker, namespace: &str) {
    smol::block_on(contract::run_all(locker, namespace, 20, smol::Timer::after));
}

#[test]
fn standalone_passes_the_locker_contract() {
    let server = RedisServer::start().expect("redis-server");
    let locker = connect(Topology::Standalone { url: server.url() });
    run_contract(&locker, "guard:test:standalone");
}

#[test]
fn a_lost_lock_key_is_granted_to_nobody_before_its_holder_s_deadline() {
    // The lock key deleted mid-lease (an operator's DEL, an eviction): its
    // grant record keeps the holder's deadline.
    let server = RedisServer::start().expect("redis-server");
    let locker = connect(Topology::Standalone { url: server.url() })
        .with_prefix("prod1")
        .unwrap();
    let lose = |key: &str| {
        let (lock, _) = lock_keys("prod1:", key).unwrap();
        let deleted = server.command(&format!("DEL {lock}")).unwrap();
        assert!(deleted.starts_with(":1"), "{lock} deleted: {deleted}");
        std::future::ready(())
    };
    smol::block_on(
        contract::a_lost_key_is_granted_to_nobody_before_its_deadline(
            &locker,
            "guard:active:sensors",
            lose,
            smol::Timer::after,
        ),
    );
}

#[test]
fn with_its_quarantine_a_store_that_lost_its_data_grants_nothing_for_one_ttl() {
    let server = RedisServer::start().expect("redis-server");
    let locker = connect(Topology::Standalone { url: server.url() }).with_quarantine(true);
    let lose_all = |_key: &str| {
        let flushed = server.command("FLUSHALL").unwrap();
        assert!(flushed.starts_with("+OK"), "FLUSHALL: {flushed}");
        std::future::ready(())
    };
    smol::block_on(contract::a_lost_store_grants_nothing_for_one_ttl(
        &locker,
        "guard:active:sensors",
        lose_all,
        smol::Timer::after,
    ));
    // Without it, a key with no record is granted at once: the case
    // catches that.
    let plain = connect(Topology::Standalone { url: server.url() });
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        smol::block_on(contract::a_lost_store_grants_nothing_for_one_ttl(
            &plain,
            "plain:k",
            lose_all,
            smol::Timer::after,
        ));
    }));
    assert!(
        caught.is_err(),
        "the case passed a locker without the quarantine"
    );
}

#[test]
fn the_last_fence_told_is_never_below_a_granted_one() {
    let server = RedisServer::start().expect("redis-server");
    let locker = connect(Topology::Standalone { url: server.url() })
        .with_prefix("prod1")
        .unwrap();
    smol::block_on(contract::last_fence_is_never_below_a_granted_one(
        &locker,
        "guard:active:endpoint:node=alerts",
    ));
}

#[test]
fn cluster_passes_the_locker_contract_without_crossslot_errors() {
    let cluster = RedisCluster::start().expect("redis cluster");
    let locker = connect(Topology::Cluster {
        nodes: cluster.urls(),
    });
    // Keys spread over many slots; each lock and its fence share one.
    for i in 0..20 {
        let key = format!("guard:once:job{i}:slot");
        smol::block_on(contract::exclusivity(&locker, &key));
    }
    run_contract(&locker, "guard:test:cluster");
    let (lock, fence) = lock_keys("", "guard:once:schedule:router=r1:1767225600000").unwrap();
    let node = &cluster.nodes()[0];
    let slot_of = |k: &str| node.command(&format!("CLUSTER KEYSLOT {k}")).unwrap();
    assert_eq!(
        slot_of(&lock),
        slot_of(&fence),
        "{lock} and {fence} share a slot"
    );
}

#[test]
fn sentinel_passes_the_locker_contract() {
    let sentinel = RedisSentinel::start().expect("redis sentinel");
    let locker = connect(Topology::Sentinel {
        sentinels: vec![sentinel.sentinel_url()],
        service: SENTINEL_SERVICE.into(),
    });
    run_contract(&locker, "guard:test:sentinel");
}

#[test]
fn the_key_layout_is_as_documented() {
    assert_eq!(
        lock_keys("", "guard:once:schedule:owner=t1:router=r1:1767225600000").unwrap(),
        (
            "{guard:once:schedule:owner=t1:router=r1}:1767225600000".to_string(),
            "fence:{guard:once:schedule:owner=t1:router=r1}".to_string()
        )
    );
    assert_eq!(
        lock_keys("prod1:", "plain").unwrap(),
        (
            "prod1:{plain}".to_string(),
            "prod1:fence:{plain}".to_string()
        )
    );
    assert_eq!(
        lock_keys("", ":x").unwrap().0,
        "{:x}",
        "an empty domain is not a hash tag"
    );
    assert!(
        lock_keys("", "")
            .unwrap_err()
            .to_string()
            .contains("must not be empty")
    );
}

#[test]
fn a_prefix_or_key_that_would_split_cluster_slots_is_refused_with_its_value() {
    let server = RedisServer::start().expect("redis-server");
    let locker = connect(Topology::Standalone { url: server.url() });
    let e = locker.with_prefix("p{").unwrap_err().to_string();
    assert!(e.contains("\"p{\"") && e.contains("hash tag"), "{e}");
    let e = lock_keys("", "}x:1").unwrap_err().to_string();
    assert!(
        e.contains("\"}x:1\"") && e.contains("start with '}'"),
        "{e}"
    );
}

#[test]
fn a_prefix_namespaces_environments() {
    let server = RedisServer::start().expect("redis-server");
    let url = server.url();
    let prod = connect(Topology::Standalone { url: url.clone() })
        .with_prefix("prod1")
        .unwrap();
    let staging = connect(Topology::Standalone { url })
        .with_prefix("staging:")
        .unwrap();
    let ttl = guard_core::lock::Ttl::from_secs(10).unwrap();
    use guard_core::lock::Locker;
    assert!(
        smol::block_on(prod.try_lock("guard:once:s:1", ttl))
            .unwrap()
            .is_some()
    );
    assert!(
        smol::block_on(staging.try_lock("guard:once:s:1", ttl))
            .unwrap()
            .is_some()
    );
    assert!(
        server
            .command("EXISTS prod1:{guard:once:s}:1")
            .unwrap()
            .starts_with(":1")
    );
}

#[test]
fn an_unreachable_server_is_a_clear_error() {
    let port = guard_testkit::free_port().unwrap();
    let err = smol::block_on(RedisConnection::connect(
        Topology::Standalone {
            url: format!("redis://127.0.0.1:{port}/"),
        },
        Duration::from_millis(500),
    ))
    .unwrap_err();
    let message = err.to_string();
    assert!(message.starts_with("redis:"), "{message}");
}

#[test]
fn a_sentinel_failover_is_followed() {
    use guard_core::lock::{Locker, Ttl};
    let mut sentinel = RedisSentinel::start_with_replica().expect("redis sentinel with a replica");
    let locker = connect(Topology::Sentinel {
        sentinels: vec![sentinel.sentinel_url()],
        service: SENTINEL_SERVICE.into(),
    });
    let ttl = Ttl::from_secs(60).unwrap();
    assert!(
        smol::block_on(locker.try_lock("before", ttl))
            .unwrap()
            .is_some()
    );
    sentinel.stop_master();
    sentinel
        .wait_for_failover(Duration::from_secs(30))
        .expect("the replica promoted");
    // The locker asks the sentinel again after a failed request and goes on
    // against the new master.
    let start = std::time::Instant::now();
    let token = loop {
        match smol::block_on(locker.try_lock("after", ttl)) {
            Ok(token) => break token,
            Err(e) => {
                assert!(
                    start.elapsed() < Duration::from_secs(10),
                    "still failing after the failover: {e}"
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    };
    assert!(token.is_some());
    let on_new_master = sentinel
        .replica()
        .unwrap()
        .command("EXISTS {after}")
        .unwrap();
    assert!(
        on_new_master.starts_with(":1"),
        "the lock is on the promoted replica: {on_new_master}"
    );
}
