//! The active runner's callbacks run beside its lease loop: a callback
//! that does its work in `on_promoted`, for longer than a lease, keeps the
//! lease renewed, and is told (and the loss reported) when the lease ends
//! while it still runs. Real timers; the margins hold on a loaded machine.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use async_io::Timer;
use futures_lite::future;
use guard_core::guard::{ActiveConfig, DemoteReason};
use guard_core::lock::{Renewal, Scope, Token, Ttl, UnlockError};
use guard_smol::{ActiveRunner, control};
use guard_std::{BoxFuture, DynLocker, GuardConfig, LocalLocker, LockerError, SharedLocker};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};

#[derive(Clone, Debug, PartialEq)]
enum Event {
    Promoted(usize),
    JobDone(usize),
    Demoted(usize, DemoteReason),
}

type Log = Arc<Mutex<Vec<Event>>>;

fn scope() -> Scope {
    Scope::new("consumer").unwrap()
}

fn push(log: &Log, event: Event) {
    log.lock().unwrap().push(event);
}

fn events(log: &Log) -> Vec<Event> {
    log.lock().unwrap().clone()
}

/// Waits (polling) until `done` holds or `limit` has passed.
fn wait_for(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let started = Instant::now();
    while !done() {
        if started.elapsed() > limit {
            return false;
        }
        thread::sleep(Duration::from_millis(10));
    }
    true
}

#[test]
fn a_callback_that_outlives_several_leases_keeps_its_lease_and_the_standby_waits() {
    // A 1 s lease renewed every 100 ms; the leader's job takes three
    // leases. Only renewals that go on while it works keep the standby
    // out: the lease would expire on the server after 1 s.
    let timing = ActiveConfig::new()
        .with_ttl(Ttl::from_secs(1).unwrap())
        .with_interval(Duration::from_millis(100));
    let config = GuardConfig::new().with_locker(SharedLocker::new(LocalLocker::new()));
    let log: Log = Arc::default();
    let job = Duration::from_secs(3);
    // How many of the job's checks found no valid lease.
    let gaps = Arc::new(Mutex::new(0_u32));

    let runner_a = ActiveRunner::new(&config, &scope())
        .unwrap()
        .with_settings(timing)
        .unwrap();
    let lease_a = runner_a.lease_check();
    let (handle_a, ctl_a) = control();
    let (log_p, log_d, gaps_a) = (log.clone(), log.clone(), gaps.clone());
    let thread_a = thread::spawn(move || {
        smol::block_on(runner_a.run(
            ctl_a,
            move |fence| {
                let (log, lease, gaps) = (log_p.clone(), lease_a.clone(), gaps_a.clone());
                async move {
                    push(&log, Event::Promoted(0));
                    let started = Instant::now();
                    while started.elapsed() < job {
                        if lease.fence() != Some(fence) {
                            *gaps.lock().unwrap() += 1;
                        }
                        Timer::after(Duration::from_millis(20)).await;
                    }
                    push(&log, Event::JobDone(0));
                    Ok::<(), String>(())
                }
            },
            move |reason| {
                let log = log_d.clone();
                async move { push(&log, Event::Demoted(0, reason)) }
            },
        ))
    });
    assert!(
        wait_for(Duration::from_secs(5), || events(&log)
            .contains(&Event::Promoted(0))),
        "A leads first: {:?}",
        events(&log)
    );

    let runner_b = ActiveRunner::new(&config, &scope())
        .unwrap()
        .with_settings(timing)
        .unwrap();
    let (handle_b, ctl_b) = control();
    let (log_p, log_d) = (log.clone(), log.clone());
    let thread_b = thread::spawn(move || {
        smol::block_on(runner_b.run(
            ctl_b,
            move |_fence| {
                let log = log_p.clone();
                async move {
                    push(&log, Event::Promoted(1));
                    Ok::<(), String>(())
                }
            },
            move |reason| {
                let log = log_d.clone();
                async move { push(&log, Event::Demoted(1, reason)) }
            },
        ))
    });

    assert!(
        wait_for(job * 3, || events(&log).contains(&Event::JobDone(0))),
        "the job ends: {:?}",
        events(&log)
    );
    let seen = events(&log);
    assert_eq!(
        seen,
        [Event::Promoted(0), Event::JobDone(0)],
        "A stays the only leader, and is not demoted, while its job runs"
    );
    assert_eq!(
        *gaps.lock().unwrap(),
        0,
        "A's lease check gives the fence all along the job"
    );

    // A stop hands over as ever: B leads once A has stepped down.
    handle_a.stop();
    thread_a.join().unwrap();
    assert!(
        wait_for(Duration::from_secs(5), || events(&log)
            .contains(&Event::Promoted(1))),
        "B takes over once A stops: {:?}",
        events(&log)
    );
    let seen = events(&log);
    let demoted = seen
        .iter()
        .position(|e| *e == Event::Demoted(0, DemoteReason::Stopping));
    let promoted = seen.iter().position(|e| *e == Event::Promoted(1));
    assert!(demoted < promoted, "{seen:?}");
    handle_b.stop();
    thread_b.join().unwrap();
}

