//! Scheduled jobs across replicas sharing one locker: every planned slot
//! runs exactly once, none is missed; the original's isolation tests.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use guard_core::slot::{Every, UnixMillis};
use guard_smol::{RunHandle, ScheduleError, Scheduler, control};
use guard_std::{CronSchedule, GuardConfig, LocalLocker, SharedLocker};

type Runs = Arc<Mutex<Vec<(usize, UnixMillis, Option<u64>)>>>;

fn replica(
    id: usize,
    config: GuardConfig,
    router: &str,
    schedule: impl guard_core::slot::Schedule + Send + 'static,
    runs: &Runs,
) -> (RunHandle, thread::JoinHandle<()>) {
    let mut scheduler = Scheduler::new(config);
    let runs = runs.clone();
    scheduler
        .add_job(router, "chain1", schedule, move |run| {
            let runs = runs.clone();
            async move { runs.lock().unwrap().push((id, run.slot, run.fence)) }
        })
        .unwrap();
    let (handle, ctl) = control();
    (
        handle,
        thread::spawn(move || smol::block_on(scheduler.run(ctl))),
    )
}

fn per_slot(runs: &Runs) -> BTreeMap<u64, Vec<usize>> {
    let mut slots: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
    for (id, slot, _) in runs.lock().unwrap().iter() {
        slots.entry(slot.as_millis()).or_default().push(*id);
    }
    slots
}

#[test]
fn three_replicas_run_every_second_slot_exactly_once() {
    let config = GuardConfig::new().with_locker(SharedLocker::new(LocalLocker::new()));
    let runs: Runs = Arc::default();
    let every_second = Every::new(Duration::from_secs(1)).unwrap();
    let replicas: Vec<_> = (0..3)
        .map(|id| {
            // Replicas start at different moments, as after a rollout.
            thread::sleep(Duration::from_millis(150));
            replica(id, config.clone(), "tick", every_second, &runs)
        })
        .collect();
    thread::sleep(Duration::from_millis(5_600));
    for (handle, _) in &replicas {
        handle.stop();
    }
    for (_, thread) in replicas {
        thread.join().unwrap();
    }
    let slots = per_slot(&runs);
    assert!(slots.len() >= 5, "ran {} slots in 5.6 s", slots.len());
    for (slot, replicas) in &slots {
        assert_eq!(replicas.len(), 1, "slot {slot} ran on {replicas:?}");
        assert_eq!(slot % 1000, 0, "slots are whole seconds");
    }
    let first = *slots.keys().next().unwrap();
    let last = *slots.keys().last().unwrap();
    assert_eq!(
        slots.len() as u64,
        (last - first) / 1000 + 1,
        "no slot missed after the first: {slots:?}"
    );
    let fences: Vec<_> = runs
        .lock()
        .unwrap()
        .iter()
        .map(|r| r.2.expect("fenced"))
        .collect();
    assert!(
        fences.windows(2).all(|w| w[0] < w[1]),
        "fences increase: {fences:?}"
    );
}

#[test]
fn cron_schedules_are_deduplicated_the_same_way() {
    let config = GuardConfig::new().with_locker(SharedLocker::new(LocalLocker::new()));
    let runs: Runs = Arc::default();
    let cron: CronSchedule = "* * * * * *".parse().unwrap();
    let replicas: Vec<_> = (0..2)
        .map(|id| replica(id, config.clone(), "cron", cron.clone(), &runs))
        .collect();
    thread::sleep(Duration::from_millis(2_600));
    replicas.iter().for_each(|(h, _)| h.stop());
    replicas.into_iter().for_each(|(_, t)| t.join().unwrap());
    let slots = per_slot(&runs);
    assert!(slots.len() >= 2);
    assert!(slots.values().all(|r| r.len() == 1), "{slots:?}");
}

#[test]
fn owners_and_routers_are_isolated() {
    let locker = SharedLocker::new(LocalLocker::new());
    let runs: Runs = Arc::default();
    let every = Every::new(Duration::from_millis(200)).unwrap();
    let tenant_a = GuardConfig::new()
        .with_locker(locker.clone())
        .with_owner("tenantA");
    let tenant_b = GuardConfig::new()
        .with_locker(locker.clone())
        .with_owner("tenantB");
    let replicas = [
        replica(0, tenant_a.clone(), "r1", every, &runs),
        replica(1, tenant_b, "r1", every, &runs),
        replica(2, tenant_a, "r2", every, &runs),
    ];
    thread::sleep(Duration::from_millis(1_100));
    replicas.iter().for_each(|(h, _)| h.stop());
    replicas.into_iter().for_each(|(_, t)| t.join().unwrap());
    // Every replica has its own scope, so each runs every slot.
    let slots = per_slot(&runs);
    let complete: Vec<_> = slots.values().filter(|r| r.len() == 3).collect();
    assert!(complete.len() >= 3, "{slots:?}");
}

#[test]
fn without_a_locker_every_replica_runs_every_slot() {
    let runs: Runs = Arc::default();
    let every = Every::new(Duration::from_millis(100)).unwrap();
    let replicas = [
        replica(0, GuardConfig::new(), "r", every, &runs),
        replica(1, GuardConfig::new(), "r", every, &runs),
    ];
    thread::sleep(Duration::from_millis(650));
    replicas.iter().for_each(|(h, _)| h.stop());
    replicas.into_iter().for_each(|(_, t)| t.join().unwrap());
    let slots = per_slot(&runs);
    assert!(
        slots.values().filter(|r| r.len() == 2).count() >= 4,
        "{slots:?}"
    );
    assert!(
        runs.lock().unwrap().iter().all(|r| r.2.is_none()),
        "no fence without a locker"
    );
}

#[test]
fn a_router_id_is_required_and_unique() {
    let mut scheduler = Scheduler::new(GuardConfig::new());
    let every = Every::new(Duration::from_secs(1)).unwrap();
    assert_eq!(
        scheduler.add_job("", "c", every, |_| async {}),
        Err(ScheduleError::MissingRouterId)
    );
    assert!(scheduler.add_job("r1", "c", every, |_| async {}).is_ok());
    assert!(
        scheduler
            .add_job("r1", "other-chain", every, |_| async {})
            .is_ok()
    );
    assert_eq!(
        scheduler.add_job("r1", "c", every, |_| async {}),
        Err(ScheduleError::DuplicateRouterId("r1".into()))
    );
    assert!(
        ScheduleError::MissingRouterId
            .to_string()
            .contains("router id")
    );
}

#[test]
fn stop_ends_a_scheduler_promptly() {
    let runs: Runs = Arc::default();
    let hourly = Every::new(Duration::from_secs(3600)).unwrap();
    let (handle, thread) = replica(0, GuardConfig::new(), "r", hourly, &runs);
    let start = std::time::Instant::now();
    handle.stop();
    thread.join().unwrap();
    assert!(start.elapsed() < Duration::from_millis(500));
}
