//! Runs every benchmark of guard beside its peers and writes
//! `benches/RESULTS.md`: the machine, the date, each figure with the
//! peer's in the same run and their ratio, and the tables the benchmarks
//! publish themselves (bytes per key, Redis throughput, endpoint
//! throughput: Redis, MQTT, NATS and JetStream, RabbitMQ, PostgreSQL and
//! the MariaDB binlog, each beside a plain client loop; the lockers'
//! acquisitions per second). Sections it does not write (the HTTP
//! layer's, measured with wrk by hand) are kept from the file as it was.
//!
//! `cargo run --release -p guard-benches --bin bench-results [-- --quick]`
//!
//! `--quick` shortens criterion's measurement (1 s instead of 3 s), the
//! Redis runs (2 s instead of 5 s) and the endpoints' message counts for
//! a look rather than a record.
//!
//! The endpoint benchmark uses the machine's RabbitMQ (127.0.0.1:5672)
//! and PostgreSQL (127.0.0.1:5432), which `scripts/test.sh` starts; they
//! are checked before anything runs, so a missing one fails at once
//! rather than after the criterion runs. The other servers it starts
//! itself.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Duration;
use std::{env, fs};

use guard_benches::RESULTS_DIR_VAR;

/// One comparison: our function beside the peer's in the same criterion
/// group, and the ratio the goal allows (none: reported only).
struct Pair {
    group: &'static str,
    ours: &'static str,
    peer: &'static str,
    goal: Option<f64>,
    what: &'static str,
}

const fn pair(
    group: &'static str,
    ours: &'static str,
    peer: &'static str,
    goal: Option<f64>,
    what: &'static str,
) -> Pair {
    Pair {
        group,
        ours,
        peer,
        goal,
        what,
    }
}

