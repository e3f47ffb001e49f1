//! guard-redis in a tokio application (the `tokio` feature): limiter
//! decisions, locks and the runners' waiting run on tokio's reactor and
//! timers, redis-rs's connection tasks on tokio's executor; no async-io
//! reactor thread and no smol executor thread is started. One test per
//! process: the threads checked are the process's.

use std::sync::Arc;
use std::time::Duration;

use guard_core::limit::{Rate, TokenBucket};
use guard_core::lock::{Locker, Ttl};
use guard_redis::{Clock, RedisConnection, RedisLocker, RedisTokenBucket, Topology};
use guard_testkit::{RedisServer, thread_names};
use guard_tokio::WaitingLimiter;

#[test]
fn a_tokio_application_decides_locks_and_waits_on_redis_without_a_second_reactor() {
    let server = RedisServer::start_with(&["--enable-debug-command", "yes"]).expect("redis-server");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("app-worker")
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let conn = RedisConnection::connect(
            Topology::Standalone { url: server.url() },
            Duration::from_secs(2),
        )
        .await
        .expect("connect");
        let bucket = TokenBucket::new(5, Rate::per(1, Duration::from_millis(20))).unwrap();
        let limiter = Arc::new(RedisTokenBucket::new(conn.clone(), bucket).unwrap());
        let admitted = {
            let mut admitted = 0;
            for _ in 0..20 {
                if limiter
                    .check("tenant", Clock::Server)
                    .await
                    .unwrap()
                    .is_allowed()
                {
                    admitted += 1;
                }
            }
            admitted
        };
        assert!((5..=7).contains(&admitted), "the burst of 5: {admitted}");
        // Concurrent decisions from spawned tasks: some go over the
        // direct connection, the rest over the multiplexed ones.
        let tasks: Vec<_> = (0..16)
            .map(|i| {
                let limiter = limiter.clone();
                tokio::spawn(async move {
                    let key = format!("spawned-{i}");
                    limiter
                        .check(&key, Clock::Server)
                        .await
                        .unwrap()
                        .is_allowed()
                })
            })
            .collect();
        for task in tasks {
            assert!(task.await.unwrap(), "a fresh key is admitted");
        }
        let locker = RedisLocker::new(conn.clone());
        let token = locker
            .try_lock("report", Ttl::from_secs(5).unwrap())
            .await
            .unwrap()
            .expect("free");
        assert!(
            locker
                .try_lock("report", Ttl::from_secs(5).unwrap())
                .await
                .unwrap()
                .is_none()
        );
        locker.unlock("report", &token).await.unwrap();
        // Waiting on tokio's timers: the burst of 5, then 4 at 50/s.
        let waiting = WaitingLimiter::new(limiter.clone());
        for _ in 0..9 {
            let report = waiting.until_ready("waiter", None).await.unwrap();
            assert!(report.is_allowed());
        }
        // A request timed out by our own timeout, on tokio's timer.
        let slow = RedisConnection::connect(
            Topology::Standalone { url: server.url() },
            Duration::from_millis(50),
        )
        .await
        .unwrap();
        let started = tokio::time::Instant::now();
        let late: Result<(), _> = slow
            .query(redis::cmd("DEBUG").arg("SLEEP").arg("0.3"))
            .await;
        assert!(late.is_err(), "DEBUG SLEEP 0.3 within 50 ms: {late:?}");
        assert!(started.elapsed() < Duration::from_millis(250));
    });
    let names = thread_names();
    assert!(
        !names
            .iter()
            .any(|n| n == "async-io" || n.starts_with("smol")),
        "a second reactor or executor was started: {names:?}"
    );
    assert!(
        names.iter().any(|n| n == "app-worker"),
        "the check sees threads: {names:?}"
    );
}
