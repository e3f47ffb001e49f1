//! Keyed limiters at 1, 1k, 100k and 1M distinct keys, guard's bounded
//! table beside governor's keyed (DashMap) limiter in the same run: time
//! per decision (criterion), bytes per key and allocations per decision
//! (a counting global allocator); then two threads on one shared bucket.
//!
//! `cargo bench -p guard-benches --bench keyed`

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::Barrier;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant as WallInstant};

use criterion::{Criterion, criterion_group, criterion_main};
use governor::clock::FakeRelativeClock;
use governor::{Quota, RateLimiter};
use guard_benches::{SteppingClock, publish};
use guard_core::limit::{AtomicTokenBucket, FullPolicy, Keyed, Rate, TokenBucket};
use guard_core::time::Instant;
use guard_std::{Clock, QuantaClock, SystemClock};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

#[global_allocator]
static ALLOCATOR: &StatsAlloc<std::alloc::System> = &INSTRUMENTED_SYSTEM;

/// One token per microsecond, ten in the bucket; the clocks advance 2 µs
/// per decision, so every decision admits and writes its key's state.
fn bucket() -> TokenBucket {
    TokenBucket::new(10, Rate::per(1, Duration::from_micros(1))).expect("valid bucket")
}

fn quota() -> Quota {
    Quota::per_second(NonZeroU32::new(1_000_000).expect("non-zero"))
        .allow_burst(NonZeroU32::new(10).expect("non-zero"))
}

/// Builds a boxed table on a thread with a stack large enough for it: a
/// million-key table is larger than the main thread's stack, and the value
/// may pass through the stack before it reaches the heap.
fn boxed_table<const N: usize>() -> Box<Keyed<u64, TokenBucket, N>> {
    std::thread::Builder::new()
        .stack_size(4 * N * size_of::<Option<(u64, guard_core::limit::BucketState)>>() + (1 << 20))
        .spawn(|| Box::new(Keyed::new(bucket(), FullPolicy::DenyNewKeys)))
        .expect("spawn")
        .join()
        .expect("build table")
}

/// What one keyed limiter costs in memory.
struct Footprint {
    bytes_per_key: f64,
    allocations_per_decision: f64,
}

/// Inserts `keys` keys into `check` (one decision each, counting bytes),
/// then decides `keys` more (counting allocations).
fn footprint(keys: u64, build: impl FnOnce() -> Box<dyn FnMut(u64)>) -> Footprint {
    let region = Region::new(ALLOCATOR);
    let mut check = build();
    for k in 0..keys {
        check(k);
    }
    let stats = region.change();
    let held = stats.bytes_allocated as f64 - stats.bytes_deallocated as f64;
    let region = Region::new(ALLOCATOR);
    for k in 0..keys {
        check(k);
    }
    let allocations = region.change().allocations;
    Footprint {
        bytes_per_key: held / keys as f64,
        allocations_per_decision: allocations as f64 / keys as f64,
    }
}

fn one_count<const N: usize>(c: &mut Criterion, keys: u64, rows: &mut Vec<String>) {
    // Memory first, on fresh limiters, so the figures hold only their keys.
    let ours = footprint(keys, || {
        let mut table = boxed_table::<N>();
        let mut clock = SteppingClock::new(2_000);
        Box::new(move |k| {
            assert!(
                table.check(&k, clock.tick()).is_allowed(),
                "a table of {N} slots refused key {k} of {keys}"
            );
        })
    });
    let theirs = footprint(keys, || {
        let clock = FakeRelativeClock::default();
        let limiter = RateLimiter::dashmap_with_clock(quota(), clock.clone());
        Box::new(move |k| {
            clock.advance(Duration::from_micros(2));
            assert!(limiter.check_key(&k).is_ok());
        })
    });
    rows.push(format!(
        "| {keys} | {:.1} | {:.1} | {:.2} | {:.2} |",
        ours.bytes_per_key,
        theirs.bytes_per_key,
        ours.allocations_per_decision,
        theirs.allocations_per_decision
    ));

    let mut g = c.benchmark_group(format!("keyed_{keys}_keys"));
    let mut table = boxed_table::<N>();
    let mut clock = SteppingClock::new(2_000);
    // All keys at one instant: each is busy (a token spent), so none may be
    // forgotten and every one must find a slot of its own.
    let first = clock.tick();
    for k in 0..keys {
        assert!(
            table.check(&k, first).is_allowed(),
            "a table of {N} slots refused busy key {k} of {keys}"
        );
    }
    let mut i = 0u64;
    g.bench_function("guard_keyed", |b| {
        b.iter(|| {
            i = if i + 1 == keys { 0 } else { i + 1 };
            black_box(table.check(black_box(&i), clock.tick()))
        })
    });
    drop(table);

    let fake = FakeRelativeClock::default();
    let limiter = RateLimiter::dashmap_with_clock(quota(), fake.clone());
    for k in 0..keys {
        fake.advance(Duration::from_micros(2));
        let _ = limiter.check_key(&k);
    }
    let mut i = 0u64;
    g.bench_function("governor_keyed", |b| {
        b.iter(|| {
            i = if i + 1 == keys { 0 } else { i + 1 };
            fake.advance(Duration::from_micros(2));
            black_box(limiter.check_key(black_box(&i)))
        })
    });
    g.finish();
}

