//! The application's loom model: its worker threads share a [`Gateway`]
//! (guard's atomic bucket, shared keyed table, shared dead-letter queue,
//! local locker and limiter registry) and loom runs every interleaving of
//! them, guard's code included, as written.
//!
//! `RUSTFLAGS="--cfg guard_loom" cargo test --release -p guard-example-loom --test loom`
//! (`LOOM_MAX_PREEMPTIONS` bounds the search; the test script uses 3).
#![cfg(guard_loom)]

use std::sync::Arc;

use guard_core::lock::Ttl;
use guard_core::time::Instant;
use guard_example_loom::{Admission, Gateway};
use loom::thread;

/// Two workers send two requests each for one tenant allowed two: the
/// gateway admits exactly two, parks exactly two, hands nothing back and
/// loses nothing, whatever the interleaving.
#[test]
fn every_request_is_admitted_or_parked_and_the_limit_holds() {
    loom::model(|| {
        let gateway = Arc::new(Gateway::new(10, 2).unwrap());
        let now = Instant::from_millis(0);
        let workers: Vec<_> = (0..2u32)
            .map(|w| {
                let gateway = gateway.clone();
                thread::spawn(move || {
                    [w * 10, w * 10 + 1].map(|id| (id, gateway.admit(1, id, now)))
                })
            })
            .collect();
        let results: Vec<(u32, Admission)> = workers
            .into_iter()
            .flat_map(|w| w.join().unwrap())
            .collect();
        let admitted = results
            .iter()
            .filter(|(_, a)| *a == Admission::Admitted)
            .count();
        assert_eq!(admitted, 2, "{results:?}");
        assert_eq!(gateway.admitted(), 2, "the application's own count");
        let mut parked: Vec<u32> = results
            .iter()
            .filter(|(_, a)| *a == Admission::Parked)
            .map(|(id, _)| *id)
            .collect();
        let mut drained = gateway.drain_parked();
        parked.sort_unstable();
        drained.sort_unstable();
        assert_eq!(drained, parked, "the queue holds exactly what was parked");
    });
}

/// Two workers race to start the maintenance job: one runs it; the other
/// can start it only once the first has ended it.
#[test]
fn the_maintenance_job_runs_on_one_worker_at_a_time() {
    loom::model(|| {
        let gateway = Arc::new(Gateway::new(1, 1).unwrap());
        let ttl = Ttl::from_secs(3600).unwrap();
        let running = Arc::new(loom::sync::atomic::AtomicUsize::new(0));
        let workers: Vec<_> = (0..2)
            .map(|_| {
                let (gateway, running) = (gateway.clone(), running.clone());
                thread::spawn(move || {
                    let Some(token) = gateway.start_job(ttl) else {
                        return false;
                    };
                    use loom::sync::atomic::Ordering::SeqCst;
                    assert_eq!(running.fetch_add(1, SeqCst), 0, "two jobs at once");
                    running.fetch_sub(1, SeqCst);
                    assert!(gateway.end_job(&token));
                    true
                })
            })
            .collect();
        let ran = workers
            .into_iter()
            .map(|w| w.join().unwrap())
            .filter(|r| *r)
            .count();
        assert!(ran >= 1, "nobody ran the job");
    });
}

/// Two workers send a webhook to one destination allowed one a minute:
/// exactly one goes out, and the registry's counters (loom's atomics)
/// count both decisions.
#[test]
fn one_webhook_goes_out_and_the_registry_counts_both_decisions() {
    loom::model(|| {
        let gateway = Arc::new(Gateway::new(1, 1).unwrap());
        let workers: Vec<_> = (0..2)
            .map(|_| {
                let gateway = gateway.clone();
                thread::spawn(move || gateway.may_send_webhook("billing"))
            })
            .collect();
        let sent = workers
            .into_iter()
            .map(|w| w.join().unwrap())
            .filter(|s| *s)
            .count();
        assert_eq!(sent, 1);
        assert_eq!(gateway.webhook_counts(), (1, 1));
    });
}
