//! guard on a Cortex-M4F (QEMU `mps2-an386`): the limiters, retry on
//! embassy-time, the dead-letter queue, and two tasks electing one active
//! consumer and sharing slots over a RAM locker, each checked on target.
//!
//! Every line of the report goes out through semihosting; a failed check
//! panics, and `panic-semihosting` makes QEMU exit with status 1, so
//! `cargo run --release` here is a test.
//!
//! With feature `defmt`, the checks also log through defmt (decode with
//! `defmt-print`).

#![no_std]
#![no_main]

use core::time::Duration;

use cortex_m_semihosting::{debug, hprintln};
#[cfg(feature = "defmt")]
use defmt_semihosting as _;
use embassy_executor::Spawner;
use embassy_sync::blocking_mutex::raw::CriticalSectionRawMutex;
use embassy_sync::channel::Channel;
use embassy_sync::signal::Signal;
use embassy_time::{Instant, Timer};
use guard_core::dlq::DeadLetterQueue;
use guard_core::guard::{ActiveConfig, DemoteReason, OnceGuard};
use guard_core::limit::{
    AtomicTokenBucket, Decision, FullPolicy, Keyed, Limiter, Rate, SlidingWindow, TokenBucket,
};
use guard_core::lock::{Scope, Ttl};
use guard_core::retry::{Classifier, GiveUpReason, RetryExecutor, RetryPolicy};
use guard_core::slot::{Every, UnixMillis};
use guard_embassy::time::{duration_to_embassy, now};
use guard_embassy::{ActiveControl, ActiveRunner, RamLocker, retry, run_slots};
use guard_firmware_mps2::time_driver;
use panic_semihosting as _;

type Raw = CriticalSectionRawMutex;

/// Logs a check's result through semihosting (and defmt with the feature).
macro_rules! report {
    ($($arg:tt)*) => {{
        hprintln!($($arg)*);
        #[cfg(feature = "defmt")]
        defmt::info!("{}", defmt::Display2Format(&format_args!($($arg)*)));
    }};
}

#[embassy_executor::main]
async fn main(spawner: Spawner) {
    // At reset nothing has taken the core peripherals yet.
    let Some(peripherals) = cortex_m::Peripherals::take() else {
        panic!("core peripherals taken twice");
    };
    time_driver::init(peripherals.SYST);

    limiters().await;
    retry_on_embassy_time().await;
    dead_letter_queue();
    one_active_consumer(spawner).await;
    slots_once(spawner).await;

    report!("all checks passed");
    debug::exit(debug::EXIT_SUCCESS);
}

fn denied_for(decision: Decision) -> Duration {
    match decision {
        Decision::Denied { retry_after } => retry_after,
        Decision::Allowed => panic!("admitted past the limit"),
    }
}

async fn limiters() {
    // Token bucket: a burst of 5, then one every 100 ms, on embassy time.
    let Ok(bucket) = TokenBucket::new(5, Rate::per_second(10)) else {
        panic!("bucket parameters");
    };
    let mut limiter = Limiter::new(bucket);
    for _ in 0..5 {
        assert!(limiter.check(now()).is_allowed());
    }
    let bucket_wait = denied_for(limiter.check(now()));
    assert!(bucket_wait > Duration::ZERO && bucket_wait <= Duration::from_millis(100));
    let start = Instant::now();
    Timer::after(duration_to_embassy(bucket_wait)).await;
    assert!(limiter.check(now()).is_allowed(), "a token after the wait");
    assert!(Instant::now() - start >= duration_to_embassy(bucket_wait));

    // Sliding window: 3 per 50 ms.
    let Ok(window) = SlidingWindow::<3>::new(Duration::from_millis(50), 3) else {
        panic!("window parameters");
    };
    let mut limiter = Limiter::new(window);
    for _ in 0..3 {
        assert!(limiter.check(now()).is_allowed());
    }
    let wait = denied_for(limiter.check(now()));
    Timer::after(duration_to_embassy(wait)).await;
    assert!(limiter.check(now()).is_allowed());

    // Keyed: each client its own bucket in a fixed table.
    let Ok(per_key) = TokenBucket::new(2, Rate::per_second(1)) else {
        panic!("bucket parameters");
    };
    let mut clients: Keyed<u32, TokenBucket, 16> = Keyed::new(per_key, FullPolicy::DenyNewKeys);
    let t = now();
    assert!(clients.check(&1, t).is_allowed() && clients.check(&1, t).is_allowed());
    assert!(clients.check(&1, t).is_denied(), "client 1 spent its burst");
    assert!(
        clients.check(&2, t).is_allowed(),
        "client 2 is not client 1"
    );

    // The atomic bucket (a critical section on this core) decides alike.
    let shared = AtomicTokenBucket::new(bucket);
    let t = now();
    let admitted = (0..8).filter(|_| shared.check(t).is_allowed()).count();
    assert_eq!(admitted, 5);
    report!(
        "limiters: ok (token bucket refused for {} ms, window for {} ms)",
        bucket_wait.as_millis(),
        wait.as_millis()
    );
}

