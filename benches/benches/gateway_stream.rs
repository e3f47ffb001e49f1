//! Redis Stream entries per second through the gateway's path: a
//! consumer-group `StreamConsumer` whose handler first passes an
//! `Admission` (the limiter an endpoint names), beside the same loop with
//! no limiter. The limit is far above the rate, so it never binds: the
//! figure is the limiter's cost on the path, not its effect.
//!
//! `cargo bench -p guard-benches --bench gateway_stream [-- ENTRIES]`
//! (`--test` runs a short smoke pass). Starts its own `redis-server`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use guard_core::limit::{FullPolicy, Rate, TokenBucket};
use guard_core::retry::Classifier;
use guard_endpoints::admission::{Admission, Verdict};
use guard_endpoints::config::WhenLimited;
use guard_endpoints::redis::StreamConsumer;
use guard_redis::{RedisConnection, Topology};
use guard_std::ratelimit::{MemoryLimiter, NamedRateLimiter};
use guard_testkit::RedisServer;

/// Adds `n` entries to `stream`, pipelined in chunks.
fn fill(server: &RedisServer, stream: &str, n: u64) {
    let mut conn = redis::Client::open(server.url())
        .and_then(|c| c.get_connection())
        .expect("connect");
    for chunk in 0..n.div_ceil(1_000) {
        let mut pipe = redis::pipe();
        for i in chunk * 1_000..((chunk + 1) * 1_000).min(n) {
            pipe.cmd("XADD")
                .arg(stream)
                .arg("*")
                .arg("payload")
                .arg(format!("e{i}"))
                .arg("device")
                .arg(format!("d{}", i % 100))
                .ignore();
        }
        let () = pipe.query(&mut conn).expect("XADD");
    }
}

/// Consumes `n` entries of a fresh stream, each through `gate` if given;
/// returns entries per second.
fn consume(
    server: &RedisServer,
    conn: &RedisConnection,
    name: &str,
    n: u64,
    gate: Option<Arc<Admission>>,
) -> f64 {
    fill(server, name, n);
    let handled = Arc::new(AtomicU64::new(0));
    // The gateway's settings: the default batch and poll interval.
    let consumer =
        StreamConsumer::new(conn.clone(), name, "bench", "consumer-1").expect("consumer");
    let (handle, control) = guard_smol::control();
    let started = Instant::now();
    smol::block_on(async {
        let stop = {
            let handled = handled.clone();
            async move {
                while handled.load(Ordering::Relaxed) < n {
                    async_io::Timer::after(Duration::from_millis(1)).await;
                }
                handle.stop();
            }
        };
        let run = consumer.run(control, Classifier::retry_all(), |message| {
            let (handled, gate) = (handled.clone(), gate.clone());
            async move {
                if let Some(gate) = &gate {
                    let key = message
                        .field("device")
                        .and_then(|d| std::str::from_utf8(d).ok())
                        .unwrap_or("");
                    if let Verdict::Refused(why) = gate.admit(key).await {
                        return Err(why.to_string());
                    }
                }
                handled.fetch_add(1, Ordering::Relaxed);
                Ok::<(), String>(())
            }
        });
        futures_lite::future::zip(run, stop).await;
    });
    n as f64 / started.elapsed().as_secs_f64()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let smoke = args.iter().any(|a| a == "--test");
    let entries: u64 = args
        .iter()
        .filter_map(|a| a.parse().ok())
        .next()
        .unwrap_or(if smoke { 2_000 } else { 200_000 });
    let server = RedisServer::start().expect("redis-server");
    let conn = smol::block_on(RedisConnection::connect(
        Topology::Standalone { url: server.url() },
        Duration::from_secs(2),
    ))
    .expect("connect");
    // A million a second per device, bursts of a million: never binding.
    let bucket = TokenBucket::new(1_000_000, Rate::per_second(1_000_000)).expect("bucket");
    let limiter = NamedRateLimiter::new(
        "bench",
        Arc::new(MemoryLimiter::new(bucket, 1_024, FullPolicy::DenyNewKeys)),
    );
    let gate = Arc::new(Admission::new(
        Arc::new(limiter),
        WhenLimited::Wait(Duration::from_secs(1)),
    ));
    // Alternate the two loops and keep each one's best, so that a slow
    // moment of the machine does not decide the ratio.
    let rounds = if smoke { 1 } else { 3 };
    let (mut plain, mut limited) = (0.0_f64, 0.0_f64);
    for round in 0..rounds {
        plain = plain.max(consume(
            &server,
            &conn,
            &format!("plain-{round}"),
            entries,
            None,
        ));
        limited = limited.max(consume(
            &server,
            &conn,
            &format!("limited-{round}"),
            entries,
            Some(gate.clone()),
        ));
    }
    println!("| loop | entries/s |");
    println!("|---|---|");
    println!("| stream consumer, no limiter | {plain:.0} |");
    println!("| stream consumer through a non-binding limiter | {limited:.0} |");
    println!("limiter / plain: {:.2}", limited / plain);
}
