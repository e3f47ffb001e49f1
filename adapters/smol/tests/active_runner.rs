//! The original's ActiveGuard tests (seed-originals A3) on real timers, with
//! replicas on separate threads sharing one locker, plus the renew deadline
//! against a backend that never answers.

use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use guard_core::guard::{ActiveConfig, DemoteReason};
use guard_core::lock::{Scope, Ttl};
use guard_smol::{ActiveRunner, RunHandle, control};
use guard_std::{GuardConfig, LocalLocker, SharedLocker};
use guard_testkit::{FaultyLocker, RenewFault};

#[derive(Clone, Debug, PartialEq)]
enum Event {
    Promoted(usize),
    Demoted(usize, DemoteReason),
}

type Log = Arc<Mutex<Vec<(Event, Instant)>>>;

/// TTL 1 s, interval 50 ms: the original's test timing.
fn settings() -> ActiveConfig {
    ActiveConfig::new()
        .with_ttl(Ttl::from_secs(1).unwrap())
        .with_interval(Duration::from_millis(50))
}

fn scope() -> Scope {
    Scope::new("endpoint/redis")
        .unwrap()
        .segment("instance", "n1")
        .unwrap()
}

/// Starts replica `id` with the test timing.
fn replica(
    id: usize,
    config: &GuardConfig,
    log: &Log,
    fail: Fail,
) -> (RunHandle, thread::JoinHandle<()>) {
    replica_with(id, config, log, fail, settings())
}

#[derive(Clone, Copy, PartialEq)]
enum Fail {
    Never,
    Always,
}

fn replica_with(
    id: usize,
    config: &GuardConfig,
    log: &Log,
    fail: Fail,
    timing: ActiveConfig,
) -> (RunHandle, thread::JoinHandle<()>) {
    let runner = ActiveRunner::new(config, &scope())
        .unwrap()
        .with_settings(timing)
        .unwrap();
    let (handle, ctl) = control();
    let (log_p, log_d) = (log.clone(), log.clone());
    let thread = thread::spawn(move || {
        smol::block_on(runner.run(
            ctl,
            |_fence| {
                let log = log_p.clone();
                let fail = fail == Fail::Always;
                async move {
                    log.lock()
                        .unwrap()
                        .push((Event::Promoted(id), Instant::now()));
                    if fail {
                        Err("subscription refused")
                    } else {
                        Ok(())
                    }
                }
            },
            |reason| {
                let log = log_d.clone();
                async move {
                    log.lock()
                        .unwrap()
                        .push((Event::Demoted(id, reason), Instant::now()))
                }
            },
        ))
    });
    (handle, thread)
}

fn events(log: &Log) -> Vec<Event> {
    log.lock().unwrap().iter().map(|(e, _)| e.clone()).collect()
}

fn promotions(log: &Log) -> Vec<usize> {
    events(log)
        .into_iter()
        .filter_map(|e| match e {
            Event::Promoted(id) => Some(id),
            _ => None,
        })
        .collect()
}

fn local() -> GuardConfig {
    GuardConfig::new().with_locker(SharedLocker::new(LocalLocker::new()))
}

#[test]
fn one_leader_then_a_standby_takes_over_when_it_stops() {
    let config = local();
    let log: Log = Arc::default();
    let (a, ta) = replica(0, &config, &log, Fail::Never);
    let (b, tb) = replica(1, &config, &log, Fail::Never);
    thread::sleep(Duration::from_millis(500));
    let first = promotions(&log);
    assert_eq!(first.len(), 1, "exactly one leader: {:?}", events(&log));
    let (leader, standby) = if first[0] == 0 {
        ((a, ta), (b, tb))
    } else {
        ((b, tb), (a, ta))
    };
    let stopped_at = Instant::now();
    leader.0.stop();
    leader.1.join().unwrap();
    thread::sleep(Duration::from_millis(300));
    let all = log.lock().unwrap().clone();
    let takeover = all
        .iter()
        .find(|(e, _)| *e == Event::Promoted(1 - first[0]))
        .map(|(_, t)| *t);
    let takeover = takeover.expect("the standby took over");
    assert!(
        takeover.duration_since(stopped_at) < Duration::from_millis(300),
        "no wait for the TTL"
    );
    assert_eq!(promotions(&log).len(), 2);
    assert!(events(&log).contains(&Event::Demoted(first[0], DemoteReason::Stopping)));
    // Demote happened before the standby was promoted.
    let demoted = all
        .iter()
        .position(|(e, _)| matches!(e, Event::Demoted(id, _) if *id == first[0]))
        .unwrap();
    let promoted = all
        .iter()
        .position(|(e, _)| *e == Event::Promoted(1 - first[0]))
        .unwrap();
    assert!(demoted < promoted);
    standby.0.stop();
    standby.1.join().unwrap();
}

