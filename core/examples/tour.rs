//! A tour of guard-core: an edge gateway forwarding sensor messages over a
//! flaky uplink, in simulated time.
//!
//! - a windowed deduplicator drops messages the sensors send twice;
//! - a token bucket shapes the uplink to 20 messages per second;
//! - failed sends are retried with exponential backoff and full jitter;
//! - what still fails lands in a bounded dead-letter queue.
//!
//! Run: `cargo run -p guard-core --example tour`

use core::time::Duration;

use guard_core::dedup::{Deduplicator, WindowedDeduplicator};
use guard_core::dlq::DeadLetterQueue;
use guard_core::failure::{FailureHandler, Handled, ReliabilityConfig};
use guard_core::limit::{Limiter, Rate, TokenBucket};
use guard_core::retry::{Classifier, Jitter, RetryPolicy};
use guard_core::time::Instant;

/// A small deterministic PRNG (xorshift64): core has no global randomness.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut now = Instant::from_secs(1);
    let mut rng = XorShift(0x2545_f491_4f6c_dd1d);
    let mut uplink_rng = XorShift(42);

    // Resends arrive within a second; 512 slots hold that window easily.
    let mut seen: WindowedDeduplicator<u32, 512> =
        WindowedDeduplicator::new(Duration::from_secs(1))?;
    let mut uplink = Limiter::new(TokenBucket::new(5, Rate::per_second(20))?);
    let mut dlq: DeadLetterQueue<u32, &str, 16> = DeadLetterQueue::new();
    let policy = RetryPolicy::new()
        .with_max_attempts(3)
        .with_initial_delay(Duration::from_millis(20))
        .with_jitter(Jitter::Full);
    let config = ReliabilityConfig {
        retry_policy: Some(policy),
        ..ReliabilityConfig::with_dead_letter_queue(&mut dlq)
    };
    let mut handler =
        FailureHandler::with_random(config, Classifier::retry_all(), move || rng.next())?;

    let (mut duplicates, mut shaped, mut sent, mut dead) = (0, 0, 0, 0);
    for i in 0..400u32 {
        now = now + Duration::from_millis(10); // a message every 10 ms (100/s)
        let id = if (i + 1).is_multiple_of(10) { i - 1 } else { i }; // every tenth is a resend
        match seen.check_and_mark(&id, now) {
            Ok(true) => {
                duplicates += 1;
                continue;
            }
            Ok(false) => {}
            // New, but not remembered: forward it and say so.
            Err(full) => println!("message {id}: {full}"),
        }
        if let Some(wait) = uplink.check(now).retry_after() {
            shaped += 1;
            let _ = wait; // a real gateway would buffer and retry after `wait`
            continue;
        }
        // The uplink drops about one send in three.
        let mut elapsed = Duration::ZERO;
        let outcome: Handled<(), u32, &str> = handler.process(
            id,
            now,
            |d| {
                elapsed += d;
                Ok(())
            },
            |_, _| {
                if uplink_rng.next().is_multiple_of(3) {
                    Err("uplink timeout")
                } else {
                    Ok(())
                }
            },
        );
        now = now + elapsed;
        match outcome {
            Handled::Succeeded { .. } => sent += 1,
            Handled::DeadLettered { .. } => dead += 1,
            other => println!("message {id}: {other:?}"),
        }
    }
    println!("messages: 400, duplicates dropped: {duplicates}, shaped away: {shaped}");
    println!("sent: {sent}, dead-lettered: {dead}");
    for failed in dlq.iter() {
        println!("  dead letter: {failed}");
    }
    Ok(())
}
