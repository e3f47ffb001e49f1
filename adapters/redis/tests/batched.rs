//! A local cache in front of a Redis token bucket, on several replicas at
//! once: together they admit at most the bucket's budget plus one batch
//! per replica, over the whole run and over every window of a second, and
//! most decisions take no round trip.

use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use guard_core::limit::batch::BatchSize;
use guard_core::limit::{Rate, TokenBucket};
use guard_redis::{RedisBatchedBucket, RedisConnection, RedisTokenBucket, Topology};
use guard_testkit::RedisServer;

const REPLICAS: usize = 4;
const CALLERS: usize = 4;
const CAPACITY: u32 = 50;
const PER_SECOND: u32 = 500;
const MAX_BATCH: u32 = 20;
const RUN: Duration = Duration::from_secs(3);

#[test]
fn replicas_with_a_local_cache_admit_at_most_the_quota_plus_a_batch_each() {
    let server = RedisServer::start().expect("redis-server");
    let bucket = TokenBucket::new(CAPACITY, Rate::per_second(PER_SECOND)).unwrap();
    let sizing = BatchSize::new(1, MAX_BATCH, Duration::from_millis(50)).unwrap();
    let replicas: Vec<Arc<RedisBatchedBucket>> = (0..REPLICAS)
        .map(|_| {
            let conn = smol::block_on(RedisConnection::connect(
                Topology::Standalone { url: server.url() },
                Duration::from_secs(2),
            ))
            .unwrap();
            let remote = RedisTokenBucket::new(conn, bucket).unwrap();
            Arc::new(RedisBatchedBucket::new(remote, sizing, 1_024))
        })
        .collect();
    server.command("CONFIG RESETSTAT").unwrap();

    let admitted: Arc<Mutex<Vec<Duration>>> = Arc::default();
    let decisions: Arc<Mutex<u64>> = Arc::default();
    let start = Instant::now();
    let threads: Vec<_> = replicas
        .iter()
        .flat_map(|replica| (0..CALLERS).map(move |_| Arc::clone(replica)))
        .map(|replica| {
            let admitted = Arc::clone(&admitted);
            let decisions = Arc::clone(&decisions);
            thread::spawn(move || {
                let (mut mine, mut count) = (Vec::new(), 0u64);
                while start.elapsed() < RUN {
                    let decision = smol::block_on(replica.check("hot")).unwrap();
                    count += 1;
                    if decision.is_allowed() {
                        mine.push(start.elapsed());
                    }
                }
                admitted.lock().unwrap().extend(mine);
                *decisions.lock().unwrap() += count;
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let span = start.elapsed();
    let mut admitted = admitted.lock().unwrap().clone();
    admitted.sort();
    let decisions = *decisions.lock().unwrap();
    let round_trips =
        server.command_calls("evalsha").unwrap() + server.command_calls("eval").unwrap();

    // The bucket's budget over the run (its clock is the server's: a
    // decision observed here was made within the span measured here).
    let budget = |secs: f64| f64::from(CAPACITY) + f64::from(PER_SECOND) * secs;
    let beyond = f64::from(MAX_BATCH) * REPLICAS as f64;
    let total = admitted.len() as f64;
    assert!(
        total <= budget(span.as_secs_f64()) + beyond,
        "{total} admitted in {span:?}: more than the budget {} plus a batch per replica",
        budget(span.as_secs_f64())
    );
    // Every window of a second, with 200 ms for an admission made by the
    // server and seen here later on a busy machine.
    let window = Duration::from_secs(1);
    let slack = Duration::from_millis(200);
    let mut first = 0;
    for (last, at) in admitted.iter().enumerate() {
        while admitted[first] + window < *at {
            first += 1;
        }
        let in_window = (last - first + 1) as f64;
        assert!(
            in_window <= budget((window + slack).as_secs_f64()) + beyond,
            "{in_window} admitted in the second before {at:?}"
        );
    }
    // Demand far beyond the quota takes nearly all of it.
    assert!(
        total >= f64::from(PER_SECOND) * span.as_secs_f64() - beyond,
        "only {total} admitted in {span:?}"
    );
    // Most decisions are local: far fewer round trips than decisions.
    assert!(
        round_trips * 10 < decisions,
        "{round_trips} round trips for {decisions} decisions"
    );
    eprintln!(
        "{REPLICAS} replicas x {CALLERS} callers, {span:?}: {decisions} decisions, {total} \
         admitted (budget {:.0} + {beyond} in batches), {round_trips} round trips",
        budget(span.as_secs_f64())
    );
}

#[test]
fn a_cached_key_and_an_uncached_one_share_the_bucket() {
    let server = RedisServer::start().expect("redis-server");
    let conn = smol::block_on(RedisConnection::connect(
        Topology::Standalone { url: server.url() },
        Duration::from_secs(2),
    ))
    .unwrap();
    let bucket = TokenBucket::new(10, Rate::per(1, Duration::from_secs(60))).unwrap();
    let sizing = BatchSize::new(4, 4, Duration::from_secs(1)).unwrap();
    let cached = RedisBatchedBucket::new(
        RedisTokenBucket::new(conn.clone(), bucket).unwrap(),
        sizing,
        1,
    );
    let plain = RedisTokenBucket::new(conn, bucket).unwrap();
    // The cache takes 4 of the 10 at its first call (1 spent, 3 held).
    assert!(smol::block_on(cached.check("k")).unwrap().is_allowed());
    let left = smol::block_on(plain.check_n("k", 0, guard_redis::Clock::Server))
        .unwrap()
        .remaining;
    assert_eq!(left, 6, "the batch came out of the shared bucket");
    for _ in 0..6 {
        assert!(
            smol::block_on(plain.check("k", guard_redis::Clock::Server))
                .unwrap()
                .is_allowed()
        );
    }
    // The three held are still the cache's; then it is refused, and keeps
    // refusing without asking again until the next token.
    for _ in 0..3 {
        assert!(smol::block_on(cached.check("k")).unwrap().is_allowed());
    }
    server.command("CONFIG RESETSTAT").unwrap();
    let refused = smol::block_on(cached.check("k")).unwrap();
    assert!(refused.retry_after().unwrap() > Duration::from_secs(50));
    assert!(smol::block_on(cached.check("k")).unwrap().is_denied());
    assert_eq!(
        server.command_calls("evalsha").unwrap(),
        1,
        "the second refusal is local"
    );
    // Beyond max_keys, a key is decided by the shared bucket directly.
    assert!(smol::block_on(cached.check("other")).unwrap().is_allowed());
    assert_eq!(cached.cached_keys(), 1);
    assert!(
        smol::block_on(cached.check_n("k", 11)).is_err(),
        "a cost above the capacity"
    );
}
