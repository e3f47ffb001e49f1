//! Three replicas elect an active consumer through etcd (guard-smol's
//! `ActiveRunner` on the etcd locker, each replica with a client of its
//! own on every member) while the etcd member that is raft leader is
//! killed with `SIGKILL`: no two replicas ever lead at the same instant,
//! and a replica leads again once the cluster has recovered.

use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use guard_core::guard::{ActiveConfig, DemoteReason};
use guard_core::lock::{Scope, Ttl};
use guard_etcd::{EtcdConfig, EtcdLocker};
use guard_smol::{ActiveRunner, RunHandle, control};
use guard_std::{GuardConfig, SharedLocker};
use guard_testkit::etcd::EtcdCluster;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Event {
    Promoted(usize),
    Demoted(usize, DemoteReason),
}

type Log = Arc<Mutex<Vec<(Event, Instant)>>>;

/// A 3 s lease renewed every 500 ms; the leader gives up 2.7 s after the
/// last renewal it sent that succeeded (the default drift, ttl / 10).
fn timing() -> ActiveConfig {
    ActiveConfig::new()
        .with_ttl(Ttl::from_secs(3).unwrap())
        .with_interval(Duration::from_millis(500))
}

/// Starts replica `id` on a thread of its own, with its own etcd client.
fn replica(id: usize, endpoints: Vec<String>, log: &Log) -> (RunHandle, thread::JoinHandle<()>) {
    let (handle, ctl) = control();
    let log = log.clone();
    let thread = thread::spawn(move || {
        smol::block_on(async move {
            let locker = EtcdLocker::connect(
                EtcdConfig::new(endpoints).with_timeout(Duration::from_secs(1)),
            )
            .await
            .expect("etcd client");
            let config = GuardConfig::new().with_locker(SharedLocker::new(locker));
            let scope = Scope::new("etcd-failover").unwrap();
            let runner = ActiveRunner::new(&config, &scope)
                .unwrap()
                .with_settings(timing())
                .unwrap();
            let (log_p, log_d) = (log.clone(), log);
            runner
                .run(
                    ctl,
                    |_fence| {
                        let log = log_p.clone();
                        async move {
                            log.lock()
                                .unwrap()
                                .push((Event::Promoted(id), Instant::now()));
                            Ok::<(), &str>(())
                        }
                    },
                    |reason| {
                        let log = log_d.clone();
                        async move {
                            log.lock()
                                .unwrap()
                                .push((Event::Demoted(id, reason), Instant::now()));
                        }
                    },
                )
                .await;
        });
    });
    (handle, thread)
}

/// The replica leading now, if any (its last event is a promotion).
fn leading(log: &Log, replicas: usize) -> Option<usize> {
    let log = log.lock().unwrap();
    (0..replicas).find(|&id| {
        log.iter()
            .rev()
            .find(|(e, _)| matches!(e, Event::Promoted(i) | Event::Demoted(i, _) if *i == id))
            .is_some_and(|(e, _)| matches!(e, Event::Promoted(_)))
    })
}

/// Each replica's leadership intervals `(replica, from, to)`; one still
/// open ends at `end`.
fn intervals(log: &[(Event, Instant)], end: Instant) -> Vec<(usize, Instant, Instant)> {
    let mut open: Vec<Option<Instant>> = vec![None; 3];
    let mut out = Vec::new();
    for (event, at) in log {
        match *event {
            Event::Promoted(id) => {
                assert!(open[id].is_none(), "replica {id} promoted twice: {log:?}");
                open[id] = Some(*at);
            }
            Event::Demoted(id, _) => {
                let from = open[id]
                    .take()
                    .unwrap_or_else(|| panic!("replica {id} demoted unpromoted: {log:?}"));
                out.push((id, from, *at));
            }
        }
    }
    for (id, from) in open.into_iter().enumerate() {
        if let Some(from) = from {
            out.push((id, from, end));
        }
    }
    out.sort_by_key(|&(_, from, _)| from);
    out
}

#[test]
fn killing_the_etcd_leader_never_gives_two_replicas_the_lead() {
    const REPLICAS: usize = 3;
    let mut cluster = EtcdCluster::start(3).expect("etcd cluster");
    let log: Log = Arc::default();
    let origin = Instant::now();
    let replicas: Vec<_> = (0..REPLICAS)
        .map(|id| replica(id, cluster.endpoints(), &log))
        .collect();

    let wait_for_leading = |within: Duration| {
        let start = Instant::now();
        while start.elapsed() < within {
            if let Some(id) = leading(&log, REPLICAS) {
                return Some(id);
            }
            thread::sleep(Duration::from_millis(20));
        }
        None
    };
    let first = wait_for_leading(Duration::from_secs(10)).expect("a replica leads");
    // A few renewals of the guard's lease before the failure.
    thread::sleep(Duration::from_millis(1_500));

    let etcd_leader = cluster.leader().expect("an etcd leader");
    let killed_at = Instant::now();
    cluster.kill(etcd_leader);
    let new_leader = cluster.leader().expect("the two others elect a leader");
    let recovered_at = Instant::now();
    eprintln!(
        "replica {first} led; killed etcd member {etcd_leader}, member {new_leader} leads after {:?}",
        recovered_at - killed_at
    );
    assert_ne!(new_leader, etcd_leader);

    // Leadership again after the recovery: the lease survived, or it
    // expired (at most a TTL and an election timeout after the new etcd
    // leader took over) and a replica took it again.
    thread::sleep(Duration::from_secs(1));
    let after = wait_for_leading(Duration::from_secs(15))
        .expect("a replica leads again after the etcd cluster recovered");
    // The killed member comes back and catches up; the lead stays single.
    cluster.restart(etcd_leader).expect("member restarts");
    thread::sleep(Duration::from_secs(2));
    let last = leading(&log, REPLICAS);
    eprintln!(
        "events: {:?}",
        log.lock()
            .unwrap()
            .iter()
            .map(|(e, t)| (e, *t - origin))
            .collect::<Vec<_>>()
    );

    for (handle, _) in &replicas {
        handle.stop();
    }
    for (_, thread) in replicas {
        thread.join().unwrap();
    }
    let end = Instant::now();
    let log = log.lock().unwrap().clone();
    let spans = intervals(&log, end);
    let shown: Vec<_> = spans
        .iter()
        .map(|&(id, from, to)| (id, from - origin, to - origin))
        .collect();
    let events: Vec<_> = log.iter().map(|(e, at)| (*e, *at - origin)).collect();
    eprintln!(
        "kill at {:?}; events {events:?}; leading after the recovery: {after}, at the end: {last:?}",
        killed_at - origin
    );
    for pair in spans.windows(2) {
        let ((a, _, a_to), (b, b_from, _)) = (pair[0], pair[1]);
        assert!(
            a_to <= b_from,
            "replicas {a} and {b} led at the same time: intervals {shown:?}"
        );
    }
    // The leadership seen after the recovery is in the log.
    assert!(
        spans.iter().any(|&(_, _, to)| to > recovered_at),
        "a replica led after the recovery: {shown:?}"
    );
}
