//! The common Locker and ClaimStore contracts against a real 3-member etcd cluster, from
//! smol (async-compat's tokio runtime underneath) and from inside a tokio
//! runtime.

use std::sync::Arc;
use std::time::{Duration, Instant};

use guard_core::lock::{Locker, Ttl};
use guard_etcd::{Call, EtcdConfig, EtcdError, EtcdLocker};
use guard_testkit::contract;
use guard_testkit::etcd::EtcdCluster;

/// The suite's 50 to 250 ms TTLs and waits, times 40: etcd's leases are
/// whole seconds, at least 1 s with this cluster's 500 ms election
/// timeout, and expire on a 500 ms check.
const SCALE: u32 = 40;

#[test]
fn a_three_member_cluster_passes_the_locker_contract() {
    let cluster = EtcdCluster::start(3).expect("etcd cluster");
    let started = Instant::now();
    smol::block_on(async {
        let locker = EtcdLocker::connect(EtcdConfig::new(cluster.endpoints()))
            .await
            .expect("etcd client");
        contract::run_all_scaled(
            &locker,
            "guard/test/contract",
            10,
            SCALE,
            smol::Timer::after,
        )
        .await;
    });
    eprintln!("contract suite on etcd: {:?}", started.elapsed());
}

#[test]
fn a_lost_lock_key_is_granted_to_nobody_before_its_holder_s_deadline() {
    // The key deleted by hand mid-lease (`etcdctl del`): its grant record
    // stays on the holder's lease until that lease ends.
    let cluster = EtcdCluster::start(3).expect("etcd cluster");
    let endpoints = cluster.endpoints();
    smol::block_on(async {
        let locker = EtcdLocker::connect(EtcdConfig::new(endpoints.clone()))
            .await
            .expect("etcd client");
        let lose = |key: &str| {
            let (key, endpoints) = (key.to_owned(), endpoints.clone());
            async_compat::Compat::new(async move {
                let mut client = etcd_client::Client::connect(endpoints, None)
                    .await
                    .expect("a client of its own");
                let deleted = client.delete(key.as_str(), None).await.expect("delete");
                assert_eq!(deleted.deleted(), 1, "{key}: the lock key was there");
            })
        };
        // Leases are whole seconds and end on etcd's own timer: twice the
        // suite's TTLs and waits.
        contract::a_lost_key_is_granted_to_nobody_before_its_deadline_scaled(
            &locker,
            "guard/test/lost",
            2,
            lose,
            smol::Timer::after,
        )
        .await;
    });
}

#[test]
fn the_last_fence_told_is_never_below_a_granted_one() {
    let cluster = EtcdCluster::start(3).expect("etcd cluster");
    smol::block_on(async {
        let locker = EtcdLocker::connect(EtcdConfig::new(cluster.endpoints()))
            .await
            .expect("etcd client");
        contract::last_fence_is_never_below_a_granted_one(&locker, "guard/test/last-fence").await;
    });
}

#[test]
fn inside_a_tokio_runtime_its_futures_are_send_and_one_task_wins() {
    let cluster = EtcdCluster::start(3).expect("etcd cluster");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let locker = Arc::new(
            EtcdLocker::connect(EtcdConfig::new(cluster.endpoints()))
                .await
                .expect("etcd client"),
        );
        // `tokio::spawn` asks for `Send` futures: a `SendLocker`'s are.
        let tasks: Vec<_> = (0..8)
            .map(|_| {
                let locker = locker.clone();
                tokio::spawn(async move {
                    locker
                        .try_lock("guard/test/tokio", Ttl::from_secs(30).unwrap())
                        .await
                })
            })
            .collect();
        let mut winners = Vec::new();
        for task in tasks {
            if let Some(token) = task.await.unwrap().expect("try_lock") {
                winners.push(token);
            }
        }
        assert_eq!(winners.len(), 1, "exactly one of 8 tasks wins");
        locker
            .unlock("guard/test/tokio", &winners[0])
            .await
            .expect("the winner releases");
    });
}

#[test]
fn an_endpoint_that_refuses_connections_is_skipped() {
    let cluster = EtcdCluster::start(3).expect("etcd cluster");
    // A dead member first: nothing listens on a port just freed.
    let dead = format!("http://127.0.0.1:{}", guard_testkit::free_port().unwrap());
    let mut endpoints = vec![dead];
    endpoints.extend(cluster.endpoints());
    smol::block_on(async {
        let locker = EtcdLocker::connect(EtcdConfig::new(endpoints))
            .await
            .expect("etcd client");
        // A refused request was never sent: it goes to the next endpoint
        // at once, and every call succeeds, the first one too.
        for round in 0..20 {
            let key = format!("guard/test/refused/{round}");
            let token = locker
                .try_lock(&key, Ttl::from_secs(5).unwrap())
                .await
                .unwrap_or_else(|e| panic!("round {round}: {e}"))
                .expect("a free key is granted");
            locker.unlock(&key, &token).await.expect("unlock");
        }
    });
}

