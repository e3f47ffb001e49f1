//! The checks' clock as an embassy-time driver: `now` is what the checks
//! last set, so the RAM locker's expiries follow the same stepped time as
//! every other decision. Nothing here sleeps, so no wake-up is scheduled.

use core::cell::Cell;
use core::task::Waker;

use critical_section::Mutex;
use embassy_time_driver::Driver;

struct SteppedClock {
    /// Milliseconds since boot (tick-hz-1_000, embassy-time's default is
    /// 1 MHz: converted in `set`).
    ticks: Mutex<Cell<u64>>,
}

impl Driver for SteppedClock {
    fn now(&self) -> u64 {
        critical_section::with(|cs| self.ticks.borrow(cs).get())
    }

    fn schedule_wake(&self, _at: u64, waker: &Waker) {
        // Only `block_on` polls here, and it polls again at once.
        waker.wake_by_ref();
    }
}

embassy_time_driver::time_driver_impl!(static DRIVER: SteppedClock = SteppedClock {
    ticks: Mutex::new(Cell::new(0)),
});

/// Sets the clock to `ms` milliseconds since boot.
pub fn set(ms: u64) {
    let ticks = ms.saturating_mul(embassy_time_driver::TICK_HZ / 1_000);
    critical_section::with(|cs| DRIVER.ticks.borrow(cs).set(ticks));
}
