//! guard beside its peers, in the same run: criterion medians are compared
//! function by function within one group.
//!
//! `cargo bench -p guard-benches --bench peers`

use std::hint::black_box;
use std::num::NonZeroU32;
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use criterion::{Criterion, criterion_group, criterion_main};
use governor::clock::FakeRelativeClock;
use governor::{Quota, RateLimiter};
use guard_benches::SteppingClock;
use guard_core::dlq::DeadLetterQueue;
use guard_core::guard::OnceGuard;
use guard_core::limit::{AtomicTokenBucket, Limiter, Rate, TokenBucket};
use guard_core::lock::Scope;
use guard_core::retry::RetryPolicy;
use guard_core::time::Instant;
use guard_std::LocalLocker;

/// The floor: a `&mut` integer token bucket with `now` passed in and no
/// denial information, as small as such a thing gets.
struct Floor {
    tokens_ns: u64,
    last: u64,
    interval: u64,
    capacity_ns: u64,
}

impl Floor {
    #[inline]
    fn check(&mut self, now: u64) -> bool {
        let refill = now.saturating_sub(self.last);
        self.last = self.last.max(now);
        self.tokens_ns = (self.tokens_ns + refill).min(self.capacity_ns);
        if self.tokens_ns >= self.interval {
            self.tokens_ns -= self.interval;
            true
        } else {
            false
        }
    }
}

/// One decision per iteration on a clock advancing 2 µs per call against a
/// refill of one token per µs: every call is admitted (the state is written).
fn direct(c: &mut Criterion) {
    let mut g = c.benchmark_group("direct_admit");
    let bucket = TokenBucket::new(10, Rate::per(1, Duration::from_micros(1))).unwrap();

    let mut floor = Floor {
        tokens_ns: 10_000,
        last: 0,
        interval: 1_000,
        capacity_ns: 10_000,
    };
    let mut clock = SteppingClock::new(2_000);
    g.bench_function("hand_written_floor", |b| {
        b.iter(|| black_box(floor.check(black_box(clock.tick().as_nanos()))))
    });

    let mut ours = Limiter::new(bucket);
    let mut clock = SteppingClock::new(2_000);
    g.bench_function("guard_token_bucket_mut", |b| {
        b.iter(|| black_box(ours.check(black_box(clock.tick()))))
    });

    let atomic = AtomicTokenBucket::new(bucket);
    let mut clock = SteppingClock::new(2_000);
    g.bench_function("guard_atomic_bucket", |b| {
        b.iter(|| black_box(atomic.check(black_box(clock.tick()))))
    });

    let fake = FakeRelativeClock::default();
    let quota = Quota::per_second(NonZeroU32::new(1_000_000).unwrap())
        .allow_burst(NonZeroU32::new(10).unwrap());
    let governor = RateLimiter::direct_with_clock(quota, fake.clone());
    g.bench_function("governor_direct_fake_clock", |b| {
        b.iter(|| {
            fake.advance(Duration::from_micros(2));
            black_box(governor.check())
        })
    });
    g.finish();
}

/// The wait before each of five retries.
fn retry_delays(c: &mut Criterion) {
    let mut g = c.benchmark_group("retry_five_delays");
    let policy = RetryPolicy::new().with_max_attempts(5);
    g.bench_function("guard_delay_for_attempt", |b| {
        b.iter(|| {
            (1..=5)
                .map(|n| black_box(&policy).delay_for_attempt(n))
                .fold(Duration::ZERO, |a, d| a + d)
        })
    });
    let builder = ExponentialBuilder::new()
        .with_min_delay(Duration::from_millis(100))
        .with_max_delay(Duration::from_secs(10))
        .with_factor(2.0)
        .with_max_times(5);
    g.bench_function("backon_exponential", |b| {
        b.iter(|| {
            black_box(builder)
                .build()
                .fold(Duration::ZERO, |a, d| a + d)
        })
    });
    g.finish();
}

/// One push and one pop on a queue of 64.
fn dlq(c: &mut Criterion) {
    let mut g = c.benchmark_group("queue_push_pop");
    let mut ours: DeadLetterQueue<u64, (), 64> = DeadLetterQueue::new();
    g.bench_function("guard_dead_letter_queue", |b| {
        b.iter(|| {
            let _ = ours.add(black_box(7), None, 1, Instant::ZERO);
            black_box(ours.poll())
        })
    });
    let mut deque: heapless::Deque<u64, 64> = heapless::Deque::new();
    g.bench_function("heapless_deque", |b| {
        b.iter(|| {
            let _ = deque.push_back(black_box(7));
            black_box(deque.pop_front())
        })
    });
    g.finish();
}

/// A once-guard with no locker configured beside the call it guards.
fn once_guard_without_locker(c: &mut Criterion) {
    let mut g = c.benchmark_group("once_guard_no_locker");
    let guard: OnceGuard<'_, LocalLocker> = OnceGuard::new(None, Scope::new("bench").unwrap());
    g.bench_function("plain_async_call", |b| {
        b.iter(|| futures_lite::future::block_on(async { black_box(Ok::<bool, ()>(true)) }))
    });
    g.bench_function("guard_allow", |b| {
        b.iter(|| {
            futures_lite::future::block_on(async {
                black_box(guard.allow(black_box("k")).await.map(|o| o.is_allowed()))
            })
        })
    });
    g.finish();
}

criterion_group!(
    benches,
    direct,
    retry_delays,
    dlq,
    once_guard_without_locker
);
criterion_main!(benches);
