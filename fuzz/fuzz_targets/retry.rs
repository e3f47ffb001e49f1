//! Retry arithmetic: no parameters overflow or panic; waits respect the
//! cap and, for factors of at least one, never shrink.
#![no_main]

use std::time::Duration;

use arbitrary::Arbitrary;
use guard_core::retry::{Backoff, Jitter, Multiplier, RetryPolicy};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
struct Input {
    retries: u8,
    initial: u64,
    cap: u64,
    per_mille: u32,
    exponential: bool,
    jitter: u8,
    attempts: Vec<u32>,
    seed: u64,
}

fuzz_target!(|input: Input| {
    let jitter = match input.jitter % 3 {
        0 => Jitter::None,
        1 => Jitter::Full,
        _ => Jitter::Decorrelated,
    };
    let policy = RetryPolicy::new()
        .with_max_attempts(u32::from(input.retries))
        .with_initial_delay(Duration::from_nanos(input.initial))
        .with_max_delay(Duration::from_nanos(input.cap))
        .with_multiplier(Multiplier::per_mille(input.per_mille))
        .with_exponential(input.exponential)
        .with_jitter(jitter);
    let cap = Duration::from_nanos(input.cap);
    let mut attempts = input.attempts;
    attempts.sort_unstable();
    let mut last = Duration::ZERO;
    for n in attempts {
        let d = policy.delay_for_attempt(n);
        assert!(d <= cap);
        if input.per_mille >= 1000 && n > 0 {
            assert!(d >= last, "attempt {n} shrank");
            last = d;
        }
    }
    let mut seed = input.seed | 1;
    let mut random = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut backoff = Backoff::new(policy);
    let mut waits = 0;
    while let Some(d) = backoff.next_delay(&mut random) {
        assert!(d <= cap);
        waits += 1;
    }
    assert_eq!(waits, u32::from(input.retries));
});