const PAIRS: &[Pair] = &[
    pair(
        "direct_admit",
        "guard_token_bucket_mut",
        "hand_written_floor",
        Some(2.0),
        "`&mut` token bucket vs a hand-written integer bucket",
    ),
    pair(
        "direct_admit",
        "guard_two_bandwidths_mut",
        "guard_token_bucket_mut",
        Some(2.0),
        "two bandwidths on one key, all or nothing (`&mut`) vs one token bucket",
    ),
    pair(
        "direct_admit",
        "guard_atomic_bucket",
        "governor_direct_stepping_clock",
        Some(1.0),
        "shared atomic token bucket vs governor direct, equal clocks (a plain add each)",
    ),
    pair(
        "direct_admit",
        "guard_atomic_bucket",
        "governor_direct_fake_clock",
        None,
        "shared atomic token bucket vs governor direct on its `FakeRelativeClock` (an atomic add)",
    ),
    pair(
        "direct_default_clock",
        "guard_atomic_bucket_quanta_clock",
        "governor_direct_default_clock",
        Some(1.0),
        "shared atomic token bucket vs governor direct, default clocks (both quanta)",
    ),
    pair(
        "direct_default_clock",
        "guard_atomic_bucket_system_clock",
        "governor_direct_default_clock",
        None,
        "shared atomic token bucket on `SystemClock` (`std::time::Instant`) vs governor's default",
    ),
    pair(
        "direct_admit",
        "guard_leaky_bucket_mut",
        "governor_direct_fake_clock",
        None,
        "`&mut` leaky bucket vs governor direct",
    ),
    pair(
        "direct_admit",
        "guard_sliding_window_16_mut",
        "governor_direct_fake_clock",
        None,
        "`&mut` sliding window (16) vs governor direct",
    ),
    pair(
        "keyed_1_keys",
        "guard_keyed",
        "governor_keyed",
        Some(1.0),
        "keyed, 1 key",
    ),
    pair(
        "keyed_1000_keys",
        "guard_keyed",
        "governor_keyed",
        Some(1.0),
        "keyed, 1k keys",
    ),
    pair(
        "keyed_100000_keys",
        "guard_keyed",
        "governor_keyed",
        Some(1.0),
        "keyed, 100k keys",
    ),
    pair(
        "keyed_1000000_keys",
        "guard_keyed",
        "governor_keyed",
        Some(1.0),
        "keyed, 1M keys",
    ),
    pair(
        "two_threads_one_bucket",
        "guard_atomic_bucket_shared_fake_clock",
        "governor_direct_shared_fake_clock",
        Some(1.0),
        "two threads, one bucket, one shared fake clock",
    ),
    pair(
        "two_threads_one_bucket",
        "guard_atomic_bucket_quanta_clock",
        "governor_direct_default_clock",
        Some(1.5),
        "two threads, one bucket, default clocks (both quanta)",
    ),
    pair(
        "two_threads_one_bucket",
        "guard_atomic_bucket_default_clock",
        "governor_direct_default_clock",
        None,
        "two threads, one bucket, ours on `SystemClock` (`std::time::Instant`)",
    ),
    pair(
        "retry_five_delays",
        "guard_delay_for_attempt",
        "backon_exponential",
        None,
        "five retry delays vs backon",
    ),
    pair(
        "breaker_decision",
        "guard_breaker_mut",
        "failsafe_call",
        Some(1.0),
        "circuit breaker, one permitted call recorded (`&mut`, time passed in) vs failsafe-rs",
    ),
    pair(
        "breaker_decision",
        "guard_breaker_mutex_quanta_clock",
        "failsafe_call",
        Some(1.0),
        "circuit breaker behind a mutex on a quanta clock (as guard-tower's layer) vs failsafe-rs",
    ),
    pair(
        "bulkhead_permit",
        "guard_bulkhead",
        "tokio_semaphore",
        None,
        "one bulkhead permit taken and given back, by reference, vs tokio's semaphore",
    ),
    pair(
        "bulkhead_permit",
        "guard_bulkhead_arc",
        "tokio_semaphore_owned",
        None,
        "one bulkhead permit through an `Arc` (as guard-tower holds it) vs tokio's owned permit",
    ),
    pair(
        "queue_push_pop",
        "guard_dead_letter_queue",
        "heapless_deque",
        None,
        "DLQ push+pop vs `heapless::Deque<u64>`",
    ),
    pair(
        "queue_push_pop",
        "guard_dead_letter_queue",
        "heapless_deque_of_records",
        None,
        "DLQ push+pop vs `heapless::Deque` of the same record",
    ),
    pair(
        "shared_queue_push_pop",
        "guard_shared_dlq_critical_section",
        "crossbeam_array_queue",
        None,
        "shared DLQ (critical section) vs crossbeam `ArrayQueue`",
    ),
    pair(
        "shared_queue_push_pop",
        "guard_dlq_std_mutex",
        "crossbeam_array_queue",
        None,
        "DLQ in a `std` mutex vs crossbeam `ArrayQueue`",
    ),
    pair(
        "once_guard_no_locker",
        "guard_allow",
        "plain_async_call",
        None,
        "`OnceGuard::allow` with no locker vs a plain async call",
    ),
];

/// The servers of the machine the endpoint benchmark uses, by address.
const MACHINE_SERVERS: [(&str, &str); 2] = [
    ("RabbitMQ", "127.0.0.1:5672"),
    ("PostgreSQL", "127.0.0.1:5432"),
];

