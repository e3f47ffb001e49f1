//! Every limiter against its reference model, on arbitrary traces; the
//! atomic bucket against the `&mut` one on arbitrary (also backwards)
//! clocks.
#![no_main]

use std::time::Duration;

use arbitrary::Arbitrary;
use guard_core::limit::{
    AtomicTokenBucket, LeakyBucket, Limiter, Rate, SlidingWindow, TokenBucket,
};
use guard_core::time::Instant;
use libfuzzer_sys::fuzz_target;

#[path = "../../core/tests/models/mod.rs"]
mod models;

#[derive(Arbitrary, Debug)]
enum Step {
    Same,
    Forward(u16),
    Idle(u32),
    Back(u16),
}

#[derive(Arbitrary, Debug)]
struct Input {
    capacity: u8,
    amount: u8,
    period_ms: u16,
    window_ms: u16,
    limit: u8,
    start: u32,
    steps: Vec<Step>,
}

fuzz_target!(|input: Input| {
    let capacity = u32::from(input.capacity).max(1);
    let rate = Rate::per(
        u32::from(input.amount).max(1),
        Duration::from_millis(u64::from(input.period_ms).max(1)),
    );
    let token = TokenBucket::new(capacity, rate).unwrap();
    let leaky = LeakyBucket::new(capacity, rate).unwrap();
    let window = SlidingWindow::<256>::new(
        Duration::from_millis(u64::from(input.window_ms).max(1)),
        u32::from(input.limit).max(1),
    )
    .unwrap();
    let interval = token.interval().as_nanos() as u64;
    let (mut real_token, mut real_leaky, mut real_window) = (
        Limiter::new(token),
        Limiter::new(leaky),
        Limiter::new(window),
    );
    let atomic = AtomicTokenBucket::new(token);
    let mut mut_token = Limiter::new(token);
    let mut token_model = models::TokenModel::new(capacity, interval);
    let mut leaky_model = models::LeakyModel::new(capacity, interval);
    let mut window_model = models::WindowModel {
        window: window.window().as_nanos(),
        limit: window.limit() as usize,
        admitted: vec![],
    };
    let (mut raw, mut forward) = (
        u64::from(input.start) * 1_000_000,
        u64::from(input.start) * 1_000_000,
    );
    for step in input.steps {
        raw = match step {
            Step::Same => raw,
            Step::Forward(ms) => raw.saturating_add(u64::from(ms) * 1_000_000),
            Step::Idle(ms) => raw.saturating_add(u64::from(ms) * 1_000_000),
            Step::Back(ms) => raw.saturating_sub(u64::from(ms) * 1_000_000),
        };
        forward = forward.max(raw);
        let at = Instant::from_nanos(forward);
        // The models state the original's algorithms on a forward clock.
        assert_eq!(
            real_token.check(at).is_allowed(),
            token_model.check(forward),
            "token bucket at {forward}"
        );
        assert_eq!(
            real_leaky.check(at).is_allowed(),
            leaky_model.check(forward),
            "leaky bucket at {forward}"
        );
        // The window model also takes the clamped backwards clock.
        assert_eq!(
            real_window.check(Instant::from_nanos(raw)).is_allowed(),
            window_model.check(raw),
            "window at {raw}"
        );
        // One decision function behind both buckets, on any clock.
        assert_eq!(
            atomic.check(Instant::from_nanos(raw)),
            mut_token.check(Instant::from_nanos(raw)),
            "atomic at {raw}"
        );
    }
});
