//! guard's decisions checked on a microcontroller, shared by the boards
//! that run them under QEMU (`boards/microbit` on a Cortex-M0,
//! `boards/riscv-virt` on a RISC-V core): the limiters (the shared atomic
//! bucket on a critical section where the core has no compare-and-swap),
//! retry, the dead-letter queue, two `ActiveGuard` state machines
//! competing for one lease, and two devices claiming slots once through a
//! `RamLocker`.
//!
//! Time is passed in, as guard-core takes it: the checks step a clock of
//! their own ([`clock`]), which is also the embassy-time driver the RAM
//! locker reads, so every figure is exact and repeatable. Each result is
//! written to the board's output; a failed check panics, and the board's
//! panic handler exits QEMU with status 1.

#![no_std]

pub mod clock;

use core::fmt::Write;
use core::time::Duration;

use embassy_futures::block_on;
use embassy_sync::blocking_mutex::raw::CriticalSectionRawMutex;
use guard_core::dlq::DeadLetterQueue;
use guard_core::guard::{Action, ActiveConfig, ActiveGuard, DemoteReason, Done, OnceGuard};
use guard_core::limit::{
    AtomicTokenBucket, FullPolicy, Keyed, Limiter, Rate, SlidingWindow, TokenBucket,
};
use guard_core::lock::{Renewal, Scope, Token, TokenId, Ttl};
use guard_core::retry::{Classifier, GiveUpReason, RetryExecutor, RetryPolicy};
use guard_core::slot::{Every, SlotTimer, UnixMillis};
use guard_core::time::Instant;
use guard_embassy::RamLocker;

/// Writes one line of a check's result (output is best effort: a board
/// without a host to write to still runs the checks).
macro_rules! say {
    ($out:expr, $($arg:tt)*) => {
        let _ = writeln!($out, $($arg)*);
    };
}

/// Runs every check, each writing its result to `out`, then "all checks
/// passed".
pub fn run_all(out: &mut dyn Write) {
    limiters(out);
    retry(out);
    dead_letter_queue(out);
    one_active_guard(out);
    slots_once(out);
    say!(out, "all checks passed");
}

/// Checks limiters on target; panics on a wrong decision.
pub fn limiters(out: &mut dyn Write) {
    let t0 = Instant::from_millis(1_000);
    let Ok(bucket) = TokenBucket::new(5, Rate::per_second(10)) else {
        panic!("bucket parameters");
    };
    let mut limiter = Limiter::new(bucket);
    assert_eq!((0..8).filter(|_| limiter.check(t0).is_allowed()).count(), 5);
    assert!(limiter.check(t0 + Duration::from_millis(99)).is_denied());
    assert!(limiter.check(t0 + Duration::from_millis(100)).is_allowed());

    let Ok(window) = SlidingWindow::<3>::new(Duration::from_millis(50), 3) else {
        panic!("window parameters");
    };
    let mut windowed = Limiter::new(window);
    assert_eq!(
        (0..5).filter(|_| windowed.check(t0).is_allowed()).count(),
        3
    );
    assert!(windowed.check(t0 + Duration::from_millis(50)).is_allowed());

    let Ok(per_key) = TokenBucket::new(2, Rate::per_second(1)) else {
        panic!("bucket parameters");
    };
    let mut clients: Keyed<u32, TokenBucket, 4> = Keyed::new(per_key, FullPolicy::DenyNewKeys);
    assert!(clients.check(&1, t0).is_allowed() && clients.check(&1, t0).is_allowed());
    assert!(
        clients.check(&1, t0).is_denied(),
        "client 1 spent its burst"
    );
    assert!(
        clients.check(&2, t0).is_allowed(),
        "client 2 is not client 1"
    );

    // No compare-and-swap on this core: the shared bucket's 64-bit state
    // is updated in a critical section, and decides as the plain one.
    let shared = AtomicTokenBucket::new(bucket);
    assert_eq!((0..8).filter(|_| shared.check(t0).is_allowed()).count(), 5);
    assert!(shared.check(t0 + Duration::from_millis(100)).is_allowed());
    say!(
        out,
        "limiters: ok (token bucket, sliding window, keyed, atomic bucket on a critical section)"
    );
}

