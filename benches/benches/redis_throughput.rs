//! Decisions per second on Redis, ours beside `redis-benchmark` running
//! the same command or script at the same concurrency against the same
//! server (which this harness starts on a free loopback port).
//!
//! Ours and `redis-benchmark` are measured in turn (A B A B ...) several
//! times, and each row gives the median ratio with its minimum and maximum,
//! so that the machine's drift between two measurements does not decide
//! the ratio. A second table takes one decision apart layer by layer.
//!
//! `cargo bench -p guard-benches --bench redis_throughput [-- SECONDS] [--rounds N]`
//! (slices of SECONDS, 1 by default, N rounds, 5 by default; `--test` runs
//! a short smoke pass).

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

/// Where the measured calls run.
#[derive(Clone, Copy)]
enum Placement {
    /// In tasks spawned on smol's executor, as a server's handlers would
    /// (the reactor may be polled by another thread, which then wakes them).
    Spawned,
    /// One caller on the thread of `block_on`, which polls the reactor
    /// itself (a replica's main loop, or a command-line tool).
    Caller,
}

/// One caller's loop: `op` on pseudo-random keys until `duration` has
/// passed since `start`, counting each call in `done`.
async fn caller<F, Fut>(
    task: usize,
    start: Instant,
    duration: Duration,
    done: Arc<AtomicU64>,
    op: Arc<F>,
) where
    F: Fn(u64) -> Fut + Send + Sync + 'static + ?Sized,
    Fut: std::future::Future<Output = ()> + Send,
{
    let mut n = task as u64 * 7919;
    while start.elapsed() < duration {
        n = n
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        op((n >> 33) % KEYSPACE).await;
        done.fetch_add(1, Ordering::Relaxed);
    }
}

/// Runs `op` from `concurrency` callers placed as `placement` says, for
/// `duration`; returns calls per second.
fn ours<F, Fut>(placement: Placement, concurrency: usize, duration: Duration, op: Arc<F>) -> f64
where
    F: Fn(u64) -> Fut + Send + Sync + 'static + ?Sized,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    match placement {
        // One caller: `concurrency` is 1 wherever this placement is used.
        Placement::Caller => smol::block_on(caller(0, start, duration, done.clone(), op)),
        Placement::Spawned => smol::block_on(async {
            let tasks: Vec<_> = (0..concurrency)
                .map(|t| smol::spawn(caller(t, start, duration, done.clone(), op.clone())))
                .collect();
            for t in tasks {
                t.await;
            }
        }),
    }
    done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
}

/// [`ours`] with the callers spawned on a tokio runtime (whose
/// connection's tasks run there too).
fn ours_on_tokio<F, Fut>(
    runtime: &tokio::runtime::Runtime,
    concurrency: usize,
    duration: Duration,
    op: Arc<F>,
) -> f64
where
    F: Fn(u64) -> Fut + Send + Sync + 'static + ?Sized,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    runtime.block_on(async {
        let tasks: Vec<_> = (0..concurrency)
            .map(|t| tokio::spawn(caller(t, start, duration, done.clone(), op.clone())))
            .collect();
        for t in tasks {
            t.await.expect("caller");
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

/// Ours and `redis-benchmark` measured in turn, `rounds` times each
/// against the same server (A B A B ...), so that drift of the machine
/// between two measurements moves both alike; the ratio of each round is
/// ours over the raw figure measured right after it.
struct Alternated {
    ours: Vec<f64>,
    raw: Vec<f64>,
}

impl Alternated {
    fn run(rounds: usize, mut ours: impl FnMut() -> f64, mut raw: impl FnMut(u64) -> f64) -> Self {
        let mut runs = Alternated {
            ours: Vec::new(),
            raw: Vec::new(),
        };
        for _ in 0..rounds {
            let rate = ours();
            // As many requests as ours made in its slice: both run about
            // as long.
            runs.ours.push(rate);
            runs.raw.push(raw((rate as u64).max(2_000)));
        }
        runs
    }

    fn ratios(&self) -> Vec<f64> {
        self.ours
            .iter()
            .zip(&self.raw)
            .map(|(o, r)| o / r)
            .collect()
    }
}

/// The median of `values` (the upper one of an even count).
fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted.get(sorted.len() / 2).copied().unwrap_or(0.0)
}

