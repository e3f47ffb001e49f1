//! Fences never go backwards when Redis loses its data: a server killed
//! with SIGKILL and started again without persistence hands out fences
//! above every fence it issued before.

use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use guard_core::guard::ActiveConfig;
use guard_core::lock::{Locker, Scope, Ttl};
use guard_redis::{RedisConnection, RedisLocker, Topology};
use guard_smol::{ActiveRunner, control};
use guard_std::{GuardConfig, SharedLocker};
use guard_testkit::RedisServer;

fn connect(server: &RedisServer) -> RedisConnection {
    smol::block_on(RedisConnection::connect(
        Topology::Standalone { url: server.url() },
        Duration::from_millis(300),
    ))
    .expect("connect")
}

/// Takes and releases `key`, retrying while the server comes back.
fn grant(locker: &RedisLocker, key: &str) -> u64 {
    let ttl = Ttl::from_millis(500).unwrap();
    let started = Instant::now();
    loop {
        match smol::block_on(locker.try_lock(key, ttl)) {
            Ok(Some(token)) => {
                smol::block_on(locker.unlock(key, &token)).unwrap();
                return token.fence();
            }
            Ok(None) => panic!("{key} is held by nobody else"),
            Err(e) if started.elapsed() < Duration::from_secs(10) => {
                let _ = e;
                thread::sleep(Duration::from_millis(50));
            }
            Err(e) => panic!("no grant within 10 s: {e}"),
        }
    }
}

#[test]
fn a_restart_without_persistence_never_hands_out_a_lower_fence() {
    let mut server = RedisServer::start().expect("redis-server");
    let locker = RedisLocker::new(connect(&server));
    let mut fences = Vec::new();
    for round in 0..3 {
        for slot in 0..5 {
            fences.push(grant(&locker, &format!("guard:once:report:{round}-{slot}")));
        }
        server.restart().expect("restart"); // SIGKILL, no persistence
    }
    fences.push(grant(&locker, "guard:once:report:last"));
    assert!(
        fences.windows(2).all(|w| w[0] < w[1]),
        "fences went backwards across restarts: {fences:?}"
    );
    // The floor is the server's clock in microseconds since the epoch.
    let now_us = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64;
    let last = *fences.last().unwrap();
    assert!(
        last <= now_us && now_us - last < 60_000_000,
        "fence {last} is not near the clock ({now_us} µs)"
    );
}

#[test]
fn fences_seen_by_a_resource_never_decrease_while_redis_restarts_under_running_replicas() {
    let mut server = RedisServer::start().expect("redis-server");
    // The protected resource: remembers the highest fence it accepted and
    // refuses lower ones.
    let accepted: Arc<Mutex<Vec<(usize, u64)>>> = Arc::default();
    let refused: Arc<Mutex<Vec<(usize, u64)>>> = Arc::default();
    let settings = ActiveConfig::new()
        .with_ttl(Ttl::from_millis(900).unwrap())
        .with_interval(Duration::from_millis(150));
    let replicas: Vec<_> = (0..3)
        .map(|id| {
            let config = GuardConfig::new()
                .with_locker(SharedLocker::new(RedisLocker::new(connect(&server))));
            let runner = ActiveRunner::new(&config, &Scope::new("fenced").unwrap())
                .unwrap()
                .with_settings(settings)
                .unwrap();
            let (accepted, refused) = (accepted.clone(), refused.clone());
            let (handle, ctl) = control();
            let task = thread::spawn(move || {
                smol::block_on(runner.run(
                    ctl,
                    move |fence| {
                        let mut accepted = accepted.lock().unwrap();
                        let highest = accepted.last().map_or(0, |(_, f)| *f);
                        if fence > highest {
                            accepted.push((id, fence));
                        } else {
                            refused.lock().unwrap().push((id, fence));
                        }
                        async { Ok::<(), String>(()) }
                    },
                    |_| async {},
                ))
            });
            (handle, task)
        })
        .collect();
    thread::sleep(Duration::from_millis(1_000));
    for _ in 0..3 {
        let before = accepted.lock().unwrap().len();
        server.restart().expect("restart"); // SIGKILL, no persistence
        // The leader's renewals fail, it demotes, and someone leads again.
        let started = Instant::now();
        while accepted.lock().unwrap().len() == before && refused.lock().unwrap().is_empty() {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "nobody led again after the restart"
            );
            thread::sleep(Duration::from_millis(50));
        }
        thread::sleep(Duration::from_millis(300));
    }
    replicas.iter().for_each(|(h, _)| h.stop());
    replicas.into_iter().for_each(|(_, t)| t.join().unwrap());
    let accepted = accepted.lock().unwrap();
    assert!(accepted.len() >= 4, "{accepted:?}");
    assert!(
        refused.lock().unwrap().is_empty(),
        "a lower fence was offered after a restart: {:?} after {accepted:?}",
        refused.lock().unwrap()
    );
}