async fn retry_on_embassy_time() {
    let policy = RetryPolicy::fixed_delay(2, Duration::from_millis(20));
    let Ok(mut executor) = RetryExecutor::new(policy, Classifier::retry_all()) else {
        panic!("retry policy");
    };
    let start = Instant::now();
    let result = retry(&mut executor, |attempt| async move {
        if attempt < 3 {
            Err("busy")
        } else {
            Ok(attempt)
        }
    })
    .await;
    assert_eq!(result, Ok(3));
    let slept = Instant::now() - start;
    assert!(
        slept.as_millis() >= 40,
        "two waits of 20 ms, slept {} ms",
        slept.as_millis()
    );

    let failed = retry(&mut executor, |_| async { Err::<(), _>("down") }).await;
    let Err(error) = failed else {
        panic!("an operation that always fails succeeded");
    };
    assert_eq!((error.attempts, error.reason), (3, GiveUpReason::Exhausted));
    report!("retry: ok (3 attempts over {} ms)", slept.as_millis());
}

fn dead_letter_queue() {
    let mut dlq: DeadLetterQueue<u32, &str, 4> = DeadLetterQueue::new();
    for element in 0..4 {
        assert!(dlq.add(element, Some("timeout"), 3, now()).is_ok());
    }
    // Full: the fifth is handed back, not dropped.
    let Err(back) = dlq.add(4, Some("timeout"), 3, now()) else {
        panic!("a full queue took a fifth element");
    };
    assert_eq!(*back.element(), 4);
    let order: heapless::Vec<u32, 4> = core::iter::from_fn(|| dlq.poll())
        .map(|f| *f.element())
        .collect();
    assert_eq!(order.as_slice(), &[0, 1, 2, 3]);
    report!("dead-letter queue: ok (full queue handed element 4 back)");
}

/// What the active-guard tasks report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Seen {
    Promoted(usize, u64),
    Demoted(usize, DemoteReason),
}

static LOCKER: RamLocker<Raw, 4> = RamLocker::new();
static EVENTS: Channel<Raw, Seen, 8> = Channel::new();
static CONTROLS: [ActiveControl<Raw>; 2] = [ActiveControl::new(), ActiveControl::new()];
static STOPPED: [Signal<Raw, ()>; 2] = [Signal::new(), Signal::new()];

#[embassy_executor::task(pool_size = 2)]
async fn device(id: usize) {
    let settings = ActiveConfig::new()
        .with_ttl(Ttl::from_millis(300).unwrap_or(Ttl::MIN))
        .with_interval(Duration::from_millis(100));
    let Ok(runner) = ActiveRunner::new("guard:active:consumer:sensors", settings) else {
        panic!("active guard settings");
    };
    runner
        .run(
            &LOCKER,
            &CONTROLS[id],
            |fence| async move {
                EVENTS.send(Seen::Promoted(id, fence)).await;
                Ok::<(), ()>(())
            },
            |reason| async move { EVENTS.send(Seen::Demoted(id, reason)).await },
        )
        .await;
    STOPPED[id].signal(());
}