fn min_max(values: &[f64]) -> (f64, f64) {
    values
        .iter()
        .fold((f64::MAX, f64::MIN), |(lo, hi), &v| (lo.min(v), hi.max(v)))
}

/// One measured operation: a call for a key number.
type Layer = Arc<dyn Fn(u64) -> futures_lite::future::Boxed<()> + Send + Sync>;

/// The ratio a limiter decision (an `EVALSHA` row) is to reach at
/// `concurrency`, where there is a goal.
fn goal(operation: &str, concurrency: usize) -> Option<f64> {
    if !operation.ends_with("EVALSHA") {
        return None;
    }
    match concurrency {
        1 => Some(0.9),
        16 => Some(1.0),
        _ => None,
    }
}

/// One row of the table: the medians, the median ratio with its range,
/// and the goal, met or missed by the median.
fn row(rows: &mut Vec<String>, operation: &str, concurrency: usize, runs: &Alternated) {
    let ratios = runs.ratios();
    let (lo, hi) = min_max(&ratios);
    let ratio = median(&ratios);
    let goal = match goal(operation, concurrency) {
        Some(goal) if ratio >= goal => format!("≥ {goal:.1} met"),
        Some(goal) => format!("≥ {goal:.1} missed"),
        None => "reported".to_owned(),
    };
    rows.push(format!(
        "| {operation} | {concurrency} | {:.0} | {:.0} | {ratio:.2} | {lo:.2}–{hi:.2} | {goal} |",
        median(&runs.ours),
        median(&runs.raw),
    ));
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let smoke = args.iter().any(|a| a == "--test");
    let seconds: f64 = args
        .iter()
        .filter_map(|a| a.parse().ok())
        .next()
        .unwrap_or(1.0);
    let rounds: usize = args
        .iter()
        .position(|a| a == "--rounds")
        .and_then(|i| args.get(i + 1)?.parse().ok())
        .unwrap_or(5);
    let (slice, rounds) = if smoke {
        (Duration::from_millis(100), 1)
    } else {
        (Duration::from_secs_f64(seconds), rounds)
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
        format!(
            "Each row: ours and `redis-benchmark` in turn, {rounds} times each, {slice:?} slices; \
             medians, and the median ratio with its minimum and maximum."
        ),
        String::new(),
        "| operation | concurrency | guard (ops/s) | redis-benchmark (ops/s) | ratio | range | goal |"
            .to_owned(),
        "|---|---|---|---|---|---|---|".to_owned(),
    ];
    let lock: Layer = Arc::new(move |k| {
        let locker = locker.clone();
        Box::pin(async move {
            let _ = locker
                .try_lock(&format!("bench:lock:{k}"), ttl)
                .await
                .expect("try_lock");
        })
    });
    let window: Layer = Arc::new(move |k| {
        let window = window.clone();
        Box::pin(async move {
            let _ = window
                .check(&format!("bench:{k}"), Clock::Server)
                .await
                .expect("check");
        })
    });
    let bucket: Layer = Arc::new(move |k| {
        let bucket = bucket.clone();
        Box::pin(async move {
            let _ = bucket
                .check(&format!("bench:{k}"), Clock::Server)
                .await
                .expect("check");
        })
    });
    let lock_keys = [
        "{bench:lock:__rand_int__}",
        "fence:{bench:lock:__rand_int__}",
        "grant:{bench:lock:__rand_int__}",
    ];
    let window_keys = [
        "guard:rl:{bench:__rand_int__}",
        "guard:rl:{bench:__rand_int__}:seq",
    ];
    let comparisons: [(&str, &Layer, Vec<&str>); 4] = [
        (
            "try_lock vs SET NX PX",
            &lock,
            vec!["SET", "{bench:lock:__rand_int__}", "v", "NX", "PX", "1000"],
        ),
        (
            "try_lock vs EVALSHA of its script",
            &lock,
            vec![
                "EVALSHA",
                &acquire_sha,
                "3",
                lock_keys[0],
                lock_keys[1],
                lock_keys[2],
                "v",
                "1000",
            ],
        ),
        (
            "sliding window vs EVALSHA",
            &window,
            vec![
                "EVALSHA",
                &window_sha,
                "2",
                window_keys[0],
                window_keys[1],
                "",
                "1000000",
                "1000",
                "1",
            ],
        ),
        (
            "token bucket vs EVALSHA",
            &bucket,
            bucket_command(&bucket_sha),
        ),
    ];
    let mut on_smol = Vec::new();
    for concurrency in [1usize, 16, 64] {
        for (name, op, command) in &comparisons {
            let runs = Alternated::run(
                rounds,
                || ours(Placement::Spawned, concurrency, slice, (*op).clone()),
                |n| raw(server.port(), concurrency, n, command),
            );
            row(&mut rows, name, concurrency, &runs);
            if *name == "token bucket vs EVALSHA" {
                on_smol.push((concurrency, median(&runs.ratios())));
            }
        }
    }
    rows.extend(on_tokio(&server, &bucket_sha, rounds, slice, &on_smol));
    rows.push(String::new());
    rows.extend(breakdown(&server, &conn, &bucket, rounds, slice));
    publish("redis", &(rows.join("\n") + "\n"));
}