/// [`LocalLocker`] whose every renewal finds the lease lost.
struct RenewalsLost(LocalLocker);

impl DynLocker for RenewalsLost {
    fn try_lock<'a>(
        &'a self,
        key: &'a str,
        ttl: Ttl,
    ) -> BoxFuture<'a, Result<Option<Token>, LockerError>> {
        DynLocker::try_lock(&self.0, key, ttl)
    }

    fn unlock<'a>(
        &'a self,
        key: &'a str,
        token: &'a Token,
    ) -> BoxFuture<'a, Result<(), UnlockError<LockerError>>> {
        DynLocker::unlock(&self.0, key, token)
    }

    fn can_renew(&self) -> bool {
        true
    }

    fn renew<'a>(
        &'a self,
        _key: &'a str,
        _token: &'a Token,
        _ttl: Ttl,
    ) -> BoxFuture<'a, Result<Renewal, LockerError>> {
        Box::pin(async { Ok(Renewal::Lost) })
    }
}

/// The value of counter `name` whose labels are exactly `labels`.
fn counter(recorder: &DebuggingRecorder, name: &str, labels: &[(&str, &str)]) -> Option<u64> {
    recorder
        .snapshotter()
        .snapshot()
        .into_vec()
        .into_iter()
        .find_map(|(key, _, _, value)| {
            let found: Vec<(String, String)> = key
                .key()
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            let wanted: Vec<(String, String)> = labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect();
            match value {
                DebugValue::Counter(n) if key.key().name() == name && found == wanted => Some(n),
                _ => None,
            }
        })
}

#[test]
fn a_lease_lost_while_the_callback_runs_tells_it_and_is_reported() {
    // A 10 s lease (renew deadline 9 s) renewed every 100 ms: the first
    // renewal, after 100 ms, finds the lease lost. The callback is told
    // when that renewal answers, long before the deadline would tell it.
    let timing = ActiveConfig::new()
        .with_ttl(Ttl::from_secs(10).unwrap())
        .with_interval(Duration::from_millis(100));
    let config =
        GuardConfig::new().with_locker(SharedLocker::new(RenewalsLost(LocalLocker::new())));
    let runner = ActiveRunner::new(&config, &scope())
        .unwrap()
        .with_settings(timing)
        .unwrap();
    let key = runner.key().to_owned();
    let lease = runner.lease_check();
    let (handle, ctl) = control();
    let log: Log = Arc::default();
    let told_after: Arc<Mutex<Option<Duration>>> = Arc::default();
    let returned = Arc::new(AtomicBool::new(false));
    // Whether on_promoted had returned when on_demoted was called.
    let demoted_after_return: Arc<Mutex<Vec<bool>>> = Arc::default();
    let recorder = DebuggingRecorder::new();
    let limit = Duration::from_secs(5);

    let (log_p, log_d, told, returned_p, returned_d, order) = (
        log.clone(),
        log.clone(),
        told_after.clone(),
        returned.clone(),
        returned.clone(),
        demoted_after_return.clone(),
    );
    let run = runner.run(
        ctl,
        move |fence| {
            let (log, lease, told, returned) = (
                log_p.clone(),
                lease.clone(),
                told.clone(),
                returned_p.clone(),
            );
            async move {
                push(&log, Event::Promoted(0));
                let started = Instant::now();
                // Works until the lease check says the lease is gone, or
                // gives up at `limit`.
                while started.elapsed() < limit {
                    if lease.fence() != Some(fence) {
                        *told.lock().unwrap() = Some(started.elapsed());
                        break;
                    }
                    Timer::after(Duration::from_millis(10)).await;
                }
                push(&log, Event::JobDone(0));
                returned.store(true, Ordering::SeqCst);
                Ok::<(), String>(())
            }
        },
        move |reason| {
            let (log, returned, order) = (log_d.clone(), returned_d.clone(), order.clone());
            async move {
                order.lock().unwrap().push(returned.load(Ordering::SeqCst));
                push(&log, Event::Demoted(0, reason));
            }
        },
    );
    let watch = async {
        let started = Instant::now();
        while started.elapsed() < limit * 3
            && !events(&log).iter().any(|e| matches!(e, Event::Demoted(..)))
        {
            Timer::after(Duration::from_millis(10)).await;
        }
        handle.stop();
    };
    metrics::with_local_recorder(&recorder, || smol::block_on(future::zip(run, watch)));

    let told = *told_after.lock().unwrap();
    assert!(
        told.is_some_and(|t| t < limit),
        "the callback learns of the loss from its lease check: {told:?}"
    );
    assert_eq!(
        events(&log),
        [
            Event::Promoted(0),
            Event::JobDone(0),
            Event::Demoted(0, DemoteReason::LeaseLost)
        ]
    );
    assert_eq!(
        *demoted_after_return.lock().unwrap(),
        [true],
        "on_demoted once, after on_promoted returned"
    );
    assert_eq!(
        counter(
            &recorder,
            "guard_active_callback_overruns_total",
            &[("key", &key)]
        ),
        Some(1),
        "the loss under a running callback is counted"
    );
}

