//! Acquisitions per second of each locker, at concurrency 1 and 16, in
//! one run on this machine: the in-process `LocalLocker`, `RedisLocker`
//! on a `redis-server` of its own, `PgLocker` on the machine's PostgreSQL
//! (a database of its own, dropped at the end) and `EtcdLocker` on a
//! 3-member etcd cluster of its own.
//!
//! One acquisition is a `try_lock` of a key no one holds followed by its
//! `unlock` (two requests): what a once-guard's claim and a leader's
//! release cost. `C` callers run on one thread (`smol::block_on` over `C`
//! joined futures), each on keys of its own, for the measuring time; the
//! row is the acquisitions completed per second. Each locker runs three
//! rounds and keeps its best, so a slow moment of the machine does not
//! decide its row.
//!
//! `cargo bench -p guard-benches --bench lockers [-- SECONDS]` (default 3
//! s a measurement; about a minute in all); `--test` runs a short smoke
//! pass (one round, 200 ms).

use std::cell::Cell;
use std::future::Future;
use std::time::{Duration, Instant};

use guard_core::lock::{Locker, Ttl};
use guard_etcd::{EtcdConfig, EtcdLocker};
use guard_postgres::PgLocker;
use guard_redis::{RedisConnection, RedisLocker, Topology};
use guard_std::LocalLocker;
use guard_testkit::RedisServer;
use guard_testkit::etcd::EtcdCluster;
use guard_testkit::postgres::PgDatabase;

/// The callers of each measurement.
const CONCURRENCY: [usize; 2] = [1, 16];

/// Acquisitions per second of `callers` concurrent loops on `locker`
/// over `measure`.
fn rate<L: Locker>(locker: &L, name: &str, callers: usize, measure: Duration) -> f64 {
    let ttl = Ttl::from_secs(30).expect("a TTL");
    let done = Cell::new(0u64);
    let started = Instant::now();
    let until = started + measure;
    let loops = (0..callers).map(|caller| {
        let done = &done;
        async move {
            let mut i = 0u64;
            while Instant::now() < until {
                let key = format!("bench:{name}:{caller}:{i}");
                let token = locker
                    .try_lock(&key, ttl)
                    .await
                    .unwrap_or_else(|e| panic!("{name}: try_lock: {e}"))
                    .unwrap_or_else(|| panic!("{name}: {key} is free"));
                if let Err(e) = locker.unlock(&key, &token).await {
                    panic!("{name}: unlock: {e}");
                }
                done.set(done.get() + 1);
                i += 1;
            }
        }
    });
    smol::block_on(join_all(loops));
    done.get() as f64 / started.elapsed().as_secs_f64()
}

/// Polls every future on the caller's thread until all are done.
async fn join_all<F: Future<Output = ()>>(futures: impl IntoIterator<Item = F>) {
    let mut futures: Vec<_> = futures.into_iter().map(Box::pin).collect();
    std::future::poll_fn(|cx| {
        futures.retain_mut(|f| f.as_mut().poll(cx).is_pending());
        if futures.is_empty() {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await;
}

/// The best of `rounds` measurements of `locker` at each concurrency.
fn row<L: Locker>(locker: &L, name: &str, rounds: u32, measure: Duration) -> [f64; 2] {
    // A warm-up: connections opened, statements prepared, tables made.
    rate(locker, name, 1, Duration::from_millis(100));
    CONCURRENCY.map(|callers| {
        (0..rounds)
            .map(|_| rate(locker, name, callers, measure))
            .fold(0.0, f64::max)
    })
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let smoke = args.iter().any(|a| a == "--test");
    let measure = if smoke {
        Duration::from_millis(200)
    } else {
        let secs = args
            .iter()
            .skip(1)
            .find_map(|a| a.parse::<f64>().ok())
            .unwrap_or(3.0);
        Duration::from_secs_f64(secs)
    };
    let rounds = if smoke { 1 } else { 3 };
    let mut rows: Vec<(&str, [f64; 2])> = Vec::new();

    rows.push((
        "`LocalLocker` (in process)",
        row(&LocalLocker::new(), "local", rounds, measure),
    ));

    let redis = RedisServer::start().expect("redis-server");
    let conn = smol::block_on(RedisConnection::connect(
        Topology::Standalone { url: redis.url() },
        Duration::from_secs(5),
    ))
    .expect("connect to redis-server");
    rows.push((
        "`RedisLocker` (one redis-server)",
        row(&RedisLocker::new(conn), "redis", rounds, measure),
    ));

    let database = PgDatabase::create().expect("a database on the machine's PostgreSQL");
    let postgres = PgLocker::new(&database.url()).expect("a PostgreSQL locker");
    rows.push((
        "`PgLocker` (the machine's PostgreSQL)",
        row(&postgres, "postgres", rounds, measure),
    ));

    let cluster = EtcdCluster::start(3).expect("a 3-member etcd cluster");
    let etcd = smol::block_on(EtcdLocker::connect(EtcdConfig::new(cluster.endpoints())))
        .expect("an etcd locker");
    rows.push((
        "`EtcdLocker` (3 members)",
        row(&etcd, "etcd", rounds, measure),
    ));

    let mut table = String::from(
        "| locker | acquisitions/s, 1 caller | acquisitions/s, 16 callers |\n|---|---|---|\n",
    );
    for (name, [one, sixteen]) in &rows {
        table.push_str(&format!("| {name} | {one:.0} | {sixteen:.0} |\n"));
    }
    table.push_str(&format!(
        "\nAn acquisition is a `try_lock` of a free key and its `unlock`; callers on one thread, best of {rounds} rounds of {measure:?}.\n"
    ));
    guard_benches::publish("lockers", &table);
}
