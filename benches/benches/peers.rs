//! guard beside its peers, in the same run: criterion medians are compared
//! function by function within one group.
//!
//! `cargo bench -p guard-benches --bench peers`

use std::future::Future;
use std::hint::black_box;
use std::num::NonZeroU32;
use std::pin::pin;
use std::sync::Mutex;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use criterion::{Criterion, criterion_group, criterion_main};
use crossbeam_queue::ArrayQueue;
use embassy_sync::blocking_mutex::raw::CriticalSectionRawMutex;
use governor::clock::FakeRelativeClock;
use governor::{Quota, RateLimiter};
use guard_benches::{SteppingClock, SteppingGovernorClock};
use guard_core::breaker::{BreakerConfig, CircuitBreaker, CountWindow};
use guard_core::dlq::{DeadLetterQueue, FailedElement, SharedDeadLetterQueue};
use guard_core::guard::OnceGuard;
use guard_core::limit::{
    AtomicTokenBucket, Bandwidths, LeakyBucket, Limiter, Rate, SlidingWindow, TokenBucket,
};
use guard_core::lock::Scope;
use guard_core::retry::RetryPolicy;
use guard_core::time::Instant;
use guard_std::{Clock, LocalLocker, QuantaClock, SystemClock};

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

    // Two bandwidths on one key, all or nothing, both admitting: what a
    // second limit on a key costs beside the single bucket above.
    let second = TokenBucket::new(1_000, Rate::per(1, Duration::from_micros(1))).unwrap();
    let mut ours = Limiter::new(Bandwidths::new([bucket, second]));
    let mut clock = SteppingClock::new(2_000);
    g.bench_function("guard_two_bandwidths_mut", |b| {
        b.iter(|| black_box(ours.check(black_box(clock.tick()))))
    });

    // Compared with governor, whose clock reading is not passed through
    // `black_box` either (it is read inside `check`).
    let atomic = AtomicTokenBucket::new(bucket);
    let mut clock = SteppingClock::new(2_000);
    g.bench_function("guard_atomic_bucket", |b| {
        b.iter(|| black_box(atomic.check(clock.tick())))
    });

    let leaky = LeakyBucket::new(10, Rate::per(1, Duration::from_micros(1))).unwrap();
    let mut ours = Limiter::new(leaky);
    let mut clock = SteppingClock::new(2_000);
    g.bench_function("guard_leaky_bucket_mut", |b| {
        b.iter(|| black_box(ours.check(black_box(clock.tick()))))
    });

    // 16 per 16 µs: a full log where each admission evicts the oldest.
    let window = SlidingWindow::<16>::new(Duration::from_micros(16), 16).unwrap();
    let mut ours = Limiter::new(window);
    let mut clock = SteppingClock::new(2_000);
    g.bench_function("guard_sliding_window_16_mut", |b| {
        b.iter(|| black_box(ours.check(black_box(clock.tick()))))
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

    // Equal clocks: governor reads a plain add, as guard's stepping clock.
    let governor = RateLimiter::direct_with_clock(quota, SteppingGovernorClock::new(2_000));
    g.bench_function("governor_direct_stepping_clock", |b| {
        b.iter(|| black_box(governor.check()))
    });
    g.finish();

    // Default clocks, one thread: each reads the clock a user gets by
    // default (guard-std's `QuantaClock` for in-memory limiters, governor's
    // quanta clock), and `SystemClock` (`std::time::Instant`) beside them.
    // The bucket refills one token per ns, so every call admits.
    let mut g = c.benchmark_group("direct_default_clock");
    let fast = TokenBucket::new(10, Rate::per(1, Duration::from_nanos(1))).unwrap();
    let atomic = AtomicTokenBucket::new(fast);
    let clock = QuantaClock::new();
    g.bench_function("guard_atomic_bucket_quanta_clock", |b| {
        b.iter(|| black_box(atomic.check(clock.now())))
    });
    let atomic = AtomicTokenBucket::new(fast);
    let clock = SystemClock::new();
    g.bench_function("guard_atomic_bucket_system_clock", |b| {
        b.iter(|| black_box(atomic.check(clock.now())))
    });
    let quota = Quota::per_second(NonZeroU32::new(1_000_000_000).unwrap())
        .allow_burst(NonZeroU32::new(10).unwrap());
    let governor = RateLimiter::direct(quota);
    g.bench_function("governor_direct_default_clock", |b| {
        b.iter(|| black_box(governor.check()))
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
    // The same 32-byte record (element, error, attempts, failure time) our
    // queue stores, in a bare heapless deque: what the record costs to move.
    let mut records: heapless::Deque<FailedElement<u64, ()>, 64> = heapless::Deque::new();
    g.bench_function("heapless_deque_of_records", |b| {
        b.iter(|| {
            let _ = records.push_back(FailedElement::new(black_box(7), None, 1, Instant::ZERO));
            black_box(records.pop_front())
        })
    });
    g.finish();

    // The shared variants, through `&self`: guard's queue behind the
    // critical-section mutex an MCU build uses (here the `std`
    // implementation of critical-section, one process-wide lock), and
    // behind `std::sync::Mutex` as guard-std holds it, beside crossbeam's
    // lock-free bounded queue.
    let mut g = c.benchmark_group("shared_queue_push_pop");
    let shared: SharedDeadLetterQueue<CriticalSectionRawMutex, u64, (), 64> =
        SharedDeadLetterQueue::new();
    g.bench_function("guard_shared_dlq_critical_section", |b| {
        b.iter(|| {
            let _ = shared.add(black_box(7), None, 1, Instant::ZERO);
            black_box(shared.poll())
        })
    });
    let locked: Mutex<DeadLetterQueue<u64, (), 64>> = Mutex::new(DeadLetterQueue::new());
    g.bench_function("guard_dlq_std_mutex", |b| {
        b.iter(|| {
            let mut queue = locked.lock().expect("not poisoned");
            let _ = queue.add(black_box(7), None, 1, Instant::ZERO);
            black_box(queue.poll())
        })
    });
    let array: ArrayQueue<u64> = ArrayQueue::new(64);
    g.bench_function("crossbeam_array_queue", |b| {
        b.iter(|| {
            let _ = array.push(black_box(7));
            black_box(array.pop())
        })
    });
    g.finish();
}

/// A once-guard with no locker configured beside the call it guards, each
/// polled once in place as an `.await` inside an async function does.
/// (Handing either to an executor's `block_on` adds the cost of moving the
/// future into it, which grows with the future's size: the guard's claim
/// state holds the 256-byte key buffer.)
fn once_guard_without_locker(c: &mut Criterion) {
    let mut g = c.benchmark_group("once_guard_no_locker");
    let guard: OnceGuard<'_, LocalLocker> = OnceGuard::new(None, Scope::new("bench").unwrap());
    let mut cx = Context::from_waker(Waker::noop());
    async fn plain(key: &str) -> Result<bool, ()> {
        Ok(!key.is_empty())
    }
    g.bench_function("plain_async_call", |b| {
        b.iter(|| {
            let call = pin!(plain(black_box("k")));
            matches!(call.poll(&mut cx), Poll::Ready(Ok(true)))
        })
    });
    g.bench_function("guard_allow", |b| {
        b.iter(|| {
            let call = pin!(guard.allow(black_box("k")));
            matches!(call.poll(&mut cx), Poll::Ready(Ok(o)) if o.is_allowed())
        })
    });
    g.finish();
}

/// One permitted call through a closed circuit breaker that records it as
/// a success: guard-core's `&mut` breaker on a count window of 100 calls
/// (time passed in), the same behind a `std` mutex reading a quanta clock
/// at permission and at outcome (what guard-tower's layer does), and
/// failsafe-rs's `call` with its defaults (a mutex inside, its own clock).
fn breaker_decision(c: &mut Criterion) {
    let mut g = c.benchmark_group("breaker_decision");
    let config = BreakerConfig::new();
    let mut ours = CircuitBreaker::new(config, CountWindow::<100>::new()).unwrap();
    let now = Instant::from_secs(1);
    g.bench_function("guard_breaker_mut", |b| {
        b.iter(|| {
            let permit = ours.try_acquire(black_box(now)).unwrap();
            black_box(ours.on_result(permit, now, black_box(false)))
        })
    });
    let shared =
        std::sync::Mutex::new(CircuitBreaker::new(config, CountWindow::<100>::new()).unwrap());
    let clock = QuantaClock::new();
    g.bench_function("guard_breaker_mutex_quanta_clock", |b| {
        b.iter(|| {
            let permit = shared.lock().unwrap().try_acquire(clock.now()).unwrap();
            let ok: Result<(), ()> = black_box(Ok(()));
            black_box(
                shared
                    .lock()
                    .unwrap()
                    .on_result(permit, clock.now(), ok.is_err()),
            )
        })
    });
    let peer = failsafe::Config::new().build();
    g.bench_function("failsafe_call", |b| {
        b.iter(|| {
            use failsafe::CircuitBreaker as _;
            black_box(peer.call(|| black_box(Ok::<(), ()>(()))))
        })
    });
    g.finish();
}

/// One permit taken and given back while nobody waits: guard-core's
/// bulkhead (by reference, and through an `Arc` as guard-tower's layer
/// holds it) beside tokio's semaphore (what tower's
/// `ConcurrencyLimitLayer` uses), both with room to spare.
fn bulkhead_permit(c: &mut Criterion) {
    use embassy_sync::blocking_mutex::raw::CriticalSectionRawMutex;
    use guard_core::bulkhead::Bulkhead;
    let mut g = c.benchmark_group("bulkhead_permit");
    let ours = Bulkhead::<CriticalSectionRawMutex, 1024>::new(1_000_000).unwrap();
    g.bench_function("guard_bulkhead", |b| {
        b.iter(|| black_box(Bulkhead::try_acquire(black_box(&ours)).is_ok()))
    });
    let shared = std::sync::Arc::new(ours);
    g.bench_function("guard_bulkhead_arc", |b| {
        b.iter(|| black_box(Bulkhead::try_acquire(std::sync::Arc::clone(&shared)).is_ok()))
    });
    let tokio = std::sync::Arc::new(tokio::sync::Semaphore::new(1_000_000));
    g.bench_function("tokio_semaphore", |b| {
        b.iter(|| black_box(black_box(&tokio).try_acquire().is_ok()))
    });
    g.bench_function("tokio_semaphore_owned", |b| {
        b.iter(|| black_box(std::sync::Arc::clone(&tokio).try_acquire_owned().is_ok()))
    });
    g.finish();
}

criterion_group!(
    benches,
    direct,
    bulkhead_permit,
    retry_delays,
    breaker_decision,
    dlq,
    once_guard_without_locker
);
criterion_main!(benches);
