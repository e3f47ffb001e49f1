//! loom models of guard-core's shared types (the atomic token bucket, the
//! shared dead-letter queue, the shared keyed limiter) and of an
//! `ActiveGuard` shared by threads: run with
//! `RUSTFLAGS="--cfg guard_loom" cargo test -p guard-core --test loom`
//! (the test script does, with a bounded number of preemptions). Under
//! that cfg the atomics and the blocking mutex of `guard_core::sync` are
//! loom's, so loom can preempt a thread anywhere, also while it holds the
//! lock of a shared queue or table.
#![cfg(guard_loom)]

use std::sync::Arc;
use std::time::Duration;

use embassy_sync::blocking_mutex::raw::CriticalSectionRawMutex;
use guard_core::dlq::SharedDeadLetterQueue;
use guard_core::limit::{AtomicTokenBucket, FullPolicy, Keyed, Rate, SharedKeyed, TokenBucket};
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
        let released_at = log
            .iter()
            .position(|a| *a == Action::Release(leading))
            .unwrap_or_else(|| panic!("the leading lease is never released: {log:?}"));
        assert!(
            demoted_at < released_at,
            "released before demoting: {log:?}"
        );
        assert!(!state.0.is_active());
    });
}

type Dlq = SharedDeadLetterQueue<CriticalSectionRawMutex, &'static str, &'static str, 1>;

/// Two threads add to a shared dead-letter queue of capacity 1: in every
/// interleaving exactly one gets its element back, and no thread ever sees
/// more than one element queued.
#[test]
fn concurrent_adds_to_a_full_shared_queue_hand_exactly_one_back() {
    loom::model(|| {
        let dlq: Arc<Dlq> = Arc::new(SharedDeadLetterQueue::new());
        let now = Instant::from_secs(1);
        let threads: Vec<_> = ["a", "b"]
            .into_iter()
            .map(|element| {
                let dlq = dlq.clone();
                thread::spawn(move || {
                    let result = dlq.add(element, Some("timeout"), 1, now);
                    assert!(dlq.len() <= 1, "the bound of 1 was exceeded");
                    result.err().map(|back| *back.element())
                })
            })
            .collect();
        let handed_back: Vec<_> = threads
            .into_iter()
            .filter_map(|t| t.join().unwrap())
            .collect();
        assert_eq!(handed_back.len(), 1, "exactly one add is handed back");
        assert_eq!(dlq.len(), 1);
        let kept = dlq.poll().map(|f| *f.element());
        assert!(kept.is_some() && kept != Some(handed_back[0]));
    });
}

/// A thread that is preempted while it holds the queue's lock (here inside
/// `with_each`) makes an adder wait for the lock; the adder never finds the
/// queue busy and never loses its element. loom can only show this when
/// the lock is one it can preempt a holder of.
#[test]
fn an_add_waits_for_a_reader_holding_the_shared_queue() {
    type Dlq2 = SharedDeadLetterQueue<CriticalSectionRawMutex, u8, (), 2>;
    loom::model(|| {
        let dlq: Arc<Dlq2> = Arc::new(SharedDeadLetterQueue::new());
        let now = Instant::from_secs(1);
        assert!(dlq.add(1, None, 1, now).is_ok());
        let reader = {
            let dlq = dlq.clone();
            thread::spawn(move || {
                let mut seen = 0;
                dlq.with_each(|_| {
                    thread::yield_now();
                    seen += 1;
                });
                seen
            })
        };
        let adder = {
            let dlq = dlq.clone();
            thread::spawn(move || dlq.add(2, None, 1, now).is_ok())
        };
        let seen = reader.join().unwrap();
        assert!(adder.join().unwrap(), "the add found the queue busy");
        assert!(seen == 1 || seen == 2);
        assert_eq!(dlq.len(), 2);
    });
}

/// Two threads check one key of a shared keyed token bucket of capacity 1
/// at one instant: in every interleaving exactly one is admitted.
#[test]
fn concurrent_checks_of_one_key_admit_exactly_the_capacity() {
    type Table = SharedKeyed<CriticalSectionRawMutex, u32, TokenBucket, 8>;
    loom::model(|| {
        let bucket = TokenBucket::new(1, Rate::per_second(1)).unwrap();
        let table: Arc<Table> = Arc::new(SharedKeyed::new(Keyed::new(
            bucket,
            FullPolicy::DenyNewKeys,
        )));
        let now = Instant::from_secs(5);
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let table = table.clone();
                thread::spawn(move || table.check(&7, now).is_allowed())
            })
            .collect();
        let admitted = threads
            .into_iter()
            .map(|t| t.join().unwrap())
            .filter(|a| *a)
            .count();
        assert_eq!(admitted, 1);
        assert_eq!(table.len(), 1);
        assert!(table.check(&7, now).is_denied());
    });
}