async fn one_active_consumer(spawner: Spawner) {
    spawner.spawn(device(0).unwrap_or_else(|_| panic!("task pool")));
    Timer::after_millis(50).await;
    spawner.spawn(device(1).unwrap_or_else(|_| panic!("task pool")));

    assert_eq!(EVENTS.receive().await, Seen::Promoted(0, 1));
    // Several lease intervals: the standby stays a standby. (530 ms puts
    // the stop between two of the standby's polls.)
    Timer::after_millis(530).await;
    assert!(EVENTS.is_empty(), "a second leader while the first renews");

    let handed_over = Instant::now();
    CONTROLS[0].stop();
    assert_eq!(
        EVENTS.receive().await,
        Seen::Demoted(0, DemoteReason::Stopping)
    );
    assert_eq!(EVENTS.receive().await, Seen::Promoted(1, 2));
    let takeover = Instant::now() - handed_over;
    STOPPED[0].wait().await;
    CONTROLS[1].stop();
    assert_eq!(
        EVENTS.receive().await,
        Seen::Demoted(1, DemoteReason::Stopping)
    );
    STOPPED[1].wait().await;
    // The standby polls every interval: it takes over within one.
    assert!(
        takeover.as_millis() <= 150,
        "takeover after {} ms",
        takeover.as_millis()
    );
    report!(
        "active guard: ok (one leader, takeover after {} ms)",
        takeover.as_millis()
    );
}

/// Slot claims live for 500 ms: at 10 slots a second, up to 5 at once.
static SLOT_LOCKER: RamLocker<Raw, 8> = RamLocker::new();
/// (device, slot) for every slot run.
static SLOTS: Channel<Raw, (usize, u64), 32> = Channel::new();
static SLOTS_STOP: [Signal<Raw, ()>; 2] = [Signal::new(), Signal::new()];
static SLOTS_DONE: Channel<Raw, u64, 2> = Channel::new();

/// A wall clock for the demo: boot is 2023-11-14T22:13:20Z.
fn wall() -> UnixMillis {
    UnixMillis::from_millis(1_700_000_000_000 + Instant::now().as_millis())
}

#[embassy_executor::task(pool_size = 2)]
async fn slot_device(id: usize) {
    let Ok(scope) = Scope::new("schedule").and_then(|s| s.segment("router", "tick")) else {
        panic!("scope");
    };
    let guard = OnceGuard::new(Some(&SLOT_LOCKER), scope)
        .with_ttl(Ttl::from_millis(500).unwrap_or(Ttl::MIN));
    let Ok(every) = Every::new(Duration::from_millis(100)) else {
        panic!("period");
    };
    let ran = run_slots(&guard, every, wall, &SLOTS_STOP[id], |run| async move {
        SLOTS.send((id, run.slot.as_millis())).await;
    })
    .await;
    SLOTS_DONE
        .send(ran.unwrap_or_else(|_| panic!("slot key")))
        .await;
}

async fn slots_once(spawner: Spawner) {
    spawner.spawn(slot_device(0).unwrap_or_else(|_| panic!("task pool")));
    spawner.spawn(slot_device(1).unwrap_or_else(|_| panic!("task pool")));
    Timer::after_millis(1_050).await;
    SLOTS_STOP.iter().for_each(|s| s.signal(()));
    let ran = SLOTS_DONE.receive().await + SLOTS_DONE.receive().await;
    let mut slots: heapless::Vec<u64, 32> = heapless::Vec::new();
    while let Ok((_, slot)) = SLOTS.try_receive() {
        assert!(!slots.contains(&slot), "slot {slot} ran twice");
        assert!(slots.push(slot).is_ok());
    }
    assert_eq!(ran as usize, slots.len());
    slots.sort_unstable();
    let (first, last) = (slots[0], slots[slots.len() - 1]);
    assert!(slots.len() >= 9, "{} slots in about a second", slots.len());
    assert_eq!(
        slots.len() as u64,
        (last - first) / 100 + 1,
        "a slot was missed"
    );
    report!(
        "slots: ok ({} slots, each once across two tasks)",
        slots.len()
    );
}
