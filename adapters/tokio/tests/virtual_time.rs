//! guard-std's runners on tokio, spawned with `tokio::spawn` (so their
//! futures are `Send`) and run in tokio's paused virtual time: the
//! locker, the limiter and the runners all read `Tokio`, so an hour of
//! leases and schedules takes milliseconds and every instant is exact.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use guard_core::guard::{ActiveConfig, DemoteReason, HoldLost};
use guard_core::limit::{FullPolicy, Rate, TokenBucket};
use guard_core::lock::{Renewal, Scope, Token, Ttl, UnlockError};
use guard_core::slot::Every;
use guard_std::ratelimit::MemoryLimiter;
use guard_std::run::RuntimeClock;
use guard_std::{BoxFuture, DynLocker, GuardConfig, LocalLocker, LockerError, SharedLocker};
use guard_testkit::{FaultyLocker, RenewFault};
use guard_tokio::{ActiveRunner, RunHandle, Scheduler, Tokio, WaitingLimiter, control};
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep};

#[derive(Clone, Copy, Debug, PartialEq)]
enum Event {
    Promoted(usize),
    Demoted(usize, DemoteReason),
}

type Log = Arc<Mutex<Vec<(Event, Instant)>>>;

/// A locker whose leases expire on tokio's clock.
fn virtual_locker() -> LocalLocker<RuntimeClock<Tokio>> {
    LocalLocker::with_clock(RuntimeClock::new(Tokio::new()))
}

fn scope() -> Scope {
    Scope::new("consumer").unwrap()
}

/// Spawns replica `id` on the default timing (15 s lease, 5 s interval).
fn replica(id: usize, config: &GuardConfig, log: &Log) -> (RunHandle, JoinHandle<()>) {
    let runner = ActiveRunner::new(config, &scope()).unwrap();
    let (handle, ctl) = control();
    let (on_p, on_d) = (log.clone(), log.clone());
    let task = tokio::spawn(async move {
        runner
            .run(
                ctl,
                move |_fence| {
                    let log = on_p.clone();
                    async move {
                        log.lock()
                            .unwrap()
                            .push((Event::Promoted(id), Instant::now()));
                        Ok::<(), Infallible>(())
                    }
                },
                move |reason| {
                    let log = on_d.clone();
                    async move {
                        log.lock()
                            .unwrap()
                            .push((Event::Demoted(id, reason), Instant::now()));
                    }
                },
            )
            .await;
    });
    (handle, task)
}

/// The replica promoted last.
fn leader(log: &Log) -> usize {
    log.lock()
        .unwrap()
        .iter()
        .rev()
        .find_map(|(e, _)| match e {
            Event::Promoted(id) => Some(*id),
            Event::Demoted(..) => None,
        })
        .expect("someone leads")
}

fn promoted_at(log: &Log, id: usize, after: Instant) -> Instant {
    log.lock()
        .unwrap()
        .iter()
        .find_map(|(e, t)| (*e == Event::Promoted(id) && *t >= after).then_some(*t))
        .unwrap_or_else(|| panic!("replica {id} not promoted after {after:?}"))
}

#[tokio::test(start_paused = true)]
async fn an_hour_of_leadership_with_a_stop_and_a_crash_runs_in_virtual_time() {
    let real = std::time::Instant::now();
    let start = Instant::now();
    let config = GuardConfig::new().with_locker(SharedLocker::new(virtual_locker()));
    let log: Log = Arc::default();
    let mut replicas: Vec<_> = (0..3).map(|id| replica(id, &config, &log)).collect();

    sleep(Duration::from_secs(20 * 60)).await;
    let first = leader(&log);
    let stopped = Instant::now();
    replicas[first].0.stop();
    sleep(Duration::from_secs(20 * 60)).await;
    let second = leader(&log);
    assert_ne!(second, first);
    // A stop releases the lease: a standby takes it at its next attempt.
    let handed = promoted_at(&log, second, stopped) - stopped;
    assert!(handed <= Duration::from_secs(5), "after a stop: {handed:?}");

    // A crash: the task is gone without releasing; the lease expires.
    let crashed = Instant::now();
    replicas[second].1.abort();
    sleep(Duration::from_secs(20 * 60)).await;
    let third = leader(&log);
    assert!(
        third != first && third != second,
        "{first} {second} {third}"
    );
    let taken = promoted_at(&log, third, crashed) - crashed;
    assert!(
        taken > Duration::from_secs(5) && taken <= Duration::from_secs(15 + 5),
        "after a crash the lease expires first (15 s), then the next attempt takes it: {taken:?}"
    );

    for (handle, _) in &replicas {
        handle.stop();
    }
    for (i, (_, task)) in replicas.iter_mut().enumerate() {
        if i != second {
            task.await.expect("runner ends on stop");
        }
    }
    // One leader at a time: each promotion after the previous leader's
    // demotion (or crash).
    let events = log.lock().unwrap().clone();
    let promotions: Vec<_> = events
        .iter()
        .filter(|(e, _)| matches!(e, Event::Promoted(_)))
        .collect();
    assert_eq!(promotions.len(), 3, "{events:?}");
    assert_eq!(
        events.iter().map(|(e, _)| *e).collect::<Vec<_>>(),
        [
            Event::Promoted(first),
            Event::Demoted(first, DemoteReason::Stopping),
            Event::Promoted(second),
            Event::Promoted(third),
            Event::Demoted(third, DemoteReason::Stopping),
        ]
    );
    assert!(Instant::now() - start >= Duration::from_secs(3600));
    assert!(
        real.elapsed() < Duration::from_secs(10),
        "an hour of virtual time took {:?}",
        real.elapsed()
    );
}