#[test]
fn an_unreachable_cluster_is_an_error_naming_the_call_and_endpoint() {
    // Nothing listens on a port just freed.
    let port = guard_testkit::free_port().unwrap();
    let endpoint = format!("http://127.0.0.1:{port}");
    let err = smol::block_on(async {
        let locker = EtcdLocker::connect(
            EtcdConfig::new([endpoint.clone()]).with_timeout(Duration::from_millis(500)),
        )
        .await
        .expect("connecting is lazy");
        locker
            .try_lock("guard/test/unreachable", Ttl::from_secs(5).unwrap())
            .await
            .expect_err("no server, no token")
    });
    assert!(
        matches!(
            err,
            EtcdError::Request {
                call: Call::LeaseGrant,
                ..
            }
        ),
        "{err:?}"
    );
    let message = err.to_string();
    assert!(
        message.starts_with(&format!("etcd lease grant at {endpoint} failed: ")),
        "{message}"
    );
}

#[test]
fn no_endpoint_is_refused() {
    let err = smol::block_on(EtcdLocker::connect(EtcdConfig::new(Vec::<String>::new())))
        .expect_err("no endpoint");
    assert!(matches!(err, EtcdError::NoEndpoints), "{err:?}");
}

#[test]
fn a_zero_timeout_and_keys_no_lock_can_have_are_refused_before_asking_etcd() {
    let config = EtcdConfig::new(["http://127.0.0.1:1"]).with_timeout(Duration::ZERO);
    let err = smol::block_on(EtcdLocker::connect(config)).expect_err("a zero timeout");
    assert!(
        matches!(
            err,
            EtcdError::InvalidInput {
                parameter: "request timeout",
                ..
            }
        ),
        "{err}"
    );
    // Nothing listens on port 1: an answer without an error from the
    // connection proves the key was refused first.
    let locker = smol::block_on(EtcdLocker::connect(EtcdConfig::new(["http://127.0.0.1:1"])))
        .expect("connecting is lazy");
    let ttl = Ttl::from_secs(1).unwrap();
    for key in [
        String::new(),
        "k".repeat(257),
        "k\0x".to_owned(),
        // Lock "k"'s grant record.
        "k\u{1}grant".to_owned(),
    ] {
        let err = smol::block_on(locker.try_lock(&key, ttl)).expect_err("refused");
        assert!(
            matches!(
                err,
                EtcdError::InvalidInput {
                    parameter: "lock key",
                    ..
                }
            ),
            "{key:?}: {err}"
        );
    }
}

#[test]
fn a_missing_etcd_names_its_debian_package() {
    let err =
        guard_testkit::find_binary("etcd", "etcd-server", std::ffi::OsStr::new("/nonexistent"))
            .unwrap_err();
    assert!(
        err.to_string().contains("apt-get install etcd-server"),
        "{err}"
    );
}

#[test]
fn a_three_member_cluster_passes_the_claim_contract() {
    let cluster = EtcdCluster::start(3).expect("etcd cluster");
    let started = Instant::now();
    smol::block_on(async {
        let store = EtcdLocker::connect(EtcdConfig::new(cluster.endpoints()))
            .await
            .expect("etcd client");
        guard_testkit::claims::run_all(&store, "guard/test/claims", 10, SCALE, smol::Timer::after)
            .await;
    });
    eprintln!("claim suite on etcd: {:?}", started.elapsed());
}

#[test]
fn a_three_member_cluster_passes_the_semaphore_contract_and_callers_on_threads_stay_within_it() {
    use guard_core::semaphore::{Permits, Semaphore};
    use guard_testkit::semaphore;

    let cluster = EtcdCluster::start(3).expect("etcd cluster");
    let started = Instant::now();
    let connect = || {
        smol::block_on(EtcdLocker::connect(EtcdConfig::new(cluster.endpoints())))
            .expect("etcd client")
    };
    let locker = connect();
    smol::block_on(semaphore::run_all(
        &locker,
        "guard/test/semaphore",
        10,
        SCALE,
        smol::Timer::after,
    ));
    eprintln!("semaphore suite on etcd: {:?}", started.elapsed());

    let replicas = [locker, connect()];
    let seen = semaphore::held_at_once(
        &replicas,
        3,
        "guard/test/semaphore/threads",
        Permits::new(2).unwrap(),
        Duration::from_secs(2),
    );
    assert!(seen.most <= 2, "at most 2 holders at once: {seen:?}");
    assert_eq!(seen.most, 2, "6 callers for 2 permits fill them: {seen:?}");
    assert!(seen.runs > 10, "the permits went round: {seen:?}");

    let refused =
        smol::block_on(replicas[0].try_acquire("a\0b", Permits::ONE, Ttl::from_secs(5).unwrap()))
            .expect_err("a NUL is the permits' separator");
    assert!(refused.to_string().contains("semaphore key"), "{refused}");
}
