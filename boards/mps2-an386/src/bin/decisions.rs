//! `decisions`: what each of guard-core's decisions costs on the core,
//! measured on target and printed one per line.
//!
//! QEMU does not model the DWT cycle counter (CYCCNT stays 0; this image
//! checks and uses it when it runs, as on a real Cortex-M4F). Under
//! `-icount shift=0` QEMU's virtual clock advances one nanosecond per
//! instruction, so SysTick on the 25 MHz core clock counts one tick per 40
//! instructions: each decision is repeated 1,000 times and the figure is
//! instructions per decision (the empty loop's cost subtracted). An
//! instruction count is not a cycle count (loads, branches and the flash
//! wait states of a real part cost more), but it is deterministic, so
//! figures compare between versions. The test script runs it as
//!
//! ```text
//! qemu-system-arm -cpu cortex-m4 -machine mps2-an386 -nographic -icount shift=0 \
//!   -semihosting-config enable=on,target=native -kernel decisions
//! ```

#![no_std]
#![no_main]

use core::cell::Cell;
use core::fmt::Write as _;
use core::future::Future;
use core::hint::black_box;
use core::pin::pin;
use core::task::{Context, Poll, Waker};
use core::time::Duration;

use cortex_m::peripheral::syst::SystClkSource;
use cortex_m::peripheral::{DWT, SYST};
use cortex_m_rt::entry;
use cortex_m_semihosting::{debug, hprintln};
use embassy_sync::blocking_mutex::raw::CriticalSectionRawMutex;
use guard_core::dedup::{BloomFilter, Deduplicator, WindowedDeduplicator};
use guard_core::dlq::{DeadLetterQueue, SharedDeadLetterQueue};
use guard_core::guard::{Action, ActiveConfig, ActiveGuard, Done, OnceGuard};
use guard_core::limit::{
    AtomicTokenBucket, FullPolicy, Keyed, LeakyBucket, Limiter, Rate, SharedKeyed, SlidingWindow,
    TokenBucket,
};
use guard_core::lock::{Locker, Renewal, Scope, Token, TokenId, Ttl, UnlockError};
use guard_core::retry::{Backoff, RetryPolicy, WithoutRandom};
use guard_core::slot::{Every, SlotTimer, UnixMillis};
use guard_core::time::Instant;
use panic_semihosting as _;

const REPEAT: u32 = 1_000;
/// One SysTick count is 40 instructions under `-icount shift=0` (one
/// nanosecond each, against the 25 MHz core clock).
const INSTRUCTIONS_PER_TICK: u64 = 40;

/// Counts elapsed units: DWT cycles where the core has them, else SysTick
/// ticks (in instructions under icount).
struct Meter {
    cycles: bool,
}

impl Meter {
    fn start(&self) -> u32 {
        if self.cycles {
            DWT::cycle_count()
        } else {
            SYST::get_current()
        }
    }

    /// Units since `start`, as cycles or instructions.
    fn since(&self, start: u32) -> u64 {
        if self.cycles {
            u64::from(DWT::cycle_count().wrapping_sub(start))
        } else {
            // SysTick counts down from its 24-bit reload.
            u64::from(start.wrapping_sub(SYST::get_current()) & 0x00ff_ffff) * INSTRUCTIONS_PER_TICK
        }
    }

    /// Per-call cost of `f` over REPEAT calls, in tenths.
    fn measure(&self, mut f: impl FnMut(u32)) -> u64 {
        let start = self.start();
        for i in 0..REPEAT {
            f(black_box(i));
        }
        self.since(start) * 10 / u64::from(REPEAT)
    }
}

/// A locker that grants every key at once with a new fence: what a
/// `OnceGuard` claim costs beyond its backend.
struct Grants {
    fence: Cell<u64>,
}

impl Locker for Grants {
    type Error = core::convert::Infallible;

    async fn try_lock(&self, _key: &str, _ttl: Ttl) -> Result<Option<Token>, Self::Error> {
        let fence = self.fence.get().wrapping_add(1);
        self.fence.set(fence);
        Ok(Some(Token::new(TokenId([1; 16]), fence)))
    }

    async fn unlock(&self, _key: &str, _token: &Token) -> Result<(), UnlockError<Self::Error>> {
        Ok(())
    }
}

