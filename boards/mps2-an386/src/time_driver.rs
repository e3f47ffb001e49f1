//! An embassy-time driver on SysTick: QEMU's MPS2 boards have no HAL.
//!
//! SysTick interrupts once per tick (1 kHz from the 25 MHz core clock) and
//! counts; on each tick the timer queue wakes every task whose time has
//! come, so a timer fires within one tick after its instant, never before.

use core::cell::{Cell, RefCell};
use core::task::Waker;

use cortex_m::peripheral::SYST;
use cortex_m::peripheral::syst::SystClkSource;
use cortex_m_rt::exception;
use critical_section::Mutex;
use embassy_time_driver::Driver;
use embassy_time_queue_utils::Queue;

/// The MPS2-AN386 core clock as QEMU models it.
const CORE_HZ: u32 = 25_000_000;

struct SysTickDriver {
    /// Ticks since `init`; 64 bits never wrap (585 million years at 1 kHz).
    ticks: Mutex<Cell<u64>>,
    queue: Mutex<RefCell<Queue>>,
}

impl Driver for SysTickDriver {
    fn now(&self) -> u64 {
        critical_section::with(|cs| self.ticks.borrow(cs).get())
    }

    fn schedule_wake(&self, at: u64, waker: &Waker) {
        // An instant already past is woken by the next tick, one tick late
        // at most: the queue is only ever drained from the interrupt.
        critical_section::with(|cs| {
            self.queue.borrow_ref_mut(cs).schedule_wake(at, waker);
        });
    }
}

embassy_time_driver::time_driver_impl!(static DRIVER: SysTickDriver = SysTickDriver {
    ticks: Mutex::new(Cell::new(0)),
    queue: Mutex::new(RefCell::new(Queue::new())),
});

/// Starts the tick: SysTick from the core clock, reloading every tick.
pub fn init(mut syst: SYST) {
    let per_tick = CORE_HZ / embassy_time_driver::TICK_HZ as u32;
    syst.set_clock_source(SystClkSource::Core);
    syst.set_reload(per_tick - 1);
    syst.clear_current();
    syst.enable_counter();
    syst.enable_interrupt();
}

#[exception]
fn SysTick() {
    critical_section::with(|cs| {
        let ticks = DRIVER.ticks.borrow(cs);
        let now = ticks.get() + 1;
        ticks.set(now);
        DRIVER.queue.borrow_ref_mut(cs).next_expiration(now);
    });
}
