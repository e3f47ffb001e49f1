//! What guard-core costs in flash and RAM, for the four parts an MCU
//! gateway needs first: a token bucket behind a `Limiter`, retry backoff,
//! the dead-letter queue and the `ActiveGuard` state machine. No
//! formatting, no executor; inputs go through `black_box`, so the
//! optimizer keeps every decision. Each board's `footprint` image runs
//! [`decide`] and exits 1 on a wrong decision; the test command prints
//! its size beside the board's `empty` image.

#![no_std]

use core::hint::black_box;
use core::time::Duration;

use guard_core::dlq::DeadLetterQueue;
use guard_core::guard::{Action, ActiveConfig, ActiveGuard, Done};
use guard_core::limit::{Limiter, Rate, TokenBucket};
use guard_core::lock::{Renewal, Token, TokenId};
use guard_core::retry::{Backoff, RetryPolicy, WithoutRandom};
use guard_core::time::Instant;

/// Runs the four parts once; whether every decision was right.
pub fn decide() -> bool {
    let start = Instant::from_millis(black_box(1_000));
    let mut right = true;

    // Limiter: a burst of 5, then 10 a second.
    let Ok(bucket) = TokenBucket::new(black_box(5), Rate::per_second(black_box(10))) else {
        return false;
    };
    let mut limiter = Limiter::new(bucket);
    let admitted = (0..8).filter(|_| limiter.check(start).is_allowed()).count();
    right &= admitted == 5;

    // Retry: the default policy's waits until it gives up.
    let mut backoff = Backoff::new(black_box(RetryPolicy::new()));
    let mut waited = Duration::ZERO;
    while let Some(wait) = backoff.next_delay(&mut WithoutRandom) {
        waited += wait;
    }
    right &= waited > Duration::ZERO;

    // Dead-letter queue: a full queue hands the element back.
    let mut dlq: DeadLetterQueue<u32, u8, 4> = DeadLetterQueue::new();
    for element in 0..5u32 {
        let added = dlq.add(black_box(element), Some(1), 3, start);
        right &= added.is_ok() == (element < 4);
    }
    right &= dlq.poll().map(|f| *f.element()) == Some(0);

    // ActiveGuard: acquire, promote, renew, as a runtime drives it.
    let Ok(mut guard) = ActiveGuard::new(ActiveConfig::new(), true, start) else {
        return false;
    };
    let token = Token::new(TokenId(black_box([7; 16])), black_box(42));
    let mut now = start;
    for _ in 0..3 {
        guard.handle_timeout(now);
        while let Some(action) = guard.poll_action() {
            match action {
                Action::Acquire => guard.handle(now, Done::acquired(Ok::<_, ()>(Some(token)))),
                Action::Renew(_) => guard.handle(now, Done::renewed(Ok::<_, ()>(Renewal::Held))),
                Action::Release(_) => guard.handle(now, Done::Released(true)),
                Action::Promote { .. } | Action::Demote(_) => {}
            }
        }
        now = guard.poll_timeout().unwrap_or(now);
    }
    right &= guard.fence() == Some(42);
    right
}
