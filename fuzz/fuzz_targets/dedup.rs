//! The windowed deduplicator against a map of last-seen instants, and the
//! Bloom filter's promise of no false negatives.
#![no_main]

use std::collections::HashMap;
use std::time::Duration;

use arbitrary::Arbitrary;
use guard_core::dedup::{BloomFilter, CapacityExceeded, Deduplicator, WindowedDeduplicator};
use guard_core::time::Instant;
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
struct Input {
    window_ms: u16,
    hashes: u8,
    calls: Vec<(u8, u16, bool)>,
}

fuzz_target!(|input: Input| {
    let window = Duration::from_millis(u64::from(input.window_ms).max(1));
    let mut real: WindowedDeduplicator<u8, 16> = WindowedDeduplicator::new(window).unwrap();
    let mut model: HashMap<u8, Instant> = HashMap::new();
    let mut bloom: BloomFilter<4> = BloomFilter::new(u32::from(input.hashes % 32) + 1).unwrap();
    let mut marked = Vec::new();
    let mut now = Instant::from_secs(1);
    for (item, step_ms, mark) in input.calls {
        now = now + Duration::from_millis(u64::from(step_ms));
        let live = |seen: &Instant| now.saturating_duration_since(*seen) < window;
        let duplicate = model.get(&item).is_some_and(live);
        assert_eq!(real.is_duplicate(&item, now), duplicate);
        if mark {
            match real.check_and_mark(&item, now) {
                Ok(dup) => {
                    assert_eq!(dup, duplicate);
                    model.insert(item, now);
                }
                // Full of live items: the item is new, and not remembered.
                Err(CapacityExceeded) => {
                    assert!(!duplicate);
                    assert!(model.values().filter(|s| live(s)).count() >= 8);
                }
            }
            let _ = bloom.check_and_mark(&item, now);
            marked.push(item);
        }
        for m in &marked {
            assert!(bloom.is_duplicate(m, now), "a Bloom filter never forgets");
        }
    }
});