/// Two keys race for the one slot of a shared keyed table while its
/// resident has settled: in every interleaving each key is admitted once,
/// the table holds one key, and the forgotten one is never new again at
/// an earlier reading.
#[test]
fn concurrent_new_keys_share_one_slot_without_over_admitting() {
    type Table = SharedKeyed<CriticalSectionRawMutex, u32, TokenBucket, 1>;
    loom::model(|| {
        let bucket = TokenBucket::new(1, Rate::per_second(1)).unwrap();
        let table: Arc<Table> = Arc::new(SharedKeyed::new(Keyed::new(
            bucket,
            FullPolicy::DenyNewKeys,
        )));
        let t = Instant::from_secs(5);
        assert!(table.check(&1, t).is_allowed());
        let later = t + Duration::from_secs(2);
        let threads: Vec<_> = [(2, later), (1, t)]
            .into_iter()
            .map(|(key, now)| {
                let table = table.clone();
                thread::spawn(move || table.check(&key, now).is_allowed())
            })
            .collect();
        let results: Vec<bool> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        // Key 1 at `t` was already admitted once at `t` with one token:
        // whether or not key 2 took its slot first, it is refused.
        assert_eq!(results, [true, false]);
        assert_eq!(table.len(), 1);
    });
}

#[test]
fn a_checked_lease_never_pairs_one_grant_s_fence_with_another_s_deadline() {
    use guard_core::guard::{Lease, SharedLease};
    loom::model(|| {
        let lease = Arc::new(SharedLease::<CriticalSectionRawMutex>::new());
        lease.publish(Some(Lease::new(1, Instant::from_millis(100))));
        let runtime = {
            let lease = lease.clone();
            // Demoted, then promoted again under a later grant.
            thread::spawn(move || {
                lease.publish(None);
                lease.publish(Some(Lease::new(2, Instant::from_millis(300))));
            })
        };
        // At 200 ms grant 1 has expired and grant 2 has not: only fence 2
        // may be handed out, never fence 1 with grant 2's deadline.
        let seen = lease.check(Instant::from_millis(200));
        assert!(seen.is_none() || seen == Some(2), "{seen:?}");
        runtime.join().unwrap();
        assert_eq!(lease.check(Instant::from_millis(200)), Some(2));
        assert_eq!(lease.check(Instant::from_millis(300)), None);
    });
}

/// Two threads wait for the one permit of a bulkhead while the main
/// thread holds it and then gives it back: in every interleaving no two
/// calls are ever in flight together, each waiter gets the permit once,
/// and every permit comes back.
#[test]
fn a_bulkhead_never_has_two_calls_in_flight_and_loses_no_permit() {
    use guard_core::bulkhead::Bulkhead;
    use loom::sync::atomic::{AtomicUsize, Ordering};
    loom::model(|| {
        let bulkhead = Arc::new(Bulkhead::<CriticalSectionRawMutex, 4>::new(1).unwrap());
        let inside = Arc::new(AtomicUsize::new(0));
        let held = Bulkhead::try_acquire(bulkhead.clone()).unwrap();
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let bulkhead = bulkhead.clone();
                let inside = inside.clone();
                thread::spawn(move || {
                    let permit = loom::future::block_on(Bulkhead::acquire(bulkhead)).unwrap();
                    assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two in flight");
                    inside.fetch_sub(1, Ordering::SeqCst);
                    drop(permit);
                })
            })
            .collect();
        drop(held);
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(bulkhead.in_flight(), 0);
        assert_eq!(bulkhead.waiting(), 0);
    });
}

/// A caller that takes the one permit past the line and gives it back
/// races a caller that waits for it: in every interleaving the waiter is
/// granted it (no permit lost between the waiter's arrival and the give
/// back) and both leave nothing behind.
#[test]
fn a_permit_given_back_as_a_waiter_arrives_is_not_lost() {
    use guard_core::bulkhead::Bulkhead;
    loom::model(|| {
        let bulkhead = Arc::new(Bulkhead::<CriticalSectionRawMutex, 4>::new(1).unwrap());
        let quick = {
            let bulkhead = bulkhead.clone();
            thread::spawn(move || {
                if let Ok(permit) = Bulkhead::try_acquire(bulkhead) {
                    drop(permit);
                }
            })
        };
        let waiter = {
            let bulkhead = bulkhead.clone();
            thread::spawn(move || {
                drop(loom::future::block_on(Bulkhead::acquire(bulkhead)).unwrap());
            })
        };
        quick.join().unwrap();
        waiter.join().unwrap();
        assert_eq!(bulkhead.in_flight(), 0);
        assert_eq!(bulkhead.waiting(), 0);
    });
}