#[test]
fn a_failed_promotion_demotes_releases_and_lets_another_replica_lead() {
    // A 10 s lease: B can only lead within a second if A released it.
    let timing = ActiveConfig::new()
        .with_ttl(Ttl::from_secs(10).unwrap())
        .with_interval(Duration::from_millis(50));
    let config = local();
    let log: Log = Arc::default();
    let (a, ta) = replica_with(0, &config, &log, Fail::Always, timing);
    thread::sleep(Duration::from_millis(20));
    let (b, tb) = replica_with(1, &config, &log, Fail::Never, timing);
    thread::sleep(Duration::from_millis(1_000));
    let seen = events(&log);
    assert!(seen.contains(&Event::Promoted(1)), "B leads: {seen:?}");
    let a_events: Vec<_> = seen
        .iter()
        .filter(|e| matches!(e, Event::Promoted(0) | Event::Demoted(0, _)))
        .collect();
    assert!(!a_events.is_empty());
    for pair in a_events.chunks(2) {
        assert_eq!(pair[0], &Event::Promoted(0));
        if let Some(d) = pair.get(1) {
            assert_eq!(
                *d,
                &Event::Demoted(0, DemoteReason::PromoteFailed),
                "{seen:?}"
            );
        }
    }
    a.stop();
    b.stop();
    ta.join().unwrap();
    tb.join().unwrap();
}

#[test]
fn an_explicit_demote_hands_over_at_once() {
    let config = local();
    let log: Log = Arc::default();
    let (a, ta) = replica(0, &config, &log, Fail::Never);
    thread::sleep(Duration::from_millis(100));
    let (b, tb) = replica(1, &config, &log, Fail::Never);
    thread::sleep(Duration::from_millis(200));
    assert_eq!(promotions(&log), [0]);
    assert!(a.demote());
    thread::sleep(Duration::from_millis(300));
    let seen = events(&log);
    assert!(
        seen.contains(&Event::Demoted(0, DemoteReason::Requested)),
        "{seen:?}"
    );
    assert_eq!(
        promotions(&log),
        [0, 1],
        "B took over well before the 1 s TTL"
    );
    a.stop();
    b.stop();
    ta.join().unwrap();
    tb.join().unwrap();
}

fn wrapped(renew: RenewFault, unlock_fails: bool) -> GuardConfig {
    FaultyLocker::new(LocalLocker::new(), renew, unlock_fails).config()
}

#[test]
fn a_lost_renewal_demotes() {
    let log: Log = Arc::default();
    let (a, ta) = replica(
        0,
        &wrapped(RenewFault::AlwaysLost, false),
        &log,
        Fail::Never,
    );
    thread::sleep(Duration::from_millis(200));
    a.stop();
    ta.join().unwrap();
    let seen = events(&log);
    assert_eq!(
        seen[..2],
        [
            Event::Promoted(0),
            Event::Demoted(0, DemoteReason::LeaseLost)
        ]
    );
}

#[test]
fn without_renewal_the_leader_stays_leader_across_release_and_reacquire() {
    let log: Log = Arc::default();
    let (a, ta) = replica(
        0,
        &wrapped(RenewFault::Unsupported, false),
        &log,
        Fail::Never,
    );
    thread::sleep(Duration::from_millis(600)); // about ten release-and-reacquire cycles
    assert_eq!(events(&log), [Event::Promoted(0)], "no flapping");
    a.stop();
    ta.join().unwrap();
    assert_eq!(
        events(&log),
        [
            Event::Promoted(0),
            Event::Demoted(0, DemoteReason::Stopping)
        ]
    );
}