#[tokio::test(start_paused = true)]
async fn a_leader_whose_renewals_never_answer_demotes_before_the_lease_ends() {
    let start = Instant::now();
    let config = FaultyLocker::new(virtual_locker(), RenewFault::NeverAnswers, false).config();
    let log: Log = Arc::default();
    let (handle, task) = replica(0, &config, &log);
    sleep(Duration::from_secs(60)).await;
    handle.stop();
    task.await.unwrap();
    let events = log.lock().unwrap().clone();
    let [
        (Event::Promoted(0), promoted),
        (Event::Demoted(0, reason), demoted),
        ..,
    ] = events[..]
    else {
        panic!("promoted then demoted: {events:?}");
    };
    assert_eq!(reason, DemoteReason::RenewDeadline);
    assert_eq!(promoted, start, "acquired at once");
    // The deadline is the acquire's send time + ttl - drift (ttl / 10):
    // 13.5 s, to tokio's millisecond.
    let held = demoted - start;
    assert!(
        held >= Duration::from_millis(13_500) && held <= Duration::from_millis(13_502),
        "demoted after {held:?}"
    );
    // The renewal that never answers is given up a lease after it was
    // sent (5 s + 15 s) as a failed one, and one interval later (25 s)
    // the replica acquires and leads again, its old lease having expired
    // (at 15 s): a hung backend call does not keep it from ever leading
    // again.
    let again = events
        .iter()
        .skip(2)
        .find_map(|(event, at)| matches!(event, Event::Promoted(0)).then_some(*at - start))
        .unwrap_or_else(|| panic!("never led again: {events:?}"));
    assert!(
        again >= Duration::from_secs(25) && again <= Duration::from_millis(25_005),
        "led again after {again:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn three_replicas_run_every_slot_of_an_hour_once() {
    let config = GuardConfig::new().with_locker(SharedLocker::new(virtual_locker()));
    let runs: Arc<Mutex<Vec<(usize, u64)>>> = Arc::default();
    let every_minute = Every::new(Duration::from_secs(60)).unwrap();
    let mut replicas = Vec::new();
    for id in 0..3 {
        let mut scheduler = Scheduler::with_runtime(config.clone(), Tokio::with_virtual_wall());
        let runs = runs.clone();
        scheduler
            .add_job("tick", "", every_minute, move |run| {
                let runs = runs.clone();
                async move { runs.lock().unwrap().push((id, run.slot.as_millis())) }
            })
            .unwrap();
        let (handle, ctl) = control();
        replicas.push((handle, tokio::spawn(scheduler.run(ctl))));
        // Replicas start at different moments, as after a rollout.
        sleep(Duration::from_secs(7)).await;
    }
    sleep(Duration::from_secs(3600)).await;
    for (handle, _) in &replicas {
        handle.stop();
    }
    for (_, task) in replicas {
        task.await.unwrap();
    }
    let mut per_slot: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
    for (id, slot) in runs.lock().unwrap().iter() {
        per_slot.entry(*slot).or_default().push(*id);
    }
    assert!(per_slot.len() >= 60, "{} slots", per_slot.len());
    assert!(per_slot.values().all(|ids| ids.len() == 1), "{per_slot:?}");
    let slots: Vec<u64> = per_slot.keys().copied().collect();
    assert!(
        slots.windows(2).all(|w| w[1] - w[0] == 60_000),
        "no slot missed: {slots:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn thirty_two_spawned_waiters_are_admitted_in_arrival_order_at_the_rate() {
    let bucket = TokenBucket::new(1, Rate::per_second(100)).unwrap();
    let limiter: MemoryLimiter<_, _> = MemoryLimiter::with_clock(
        bucket,
        64,
        FullPolicy::DenyNewKeys,
        RuntimeClock::new(Tokio::new()),
    );
    let waiting = Arc::new(WaitingLimiter::new(Arc::new(limiter)));
    let order: Arc<Mutex<Vec<(usize, Instant)>>> = Arc::default();
    let start = Instant::now();
    let tasks: Vec<_> = (0..32)
        .map(|i| {
            let (waiting, order) = (waiting.clone(), order.clone());
            tokio::spawn(async move {
                let report = waiting.until_ready("hot", None).await.expect("admitted");
                assert!(report.is_allowed());
                order.lock().unwrap().push((i, Instant::now()));
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let order = order.lock().unwrap().clone();
    assert_eq!(
        order.iter().map(|(i, _)| *i).collect::<Vec<_>>(),
        (0..32).collect::<Vec<_>>(),
        "arrival order"
    );
    // One at once, then one each 10 ms: 310 ms, each sleep lengthened by
    // at most 1/16 of jitter and tokio's millisecond timer.
    let span = order[31].1 - start;
    assert!(span >= Duration::from_millis(310), "too fast: {span:?}");
    assert!(
        span <= Duration::from_millis(310 + 20 + 31),
        "too slow: {span:?}"
    );
    assert_eq!(waiting.waiting_keys(), 0, "no line is left behind");
}

#[test]
fn runners_run_on_a_multi_threaded_runtime_in_real_time() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .unwrap();
    runtime.block_on(async {
        let config = GuardConfig::new().with_locker(SharedLocker::new(LocalLocker::new()));
        let timing = ActiveConfig::new()
            .with_ttl(Ttl::from_secs(1).unwrap())
            .with_interval(Duration::from_millis(50));
        let log: Log = Arc::default();
        let mut replicas = Vec::new();
        for id in 0..2 {
            let runner = ActiveRunner::new(&config, &scope())
                .unwrap()
                .with_settings(timing)
                .unwrap();
            let (handle, ctl) = control();
            let log = log.clone();
            replicas.push((
                handle,
                tokio::spawn(async move {
                    runner
                        .run(
                            ctl,
                            |_| {
                                let log = log.clone();
                                async move {
                                    log.lock()
                                        .unwrap()
                                        .push((Event::Promoted(id), Instant::now()));
                                    Ok::<(), Infallible>(())
                                }
                            },
                            |_| async {},
                        )
                        .await
                }),
            ));
        }
        sleep(Duration::from_millis(300)).await;
        let first = leader(&log);
        replicas[first].0.stop();
        sleep(Duration::from_millis(300)).await;
        assert_eq!(leader(&log), 1 - first, "the standby took over");
        for (handle, task) in replicas {
            handle.stop();
            task.await.unwrap();
        }
    });
}

/// Three replicas run a job that takes 150 s every minute for an hour;
/// returns each run's (start, end) and the reasons of the slots told
/// skipped.
async fn overrunning_job(exclusive: bool) -> (Vec<(Instant, Instant)>, Vec<&'static str>) {
    let config = GuardConfig::new().with_locker(SharedLocker::new(virtual_locker()));
    let runs: Arc<Mutex<Vec<(Instant, Instant)>>> = Arc::default();
    let skipped: Arc<Mutex<Vec<&'static str>>> = Arc::default();
    let mut replicas = Vec::new();
    for _ in 0..3 {
        let told = skipped.clone();
        let mut scheduler = Scheduler::with_runtime(config.clone(), Tokio::with_virtual_wall())
            .on_skipped(move |job, _slot, reason| {
                assert_eq!(job, "export");
                told.lock().unwrap().push(reason.name());
            });
        if exclusive {
            scheduler = scheduler
                .with_exclusive_runs(Ttl::from_secs(30).unwrap())
                .unwrap();
        }
        let runs = runs.clone();
        let every_minute = Every::new(Duration::from_secs(60)).unwrap();
        scheduler
            .add_job("export", "", every_minute, move |run| {
                let runs = runs.clone();
                async move {
                    assert!(run.fence.is_some());
                    let start = Instant::now();
                    sleep(Duration::from_secs(150)).await;
                    runs.lock().unwrap().push((start, Instant::now()));
                }
            })
            .unwrap();
        let (handle, ctl) = control();
        replicas.push((handle, tokio::spawn(scheduler.run(ctl))));
    }
    sleep(Duration::from_secs(3600)).await;
    for (handle, _) in &replicas {
        handle.stop();
    }
    for (_, task) in replicas {
        task.await.unwrap();
    }
    let mut runs = runs.lock().unwrap().clone();
    runs.sort();
    let skipped = skipped.lock().unwrap().clone();
    (runs, skipped)
}

#[tokio::test(start_paused = true)]
async fn exclusive_runs_of_a_job_that_outruns_its_period_never_overlap() {
    let overlapping = |runs: &[(Instant, Instant)]| runs.windows(2).any(|w| w[1].0 < w[0].1);
    // Without the option, each slot runs once, but the runs of
    // consecutive slots overlap on different replicas.
    let (plain, skipped) = overrunning_job(false).await;
    assert!(overlapping(&plain), "{} runs", plain.len());
    assert!(skipped.is_empty(), "{skipped:?}");
    let (exclusive, skipped) = overrunning_job(true).await;
    assert!(!overlapping(&exclusive), "{exclusive:?}");
    // A run every third slot: 150 s of work every 180 s.
    assert!(exclusive.len() >= 18, "{} runs", exclusive.len());
    // Every other slot is told skipped, as running elsewhere.
    assert!(
        skipped.iter().all(|r| *r == "running_elsewhere"),
        "{skipped:?}"
    );
    assert!(
        exclusive.len() + skipped.len() >= 58,
        "{} runs and {} skipped of 60 slots",
        exclusive.len(),
        skipped.len()
    );
}

/// [`LocalLocker`] on tokio's clock whose renewals all fail at the
/// backend: a hold ends at its deadline (last acquire sent + ttl − drift),
/// and the lock expires on the server a drift later.
struct FailingRenewals(LocalLocker<RuntimeClock<Tokio>>);

impl DynLocker for FailingRenewals {
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
        Box::pin(async { Err(LockerError::new(std::io::Error::other("renewals down"))) })
    }
}

#[tokio::test(start_paused = true)]
async fn exclusive_runs_whose_renewals_fail_are_told_and_never_overlap() {
    // A 150 s job every minute under a 30 s run lock that cannot be
    // renewed: the lock expires on the server 30 s into each run, and the
    // next slot's replica takes it. Each run must learn of the loss (at
    // 27 s, ttl − drift) and stop before that.
    let config =
        GuardConfig::new().with_locker(SharedLocker::new(FailingRenewals(virtual_locker())));
    type Run = (Instant, Instant, Option<HoldLost>, bool);
    let runs: Arc<Mutex<Vec<Run>>> = Arc::default();
    let mut replicas = Vec::new();
    for _ in 0..3 {
        let mut scheduler = Scheduler::with_runtime(config.clone(), Tokio::with_virtual_wall())
            .with_exclusive_runs(Ttl::from_secs(30).unwrap())
            .unwrap();
        let runs = runs.clone();
        let every_minute = Every::new(Duration::from_secs(60)).unwrap();
        scheduler
            .add_job("export", "", every_minute, move |run| {
                let runs = runs.clone();
                async move {
                    let start = Instant::now();
                    let told = tokio::select! {
                        () = sleep(Duration::from_secs(150)) => None,
                        lost = run.lost() => Some(lost),
                    };
                    runs.lock()
                        .unwrap()
                        .push((start, Instant::now(), told, run.is_lost()));
                }
            })
            .unwrap();
        let (handle, ctl) = control();
        replicas.push((handle, tokio::spawn(scheduler.run(ctl))));
    }
    sleep(Duration::from_secs(600)).await;
    for (handle, _) in &replicas {
        handle.stop();
    }
    for (_, task) in replicas {
        task.await.unwrap();
    }
    let mut runs = runs.lock().unwrap().clone();
    runs.sort_by_key(|run| run.0);
    assert!(runs.len() >= 9, "a run every slot: {runs:?}");
    for (start, end, told, is_lost) in &runs {
        assert_eq!(*told, Some(HoldLost::Deadline), "{runs:?}");
        assert!(is_lost, "{runs:?}");
        assert_eq!(*end - *start, Duration::from_secs(27), "{runs:?}");
    }
    assert!(
        !runs.windows(2).any(|w| w[1].0 < w[0].1),
        "runs overlap: {runs:?}"
    );
}

/// Generic code that spawns lock calls asks for `SendLocker`: the bound
/// that says the locker's futures are `Send`.
fn spawn_try_lock<L>(locker: Arc<L>, key: &'static str) -> JoinHandle<bool>
where
    L: guard_core::lock::SendLocker + Sync + 'static,
{
    tokio::spawn(async move {
        let ttl = Ttl::from_secs(5).unwrap();
        matches!(locker.try_lock(key, ttl).await, Ok(Some(_)))
    })
}

#[tokio::test]
async fn a_send_locker_s_calls_can_be_spawned() {
    let local = Arc::new(LocalLocker::new());
    assert!(spawn_try_lock(local.clone(), "k").await.unwrap());
    assert!(!spawn_try_lock(local, "k").await.unwrap(), "held");
    let shared = Arc::new(SharedLocker::new(LocalLocker::new()));
    assert!(spawn_try_lock(shared, "k").await.unwrap());
}

/// Tokio's virtual time with a wall clock that can be stepped forward.
#[derive(Clone)]
struct SteppedWall {
    tokio: Tokio,
    ahead_ms: Arc<std::sync::atomic::AtomicU64>,
}

impl guard_std::run::Runtime for SteppedWall {
    fn now(&self) -> std::time::Instant {
        self.tokio.now()
    }

    fn wall(&self) -> guard_core::slot::UnixMillis {
        let ahead = self.ahead_ms.load(std::sync::atomic::Ordering::Relaxed);
        guard_core::slot::UnixMillis(self.tokio.wall().0 + ahead)
    }

    fn sleep_until(&self, at: std::time::Instant) -> impl std::future::Future<Output = ()> + Send {
        self.tokio.sleep_until(at)
    }
}

/// The stated behaviour of a wall clock that steps: slots are the
/// replica's wall-clock times, so a replica whose clock steps forward 10 s
/// runs the next slots up to 10 s before they are due on the true clock,
/// never earlier than the step; the slot claim keeps each slot to one run
/// across the replicas all the same.
#[tokio::test(start_paused = true)]
async fn a_wall_clock_stepped_forward_runs_slots_early_by_the_step_and_each_once() {
    use guard_std::run::Runtime as _;
    let config = GuardConfig::new().with_locker(SharedLocker::new(virtual_locker()));
    let truth = Tokio::with_virtual_wall();
    let ahead_ms = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let stepped = SteppedWall {
        tokio: truth,
        ahead_ms: ahead_ms.clone(),
    };
    // (replica, slot, true wall clock at the run), all in ms.
    let runs: Arc<Mutex<Vec<(usize, u64, u64)>>> = Arc::default();
    let every = Every::new(Duration::from_secs(60)).unwrap();
    let job = |id: usize| {
        let runs = runs.clone();
        move |run: guard_std::run::JobRun| {
            let runs = runs.clone();
            async move {
                runs.lock().unwrap().push((id, run.slot.0, truth.wall().0));
            }
        }
    };
    let mut normal = guard_std::run::Scheduler::with_runtime(config.clone(), truth);
    normal.add_job("report", "", every, job(0)).unwrap();
    let mut ahead = guard_std::run::Scheduler::with_runtime(config.clone(), stepped);
    ahead.add_job("report", "", every, job(1)).unwrap();
    let (h0, c0) = control();
    let (h1, c1) = control();
    let t0 = tokio::spawn(normal.run(c0));
    let t1 = tokio::spawn(ahead.run(c1));
    sleep(Duration::from_secs(600)).await;
    ahead_ms.store(10_000, std::sync::atomic::Ordering::Relaxed);
    sleep(Duration::from_secs(600)).await;
    h0.stop();
    h1.stop();
    t0.await.unwrap();
    t1.await.unwrap();
    let runs = runs.lock().unwrap().clone();
    let mut slots: Vec<u64> = runs.iter().map(|(_, slot, _)| *slot).collect();
    slots.sort_unstable();
    let distinct = slots.len();
    slots.dedup();
    assert_eq!(slots.len(), distinct, "a slot ran twice: {runs:?}");
    assert!(distinct >= 19, "{distinct} slots in 20 minutes");
    // Early by at most the step; the stepped replica took slots early.
    let early: Vec<i64> = runs
        .iter()
        .map(|(_, slot, at)| *slot as i64 - *at as i64)
        .collect();
    assert!(early.iter().all(|e| *e <= 10_000), "{runs:?}");
    assert!(
        runs.iter()
            .any(|(id, slot, at)| *id == 1 && slot - at >= 9_000),
        "the stepped replica ran a slot about 10 s before it was due: {runs:?}"
    );
}