/// Checks retry on target; panics on a wrong decision.
pub fn retry(out: &mut dyn Write) {
    let policy = RetryPolicy::fixed_delay(2, Duration::from_millis(20));
    let Ok(mut executor) = RetryExecutor::new(policy, Classifier::retry_all()) else {
        panic!("retry policy");
    };
    let mut slept = Duration::ZERO;
    let result = executor.run_blocking(
        |wait| {
            slept += wait;
            Ok(())
        },
        |attempt| {
            if attempt < 3 {
                Err("busy")
            } else {
                Ok(attempt)
            }
        },
    );
    assert_eq!(result, Ok(3));
    assert_eq!(slept, Duration::from_millis(40));
    let failed = executor.run_blocking(|_| Ok(()), |_| Err::<(), _>("down"));
    let Err(error) = failed else {
        panic!("an operation that always fails succeeded");
    };
    assert_eq!((error.attempts, error.reason), (3, GiveUpReason::Exhausted));
    say!(out, "retry: ok (3 attempts, 40 ms of waits)");
}

/// Checks dead letter queue on target; panics on a wrong decision.
pub fn dead_letter_queue(out: &mut dyn Write) {
    let now = Instant::from_millis(5);
    let mut dlq: DeadLetterQueue<u32, &str, 4> = DeadLetterQueue::new();
    for element in 0..4 {
        assert!(dlq.add(element, Some("timeout"), 3, now).is_ok());
    }
    let Err(back) = dlq.add(4, Some("timeout"), 3, now) else {
        panic!("a full queue took a fifth element");
    };
    assert_eq!(*back.element(), 4, "a full queue hands the element back");
    let order: heapless::Vec<u32, 4> = core::iter::from_fn(|| dlq.poll())
        .map(|f| *f.element())
        .collect();
    assert_eq!(order.as_slice(), &[0, 1, 2, 3]);
    say!(
        out,
        "dead-letter queue: ok (full queue handed element 4 back)"
    );
}

/// A lease as the lock service holds it, on the checks' clock.
struct LeaseTable {
    holder: Option<(Token, Instant)>,
    fence: u64,
}

impl LeaseTable {
    /// Runs `action` for `guard` (device `id`) at `now`, as a runtime does.
    fn serve(
        &mut self,
        guard: &mut ActiveGuard,
        id: u8,
        now: Instant,
        ttl: Duration,
    ) -> Option<(u8, Result<u64, DemoteReason>)> {
        let mut event = None;
        while let Some(action) = guard.poll_action() {
            let live = self.holder.filter(|(_, expires)| *expires > now);
            match action {
                Action::Acquire => {
                    let granted = if live.is_none() {
                        self.fence += 1;
                        let token = Token::new(TokenId([id; 16]), self.fence);
                        self.holder = Some((token, now + ttl));
                        Some(token)
                    } else {
                        None
                    };
                    guard.handle(now, Done::acquired(Ok::<_, ()>(granted)));
                }
                Action::Renew(token) => {
                    let held = matches!(live, Some((t, _)) if t == token);
                    if held {
                        self.holder = Some((token, now + ttl));
                    }
                    let renewal = if held { Renewal::Held } else { Renewal::Lost };
                    guard.handle(now, Done::renewed(Ok::<_, ()>(renewal)));
                }
                Action::Release(token) => {
                    if matches!(live, Some((t, _)) if t == token) {
                        self.holder = None;
                    }
                    guard.handle(now, Done::Released(true));
                }
                Action::Promote { fence } => event = Some((id, Ok(fence))),
                Action::Demote(reason) => event = Some((id, Err(reason))),
            }
        }
        event
    }
}

