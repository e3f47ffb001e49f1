//! A member cut off from its quorum (the two others frozen with
//! `SIGSTOP`) grants nothing: `try_lock`, `renew` and `unlock` through it
//! are errors within the request timeout, never a token or a verdict.
//! Once the others continue (`SIGCONT`), it works again.

use std::future::Future;
use std::time::{Duration, Instant};

use guard_core::lock::{LeaseRenewer, Locker, Renewal, Ttl, UnlockError};
use guard_etcd::{EtcdConfig, EtcdLocker};
use guard_testkit::etcd::EtcdCluster;

const TIMEOUT: Duration = Duration::from_secs(2);

/// `work`'s output and how long it took; a test failure (not a hang) if
/// it takes more than 10 s.
async fn timed<F: Future>(what: &str, work: F) -> (F::Output, Duration) {
    let start = Instant::now();
    let out = futures_lite::future::or(async { Some(work.await) }, async {
        smol::Timer::after(Duration::from_secs(10)).await;
        None
    })
    .await;
    match out {
        Some(out) => (out, start.elapsed()),
        None => panic!("{what}: no answer within 10 s"),
    }
}

#[test]
fn a_member_without_quorum_grants_nothing_and_recovers() {
    let mut cluster = EtcdCluster::start(3).expect("etcd cluster");
    // The member left alone; the locker talks to it only.
    let alone = 0;
    let ttl = Ttl::from_secs(10).unwrap();
    smol::block_on(async {
        let locker =
            EtcdLocker::connect(EtcdConfig::new([cluster.endpoint(alone)]).with_timeout(TIMEOUT))
                .await
                .expect("etcd client");
        let held = locker
            .try_lock("guard/test/partition/held", ttl)
            .await
            .expect("a healthy cluster answers")
            .expect("a free key is granted");

        for other in (0..cluster.len()).filter(|&i| i != alone) {
            cluster.pause(other).expect("SIGSTOP");
        }
        let paused_at = Instant::now();

        // At once: the member may still believe it leads, but it cannot
        // commit; the request times out.
        let (first, took) = timed(
            "try_lock on a member without quorum",
            locker.try_lock("guard/test/partition/key", ttl),
        )
        .await;
        let err = first.expect_err("no quorum, no token");
        eprintln!("try_lock right after the partition: {err} after {took:?}");
        assert!(
            took < TIMEOUT + Duration::from_millis(1_500),
            "the error came within the request timeout ({took:?})"
        );

        // Once it has noticed (an election timeout, 500 ms): it has no
        // leader and says so at once.
        smol::Timer::at(paused_at + Duration::from_millis(1_500)).await;
        let (again, took) = timed(
            "try_lock on a member without a leader",
            locker.try_lock("guard/test/partition/key", ttl),
        )
        .await;
        let err = again.expect_err("no quorum, no token");
        eprintln!("try_lock once the member has no leader: {err} after {took:?}");
        assert!(took < TIMEOUT, "no wait for the timeout ({took:?})");
        assert!(err.to_string().contains("no leader"), "{err}");

        // A holder hears an error, neither "held" nor "lost", and cannot
        // release either.
        let (renewed, _) = timed(
            "renew on a member without quorum",
            locker.renew("guard/test/partition/held", &held, ttl),
        )
        .await;
        assert!(renewed.is_err(), "renew without quorum: {renewed:?}");
        let (released, _) = timed(
            "unlock on a member without quorum",
            locker.unlock("guard/test/partition/held", &held),
        )
        .await;
        assert!(
            matches!(released, Err(UnlockError::Backend(_))),
            "unlock without quorum: {released:?}"
        );

        for other in (0..cluster.len()).filter(|&i| i != alone) {
            cluster.resume(other).expect("SIGCONT");
        }
        let resumed_at = Instant::now();
        // Working again once a leader is elected.
        let token = loop {
            match locker.try_lock("guard/test/partition/after", ttl).await {
                Ok(Some(token)) => break token,
                Ok(None) => panic!("a fresh key is free"),
                Err(e) if resumed_at.elapsed() < Duration::from_secs(15) => {
                    eprintln!("not yet: {e}");
                    smol::Timer::after(Duration::from_millis(200)).await;
                }
                Err(e) => panic!("no grant 15 s after the partition healed: {e}"),
            }
        };
        eprintln!("granted again {:?} after SIGCONT", resumed_at.elapsed());
        assert!(token.fence() > held.fence());
        // The lease taken before the partition is still ours (a leader
        // change only lengthens leases).
        assert_eq!(
            locker
                .renew("guard/test/partition/held", &held, ttl)
                .await
                .expect("renew"),
            Renewal::Held
        );
        locker
            .unlock("guard/test/partition/held", &held)
            .await
            .expect("the holder releases");
        locker
            .unlock("guard/test/partition/after", &token)
            .await
            .expect("the holder releases");
    });
}
