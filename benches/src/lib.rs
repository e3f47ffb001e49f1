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

/// [`SteppingClock`] for governor: a plain add per reading (a `Cell`, not
/// an atomic), so that governor and guard are compared on clocks that cost
/// the same. governor's `FakeRelativeClock` is an atomic add, about 11 ns
/// here, which a comparison would otherwise charge to governor.
#[derive(Clone, Debug)]
pub struct SteppingGovernorClock {
    now: std::rc::Rc<std::cell::Cell<u64>>,
    step_nanos: u64,
}

impl SteppingGovernorClock {
    /// A clock starting at one second that advances `step_nanos` per reading.
    pub fn new(step_nanos: u64) -> Self {
        SteppingGovernorClock {
            now: std::rc::Rc::new(std::cell::Cell::new(1_000_000_000)),
            step_nanos,
        }
    }
}

impl governor::clock::Clock for SteppingGovernorClock {
    type Instant = governor::nanos::Nanos;

    #[inline]
    fn now(&self) -> governor::nanos::Nanos {
        let now = self.now.get().wrapping_add(self.step_nanos);
        self.now.set(now);
        governor::nanos::Nanos::from(now)
    }
}

/// The folder the report command asks benchmarks to write their extra
/// tables into (figures criterion does not measure: bytes per key,
/// allocations, Redis throughput).
pub const RESULTS_DIR_VAR: &str = "GUARD_RESULTS_DIR";

/// Prints `markdown` and, when the report command runs this benchmark,
/// also saves it as `NAME.md` in its folder for `benches/RESULTS.md`.
pub fn publish(name: &str, markdown: &str) {
    println!("{markdown}");
    if let Some(dir) = std::env::var_os(RESULTS_DIR_VAR) {
        let path = std::path::Path::new(&dir).join(format!("{name}.md"));
        if let Err(e) = std::fs::write(&path, markdown) {
            eprintln!("could not write {}: {e}", path.display());
        }
    }
}