/// Polls a future that never waits (`Grants` answers at once).
fn ready<F: Future>(future: F) -> Option<F::Output> {
    match pin!(future)
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
    {
        Poll::Ready(output) => Some(output),
        Poll::Pending => None,
    }
}

#[entry]
fn main() -> ! {
    let Some(mut peripherals) = cortex_m::Peripherals::take() else {
        panic!("core peripherals taken twice");
    };
    peripherals.DCB.enable_trace();
    peripherals.DWT.enable_cycle_counter();
    let probe = DWT::cycle_count();
    cortex_m::asm::delay(100);
    let cycles = DWT::cycle_count() != probe;
    let mut syst = peripherals.SYST;
    syst.set_clock_source(SystClkSource::Core);
    syst.set_reload(0x00ff_ffff);
    syst.clear_current();
    syst.enable_counter();
    let meter = Meter { cycles };
    let unit = if cycles { "cycles" } else { "instructions" };
    hprintln!(
        "decisions: {unit} per call, over {REPEAT} calls ({})",
        if cycles {
            "DWT cycle counter"
        } else {
            "no DWT cycle counter: SysTick under -icount shift=0"
        }
    );

    let empty = meter.measure(|i| {
        black_box(i);
    });
    // Under -icount the same loop costs the same every time; on host time
    // it does not. Without a cycle counter, refuse to print host time as
    // instructions.
    let again = [(); 8].map(|()| {
        meter.measure(|i| {
            black_box(i);
        })
    });
    if !cycles && again.iter().any(|t| *t != empty) {
        hprintln!(
            "decisions: the empty loop measured {empty} then {again:?} (tenths): not under -icount shift=0, so SysTick counts host time, not instructions; run with -icount shift=0"
        );
        debug::exit(debug::EXIT_FAILURE);
    }
    let report = |name: &str, tenths: u64| {
        let net = tenths.saturating_sub(empty);
        hprintln!("decision {name}: {}.{} {unit}", net / 10, net % 10);
    };

    let Ok(bucket) = TokenBucket::new(5, Rate::per_second(1_000_000)) else {
        panic!("bucket")
    };
    let mut limiter = Limiter::new(bucket);
    report(
        "token bucket check",
        meter.measure(|i| {
            let _ = black_box(limiter.check(Instant::from_micros(u64::from(i))));
        }),
    );
    let shared = AtomicTokenBucket::new(bucket);
    report(
        "atomic token bucket check",
        meter.measure(|i| {
            let _ = black_box(shared.check(Instant::from_micros(u64::from(i))));
        }),
    );
    let Ok(leaky) = LeakyBucket::new(5, Rate::per_second(1_000_000)) else {
        panic!("leaky bucket")
    };
    let mut drained = Limiter::new(leaky);
    report(
        "leaky bucket check",
        meter.measure(|i| {
            let _ = black_box(drained.check(Instant::from_micros(u64::from(i))));
        }),
    );
    // 64 keys in a table of 64: every call finds its key's slot.
    let mut clients: Keyed<u32, TokenBucket, 64> = Keyed::new(bucket, FullPolicy::DenyNewKeys);
    report(
        "keyed token bucket (64 keys) check",
        meter.measure(|i| {
            let _ = black_box(clients.check(&(i % 64), Instant::from_micros(u64::from(i))));
        }),
    );
    let shared_clients: SharedKeyed<CriticalSectionRawMutex, u32, TokenBucket, 64> =
        SharedKeyed::new(Keyed::new(bucket, FullPolicy::DenyNewKeys));
    report(
        "shared keyed token bucket (64 keys) check",
        meter.measure(|i| {
            let _ = black_box(shared_clients.check(&(i % 64), Instant::from_micros(u64::from(i))));
        }),
    );
    let Ok(window) = SlidingWindow::<8>::new(Duration::from_millis(1), 8) else {
        panic!("window")
    };
    let mut windowed = Limiter::new(window);
    report(
        "sliding window (8) check",
        meter.measure(|i| {
            let _ = black_box(windowed.check(Instant::from_micros(u64::from(i) * 100)));
        }),
    );

    let policy = RetryPolicy::new().with_max_attempts(u32::MAX);
    let mut backoff = Backoff::new(policy);
    report(
        "retry backoff next delay",
        meter.measure(|_| {
            black_box(backoff.next_delay(&mut WithoutRandom));
        }),
    );

    let mut dlq: DeadLetterQueue<u32, u8, 16> = DeadLetterQueue::new();
    report(
        "dead-letter queue add + poll",
        meter.measure(|i| {
            let _ = black_box(dlq.add(i, Some(1), 3, Instant::from_millis(u64::from(i))));
            black_box(dlq.poll());
        }),
    );

    let shared_dlq: SharedDeadLetterQueue<CriticalSectionRawMutex, u32, u8, 16> =
        SharedDeadLetterQueue::new();
    report(
        "shared dead-letter queue add + poll",
        meter.measure(|i| {
            let _ = black_box(shared_dlq.add(i, Some(1), 3, Instant::from_millis(u64::from(i))));
            black_box(shared_dlq.poll());
        }),
    );

    // 64 words: 2,048 bits, about 200 items at 1 % false positives.
    let Ok(mut bloom) = BloomFilter::<64>::new(7) else {
        panic!("bloom")
    };
    report(
        "Bloom filter (2,048 bits, 7 hashes) check and mark",
        meter.measure(|i| {
            let _ = black_box(bloom.check_and_mark(&i, Instant::from_micros(0)));
        }),
    );
    let Ok(mut recent) = WindowedDeduplicator::<u32, 64>::new(Duration::from_micros(32)) else {
        panic!("windowed")
    };
    report(
        "windowed deduplicator (64 items) check and mark",
        meter.measure(|i| {
            let _ = black_box(recent.check_and_mark(&(i % 64), Instant::from_micros(u64::from(i))));
        }),
    );

    let Ok(every) = Every::new(Duration::from_secs(60)) else {
        panic!("period")
    };
    report(
        "slot of a wall time",
        meter.measure(|i| {
            black_box(every.slot_of(UnixMillis::from_millis(1_700_000_000_000 + u64::from(i))));
        }),
    );

    // A timer firing once a slot: one minute of wall time a call.
    let mut timer = SlotTimer::new(every, UnixMillis::from_millis(1_700_000_000_000));
    let mut wall = 1_700_000_000_000u64;
    report(
        "slot timer fire (next slot)",
        meter.measure(|_| {
            wall += 60_000;
            black_box(timer.fire(UnixMillis::from_millis(wall)));
        }),
    );

    // A claim: the scope and the delivery key made into the lock key, one
    // try_lock (on `Grants`, which answers at once) and the outcome.
    let grants = Grants {
        fence: Cell::new(0),
    };
    let Ok(scope) = Scope::new("consumer").and_then(|s| s.segment("chain", "orders")) else {
        panic!("scope")
    };
    let once = OnceGuard::new(Some(&grants), scope);
    let mut key: heapless::String<20> = heapless::String::new();
    report(
        "once-guard claim (key, try_lock, outcome)",
        meter.measure(|i| {
            key.clear();
            let _ = write!(key, "{i}");
            black_box(ready(once.allow(&key)));
        }),
    );

    // The leader's steady state: a renewal due, sent, answered Held.
    let Ok(mut guard) = ActiveGuard::new(ActiveConfig::new(), true, Instant::from_millis(0)) else {
        panic!("active config")
    };
    let token = Token::new(TokenId([7; 16]), 42);
    let mut now = Instant::from_millis(0);
    let step = |guard: &mut ActiveGuard, now: Instant| {
        guard.handle_timeout(now);
        while let Some(action) = guard.poll_action() {
            match action {
                Action::Acquire => guard.handle(now, Done::acquired(Ok::<_, ()>(Some(token)))),
                Action::Renew(_) => guard.handle(now, Done::renewed(Ok::<_, ()>(Renewal::Held))),
                Action::Release(_) => guard.handle(now, Done::Released(true)),
                Action::Promote { .. } | Action::Demote(_) => {}
            }
        }
        guard.poll_timeout().unwrap_or(now)
    };
    now = step(&mut guard, now);
    assert_eq!(guard.fence(), Some(42), "promoted");
    report(
        "active guard renewal (timeout, renew, held)",
        meter.measure(|_| {
            now = step(&mut guard, now);
        }),
    );
    assert_eq!(guard.fence(), Some(42), "still leading");

    debug::exit(debug::EXIT_SUCCESS);
    loop {
        cortex_m::asm::wfi();
    }
}