/// The token bucket's rows on tokio (the connection opened and the
/// callers spawned on a tokio runtime of two workers), and how they
/// compare with smol's rows of the same run (`on_smol`: concurrency and
/// median ratio to `redis-benchmark`).
fn on_tokio(
    server: &RedisServer,
    sha: &str,
    rounds: usize,
    slice: Duration,
    on_smol: &[(usize, f64)],
) -> Vec<String> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let conn = runtime
        .block_on(RedisConnection::connect(
            Topology::Standalone { url: server.url() },
            Duration::from_secs(2),
        ))
        .expect("connect on tokio");
    let bucket = Arc::new(
        RedisTokenBucket::new(
            conn,
            TokenBucket::new(1_000, Rate::per(1, Duration::from_millis(1))).unwrap(),
        )
        .unwrap(),
    );
    let decision: Layer = Arc::new(move |k| {
        let bucket = bucket.clone();
        Box::pin(async move {
            let _ = bucket
                .check(&format!("bench:{k}"), Clock::Server)
                .await
                .expect("check");
        })
    });
    let mut rows = Vec::new();
    let mut versus = Vec::new();
    for &(concurrency, smol_ratio) in on_smol.iter().filter(|(c, _)| *c <= 16) {
        let runs = Alternated::run(
            rounds,
            || ours_on_tokio(&runtime, concurrency, slice, decision.clone()),
            |n| raw(server.port(), concurrency, n, &bucket_command(sha)),
        );
        row(
            &mut rows,
            "token bucket on tokio vs EVALSHA",
            concurrency,
            &runs,
        );
        let ratio = median(&runs.ratios()) / smol_ratio;
        versus.push(format!(
            "{concurrency} caller(s): {ratio:.2} ({})",
            if ratio >= 1.0 { "met" } else { "missed" }
        ));
    }
    rows.push(String::new());
    rows.push(format!(
        "Token bucket on tokio / on smol, each as its median ratio to `redis-benchmark` (goal ≥ 1.0): {}.",
        versus.join("; ")
    ));
    rows
}

/// `redis-benchmark`'s `EVALSHA` of the token bucket's script, loaded as
/// `sha`, with the arguments of [`invoke`].
fn bucket_command(sha: &str) -> Vec<&str> {
    vec![
        "EVALSHA",
        sha,
        "1",
        "guard:tb:{bench:__rand_int__}:tb",
        "",
        "1000",
        "1000",
        "1",
    ]
}

/// The token bucket's call for `key` (server clock, 1 ms interval,
/// capacity 1,000, cost 1).
fn invoke<'a>(script: &'a redis::Script, key: &str) -> redis::ScriptInvocation<'a> {
    let mut invocation = script.prepare_invoke();
    invocation.key(key).arg("").arg(1_000).arg(1_000).arg(1);
    invocation
}

