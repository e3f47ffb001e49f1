//! Decisions per second on Redis, ours beside `redis-benchmark` running
//! the same command or script at the same concurrency against the same
//! server (which this harness starts on a free loopback port).
//!
//! `cargo bench -p guard-benches --bench redis_throughput [-- SECONDS]`
//! (`--test` runs a short smoke pass).

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use guard_benches::publish;
use guard_core::limit::{Rate, SlidingWindow, TokenBucket};
use guard_core::lock::{Locker, Ttl};
use guard_redis::{
    Clock, RedisConnection, RedisLocker, RedisSlidingWindow, RedisTokenBucket, Topology,
};
use guard_testkit::RedisServer;

const KEYSPACE: u64 = 100_000;

/// Runs `op` from `concurrency` tasks spawned on smol's executor (where
/// the connection's driver runs, as a server's handlers would) on one
/// multiplexed connection for `duration`.
fn ours<F, Fut>(concurrency: usize, duration: Duration, op: F) -> f64
where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let op = Arc::new(op);
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    smol::block_on(async {
        let tasks: Vec<_> = (0..concurrency)
            .map(|task| {
                let (done, op) = (done.clone(), op.clone());
                smol::spawn(async move {
                    let mut n = task as u64 * 7919;
                    while start.elapsed() < duration {
                        n = n
                            .wrapping_mul(6364136223846793005)
                            .wrapping_add(1442695040888963407);
                        op((n >> 33) % KEYSPACE).await;
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await;
        }
    });
    done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
}

/// `redis-benchmark` with the same command; returns requests per second.
fn raw(port: u16, concurrency: usize, requests: u64, command: &[&str]) -> f64 {
    let output = Command::new("redis-benchmark")
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-c",
            &concurrency.to_string(),
        ])
        .args([
            "-n",
            &requests.to_string(),
            "-r",
            &KEYSPACE.to_string(),
            "--csv",
        ])
        .args(command)
        .output()
        .expect("redis-benchmark (Debian package redis-tools)");
    let csv = String::from_utf8_lossy(&output.stdout);
    // "test","rps",...: the second field of the data line.
    csv.lines()
        .filter(|l| !l.starts_with("\"test\""))
        .find_map(|l| l.split(',').nth(1)?.trim_matches('"').parse().ok())
        .unwrap_or(0.0)
}

/// Loads `source` for `redis-benchmark`'s EVALSHA; returns its SHA1.
fn load(conn: &RedisConnection, source: &str) -> String {
    smol::block_on(conn.query(redis::cmd("SCRIPT").arg("LOAD").arg(source))).expect("SCRIPT LOAD")
}

/// One row of the table: ours beside the raw figure.
fn row(rows: &mut Vec<String>, operation: &str, concurrency: usize, ours: f64, raw: f64) {
    rows.push(format!(
        "| {operation} | {concurrency} | {ours:.0} | {raw:.0} | {:.2} |",
        ours / raw
    ));
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let smoke = args.iter().any(|a| a == "--test");
    let seconds: u64 = args
        .iter()
        .filter_map(|a| a.parse().ok())
        .next()
        .unwrap_or(5);
    let duration = if smoke {
        Duration::from_millis(200)
    } else {
        Duration::from_secs(seconds)
    };
    let server = RedisServer::start().expect("redis-server");
    let conn = smol::block_on(RedisConnection::connect(
        Topology::Standalone { url: server.url() },
        Duration::from_secs(2),
    ))
    .expect("connect");
    let locker = Arc::new(RedisLocker::new(conn.clone()));
    let window = Arc::new(
        RedisSlidingWindow::new(
            conn.clone(),
            SlidingWindow::<1000>::new(Duration::from_secs(1), 1_000).unwrap(),
        )
        .unwrap(),
    );
    let bucket = Arc::new(
        RedisTokenBucket::new(
            conn.clone(),
            TokenBucket::new(1_000, Rate::per(1, Duration::from_millis(1))).unwrap(),
        )
        .unwrap(),
    );
    let ttl = Ttl::from_millis(1_000).unwrap();

    // The same script texts our decisions send, loaded for redis-benchmark.
    let acquire_sha = load(&conn, RedisLocker::acquire_script_source());
    let window_sha = load(&conn, &RedisSlidingWindow::script_source());
    let bucket_sha = load(&conn, &RedisTokenBucket::script_source());

    let mut rows = vec![
        "| operation | concurrency | guard (ops/s) | redis-benchmark (ops/s) | ratio |".to_owned(),
        "|---|---|---|---|---|".to_owned(),
    ];
    for concurrency in [1usize, 16, 64] {
        let requests = if smoke { 2_000 } else { 200_000 };
        let raw = |command: &[&str]| raw(server.port(), concurrency, requests, command);

        let locker = locker.clone();
        let ours_lock = ours(concurrency, duration, move |k| {
            let locker = locker.clone();
            async move {
                let _ = locker
                    .try_lock(&format!("bench:lock:{k}"), ttl)
                    .await
                    .expect("try_lock");
            }
        });
        let raw_set = raw(&["SET", "{bench:lock:__rand_int__}", "v", "NX", "PX", "1000"]);
        row(
            &mut rows,
            "try_lock vs SET NX PX",
            concurrency,
            ours_lock,
            raw_set,
        );
        let raw_acquire = raw(&[
            "EVALSHA",
            &acquire_sha,
            "2",
            "{bench:lock:__rand_int__}",
            "fence:{bench:lock:__rand_int__}",
            "v",
            "1000",
        ]);
        row(
            &mut rows,
            "try_lock vs EVALSHA of its script",
            concurrency,
            ours_lock,
            raw_acquire,
        );

        let window = window.clone();
        let ours_window = ours(concurrency, duration, move |k| {
            let window = window.clone();
            async move {
                let _ = window
                    .check(&format!("bench:{k}"), Clock::Server)
                    .await
                    .expect("check");
            }
        });
        let raw_window = raw(&[
            "EVALSHA",
            &window_sha,
            "2",
            "guard:rl:{bench:__rand_int__}",
            "guard:rl:{bench:__rand_int__}:seq",
            "",
            "1000000",
            "1000",
            "1",
        ]);
        row(
            &mut rows,
            "sliding window vs EVALSHA",
            concurrency,
            ours_window,
            raw_window,
        );

        let bucket = bucket.clone();
        let ours_bucket = ours(concurrency, duration, move |k| {
            let bucket = bucket.clone();
            async move {
                let _ = bucket
                    .check(&format!("bench:{k}"), Clock::Server)
                    .await
                    .expect("check");
            }
        });
        let raw_bucket = raw(&[
            "EVALSHA",
            &bucket_sha,
            "1",
            "guard:tb:{bench:__rand_int__}:tb",
            "",
            "1000",
            "1000",
            "1",
        ]);
        row(
            &mut rows,
            "token bucket vs EVALSHA",
            concurrency,
            ours_bucket,
            raw_bucket,
        );
    }
    publish("redis", &(rows.join("\n") + "\n"));
}
