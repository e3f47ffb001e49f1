//! `PgLocker` as a claim store, on the machine's PostgreSQL (a database
//! unique to each test): the ClaimStore contract, lockers on connections
//! of their own racing for one delivery, and forgotten records purged.

use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Duration;

use guard_core::claim::{Begin, ClaimOutcome, ClaimStore, Claims, Start};
use guard_core::lock::{Scope, Ttl};
use guard_postgres::PgLocker;
use guard_testkit::claims;
use guard_testkit::postgres::PgDatabase;

fn ttl(ms: u64) -> Ttl {
    Ttl::from_millis(ms).unwrap()
}

#[test]
fn the_claim_contract_holds() {
    let db = PgDatabase::create().expect("a database on the machine's PostgreSQL");
    let store = PgLocker::new(&db.url()).unwrap();
    smol::block_on(claims::run_all(&store, "pg", 16, 1, |d| {
        async_io::Timer::after(d)
    }));
}

#[test]
fn lockers_on_connections_of_their_own_start_one_attempt_a_round() {
    let db = PgDatabase::create().unwrap();
    let url = db.url();
    const LOCKERS: usize = 6;
    const ROUNDS: usize = 20;
    let barrier = Arc::new(Barrier::new(LOCKERS));
    let racers: Vec<_> = (0..LOCKERS)
        .map(|_| {
            let (url, barrier) = (url.clone(), Arc::clone(&barrier));
            thread::spawn(move || {
                let store = PgLocker::new(&url).unwrap();
                smol::block_on(store.connect()).unwrap();
                let mut started = Vec::new();
                for round in 0..ROUNDS {
                    barrier.wait();
                    let key = format!("claim:race:{round}");
                    let begun =
                        smol::block_on(store.try_begin(&key, ttl(60_000), ttl(60_000), &mut []))
                            .unwrap();
                    if let Begin::Started { token, .. } = begun {
                        started.push((round, token.fence()));
                    }
                }
                started
            })
        })
        .collect();
    let mut by_round = vec![0usize; ROUNDS];
    let mut fences = Vec::new();
    for racer in racers {
        for (round, fence) in racer.join().unwrap() {
            by_round[round] += 1;
            fences.push(fence);
        }
    }
    assert!(
        by_round.iter().all(|&n| n == 1),
        "one attempt a round among {LOCKERS} lockers: {by_round:?}"
    );
    fences.sort_unstable();
    fences.dedup();
    assert_eq!(fences.len(), ROUNDS, "every attempt has a fence of its own");
}

#[test]
fn a_worker_that_dies_is_taken_over_and_its_late_completion_changes_nothing() {
    let db = PgDatabase::create().unwrap();
    let a = PgLocker::new(&db.url()).unwrap();
    let b = PgLocker::new(&db.url()).unwrap();
    let scope = Scope::new("jobs").unwrap();
    let on_a = Claims::new(&a, scope.clone()).with_lease(ttl(200)).unwrap();
    let on_b = Claims::new(&b, scope).with_lease(ttl(200)).unwrap();
    smol::block_on(async {
        let first = on_a.begin("job-7", &mut []).await.unwrap();
        let first = first.claim().expect("a starts it").clone();
        async_io::Timer::after(Duration::from_millis(400)).await;
        let second = on_b.begin("job-7", &mut []).await.unwrap();
        let second = second.claim().expect("b takes it over").clone();
        assert_eq!((second.attempt(), second.after()), (2, Start::AfterExpiry));
        assert!(second.fence() > first.fence());
        assert_eq!(
            on_a.complete(&first, b"late").await.unwrap(),
            guard_core::claim::Settled::Superseded
        );
        on_b.complete(&second, b"done by b").await.unwrap();
        let mut buffer = [0u8; 16];
        assert_eq!(
            on_a.begin("job-7", &mut buffer).await.unwrap(),
            ClaimOutcome::Done {
                result: b"done by b"
            }
        );
    });
}

#[test]
fn forgotten_records_are_purged_after_the_grace() {
    let db = PgDatabase::create().unwrap();
    const GRACE: Duration = Duration::from_secs(2);
    let store = PgLocker::new(&db.url())
        .unwrap()
        .with_request_timeout(GRACE / 2)
        .unwrap()
        .with_purge_grace(GRACE)
        .unwrap();
    smol::block_on(async {
        for i in 0..5 {
            let key = format!("claim:{i}");
            if let Begin::Started { token, .. } = store
                .try_begin(&key, ttl(1), ttl(1), &mut [])
                .await
                .unwrap()
            {
                store.complete(&key, &token, ttl(1), b"").await.unwrap();
            }
        }
        store
            .try_begin("claim:live", ttl(60_000), ttl(60_000), &mut [])
            .await
            .unwrap();
        assert_eq!(
            store.purge_expired().await.unwrap(),
            0,
            "kept for the grace"
        );
        async_io::Timer::after(GRACE + Duration::from_millis(200)).await;
        assert_eq!(
            store.purge_expired().await.unwrap(),
            5,
            "forgotten records go after the grace, the live one stays"
        );
    });
    let left = db
        .query("SELECT count(*) FROM \"guard_locks_claims\"")
        .unwrap();
    assert_eq!(left.trim(), "1");
}
