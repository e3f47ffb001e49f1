//! A semaphore's permits under `LockWatchdog` (through guard-core's
//! `PermitLock`), on tokio in paused virtual time: jobs longer than the
//! lease keep their permits (renewed every ttl / 3) while a third caller
//! is refused, and give them back when they end; a job whose future is
//! dropped has its permit released from a task.

use std::time::Duration;

use guard_core::lock::Ttl;
use guard_core::semaphore::{PermitLock, Permits};
use guard_std::run::RuntimeClock;
use guard_std::{LocalLocker, SharedLocker};
use guard_tokio::{LockWatchdog, Tokio};
use tokio::time::{Instant, sleep};

fn two_permits() -> SharedLocker {
    let semaphore = LocalLocker::with_clock(RuntimeClock::new(Tokio::new()));
    SharedLocker::new(PermitLock::new(semaphore, Permits::new(2).unwrap()))
}

fn ttl() -> Ttl {
    Ttl::from_secs(15).unwrap()
}

#[tokio::test(start_paused = true)]
async fn jobs_longer_than_the_lease_keep_their_permits_then_give_them_back() {
    let watchdog = LockWatchdog::new(two_permits(), ttl()).unwrap();
    let start = Instant::now();
    let jobs: Vec<_> = (0..2)
        .map(|_| {
            let watchdog = watchdog.clone();
            tokio::spawn(async move {
                watchdog
                    .run("exports", |hold| async move {
                        let first = hold.fence();
                        sleep(Duration::from_secs(60)).await;
                        (first, hold.fence())
                    })
                    .await
                    .unwrap()
                    .expect("one of two permits")
            })
        })
        .collect();
    sleep(Duration::from_secs(30)).await;
    let third = watchdog.run("exports", |_| async {}).await.unwrap();
    assert_eq!(third, None, "both permits held at 30 s, twice the lease");
    let mut fences = Vec::new();
    for job in jobs {
        let (first, last) = job.await.unwrap();
        assert!(
            first.is_some() && first == last,
            "held throughout: {first:?} {last:?}"
        );
        fences.extend(first);
    }
    assert_eq!(Instant::now() - start, Duration::from_secs(60));
    assert_ne!(fences[0], fences[1], "each permit its own fence");
    // Given back at the end: both free at once, not a lease later.
    let (a, b) = tokio::join!(
        watchdog.run("exports", |hold| async move { hold.fence() }),
        watchdog.run("exports", |hold| async move { hold.fence() }),
    );
    assert!(a.unwrap().flatten().is_some() && b.unwrap().flatten().is_some());
    assert_eq!(Instant::now() - start, Duration::from_secs(60));
}

#[tokio::test(start_paused = true)]
async fn a_dropped_job_has_its_permit_released_from_a_task() {
    let watchdog = LockWatchdog::new(two_permits(), ttl()).unwrap();
    let kept = {
        let watchdog = watchdog.clone();
        tokio::spawn(async move {
            watchdog
                .run("exports", |_| sleep(Duration::from_secs(60)))
                .await
        })
    };
    let cut = tokio::time::timeout(
        Duration::from_secs(10),
        watchdog.run("exports", |_| sleep(Duration::from_secs(60))),
    )
    .await;
    assert!(cut.is_err(), "the job was cut off at 10 s");
    sleep(Duration::from_millis(1)).await;
    let start = Instant::now();
    let again = watchdog.run("exports", |_| async {}).await.unwrap();
    assert!(again.is_some(), "released, not left to expire");
    assert_eq!(Instant::now(), start);
    kept.abort();
}
