//! The bounded keyed table: memory stays within `N`, and every key's
//! admissions, taken alone, are a schedule its own limiter would admit.
#![no_main]

use std::collections::HashMap;
use std::time::Duration;

use arbitrary::Arbitrary;
use guard_core::limit::{FullPolicy, Keyed, Limiter, Rate, TokenBucket};
use guard_core::time::Instant;
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
struct Input {
    capacity: u8,
    period_ms: u16,
    calls: Vec<(u8, u16)>,
}

fuzz_target!(|input: Input| {
    let bucket = TokenBucket::new(
        u32::from(input.capacity % 4).max(1),
        Rate::per(1, Duration::from_millis(u64::from(input.period_ms).max(1))),
    )
    .unwrap();
    let mut table: Keyed<u8, TokenBucket, 8> = Keyed::new(bucket, FullPolicy::DenyNewKeys);
    let mut audit: HashMap<u8, Limiter<TokenBucket>> = HashMap::new();
    let mut now = 1_000_000_000u64;
    for (key, step_ms) in input.calls {
        now += u64::from(step_ms) * 1_000_000;
        let at = Instant::from_nanos(now);
        if table.check(&key, at).is_allowed() {
            let own = audit.entry(key).or_insert_with(|| Limiter::new(bucket));
            assert!(
                own.check(at).is_allowed(),
                "key {key} admitted beyond its own limit at {now}"
            );
        }
        assert!(table.len() <= 8);
    }
});
