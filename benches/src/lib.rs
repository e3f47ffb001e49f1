//! Benchmarks of guard live in `benches/`; run them with
//! `cargo bench -p guard-benches --bench limiters`.
//!
//! This library holds what the benchmark binaries share.

use guard_core::time::Instant;

/// A fake monotonic clock for benchmarks: each reading is `step_nanos`
/// after the previous one, so a limiter sees time pass without a syscall.
#[derive(Debug, Clone, Copy)]
pub struct SteppingClock {
    now: u64,
    step_nanos: u64,
}

impl SteppingClock {
    /// A clock starting at one second that advances `step_nanos` per reading.
    pub const fn new(step_nanos: u64) -> Self {
        SteppingClock {
            now: 1_000_000_000,
            step_nanos,
        }
    }

    /// The next reading.
    #[inline]
    pub fn tick(&mut self) -> Instant {
        self.now = self.now.wrapping_add(self.step_nanos);
        Instant::from_nanos(self.now)
    }
}