/// Tables of 1.125 slots per key (rounded up to a multiple of eight): 18
/// bytes a key.
fn keyed(c: &mut Criterion) {
    let mut rows = Vec::new();
    one_count::<8>(c, 1, &mut rows);
    one_count::<1_128>(c, 1_000, &mut rows);
    one_count::<112_504>(c, 100_000, &mut rows);
    one_count::<1_125_000>(c, 1_000_000, &mut rows);
    publish(
        "keyed_memory",
        &format!(
            "| keys | guard bytes/key | governor bytes/key | guard allocations/decision | governor allocations/decision |\n\
             |---|---|---|---|---|\n{}\n",
            rows.join("\n")
        ),
    );
}

/// Runs `decide` on two threads at once, `iters` times each, and returns
/// the wall time divided by two: criterion then reports the time per
/// decision of both threads together.
fn two_threads(iters: u64, decide: &(dyn Fn() + Sync)) -> Duration {
    let start = Barrier::new(3);
    // The scope returns once both threads are joined.
    let began = std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                start.wait();
                for _ in 0..iters {
                    decide();
                }
            });
        }
        start.wait();
        WallInstant::now()
    });
    began.elapsed() / 2
}

/// Two threads on one shared bucket.
///
/// `*_shared_fake_clock`: both limiters read one fake clock that every
/// decision advances by 2 µs (an atomic add for both), so every decision
/// admits and writes the shared state: the limiters' own cost under
/// contention. `*_default_clock` and `*_quanta_clock`: each on a real
/// clock (guard-std's `SystemClock`, `std::time::Instant`; its
/// `QuantaClock`, the default of in-memory limiters; governor's quanta
/// clock), where most decisions deny and the clock read dominates.
fn contended(c: &mut Criterion) {
    let mut g = c.benchmark_group("two_threads_one_bucket");
    let ticks = AtomicU64::new(1_000_000_000);
    let ours = AtomicTokenBucket::new(bucket());
    g.bench_function("guard_atomic_bucket_shared_fake_clock", |b| {
        b.iter_custom(|iters| {
            two_threads(iters, &|| {
                let now = ticks.fetch_add(2_000, Ordering::Relaxed) + 2_000;
                let _ = black_box(ours.check(Instant::from_nanos(now)));
            })
        })
    });
    let fake = FakeRelativeClock::default();
    let theirs = RateLimiter::direct_with_clock(quota(), fake.clone());
    g.bench_function("governor_direct_shared_fake_clock", |b| {
        b.iter_custom(|iters| {
            two_threads(iters, &|| {
                fake.advance(Duration::from_micros(2));
                let _ = black_box(theirs.check());
            })
        })
    });

    let clock = SystemClock::new();
    let ours = AtomicTokenBucket::new(bucket());
    g.bench_function("guard_atomic_bucket_default_clock", |b| {
        b.iter_custom(|iters| {
            two_threads(iters, &|| {
                let _ = black_box(ours.check(clock.now()));
            })
        })
    });
    let clock = QuantaClock::new();
    let ours = AtomicTokenBucket::new(bucket());
    g.bench_function("guard_atomic_bucket_quanta_clock", |b| {
        b.iter_custom(|iters| {
            two_threads(iters, &|| {
                let _ = black_box(ours.check(clock.now()));
            })
        })
    });
    let theirs = RateLimiter::direct(quota());
    g.bench_function("governor_direct_default_clock", |b| {
        b.iter_custom(|iters| {
            two_threads(iters, &|| {
                let _ = black_box(theirs.check());
            })
        })
    });
    g.finish();
}

criterion_group!(benches, keyed, contended);
criterion_main!(benches);
