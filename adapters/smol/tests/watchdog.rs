//! `LockWatchdog` on async-io timers, in real time: a job three times
//! longer than the ttl keeps its lock and releases it at the end; a job
//! whose future is dropped has its lock released from a thread.

use std::time::{Duration, Instant};

use guard_core::lock::Ttl;
use guard_smol::LockWatchdog;
use guard_std::{LocalLocker, SharedLocker};

#[test]
fn a_job_longer_than_the_ttl_keeps_its_lock_then_releases_it() {
    let watchdog = LockWatchdog::new(
        SharedLocker::new(LocalLocker::new()),
        Ttl::from_millis(300).unwrap(),
    )
    .unwrap();
    smol::block_on(async {
        let ran = watchdog
            .run("report", |hold| {
                let contender = watchdog.clone();
                async move {
                    let first = hold.fence();
                    async_io::Timer::after(Duration::from_millis(900)).await;
                    // Three ttls in: still ours, so another run is refused.
                    let other = contender.run("report", |_| async {}).await.unwrap();
                    (first, hold.fence(), other)
                }
            })
            .await
            .unwrap()
            .expect("the lock was free");
        assert!(ran.0.is_some());
        assert_eq!(ran.1, ran.0, "held throughout, same fence");
        assert_eq!(ran.2, None, "another run is refused while the job holds it");
        assert!(
            watchdog
                .run("report", |_| async {})
                .await
                .unwrap()
                .is_some(),
            "released at the end"
        );
    });
}

#[test]
fn a_dropped_job_has_its_lock_released_from_a_thread() {
    let watchdog = LockWatchdog::new(
        SharedLocker::new(LocalLocker::new()),
        Ttl::from_secs(30).unwrap(),
    )
    .unwrap();
    smol::block_on(async {
        let job = watchdog.run("report", |_| {
            async_io::Timer::after(Duration::from_secs(60))
        });
        let cut = futures_lite::future::or(async { Some(job.await) }, async {
            async_io::Timer::after(Duration::from_millis(100)).await;
            None
        })
        .await;
        assert!(cut.is_none(), "cut off");
        let asked = Instant::now();
        loop {
            if watchdog
                .run("report", |_| async {})
                .await
                .unwrap()
                .is_some()
            {
                break;
            }
            assert!(
                asked.elapsed() < Duration::from_secs(5),
                "not released, left to expire (30 s)"
            );
            async_io::Timer::after(Duration::from_millis(10)).await;
        }
    });
}
