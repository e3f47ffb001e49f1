//! `PgLocker` as a semaphore, on the machine's PostgreSQL (a database
//! unique to each test): the Semaphore contract, lockers on connections
//! of their own with callers on threads never holding more permits than
//! there are, a session under a stricter isolation refused by name, and
//! ended permits purged.

use std::time::Duration;

use guard_core::lock::Ttl;
use guard_core::semaphore::{Permits, Semaphore};
use guard_postgres::PgLocker;
use guard_testkit::postgres::PgDatabase;
use guard_testkit::semaphore;

fn ttl(ms: u64) -> Ttl {
    Ttl::from_millis(ms).unwrap()
}

#[test]
fn the_semaphore_contract_holds() {
    let db = PgDatabase::create().expect("a database on the machine's PostgreSQL");
    let locker = PgLocker::new(&db.url()).unwrap();
    smol::block_on(semaphore::run_all(&locker, "pg", 16, 1, |d| {
        async_io::Timer::after(d)
    }));
}

#[test]
fn lockers_with_callers_on_threads_never_hold_more_permits_than_there_are() {
    let db = PgDatabase::create().unwrap();
    let replicas: Vec<_> = (0..3).map(|_| PgLocker::new(&db.url()).unwrap()).collect();
    for replica in &replicas {
        smol::block_on(replica.connect()).unwrap();
    }
    let seen = semaphore::held_at_once(
        &replicas,
        3,
        "pg:threads",
        Permits::new(4).unwrap(),
        Duration::from_secs(2),
    );
    assert!(seen.most <= 4, "at most 4 holders at once: {seen:?}");
    assert_eq!(seen.most, 4, "9 callers for 4 permits fill them: {seen:?}");
    assert!(seen.runs > 50, "the permits went round: {seen:?}");
}

#[test]
fn a_session_under_repeatable_read_is_refused_with_an_error_that_says_why() {
    let db = PgDatabase::create().unwrap();
    // A role whose sessions default to REPEATABLE READ: a statement there
    // sees its transaction's first snapshot, and could count too few.
    let url = format!(
        "{}?options=-c%20default_transaction_isolation%3Drepeatable%5C%20read",
        db.url()
    );
    let locker = PgLocker::new(&url).unwrap();
    let error = smol::block_on(locker.try_acquire("pg:iso", Permits::ONE, ttl(10_000)))
        .expect_err("refused")
        .to_string();
    assert!(
        error.contains("READ COMMITTED") && error.contains("repeatable read"),
        "{error}"
    );
}

#[test]
fn ended_permits_of_keys_nobody_takes_are_purged_after_the_grace() {
    let db = PgDatabase::create().unwrap();
    const GRACE: Duration = Duration::from_secs(2);
    let locker = PgLocker::new(&db.url())
        .unwrap()
        .with_request_timeout(GRACE / 2)
        .unwrap()
        .with_purge_grace(GRACE)
        .unwrap();
    let three = Permits::new(3).unwrap();
    smol::block_on(async {
        for i in 0..3 {
            locker
                .try_acquire(&format!("pg:gone:{i}"), three, ttl(1))
                .await
                .unwrap()
                .expect("a permit");
        }
        locker
            .try_acquire("pg:live", three, ttl(60_000))
            .await
            .unwrap()
            .expect("a permit");
        assert_eq!(
            locker.purge_expired().await.unwrap(),
            0,
            "kept for the grace"
        );
        async_io::Timer::after(GRACE + Duration::from_millis(200)).await;
        assert_eq!(
            locker.purge_expired().await.unwrap(),
            3,
            "ended permits go after the grace, the live one stays"
        );
        assert_eq!(locker.holders("pg:live").await.unwrap(), 1);
    });
}

#[test]
fn a_deployment_made_before_the_semaphore_keeps_its_locks_and_the_semaphore_says_what_it_needs() {
    use guard_core::lock::Locker;
    use guard_postgres::PgLockError;

    let db = PgDatabase::create().unwrap();
    let owner = PgLocker::new(&db.url()).unwrap();
    smol::block_on(owner.connect()).unwrap();
    // As an older version left it: the locks and claims, no permits.
    db.query("DROP FUNCTION guard_locks_acquire; DROP TABLE guard_locks_permits")
        .unwrap();
    let role = format!("{}_old", db.name());
    db.query(&format!(
        "CREATE ROLE \"{role}\" LOGIN; \
         GRANT SELECT, INSERT, UPDATE, DELETE ON guard_locks, guard_locks_claims, guard_locks_grants TO \"{role}\"; \
         GRANT USAGE ON SEQUENCE guard_locks_fence TO \"{role}\"; \
         REVOKE CREATE ON SCHEMA public FROM \"{role}\""
    ))
    .unwrap();
    let url = db.url().replacen("postgres@", &format!("{role}@"), 1);
    let app = PgLocker::new(&url).unwrap();
    let outcome = smol::block_on(async {
        let lock = app.try_lock("pg:old", ttl(10_000)).await;
        let permit = app
            .try_acquire("pg:old:sem", Permits::ONE, ttl(10_000))
            .await;
        (lock, permit)
    });
    db.query(&format!("DROP OWNED BY \"{role}\"; DROP ROLE \"{role}\""))
        .unwrap();
    assert!(
        matches!(outcome.0, Ok(Some(_))),
        "the locks work as before: {:?}",
        outcome.0
    );
    let err = outcome
        .1
        .expect_err("no permits table, and no right to make it");
    assert!(
        matches!(
            err,
            PgLockError::InvalidInput {
                parameter: "table",
                ..
            }
        ) && err.to_string().contains("guard_locks_permits"),
        "{err}"
    );
}
