//! The guards on a real redis-server: three scheduler replicas, and what
//! happens when the server stops and comes back.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use guard_core::guard::{ActiveConfig, DemoteReason, FailPolicy, OnceGuard, OnceOutcome};
use guard_core::lock::{Scope, Ttl};
use guard_core::slot::Every;
use guard_redis::{RedisConnection, RedisLocker, Topology};
use guard_smol::{ActiveRunner, Scheduler, control};
use guard_std::{GuardConfig, SharedLocker};
use guard_testkit::RedisServer;

fn redis_config(server: &RedisServer) -> GuardConfig {
    let conn = smol::block_on(RedisConnection::connect(
        Topology::Standalone { url: server.url() },
        Duration::from_millis(300),
    ))
    .expect("connect");
    GuardConfig::new().with_locker(SharedLocker::new(RedisLocker::new(conn)))
}

#[test]
fn three_replicas_on_redis_run_every_slot_once() {
    let server = RedisServer::start().expect("redis-server");
    let runs: Arc<Mutex<BTreeMap<u64, Vec<usize>>>> = Arc::default();
    let replicas: Vec<_> = (0..3)
        .map(|id| {
            thread::sleep(Duration::from_millis(150));
            // Each replica has its own connection, as separate processes would.
            let mut scheduler = Scheduler::new(redis_config(&server).with_owner("t1"));
            let runs = runs.clone();
            scheduler
                .add_job(
                    "tick",
                    "c",
                    Every::new(Duration::from_secs(1)).unwrap(),
                    move |run| {
                        let runs = runs.clone();
                        async move {
                            runs.lock()
                                .unwrap()
                                .entry(run.slot.as_millis())
                                .or_default()
                                .push(id)
                        }
                    },
                )
                .unwrap();
            let (handle, ctl) = control();
            (
                handle,
                thread::spawn(move || smol::block_on(scheduler.run(ctl))),
            )
        })
        .collect();
    thread::sleep(Duration::from_millis(5_600));
    replicas.iter().for_each(|(h, _)| h.stop());
    replicas.into_iter().for_each(|(_, t)| t.join().unwrap());
    let runs = runs.lock().unwrap();
    assert!(runs.len() >= 5, "{runs:?}");
    assert!(
        runs.values().all(|r| r.len() == 1),
        "a slot ran twice: {runs:?}"
    );
    let (first, last) = (*runs.keys().next().unwrap(), *runs.keys().last().unwrap());
    assert_eq!(
        runs.len() as u64,
        (last - first) / 1000 + 1,
        "a slot was missed: {runs:?}"
    );
}

#[test]
fn once_guards_fail_closed_or_open_while_redis_is_down_and_recover_after() {
    let mut server = RedisServer::start().expect("redis-server");
    let config = redis_config(&server);
    let scope = Scope::new("consumer").unwrap();
    let closed = OnceGuard::new(config.locker(), scope.clone());
    let open = OnceGuard::new(config.locker(), scope).with_fail_policy(FailPolicy::FailOpen);
    assert!(matches!(
        smol::block_on(closed.allow("m1")),
        Ok(OnceOutcome::Won { .. })
    ));
    server.stop();
    assert_eq!(
        smol::block_on(closed.allow("m2")),
        Ok(OnceOutcome::SkippedOnError)
    );
    assert_eq!(
        smol::block_on(open.allow("m3")),
        Ok(OnceOutcome::AllowedOnError)
    );
    server.restart().expect("restart");
    // The connection comes back by itself; nothing is stuck.
    let start = Instant::now();
    let outcome = loop {
        let outcome = smol::block_on(closed.allow("m4")).unwrap();
        if outcome != OnceOutcome::SkippedOnError || start.elapsed() > Duration::from_secs(10) {
            break outcome;
        }
        thread::sleep(Duration::from_millis(100));
    };
    assert!(
        matches!(outcome, OnceOutcome::Won { .. }),
        "{outcome:?} after restart"
    );
}

#[test]
fn a_leader_demotes_before_its_ttl_when_redis_stops_and_leads_again_after_restart() {
    let mut server = RedisServer::start().expect("redis-server");
    let config = redis_config(&server);
    let ttl = Duration::from_secs(2);
    let runner = ActiveRunner::new(&config, &Scope::new("pubsub").unwrap())
        .unwrap()
        .with_settings(
            ActiveConfig::new()
                .with_ttl(Ttl::new(ttl).unwrap())
                .with_interval(Duration::from_millis(200)),
        )
        .unwrap();
    type Log = Arc<Mutex<Vec<(String, Instant)>>>;
    let log: Log = Arc::default();
    let (lp, ld) = (log.clone(), log.clone());
    let (handle, ctl) = control();
    let thread = thread::spawn(move || {
        smol::block_on(runner.run(
            ctl,
            move |fence| {
                lp.lock()
                    .unwrap()
                    .push((format!("promoted {fence}"), Instant::now()));
                async { Ok::<(), String>(()) }
            },
            move |reason: DemoteReason| {
                ld.lock()
                    .unwrap()
                    .push((format!("demoted {reason:?}"), Instant::now()));
                async {}
            },
        ))
    });
    thread::sleep(Duration::from_millis(700));
    assert!(
        log.lock()
            .unwrap()
            .first()
            .is_some_and(|(e, _)| e.starts_with("promoted"))
    );
    let stopped = Instant::now();
    server.stop();
    thread::sleep(ttl + Duration::from_millis(300));
    let demoted = log
        .lock()
        .unwrap()
        .iter()
        .find(|(e, _)| e.starts_with("demoted"))
        .map(|(_, t)| *t)
        .expect("the leader demoted while redis was down");
    assert!(
        demoted.duration_since(stopped) < ttl,
        "demoted {:?} after the stop",
        demoted.duration_since(stopped)
    );
    server.restart().expect("restart");
    thread::sleep(Duration::from_secs(3));
    let events: Vec<String> = log.lock().unwrap().iter().map(|(e, _)| e.clone()).collect();
    assert!(
        events.iter().filter(|e| e.starts_with("promoted")).count() >= 2,
        "leads again after the restart: {events:?}"
    );
    handle.stop();
    thread.join().unwrap();
}