/// The token bucket's script sent straight through a redis-rs connection.
fn redis_rs<C>(conn: C, script: &Arc<redis::Script>, keys: &Arc<Vec<String>>) -> Layer
where
    C: redis::aio::ConnectionLike + Clone + Send + Sync + 'static,
{
    let (script, keys) = (script.clone(), keys.clone());
    Arc::new(move |k| {
        let (mut conn, script, keys) = (conn.clone(), script.clone(), keys.clone());
        Box::pin(async move {
            let _: Result<(i64, i64, i64, i64, i64), _> = invoke(&script, &keys[k as usize])
                .invoke_async(&mut conn)
                .await;
        })
    })
}

/// Where a decision's time goes at concurrency 1: the token bucket's
/// script called through each layer in turn, alternated as above, against
/// `redis-benchmark`'s EVALSHA of the same script.
fn breakdown(
    server: &RedisServer,
    conn: &RedisConnection,
    decision: &Layer,
    rounds: usize,
    slice: Duration,
) -> Vec<String> {
    let source = RedisTokenBucket::script_source();
    let sha = load(conn, &source);
    let script = Arc::new(redis::Script::new(&source));
    // The keys formatted once, outside every measured layer.
    let keys: Arc<Vec<String>> = Arc::new(
        (0..KEYSPACE)
            .map(|k| format!("guard:tb:{{bench:{k}}}:tb"))
            .collect(),
    );
    let client = redis::Client::open(server.url()).expect("client");
    let manager = |response_timeout| {
        smol::block_on(redis::aio::ConnectionManager::new_with_config(
            client.clone(),
            redis::aio::ConnectionManagerConfig::new()
                .set_connection_timeout(Some(Duration::from_secs(2)))
                .set_response_timeout(response_timeout),
        ))
        .expect("connection manager")
    };
    let multiplexed =
        smol::block_on(client.get_multiplexed_async_connection()).expect("multiplexed");
    let invoked: Layer = {
        let (conn, script, keys) = (conn.clone(), script.clone(), keys.clone());
        Arc::new(move |k| {
            let (conn, script, keys) = (conn.clone(), script.clone(), keys.clone());
            Box::pin(async move {
                let invocation = invoke(&script, &keys[k as usize]);
                let _: Result<(i64, i64, i64, i64, i64), _> = conn.invoke(&invocation).await;
            })
        })
    };
    let layers: Vec<(&str, Layer)> = vec![
        (
            "`RedisTokenBucket::check` (key formatted per call)",
            decision.clone(),
        ),
        (
            "`RedisConnection::invoke`, key formatted before (direct connection, our timeout)",
            invoked,
        ),
        (
            "redis-rs `ConnectionManager` with a response timeout",
            redis_rs(manager(Some(Duration::from_secs(2))), &script, &keys),
        ),
        (
            "redis-rs `ConnectionManager` without a response timeout",
            redis_rs(manager(None), &script, &keys),
        ),
        (
            "redis-rs `MultiplexedConnection`, no timeout",
            redis_rs(multiplexed, &script, &keys),
        ),
    ];
    let mut rows = vec![
        "Where a decision's time goes at concurrency 1 (token bucket script, same server):"
            .to_owned(),
        String::new(),
        "| layer | spawned task: ops/s | redis-benchmark | ratio | range | caller's thread: ops/s | redis-benchmark | ratio | range |".to_owned(),
        "|---|---|---|---|---|---|---|---|---|".to_owned(),
    ];
    let command = bucket_command(&sha);
    for (name, layer) in layers {
        let mut cells = Vec::new();
        for placement in [Placement::Spawned, Placement::Caller] {
            let runs = Alternated::run(
                rounds,
                || ours(placement, 1, slice, layer.clone()),
                |n| raw(server.port(), 1, n, &command),
            );
            let ratios = runs.ratios();
            let (lo, hi) = min_max(&ratios);
            cells.push(format!(
                "{:.0} | {:.0} | {:.2} | {lo:.2}–{hi:.2}",
                median(&runs.ours),
                median(&runs.raw),
                median(&ratios)
            ));
        }
        rows.push(format!("| {name} | {} |", cells.join(" | ")));
    }
    rows
}
