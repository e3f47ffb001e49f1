//! loom models of guard-core's lock-free type: run with
//! `RUSTFLAGS="--cfg guard_loom" cargo test -p guard-core --test loom`
//! (the test script does, with a bounded number of preemptions).
#![cfg(guard_loom)]

use std::sync::Arc;
use std::time::Duration;

use guard_core::limit::{AtomicTokenBucket, Rate, TokenBucket};
use guard_core::time::Instant;
use loom::thread;

/// One thread per instant checks `bucket` at it; how many were admitted.
fn admissions(bucket: &Arc<AtomicTokenBucket>, times: impl IntoIterator<Item = Instant>) -> usize {
    let threads: Vec<_> = times
        .into_iter()
        .map(|t| {
            let bucket = bucket.clone();
            thread::spawn(move || bucket.check(t).is_allowed())
        })
        .collect();
    threads
        .into_iter()
        .map(|t| t.join().unwrap())
        .filter(|a| *a)
        .count()
}

/// Three threads race for a bucket of two tokens at one instant: in every
/// interleaving exactly two are admitted.
#[test]
fn concurrent_admissions_never_exceed_the_tokens_available() {
    loom::model(|| {
        let bucket = Arc::new(AtomicTokenBucket::new(
            TokenBucket::new(2, Rate::per_second(1)).unwrap(),
        ));
        let now = Instant::from_secs(5);
        assert_eq!(admissions(&bucket, [now; 3]), 2);
        assert_eq!(bucket.available(now), 0);
    });
}

/// Threads whose clock readings straddle a refill: whatever the order in
/// which their compare-and-swaps land, admissions stay within the tokens
/// the bucket held at the latest instant seen, and the state never moves
/// backwards.
#[test]
fn admissions_across_a_refill_stay_within_the_budget() {
    loom::model(|| {
        let bucket = Arc::new(AtomicTokenBucket::new(
            TokenBucket::new(1, Rate::per(1, Duration::from_secs(1))).unwrap(),
        ));
        let t0 = Instant::from_secs(10);
        assert!(bucket.check(t0).is_allowed());
        let times = [t0, t0 + Duration::from_secs(1), t0 + Duration::from_secs(1)];
        // One refill happened between t0 and t0 + 1 s: one more admission.
        assert_eq!(admissions(&bucket, times), 1);
        assert!(bucket.state().settles_at() >= t0 + Duration::from_secs(2));
    });
}

/// A runtime that shares one `ActiveGuard` between threads (a control
/// thread, a timer, a backend reply), each executing the actions its call
/// produced, as callbacks: in every interleaving a promotion gets at most
/// one demotion, and the leading lease is released only after it.
#[test]
fn concurrent_control_never_demotes_twice_or_releases_before_demoting() {
    use guard_core::guard::{Acquired, Action, ActiveConfig, ActiveGuard, Renewed};
    use guard_core::lock::{Token, TokenId};
    use loom::sync::Mutex;

    loom::model(|| {
        let t0 = Instant::from_secs(100);
        let leading = Token::new(TokenId([7; 16]), 7);
        let mut guard = ActiveGuard::new(ActiveConfig::new(), true, t0).unwrap();
        guard.handle_timeout(t0);
        assert_eq!(guard.poll_action(), Some(Action::Acquire));
        guard.handle_acquired(t0, Acquired::Granted(leading));
        assert_eq!(guard.poll_action(), Some(Action::Promote { fence: 7 }));
        let shared = Arc::new(Mutex::new((guard, Vec::<Action>::new())));

        // Each thread makes one call and runs the callbacks it produced,
        // under the lock, as a runtime's dispatch loop would.
        let call = |f: fn(&mut ActiveGuard, Instant)| {
            let shared = shared.clone();
            thread::spawn(move || {
                let mut state = shared.lock().unwrap();
                let (guard, log) = &mut *state;
                f(guard, t0 + Duration::from_secs(5));
                while let Some(action) = guard.poll_action() {
                    log.push(action);
                }
            })
        };
        let threads = [
            call(|g, now| g.demote(now)),
            call(|g, now| g.stop(now)),
            call(|g, now| {
                g.handle_timeout(now);
                g.handle_renewed(now, Renewed::Held);
            }),
        ];
        for t in threads {
            t.join().unwrap();
        }
        let state = shared.lock().unwrap();
        let log = &state.1;
        let demotes = log
            .iter()
            .filter(|a| matches!(a, Action::Demote(_)))
            .count();
        assert_eq!(demotes, 1, "one demotion for the one promotion: {log:?}");
        let demoted_at = log
            .iter()
            .position(|a| matches!(a, Action::Demote(_)))
            .unwrap();
        if let Some(released_at) = log.iter().position(|a| *a == Action::Release(leading)) {
            assert!(
                demoted_at < released_at,
                "released before demoting: {log:?}"
            );
        }
        assert!(!state.0.is_active());
    });
}
