//! `RedisLocker::with_replica_acks` on a real Sentinel deployment (a
//! master, a replica, a sentinel): a grant counts only once the replica
//! has it, so a failover to a replica that was cut off grants nothing
//! twice, where a locker without it does.

use std::process::Command;
use std::time::{Duration, Instant};

use guard_core::lock::{Locker, Ttl};
use guard_redis::{RedisConnection, RedisGuardError, RedisLocker, Topology, lock_keys};
use guard_testkit::{RedisSentinel, SENTINEL_SERVICE};

const TIMEOUT: Duration = Duration::from_secs(2);

fn locker(sentinel: &RedisSentinel) -> RedisLocker {
    let topology = Topology::Sentinel {
        sentinels: vec![sentinel.sentinel_url()],
        service: SENTINEL_SERVICE.into(),
    };
    RedisLocker::new(smol::block_on(RedisConnection::connect(topology, TIMEOUT)).expect("connect"))
}

fn signal(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .args([&format!("-{signal}"), &pid.to_string()])
        .status()
        .expect("kill");
    assert!(status.success(), "kill -{signal} {pid}");
}

fn ttl() -> Ttl {
    Ttl::from_secs(60).unwrap()
}

/// Tries `key` until the locker answers (it follows a failover by asking
/// the sentinel again after a failed request).
fn try_after_failover(locker: &RedisLocker, key: &str) -> bool {
    let started = Instant::now();
    loop {
        match smol::block_on(locker.try_lock(key, ttl())) {
            Ok(token) => return token.is_some(),
            Err(e) => {
                assert!(
                    started.elapsed() < Duration::from_secs(30),
                    "still failing after the failover: {e}"
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

/// The replica is cut off (paused, and its link closed by the master, so
/// that nothing written after reaches it), a grant is asked for, the
/// master dies while the replica is still cut off, and the replica is
/// promoted: whether the grant was given, and whether the new master
/// gives it again.
fn grant_during_a_cut_then_fail_over(acked: bool) -> (bool, bool) {
    let mut sentinel = RedisSentinel::start_with_replica().expect("redis sentinel with a replica");
    let mut locker = locker(&sentinel);
    // What the new master grants is asked by a locker that waits for no
    // replica (it follows the failover as the other does).
    let plain = self::locker(&sentinel);
    if acked {
        locker = locker
            .with_replica_acks(1, Duration::from_millis(300))
            .unwrap();
    }
    let replica = sentinel.replica().unwrap();
    let replica_pid = replica.pid().unwrap();
    // Before the cut (given time to reach the replica without the
    // acknowledgements): kept by the failover below.
    assert!(
        smol::block_on(locker.try_lock("before", ttl()))
            .unwrap()
            .is_some()
    );
    std::thread::sleep(Duration::from_millis(500));
    signal(replica_pid, "STOP");
    let killed = sentinel
        .master()
        .command("CLIENT KILL TYPE replica")
        .unwrap();
    assert!(
        killed.starts_with(":1"),
        "the replica's link closed: {killed}"
    );
    let during = smol::block_on(locker.try_lock("during", ttl())).unwrap();
    if acked {
        // Not acknowledged: released at once, on the master.
        let (lock, _) = lock_keys("", "during").unwrap();
        let there = sentinel
            .master()
            .command(&format!("EXISTS {lock}"))
            .unwrap();
        assert!(
            there.starts_with(":0"),
            "the unacknowledged grant was released: {there}"
        );
    }
    sentinel.stop_master();
    signal(replica_pid, "CONT");
    sentinel
        .wait_for_failover(Duration::from_secs(30))
        .expect("the replica promoted");
    if acked {
        // The cost: the new master has no replica, so nothing is granted.
        assert!(
            !try_after_failover(&locker, "after"),
            "a grant no replica acknowledges is not given"
        );
    }
    let before_again = try_after_failover(&plain, "before");
    assert!(
        !before_again,
        "a grant the replica had is kept by the failover"
    );
    let during_again = try_after_failover(&plain, "during");
    (during.is_some(), during_again)
}

#[test]
fn without_acknowledgements_a_failover_to_a_cut_off_replica_grants_a_key_twice() {
    let (granted, granted_again) = grant_during_a_cut_then_fail_over(false);
    assert!(
        granted && granted_again,
        "granted while the replica was cut off ({granted}), and again after the failover ({granted_again})"
    );
}

#[test]
fn with_acknowledgements_a_failover_to_a_cut_off_replica_grants_nothing_twice() {
    let (granted, granted_again) = grant_during_a_cut_then_fail_over(true);
    assert!(!granted, "nothing is granted while no replica acknowledges");
    assert!(
        granted_again,
        "the key is free on the new master, granted once"
    );
}

#[test]
fn replica_acks_are_refused_unless_they_fit_the_request_timeout() {
    let sentinel = RedisSentinel::start_with_replica().expect("redis sentinel with a replica");
    for (replicas, within) in [
        (0, Duration::from_millis(100)),
        (1, Duration::ZERO),
        (1, TIMEOUT),
    ] {
        let err = locker(&sentinel)
            .with_replica_acks(replicas, within)
            .unwrap_err();
        assert!(
            matches!(err, RedisGuardError::InvalidInput { .. })
                && err.to_string().contains("replica acknowledgements"),
            "{replicas} within {within:?}: {err}"
        );
    }
}
