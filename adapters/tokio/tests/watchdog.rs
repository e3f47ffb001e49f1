//! `LockWatchdog` on tokio, in paused virtual time: a job longer than
//! the lock's ttl keeps it (renewed every ttl / 3) and releases it at the
//! end; a job learns when its hold is lost, at the exact instant; a job
//! whose future is dropped has its lock released from a task.

use std::time::Duration;

use guard_core::guard::HoldLost;
use guard_core::lock::Ttl;
use guard_std::run::RuntimeClock;
use guard_std::{LocalLocker, SharedLocker};
use guard_testkit::{FaultyLocker, RenewFault};
use guard_tokio::{LockWatchdog, Tokio};
use tokio::time::{Instant, sleep};

fn virtual_locker() -> LocalLocker<RuntimeClock<Tokio>> {
    LocalLocker::with_clock(RuntimeClock::new(Tokio::new()))
}

fn ttl() -> Ttl {
    Ttl::from_secs(15).unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_job_longer_than_the_ttl_keeps_its_lock_then_releases_it() {
    let locker = SharedLocker::new(virtual_locker());
    let watchdog = LockWatchdog::new(locker.clone(), ttl()).unwrap();
    let contender = watchdog.clone();
    // Another process tries while the job runs: the lock is still held
    // 30 s in, twice the ttl.
    let refused = tokio::spawn(async move {
        sleep(Duration::from_secs(30)).await;
        contender.run("report", |_| async {}).await.unwrap()
    });
    let start = Instant::now();
    let fences = watchdog
        .run("report", |hold| async move {
            let first = hold.fence();
            sleep(Duration::from_secs(60)).await;
            (first, hold.fence(), hold.lost_because())
        })
        .await
        .unwrap()
        .expect("the lock was free");
    assert!(fences.0.is_some(), "a fence from the start");
    assert_eq!(fences.1, fences.0, "still held, same fence, after 60 s");
    assert_eq!(fences.2, None, "never lost");
    assert_eq!(Instant::now() - start, Duration::from_secs(60));
    assert_eq!(refused.await.unwrap(), None, "held by the job at 30 s");
    // Released at the end: free at once, not a ttl later.
    let again = watchdog.run("report", |hold| async move { hold.fence() });
    assert!(again.await.unwrap().expect("free").is_some());
    assert_eq!(Instant::now() - start, Duration::from_secs(60));
}

#[tokio::test(start_paused = true)]
async fn a_job_learns_at_the_deadline_that_its_renewals_never_answer() {
    let locker = SharedLocker::new(FaultyLocker::new(
        virtual_locker(),
        RenewFault::NeverAnswers,
        false,
    ));
    let watchdog = LockWatchdog::new(locker, ttl()).unwrap();
    let start = Instant::now();
    let (reason, fence_after) = watchdog
        .run("report", |hold| async move {
            let reason = hold.lost().await;
            (reason, hold.fence())
        })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(reason, HoldLost::Deadline);
    assert_eq!(fence_after, None);
    // Acquired at 0, renewals from 5 s never answer: the job may act until
    // ttl - drift = 13.5 s, and learns it then.
    assert_eq!(Instant::now() - start, Duration::from_millis(13_500));
}

#[tokio::test(start_paused = true)]
async fn a_refused_renewal_ends_the_hold_at_once() {
    let locker = SharedLocker::new(FaultyLocker::new(
        virtual_locker(),
        RenewFault::AlwaysLost,
        false,
    ));
    let watchdog = LockWatchdog::new(locker, ttl()).unwrap();
    let start = Instant::now();
    let reason = watchdog
        .run("report", |hold| async move { hold.lost().await })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(reason, HoldLost::Lost);
    assert_eq!(
        Instant::now() - start,
        Duration::from_secs(5),
        "the first renewal"
    );
}

#[tokio::test(start_paused = true)]
async fn a_dropped_job_has_its_lock_released_from_a_task() {
    let locker = SharedLocker::new(virtual_locker());
    let watchdog = LockWatchdog::new(locker, ttl()).unwrap();
    let cut = tokio::time::timeout(
        Duration::from_secs(10),
        watchdog.run("report", |_| sleep(Duration::from_secs(60))),
    )
    .await;
    assert!(cut.is_err(), "the job was cut off at 10 s");
    // The release runs on a task of its own; let it.
    sleep(Duration::from_millis(1)).await;
    let start = Instant::now();
    let again = watchdog.run("report", |_| async {}).await.unwrap();
    assert!(again.is_some(), "released, not left to expire");
    assert_eq!(Instant::now(), start);
}