#[test]
fn a_stop_while_the_callback_runs_tells_it_and_hands_over_once_it_returns() {
    // A 10 s lease: B leads within seconds of the stop only if A released
    // it, and A releases only after its callback returned and on_demoted
    // was called (demote before release).
    let timing = ActiveConfig::new()
        .with_ttl(Ttl::from_secs(10).unwrap())
        .with_interval(Duration::from_millis(100));
    let config = GuardConfig::new().with_locker(SharedLocker::new(LocalLocker::new()));
    let log: Log = Arc::default();
    let runner = |id: usize, work: bool| {
        let runner = ActiveRunner::new(&config, &scope())
            .unwrap()
            .with_settings(timing)
            .unwrap();
        let lease = runner.lease_check();
        let (handle, ctl) = control();
        let (log_p, log_d) = (log.clone(), log.clone());
        let thread = thread::spawn(move || {
            smol::block_on(runner.run(
                ctl,
                move |_fence| {
                    let (log, lease) = (log_p.clone(), lease.clone());
                    async move {
                        push(&log, Event::Promoted(id));
                        if work {
                            // Works until told, then takes a while to
                            // wind down.
                            future::or(lease.lost(), async {
                                Timer::after(Duration::from_secs(60)).await;
                            })
                            .await;
                            Timer::after(Duration::from_millis(300)).await;
                            push(&log, Event::JobDone(id));
                        }
                        Ok::<(), String>(())
                    }
                },
                move |reason| {
                    let log = log_d.clone();
                    async move { push(&log, Event::Demoted(id, reason)) }
                },
            ))
        });
        (handle, thread)
    };
    let (handle_a, thread_a) = runner(0, true);
    assert!(wait_for(Duration::from_secs(5), || events(&log)
        .contains(&Event::Promoted(0))));
    let (handle_b, thread_b) = runner(1, false);
    thread::sleep(Duration::from_millis(300));
    let stopped_at = Instant::now();
    handle_a.stop();
    assert!(
        wait_for(Duration::from_secs(5), || events(&log)
            .contains(&Event::Promoted(1))),
        "B takes over well before A's 10 s lease would expire: {:?}",
        events(&log)
    );
    assert!(stopped_at.elapsed() < Duration::from_secs(6));
    thread_a.join().unwrap();
    assert_eq!(
        events(&log),
        [
            Event::Promoted(0),
            Event::JobDone(0),
            Event::Demoted(0, DemoteReason::Stopping),
            Event::Promoted(1)
        ]
    );
    handle_b.stop();
    thread_b.join().unwrap();
}