#[test]
fn without_renewal_a_failing_unlock_demotes() {
    let log: Log = Arc::default();
    let (a, ta) = replica(
        0,
        &wrapped(RenewFault::Unsupported, true),
        &log,
        Fail::Never,
    );
    thread::sleep(Duration::from_millis(200));
    a.stop();
    ta.join().unwrap();
    assert_eq!(
        events(&log)[..2],
        [
            Event::Promoted(0),
            Event::Demoted(0, DemoteReason::LeaseLost)
        ]
    );
}

#[test]
fn a_leader_whose_renewals_never_answer_demotes_before_the_ttl() {
    let log: Log = Arc::default();
    let started = Instant::now();
    let (a, ta) = replica(
        0,
        &wrapped(RenewFault::NeverAnswers, false),
        &log,
        Fail::Never,
    );
    thread::sleep(Duration::from_millis(1_300));
    let all = log.lock().unwrap().clone();
    a.stop();
    ta.join().unwrap();
    let promoted = all
        .iter()
        .find(|(e, _)| *e == Event::Promoted(0))
        .map(|(_, t)| *t)
        .unwrap();
    let (reason, demoted) = all
        .iter()
        .find_map(|(e, t)| match e {
            Event::Demoted(0, r) => Some((*r, *t)),
            _ => None,
        })
        .expect("demoted although the backend never answered");
    assert_eq!(reason, DemoteReason::RenewDeadline);
    // The acquire was sent after `started` and before `promoted`; the lease
    // expires on the server 1 s after it was sent at the earliest.
    assert!(
        demoted.duration_since(started) < Duration::from_secs(1),
        "demoted {:?} after start",
        demoted.duration_since(started)
    );
    assert!(demoted.duration_since(promoted) >= Duration::from_millis(800));
}

#[test]
fn without_a_locker_the_replica_is_always_active() {
    let log: Log = Arc::default();
    let (a, ta) = replica(0, &GuardConfig::new(), &log, Fail::Never);
    thread::sleep(Duration::from_millis(100));
    a.demote();
    thread::sleep(Duration::from_millis(50));
    assert_eq!(
        events(&log),
        [Event::Promoted(0)],
        "a demote request has nobody to hand over to"
    );
    a.stop();
    ta.join().unwrap();
    assert_eq!(
        events(&log),
        [
            Event::Promoted(0),
            Event::Demoted(0, DemoteReason::Stopping)
        ]
    );
}

#[test]
fn the_lease_check_gives_the_fence_only_until_the_renew_deadline() {
    // Renewals hang: the deadline (ttl 1 s - drift 100 ms after the
    // acquire was sent) is what ends the lease, on the runner's clock.
    let config = wrapped(RenewFault::NeverAnswers, false);
    let runner = ActiveRunner::new(&config, &scope())
        .unwrap()
        .with_settings(settings())
        .unwrap();
    let lease = runner.lease_check();
    assert_eq!(lease.fence(), None, "not running: not leading");
    let (handle, ctl) = control();
    let started = Instant::now();
    let task = thread::spawn(move || {
        smol::block_on(runner.run(ctl, |_| async { Ok::<(), String>(()) }, |_| async {}))
    });
    let (mut first_seen, mut valid_until) = (None, None);
    while started.elapsed() < Duration::from_millis(1_300) {
        match lease.fence() {
            Some(fence) => {
                assert!(fence > 0);
                first_seen.get_or_insert(started.elapsed());
                valid_until = Some(started.elapsed());
            }
            None if valid_until.is_some() => break,
            None => {}
        }
        thread::sleep(Duration::from_millis(5));
    }
    let valid_until = valid_until.expect("the fence was given while leading");
    // The acquire was sent before the fence was first seen, so the
    // deadline (send time + ttl - drift) is at most 900 ms after that.
    let lasted = valid_until - first_seen.unwrap();
    assert!(
        lasted < Duration::from_millis(900),
        "handed out the fence {lasted:?} after the grant, past ttl - drift"
    );
    assert!(
        lasted > Duration::from_millis(700),
        "the lease ended early, {lasted:?} after the grant"
    );
    assert_eq!(lease.fence(), None);
    handle.stop();
    task.join().unwrap();
}