fn main() -> ExitCode {
    match run() {
        Ok(path) => {
            println!("wrote {}", path.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("bench-results: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<PathBuf, String> {
    let quick = env::args().any(|a| a == "--quick");
    let crate_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let root = crate_dir
        .parent()
        .ok_or("the benches crate has no parent folder")?
        .to_path_buf();
    let target = env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    let extras = target.join("guard-results");
    fs::create_dir_all(&extras).map_err(|e| format!("{}: {e}", extras.display()))?;

    for (server, address) in MACHINE_SERVERS {
        let reachable = address
            .parse()
            .is_ok_and(|a| TcpStream::connect_timeout(&a, Duration::from_secs(2)).is_ok());
        if !reachable {
            return Err(format!(
                "the endpoint benchmark needs the machine's {server} on {address} \
                 (scripts/test.sh starts it)"
            ));
        }
    }

    let measure = if quick { "1" } else { "3" };
    for bench in ["peers", "keyed"] {
        cargo_bench(
            &root,
            &extras,
            bench,
            &["--warm-up-time", "1", "--measurement-time", measure],
        )?;
    }
    cargo_bench(
        &root,
        &extras,
        "redis_throughput",
        &["1", "--rounds", if quick { "3" } else { "5" }],
    )?;
    // The other sources' counts are the benchmark's own defaults, a few
    // seconds a run each; quick runs take about a quarter.
    let endpoint_counts: &[&str] = if quick {
        &[
            "20000",
            "nats=20000",
            "jetstream=5000",
            "amqp=3000",
            "postgres=500",
            "binlog=1500",
        ]
    } else {
        &["100000"]
    };
    cargo_bench(&root, &extras, "endpoints", endpoint_counts)?;
    cargo_bench(&root, &extras, "lockers", &[if quick { "1" } else { "3" }])?;

    let mut out = String::new();
    out.push_str("# Benchmark results\n\n");
    out.push_str(&format!(
        "Written by `cargo run --release -p guard-benches --bin bench-results`{} on {}.\n\n",
        if quick { " -- --quick" } else { "" },
        command_line("date", &["-u", "+%Y-%m-%d %H:%M UTC"])
    ));
    out.push_str(&format!(
        "Machine: {}, {} cores; {}.\n\n",
        cpu_model(),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        command_line("rustc", &["--version"])
    ));
    out.push_str(
        "Each row is two criterion medians from the same run; ratio = guard / peer \
         (below 1: guard is faster). A goal is the ratio the project promises.\n\n",
    );
    out.push_str("| comparison | guard | peer | ratio | goal |\n|---|---|---|---|---|\n");
    for p in PAIRS {
        let ours = median_ns(&target, p.group, p.ours)?;
        let peer = median_ns(&target, p.group, p.peer)?;
        let ratio = ours / peer;
        let goal = match p.goal {
            Some(g) if ratio <= g => format!("≤ {g:.1} met"),
            Some(g) => format!("≤ {g:.1} **missed**"),
            None => "reported".to_owned(),
        };
        out.push_str(&format!(
            "| {} (`{}` vs `{}`) | {} | {} | {ratio:.2} | {goal} |\n",
            p.what,
            p.ours,
            p.peer,
            nanos(ours),
            nanos(peer)
        ));
    }
    for (title, file) in [
        (
            "Keyed limiters: memory and allocations (counting global allocator)",
            "keyed_memory.md",
        ),
        (
            "Redis: decisions per second beside `redis-benchmark` on the same server",
            "redis.md",
        ),
        (
            "Endpoints: messages per second on one replica beside a plain client loop on the same server \
             (Redis, MQTT, NATS and JetStream, RabbitMQ, PostgreSQL, MariaDB binlog)",
            "endpoints.md",
        ),
        (
            "Lockers: acquisitions per second, one replica, at concurrency 1 and 16",
            "lockers.md",
        ),
    ] {
        let path = extras.join(file);
        let table = fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        out.push_str(&format!("\n## {title}\n\n{table}"));
    }
    let path = crate_dir.join("RESULTS.md");
    // Sections this command does not write (a benchmark run by hand, such
    // as the HTTP layer's with wrk) are kept as they were.
    if let Ok(old) = fs::read_to_string(&path) {
        for section in old.split("\n## ").skip(1) {
            let title = section.lines().next().unwrap_or_default();
            if !out.contains(&format!("\n## {title}\n")) {
                out.push_str(&format!("\n## {}", section.trim_end()));
                out.push('\n');
            }
        }
    }
    fs::write(&path, out).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(path)
}

fn cargo_bench(root: &Path, extras: &Path, bench: &str, args: &[&str]) -> Result<(), String> {
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let status = Command::new(cargo)
        .current_dir(root)
        .env(RESULTS_DIR_VAR, extras)
        .args(["bench", "-p", "guard-benches", "--bench", bench, "--"])
        .args(args)
        .status()
        .map_err(|e| format!("cargo bench --bench {bench}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("cargo bench --bench {bench} failed: {status}"))
    }
}

/// The median of one criterion benchmark of this run, in nanoseconds.
fn median_ns(target: &Path, group: &str, function: &str) -> Result<f64, String> {
    let path = target
        .join("criterion")
        .join(group)
        .join(function)
        .join("new")
        .join("estimates.json");
    let text = fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let json: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    json["median"]["point_estimate"]
        .as_f64()
        .ok_or_else(|| format!("{}: no median.point_estimate", path.display()))
}

fn nanos(ns: f64) -> String {
    if ns < 10.0 {
        format!("{ns:.2} ns")
    } else {
        format!("{ns:.1} ns")
    }
}

fn cpu_model() -> String {
    fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".to_owned())
}

fn command_line(program: &str, args: &[&str]) -> String {
    Command::new(program)
        .args(args)
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_else(|| format!("({program} unavailable)"))
}