#[test]
fn without_a_locker_a_stop_tells_the_running_callback() {
    let runner = ActiveRunner::new(&GuardConfig::new(), &scope()).unwrap();
    let lease = runner.lease_check();
    let (handle, ctl) = control();
    let log: Log = Arc::default();
    let (log_p, log_d) = (log.clone(), log.clone());
    let thread = thread::spawn(move || {
        smol::block_on(runner.run(
            ctl,
            move |fence| {
                let (log, lease) = (log_p.clone(), lease.clone());
                async move {
                    assert_eq!(lease.fence(), Some(fence));
                    push(&log, Event::Promoted(0));
                    future::or(lease.lost(), async {
                        Timer::after(Duration::from_secs(60)).await;
                    })
                    .await;
                    push(&log, Event::JobDone(0));
                    Ok::<(), String>(())
                }
            },
            move |reason| {
                let log = log_d.clone();
                async move { push(&log, Event::Demoted(0, reason)) }
            },
        ))
    });
    assert!(wait_for(Duration::from_secs(5), || events(&log)
        .contains(&Event::Promoted(0))));
    // A demote request has nobody to hand over to: the callback goes on.
    assert!(handle.demote());
    thread::sleep(Duration::from_millis(100));
    assert_eq!(events(&log), [Event::Promoted(0)]);
    handle.stop();
    assert!(wait_for(Duration::from_secs(5), || thread.is_finished()));
    thread.join().unwrap();
    assert_eq!(
        events(&log),
        [
            Event::Promoted(0),
            Event::JobDone(0),
            Event::Demoted(0, DemoteReason::Stopping)
        ]
    );
}

/// `held()` lists every runner of the process from the start of its run:
/// the leader with its fence and a renew deadline within the lease, the
/// standby not leading; a runner that returned is no longer listed.
#[test]
fn held_lists_each_running_runner_with_what_it_holds_and_forgets_it_once_it_returns() {
    let config = GuardConfig::new().with_locker(SharedLocker::new(LocalLocker::new()));
    let ttl = Duration::from_secs(5);
    let timing = ActiveConfig::new()
        .with_ttl(Ttl::from_secs(5).unwrap())
        .with_interval(Duration::from_millis(200));
    let scope = Scope::new("held-view").unwrap();
    let log: Log = Arc::default();
    let mut runs = Vec::new();
    for id in 0..2 {
        let runner = ActiveRunner::new(&config, &scope)
            .unwrap()
            .with_settings(timing)
            .unwrap();
        let (handle, ctl) = control();
        let (log_p, log_d) = (log.clone(), log.clone());
        let thread = thread::spawn(move || {
            smol::block_on(runner.run(
                ctl,
                move |_| {
                    let log = log_p.clone();
                    async move {
                        push(&log, Event::Promoted(id));
                        Ok::<(), String>(())
                    }
                },
                move |reason| {
                    let log = log_d.clone();
                    async move { push(&log, Event::Demoted(id, reason)) }
                },
            ))
        });
        runs.push((handle, thread));
        if id == 0 {
            assert!(
                wait_for(Duration::from_secs(30), || events(&log)
                    .contains(&Event::Promoted(0))),
                "the first runner never led"
            );
        }
    }
    let ours = || -> Vec<guard_std::run::HeldLease> {
        guard_std::run::held()
            .into_iter()
            .filter(|l| l.key.contains("held-view"))
            .collect()
    };
    assert!(
        wait_for(Duration::from_secs(30), || ours().len() == 2),
        "{:?}",
        ours()
    );
    let listed = ours();
    let leading: Vec<_> = listed.iter().filter(|l| l.valid).collect();
    assert_eq!(leading.len(), 1, "{listed:?}");
    assert_eq!(leading[0].fence, Some(1), "{listed:?}");
    let left = leading[0].renew_deadline_in.unwrap();
    assert!(left > Duration::ZERO && left <= ttl, "{left:?}");
    let standby = listed.iter().find(|l| !l.valid).unwrap();
    assert_eq!((standby.fence, standby.renew_deadline_in), (None, None));
    for (handle, thread) in runs {
        handle.stop();
        thread.join().unwrap();
    }
    assert!(ours().is_empty(), "{:?}", ours());
}
