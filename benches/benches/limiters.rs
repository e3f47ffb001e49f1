//! Time per decision of each guard-core limiter, with time passed in.
//!
//! "admit" benches advance the clock fast enough that every call is
//! admitted (the state is written); "deny" benches keep the clock still
//! after the bucket is empty (the state is only read).

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use guard_benches::SteppingClock;
use guard_core::limit::{
    AtomicTokenBucket, FullPolicy, Keyed, LeakyBucket, Limiter, Rate, SlidingWindow, TokenBucket,
};
use guard_core::time::Instant;

fn single_key(c: &mut Criterion) {
    let mut g = c.benchmark_group("limiter");
    // One token per microsecond, clock advancing 2 µs per call: always admits.
    let bucket = TokenBucket::new(10, Rate::per(1, Duration::from_micros(1))).unwrap();

    let mut l = Limiter::new(bucket);
    let mut clock = SteppingClock::new(2_000);
    g.bench_function("token_bucket/admit", |b| {
        b.iter(|| black_box(l.check(black_box(clock.tick()))))
    });

    let mut l = Limiter::new(bucket);
    let still = Instant::from_secs(5);
    while l.check(still).is_allowed() {}
    g.bench_function("token_bucket/deny", |b| {
        b.iter(|| black_box(l.check(black_box(still))))
    });

    let atomic = AtomicTokenBucket::new(bucket);
    let mut clock = SteppingClock::new(2_000);
    g.bench_function("atomic_token_bucket/admit", |b| {
        b.iter(|| black_box(atomic.check(black_box(clock.tick()))))
    });

    let mut l = Limiter::new(LeakyBucket::new(10, Rate::per(1, Duration::from_micros(1))).unwrap());
    let mut clock = SteppingClock::new(2_000);
    g.bench_function("leaky_bucket/admit", |b| {
        b.iter(|| black_box(l.check(black_box(clock.tick()))))
    });

    // 16 per 16 µs with a call every 2 µs: a full log where each admission
    // also evicts the oldest entry, the steady state of a busy key.
    let window = SlidingWindow::<16>::new(Duration::from_micros(16), 16).unwrap();
    let mut l = Limiter::new(window);
    let mut clock = SteppingClock::new(2_000);
    g.bench_function("sliding_window_16/admit_evict", |b| {
        b.iter(|| black_box(l.check(black_box(clock.tick()))))
    });
    g.finish();
}

fn keyed(c: &mut Criterion) {
    let mut g = c.benchmark_group("keyed_token_bucket");
    let bucket = TokenBucket::new(10, Rate::per(1, Duration::from_micros(1))).unwrap();
    for keys in [1u64, 1_000] {
        let mut table: Box<Keyed<u64, TokenBucket, 2048>> =
            Box::new(Keyed::new(bucket, FullPolicy::DenyNewKeys));
        let mut clock = SteppingClock::new(2_000);
        let mut i = 0u64;
        g.bench_function(format!("{keys}_keys"), |b| {
            b.iter(|| {
                i = (i + 1) % keys;
                black_box(table.check(black_box(&i), clock.tick()))
            })
        });
    }
    g.finish();
}

criterion_group!(benches, single_key, keyed);
criterion_main!(benches);