/// Checks one active guard on target; panics on a wrong decision.
pub fn one_active_guard(out: &mut dyn Write) {
    let ttl = Duration::from_millis(300);
    let config = ActiveConfig::new()
        .with_ttl(Ttl::from_millis(300).unwrap_or(Ttl::MIN))
        .with_interval(Duration::from_millis(100));
    let start = Instant::from_millis(0);
    let (Ok(mut a), Ok(mut b)) = (
        ActiveGuard::new(config, true, start),
        ActiveGuard::new(config, true, start + Duration::from_millis(50)),
    ) else {
        panic!("active config");
    };
    let mut table = LeaseTable {
        holder: None,
        fence: 0,
    };
    let mut leaders: heapless::Vec<(u8, u64, u64), 4> = heapless::Vec::new();
    let mut leading: [bool; 2] = [false, false];
    let mut stopped_at = None;
    // 10 ms steps over 1.5 s; device 0 stops at 700 ms.
    for step in 0..150u64 {
        let now = start + Duration::from_millis(step * 10);
        if step == 70 {
            a.stop(now);
            stopped_at = Some(now);
        }
        for (id, guard) in [(0u8, &mut a), (1u8, &mut b)] {
            if guard.poll_timeout().is_some_and(|due| due <= now) {
                guard.handle_timeout(now);
            }
            match table.serve(guard, id, now, ttl) {
                Some((id, Ok(fence))) => {
                    leading[usize::from(id)] = true;
                    assert!(leaders.push((id, fence, now.as_millis())).is_ok());
                }
                Some((id, Err(_))) => leading[usize::from(id)] = false,
                None => {}
            }
            assert!(
                !(leading[0] && leading[1]),
                "two leaders at {} ms",
                now.as_millis()
            );
        }
    }
    assert_eq!(leaders.len(), 2, "{leaders:?}");
    assert_eq!((leaders[0].0, leaders[0].1), (0, 1));
    assert_eq!((leaders[1].0, leaders[1].1), (1, 2));
    let Some(stopped) = stopped_at else {
        panic!("never stopped")
    };
    let takeover = leaders[1].2 - stopped.as_millis();
    assert!(
        takeover <= 100,
        "takeover after {takeover} ms, more than an interval"
    );
    say!(
        out,
        "active guard: ok (one leader at a time, takeover after {takeover} ms, fences 1 then 2)"
    );
}

type Raw = CriticalSectionRawMutex;
/// Slot claims live for 500 ms: at 10 slots a second, up to 5 at once.
static SLOT_LOCKER: RamLocker<Raw, 8> = RamLocker::new();

/// Checks slots once on target; panics on a wrong decision.
pub fn slots_once(out: &mut dyn Write) {
    let Ok(scope) = Scope::new("schedule").and_then(|s| s.segment("router", "tick")) else {
        panic!("scope");
    };
    let guard = OnceGuard::new(Some(&SLOT_LOCKER), scope)
        .with_ttl(Ttl::from_millis(500).unwrap_or(Ttl::MIN));
    let Ok(every) = Every::new(Duration::from_millis(100)) else {
        panic!("period");
    };
    // Two devices; the second's wall clock runs 30 ms ahead (skew below
    // the claims' 500 ms retention).
    let epoch = 1_700_000_000_000;
    let skew = [0u64, 30];
    let mut timers = skew.map(|s| SlotTimer::new(every, UnixMillis::from_millis(epoch + s)));
    let mut ran: heapless::Vec<(usize, u64), 32> = heapless::Vec::new();
    for ms in 0..1_000u64 {
        clock::set(ms);
        for (id, timer) in timers.iter_mut().enumerate() {
            // As a runtime does: fire once the timer's instant has come.
            let wall = UnixMillis::from_millis(epoch + ms + skew[id]);
            if timer.next_fire().is_none_or(|due| due > wall) {
                continue;
            }
            let Some(slot) = timer.fire(wall) else {
                continue;
            };
            let mut key = heapless::String::<20>::new();
            let _ = write!(key, "{}", slot.as_millis());
            let Ok(outcome) = block_on(guard.allow(&key)) else {
                panic!("slot key");
            };
            if outcome.is_allowed() {
                assert!(
                    ran.iter().all(|(_, s)| *s != slot.as_millis()),
                    "slot {} ran twice",
                    slot.as_millis()
                );
                assert!(ran.push((id, slot.as_millis())).is_ok());
            }
        }
    }
    ran.sort_unstable_by_key(|(_, s)| *s);
    let (first, last) = (ran[0].1, ran[ran.len() - 1].1);
    assert!(ran.len() >= 9, "{} slots in a second", ran.len());
    assert_eq!(
        ran.len() as u64,
        (last - first) / 100 + 1,
        "a slot was missed"
    );
    let by_second = ran.iter().filter(|(id, _)| *id == 1).count();
    say!(
        out,
        "slots: ok ({} slots, each once across two devices 30 ms apart; {} by the one ahead)",
        ran.len(),
        by_second
    );
}
