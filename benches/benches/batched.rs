//! A Redis token bucket behind a local cache (`RedisBatchedBucket`) beside
//! the same bucket deciding with one EVALSHA a call (`RedisTokenBucket`),
//! in one run against one `redis-server` this harness starts: decisions
//! per second on one hot key at one caller and at 16 callers on one
//! replica (16 threads, each calling in a loop), with a quota that never
//! binds (a burst of 10^9), so every decision is an admission.
//!
//! `cargo bench -p guard-benches --bench batched [-- SECONDS]` (each
//! measurement SECONDS long, 2 by default; `--test` runs a short smoke
//! pass). The overshoot under a binding quota is measured by
//! `adapters/redis/tests/batched.rs`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use guard_benches::publish;
use guard_core::limit::batch::BatchSize;
use guard_core::limit::{Rate, TokenBucket};
use guard_redis::{Clock, RedisBatchedBucket, RedisConnection, RedisTokenBucket, Topology};
use guard_testkit::RedisServer;

/// Decisions per second of `decide` from `callers` threads for `run`.
fn per_second<F>(callers: usize, run: Duration, decide: Arc<F>) -> f64
where
    F: Fn() + Send + Sync + 'static,
{
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let threads: Vec<_> = (0..callers)
        .map(|_| {
            let done = Arc::clone(&done);
            let decide = Arc::clone(&decide);
            thread::spawn(move || {
                let mut n = 0u64;
                while start.elapsed() < run {
                    decide();
                    n += 1;
                }
                done.fetch_add(n, Ordering::Relaxed);
            })
        })
        .collect();
    for t in threads {
        t.join().expect("caller");
    }
    done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let smoke = args.iter().any(|a| a == "--test");
    let seconds: f64 = args
        .iter()
        .filter_map(|a| a.parse().ok())
        .next()
        .unwrap_or(2.0);
    let run = if smoke {
        Duration::from_millis(100)
    } else {
        Duration::from_secs_f64(seconds)
    };
    let server = RedisServer::start().expect("redis-server");
    let conn = smol::block_on(RedisConnection::connect(
        Topology::Standalone { url: server.url() },
        Duration::from_secs(2),
    ))
    .expect("connect");
    let bucket = TokenBucket::new(1_000_000_000, Rate::per(1, Duration::from_micros(1))).unwrap();
    let plain = Arc::new(RedisTokenBucket::new(conn.clone(), bucket).unwrap());
    let sizing = BatchSize::new(16, 100_000, Duration::from_millis(100)).unwrap();
    let cached = Arc::new(RedisBatchedBucket::new(
        RedisTokenBucket::new(conn, bucket)
            .unwrap()
            .with_prefix("bench:cached")
            .unwrap(),
        sizing,
        1_024,
    ));

    let mut rows = vec![
        format!("One hot key, a quota that never binds; each measurement {run:?}."),
        String::new(),
        "| callers | one EVALSHA a decision (decisions/s) | local cache (decisions/s) | ratio | goal |"
            .to_owned(),
        "|---|---|---|---|---|".to_owned(),
    ];
    for callers in [1, 16] {
        let p = Arc::clone(&plain);
        let remote = per_second(
            callers,
            run,
            Arc::new(move || {
                let d = smol::block_on(p.check("hot", Clock::Server)).expect("check");
                assert!(d.is_allowed());
            }),
        );
        let c = Arc::clone(&cached);
        let local = per_second(
            callers,
            run,
            Arc::new(move || {
                let d = smol::block_on(c.check("hot")).expect("check");
                assert!(d.is_allowed());
            }),
        );
        let goal = match callers {
            1 => format!(
                "ratio ≥ 10: {}",
                if local >= 10.0 * remote {
                    "met"
                } else {
                    "not met"
                }
            ),
            _ => format!(
                "≥ 1,000,000/s: {}",
                if local >= 1e6 { "met" } else { "not met" }
            ),
        };
        rows.push(format!(
            "| {callers} | {remote:.0} | {local:.0} | {:.1} | {goal} |",
            local / remote
        ));
    }
    publish("batched", &rows.join("\n"));
}
