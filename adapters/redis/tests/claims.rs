//! RedisLocker passes the ClaimStore contract, on a standalone server and
//! a 3-master cluster, with the record laid out as guard-core documents.

use std::time::Duration;

use guard_core::claim::{ClaimOutcome, ClaimStore, Claims, Start};
use guard_core::lock::{Scope, Ttl};
use guard_redis::{RedisConnection, RedisLocker, Topology, lock_keys};
use guard_testkit::{RedisCluster, RedisServer, claims};

const TIMEOUT: Duration = Duration::from_secs(2);

fn connect(topology: Topology) -> RedisLocker {
    RedisLocker::new(smol::block_on(RedisConnection::connect(topology, TIMEOUT)).expect("connect"))
}

#[test]
fn standalone_passes_the_claim_contract() {
    let server = RedisServer::start().expect("redis-server");
    let store = connect(Topology::Standalone { url: server.url() });
    smol::block_on(claims::run_all(
        &store,
        "guard:claim:t",
        20,
        1,
        smol::Timer::after,
    ));
}

#[test]
fn cluster_passes_the_claim_contract_without_crossslot_errors() {
    let cluster = RedisCluster::start().expect("redis cluster");
    let store = connect(Topology::Cluster {
        nodes: cluster.urls(),
    });
    smol::block_on(claims::run_all(
        &store,
        "guard:claim:c",
        20,
        1,
        smol::Timer::after,
    ));
}

#[test]
fn a_record_is_a_hash_beside_the_lock_layout_and_a_foreign_one_is_an_error_naming_it() {
    let server = RedisServer::start().expect("redis-server");
    let store = connect(Topology::Standalone { url: server.url() })
        .with_prefix("prod1")
        .unwrap();
    let claims = Claims::new(&store, Scope::new("hooks").unwrap());
    smol::block_on(async {
        let outcome = claims.begin("evt_1", &mut []).await.unwrap();
        let claim = outcome.claim().expect("an attempt").clone();
        assert_eq!(claim.after(), Start::Fresh);
        claims.complete(&claim, b"201").await.unwrap();
    });
    let (record, fence) = lock_keys("prod1:", "guard:claim:hooks:evt_1").unwrap();
    assert_eq!(record, "prod1:{guard:claim:hooks}:evt_1");
    for (field, value) in [("s", "d"), ("v", "201"), ("n", "1")] {
        let stored = server.command(&format!("HGET {record} {field}")).unwrap();
        assert_eq!(stored.trim(), value, "{record}: field {field}");
    }
    let ttl = server.command(&format!("PTTL {record}")).unwrap();
    let ttl: i64 = ttl.trim().trim_start_matches(':').parse().unwrap();
    assert!(ttl > 3_500_000 && ttl <= 3_600_000, "kept an hour: {ttl}");
    assert!(server.command(&format!("GET {fence}")).unwrap().len() > 3);

    server
        .command(&format!("HSET {record} s z"))
        .expect("a foreign state");
    let error = smol::block_on(claims.begin("evt_1", &mut [])).unwrap_err();
    let message = error.to_string();
    assert!(
        message.contains(&record) && message.contains("unknown state"),
        "{message}"
    );
}

#[test]
fn two_replicas_run_a_delivery_once_and_a_failed_one_again() {
    let server = RedisServer::start().expect("redis-server");
    let a = connect(Topology::Standalone { url: server.url() });
    let b = connect(Topology::Standalone { url: server.url() });
    let scope = Scope::new("hooks").unwrap();
    let on_a = Claims::new(&a, scope.clone());
    let on_b = Claims::new(&b, scope);
    smol::block_on(async {
        let first = on_a.begin("evt_2", &mut []).await.unwrap();
        let first = first.claim().expect("a runs it").clone();
        assert!(matches!(
            on_b.begin("evt_2", &mut []).await.unwrap(),
            ClaimOutcome::Running { retry_after } if retry_after > Duration::from_secs(29)
        ));
        on_a.fail(&first).await.unwrap();
        let second = on_b.begin("evt_2", &mut []).await.unwrap();
        let second = second.claim().expect("b runs it again").clone();
        assert_eq!((second.attempt(), second.after()), (2, Start::AfterFailure));
        assert!(second.fence() > first.fence());
        on_b.complete(&second, b"").await.unwrap();
        assert_eq!(
            on_a.begin("evt_2", &mut []).await.unwrap(),
            ClaimOutcome::Done { result: b"" }
        );
        // The raw store answers the same.
        let begun = a
            .try_begin(
                "guard:claim:hooks:evt_2",
                Ttl::from_secs(1).unwrap(),
                Ttl::from_secs(1).unwrap(),
                &mut [],
            )
            .await
            .unwrap();
        assert_eq!(begun, guard_core::claim::Begin::Done { result_len: 0 });
    });
}
